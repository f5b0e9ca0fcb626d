"""Memory of a run against its --episodes: does ``negotiate serve --episodes 100000000`` cost more than ``--episodes 1000``?

Two measurements, each in a fresh Python process, started in a temporary folder (not a checkout, whose
``negotiate/`` would come first on ``sys.path``), that imports ``negotiate`` from wherever ``PYTHONPATH``
points, or the installed package: one script measures two trees
(``PYTHONPATH=../old python benchmarks/scale.py --label before``); the header names the one measured.

* **prepare**: :func:`negotiate.runner.prepare` of a new run of N episodes: its seconds and the process's
  peak RSS (``ru_maxrss``) before and after.
* **serve**: ``negotiate serve --episodes N --seller greedy --workers W --quiet`` into a temporary folder,
  stopped with SIGINT ``--seconds`` after its first episode is written (or after ``--limit`` seconds if none
  is): when the first episode landed, the peak RSS of the largest process (``ru_maxrss`` from ``wait4``: the
  parent, or one of its worker processes), the peak of the processes' RSS summed (``/proc`` sampled every
  0.2 s), the episodes kept and the exit code (130: stopped by SIGINT, every finished episode kept).

With ``--report``, what reads a finished run back instead (it grows with the episodes written):

* **report**: ``negotiate report DIR --baseline greedy --format csv`` over N episodes, half greedy's, half
  posted's on the same markets: the episodes of a real ``serve`` of ``--sample`` markets of the train split,
  copied with new indices and market seeds until there are N (each copy its own market, played by both
  sellers). Its seconds and peak RSS (``wait4``); copying is not counted.
* **serve**: ``negotiate serve --episodes N --seller greedy --quiet`` played to the end, so its peak is the
  larger of the playing (flat) and the table printed at the end (only for N up to ``--serve-max``: it plays
  about 1,500 episodes a second).

Each row also gives the growth per episode since the row of the next smaller N.

Each process runs under ``--address-limit`` GB of address space (``RLIMIT_AS``), so a tree that would
take the machine's memory fails with a MemoryError instead (the row says so).

    python benchmarks/scale.py                                  # N = 1,000 / 1,000,000 / 10,000,000 / 100,000,000; W = 1, 2
    python benchmarks/scale.py --episodes 1000,10000000 --workers 1 --seconds 5
    PYTHONPATH=/path/to/old/tree python benchmarks/scale.py --label before --episodes 1000,1000000,10000000
    python benchmarks/scale.py --report                         # N = 2,000 / 20,000 / 100,000: the table, not the run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PREPARE = textwrap.dedent("""
    import json, resource, sys, time
    from pathlib import Path
    import negotiate.runner as runner
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    prepared = runner.prepare(runner.RunConfig(sellers=("greedy",), episodes=int(sys.argv[1])), Path(sys.argv[2]), resume=False)
    print(json.dumps({"seconds": time.perf_counter() - began, "jobs": len(prepared.jobs), "before_kb": before,
                      "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "module": runner.__file__}))
""")


def _limit(gb: float):
    def apply() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a shell starts background jobs with SIGINT ignored
        size = int(gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    return apply


def _tree_rss_kb(root: int) -> int:
    """The RSS of ``root`` and its descendants, summed (kB)."""
    parent_of, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        pid = int(entry)
        parent_of[pid] = int(fields.get("PPid", "0").strip())
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total = 0
    for pid in rss:
        at = pid
        while at and at != root:
            at = parent_of.get(at, 0)
        if at == root:
            total += rss[pid]
    return total


def prepare_row(episodes: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-c", PREPARE, str(episodes), str(Path(tmp) / "run")], capture_output=True,
                              text=True, preexec_fn=_limit(args.address_limit), timeout=args.limit, cwd=tmp)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout)


def _reaped(pid: int, flags: int = 0):
    """(exit status, rusage) of a child that has ended, reaping it (None while it runs with ``os.WNOHANG``):
    ``wait4`` gives the peak RSS of the child and of the children it reaped (a run's workers)."""
    got, status, usage = os.wait4(pid, flags)
    return (status, usage) if got else None


def serve_row(episodes: int, workers: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        command = [sys.executable, "-m", "negotiate", "serve", "--episodes", str(episodes), "--seller", "greedy",
                   "--workers", str(workers), "--out", str(out), "--quiet"]
        began = time.monotonic()
        with open(Path(tmp) / "stderr", "w+b") as err:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_limit(args.address_limit),
                                       env={**os.environ, "COLUMNS": "200"}, cwd=tmp)
            first, total_kb, stop_at = None, 0, began + args.limit
            trace = out / "greedy.jsonl"
            while (ended := _reaped(process.pid, os.WNOHANG)) is None and time.monotonic() < stop_at:
                total_kb = max(total_kb, _tree_rss_kb(process.pid))
                if first is None and trace.exists() and b'"type":"episode_end"' in trace.read_bytes()[:1 << 20]:
                    first = time.monotonic() - began
                    stop_at = min(stop_at, time.monotonic() + args.seconds)
                time.sleep(0.2)
            if ended is None:
                process.send_signal(signal.SIGINT)
                ended = _reaped(process.pid)
            status, usage = ended
            process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            err.seek(0)
            error = "MemoryError" if b"MemoryError" in err.read() else None
        kept = trace.read_bytes().count(b'"type":"episode_end"') if trace.exists() else 0
    row = {"first_s": first, "peak_kb": usage.ru_maxrss, "sum_kb": total_kb, "kept": kept, "code": process.returncode}
    return row | ({"error": error} if error else {})


def _mb(kb) -> str:
    return "-" if kb is None else f"{kb / 1024:,.0f}"


def _sample_run(sample: int, args, tmp: Path) -> Path:
    """A real run of ``sample`` markets, greedy and posted each playing every one (played once, copied for every N)."""
    out = tmp / "sample"
    subprocess.run([sys.executable, "-m", "negotiate", "serve", "--episodes", str(sample), "--seller", "greedy,posted", "--out",
                    str(out), "--quiet"], stdout=subprocess.DEVNULL, check=True, cwd=tmp, timeout=args.limit)
    return out


def _copied_run(sample: Path, episodes: int, out: Path) -> None:
    """``episodes`` episodes, half of each seller, copied from ``sample``'s: copy k of market i is market
    ``k * sample + i``, its market seed that index (so each copy is its own market, paired across the sellers)."""
    out.mkdir()
    (out / "run.json").write_bytes((sample / "run.json").read_bytes())
    for seller in ("greedy", "posted"):
        episodes_of, current = [], []
        for line in (sample / f"{seller}.jsonl").read_bytes().splitlines():
            current.append(json.loads(line))
            if current[-1]["type"] == "episode_end":
                episodes_of.append(current)
                current = []
        episodes_of.sort(key=lambda events: events[0]["index"])  # copy k of market i is the same market for both sellers
        with open(out / f"{seller}.jsonl", "w") as handle:
            for index in range(episodes // 2):
                start, *rest = episodes_of[index % len(episodes_of)]
                name = f"{seller}-{index:06d}"
                start = start | {"episode": name, "index": index, "seed": index, "market": start["market"] | {"seed": index}}
                handle.writelines(json.dumps(event | {"episode": name}, separators=(",", ":")) + "\n" for event in [start, *rest])


def report_row(sample: Path, episodes: int, args, tmp: Path) -> dict:
    out = tmp / f"report-{episodes}"
    _copied_run(sample, episodes, out)
    command = [sys.executable, "-m", "negotiate", "report", str(out), "--baseline", "greedy", "--format", "csv"]
    row = _finished(command, args, tmp)
    shutil.rmtree(out)
    return row


def serve_to_end_row(episodes: int, args, tmp: Path) -> dict:
    out = tmp / f"serve-{episodes}"
    row = _finished([sys.executable, "-m", "negotiate", "serve", "--episodes", str(episodes), "--seller", "greedy", "--out", str(out),
                     "--quiet"], args, tmp)
    shutil.rmtree(out, ignore_errors=True)
    return row


def _finished(command: list[str], args, tmp: Path) -> dict:
    """Seconds, peak RSS (``wait4``) and exit code of ``command`` run to its end."""
    began = time.monotonic()
    with open(tmp / "stderr", "w+b") as err:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_limit(args.address_limit),
                                   env={**os.environ, "COLUMNS": "200"}, cwd=tmp)
        status, usage = _reaped(process.pid)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        err.seek(0)
        error = "MemoryError" if b"MemoryError" in err.read() else None
    row = {"seconds": time.monotonic() - began, "peak_kb": usage.ru_maxrss, "code": process.returncode}
    return row | ({"error": error} if error else {})


def report_main(args, counts: list[int], where: str) -> list[dict]:
    print(f"negotiate from {where}; Python {sys.version.split()[0]}; report: {args.sample} markets played by greedy and posted, "
          "copied", flush=True)
    header = f"{'tree':<7}{'episodes':>13}  {'what':<8}{'seconds':>9}{'peak RSS MB':>13}{'kB/episode':>12}{'exit':>6}"
    print(header)
    print("-" * len(header), flush=True)
    rows, last = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        sample = _sample_run(args.sample, args, Path(tmp))
        for n in counts:
            for what in ("report", "serve"):
                if what == "serve" and n > args.serve_max:
                    continue
                result = report_row(sample, n, args, Path(tmp)) if what == "report" else serve_to_end_row(n, args, Path(tmp))
                grown = (result["peak_kb"] - last[what][1]) / (n - last[what][0]) if what in last else None
                last[what] = (n, result["peak_kb"])
                rows.append({"label": args.label, "episodes": n, "what": what, **result, "kb_per_episode": grown})
                print(f"{args.label:<7}{n:>13,}  {what:<8}{result['seconds']:9.2f}{_mb(result['peak_kb']):>13}"
                      f"{'-' if grown is None else f'{grown:.2f}':>12}{result['code']:>6}{'  ' + result.get('error', '')}", flush=True)
    print("peak RSS: wait4's ru_maxrss; kB/episode: its growth since the row of the next smaller N")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", help="comma-separated --episodes values (default: 1000,1000000,10000000,100000000; "
                                           "with --report, 2000,20000,100000)")
    parser.add_argument("--workers", default="1,2", help="comma-separated --workers values for serve")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds serve plays after its first episode (default: 10)")
    parser.add_argument("--limit", type=float, default=150.0, help="seconds a measurement may take in all (default: 150)")
    parser.add_argument("--address-limit", type=float, default=10.0, help="GB of address space per process (default: 10)")
    parser.add_argument("--label", default="", help="names the tree measured in the table (before, after)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--report", action="store_true", help="measure the end-of-run table and `negotiate report` over N "
                                                              "episodes written, not the run")
    parser.add_argument("--sample", type=int, default=200, help="--report: markets really played, copied up to N (default: 200)")
    parser.add_argument("--serve-max", type=int, default=20000, help="--report: the largest N served to the end (default: 20000)")
    args = parser.parse_args()
    episodes = args.episodes or ("2000,20000,100000" if args.report else "1000,1000000,10000000,100000000")
    counts = [int(n) for n in episodes.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        where = subprocess.run([sys.executable, "-c", "import negotiate; print(negotiate.__file__)"], capture_output=True, text=True,
                               cwd=tmp, check=True).stdout.strip()
    if args.report:
        rows = report_main(args, counts, str(Path(where).parent))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    print(f"negotiate from {Path(where).parent}; Python {sys.version.split()[0]}; serve plays {args.seconds:g} s after its "
          "first episode", flush=True)
    header = f"{'tree':<7}{'episodes':>13}  {'what':<9}{'seconds':>9}{'peak RSS MB':>13}{'all procs MB':>14}{'kept':>8}{'exit':>6}"
    print(header)
    print("-" * len(header), flush=True)
    for n in counts:
        result = prepare_row(n, args)
        rows.append({"label": args.label, "episodes": n, "what": "prepare", **result})
        shown = result.get("error") or f"{result['seconds']:9.2f}{_mb(result['peak_kb']):>13}"
        print(f"{args.label:<7}{n:>13,}  {'prepare':<9}{shown}", flush=True)
        for w in workers:
            result = serve_row(n, w, args)
            rows.append({"label": args.label, "episodes": n, "what": f"serve -w{w}", **result})
            first = "never" if result["first_s"] is None else f"{result['first_s']:.2f}"
            print(f"{args.label:<7}{n:>13,}  {f'serve -w{w}':<9}{first:>9}{_mb(result['peak_kb']):>13}{_mb(result['sum_kb']):>14}"
                  f"{result['kept']:>8,}{result['code']:>6}{'  ' + result['error'] if 'error' in result else ''}", flush=True)
    print("seconds: prepare's, or for serve when its first episode was written; peak RSS: the largest process's; "
          "all procs: the parent's and workers' RSS summed, sampled")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
