"""Cost of one episode as the market grows: n buyers x n products (issue 44).

For each n in ``--sizes`` and each seller in ``--sellers``, ``negotiate serve`` plays one episode of an n x n market
(threshold buyers, stock 1, the default budget of 1.5 turns a pair: 1.5 n^2) in a fresh process. The table gives
its wall time, the seller turns it took, the time per turn, the peak RSS (``ru_maxrss`` from ``wait4``) and the
profit/OPT. Each turn's work is what the seller's rule asks: greedy and the planner each solve an assignment of the
free buyers to the products in stock (``scipy.optimize.linear_sum_assignment``, n^3 at worst), so a turn's cost grows
with n, and an episode's with n^2 turns beside it.

``--sigterm N``: then starts an N x N episode (each seller), sends SIGTERM ``--after`` seconds after its trace file
appears (the run has started) and times how long the process takes to exit (exit code 143: stopped, every finished episode kept).

``--cpu R`` (issue 51) gives instead each episode's CPU seconds: the same market and buyers (``serve``'s episode 0 of a
run seeded 1), played by :func:`negotiate.episode.run_episode` in a fresh process that reads ``time.process_time()``
around it (start-up, imports and OPT left out), R times; the median, its seconds a turn, each doubling's ratio and the
exponent fitted to all sizes (least squares of log CPU on log n); and of that run, the CPU spent in scipy's assignment
solver (``linear_sum_assignment`` as ``negotiate.agents.moves`` calls it, timed around each call), the calls, and the
rest, with their exponents. CPU seconds, not wall: the machine is shared. The child
runs in a temporary folder and imports ``negotiate`` from ``PYTHONPATH`` or the installed package, so one checkout
measures another tree (``PYTHONPATH=/path/to/tree``, a folder holding ``negotiate/`` with ``agents/`` inside it); the
header names the one measured.

    python benchmarks/scale_markets.py                                  # n = 10, 50, 100, 200; greedy, planner
    python benchmarks/scale_markets.py --sizes 10,50 --sellers greedy --sigterm 0
    python benchmarks/scale_markets.py --cpu 3                          # n = 25, 50, 100, 200: CPU an episode
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import orjson


def _spec(folder: Path, n: int) -> Path:
    path = folder / f"n{n}.toml"
    path.write_text(f'name = "n{n}"\nbuyers = {n}\nproducts = {n}\n')
    return path


def _command(seller: str, spec: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "negotiate", "serve", "--seller", seller, "--buyers", "threshold", "--split", str(spec),
            "--episodes", "1", "--seed", "1", "--out", str(out), "--quiet"]


def episode(seller: str, n: int, limit: float) -> dict:
    """One n x n episode in a fresh process: wall time, peak RSS, turns and profit/OPT."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        t0 = time.perf_counter()
        child = subprocess.Popen(_command(seller, _spec(Path(folder), n), out), cwd=folder, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        usage = None
        while usage is None:
            pid, _, rusage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                usage = rusage
            elif time.perf_counter() - t0 > limit:
                child.kill()
            else:
                time.sleep(0.05)
        child.returncode = 0  # reaped above
        wall = time.perf_counter() - t0
        end = None
        trace = out / f"{seller}.jsonl"
        if trace.exists():
            for line in trace.open("rb"):
                if b'"episode_end"' in line:
                    end = orjson.loads(line)
    if end is None:
        return {"seller": seller, "n": n, "wall_s": wall, "done": False}
    metrics = end.get("metrics") or {}
    return {"seller": seller, "n": n, "wall_s": wall, "done": True, "turns": end["turns_used"], "budget": end["budget"],
            "episode_s": end["wall_s"], "us_per_turn": end["wall_s"] / max(1, end["turns_used"]) * 1e6,
            "peak_mb": usage.ru_maxrss / 1024, "profit_ratio": metrics.get("profit_ratio")}


EPISODE_CPU = textwrap.dedent("""
    import json, sys, time
    import anyio
    import negotiate
    from negotiate.agents.registry import parse_agent
    from negotiate.episode import run_episode
    from negotiate.market import MarketSpec
    from negotiate.runner import build_episode
    from negotiate.agents import moves
    seller, n = sys.argv[1], int(sys.argv[2])
    spec = MarketSpec(name=f"n{n}", buyers=n, products=n)
    market, agent, buyers = build_episode(spec, parse_agent(seller, "seller"), parse_agent("threshold", "buyer"), 1, 0)
    solve, solver = moves.linear_sum_assignment, [0.0, 0]
    def timed(*args, **kwargs):
        began = time.process_time()
        try:
            return solve(*args, **kwargs)
        finally:
            solver[0] += time.process_time() - began
            solver[1] += 1
    moves.linear_sum_assignment = timed
    began = time.process_time()
    episode = anyio.run(lambda: run_episode(market, agent, buyers, episode_id="scale"))
    cpu = time.process_time() - began
    print(json.dumps({"cpu_s": cpu, "solver_s": solver[0], "solves": solver[1], "turns": episode.events[-1].turns_used,
                      "tree": negotiate.__file__}))
""")


def episode_cpu(seller: str, n: int, repeat: int) -> dict:
    """CPU seconds of one n x n episode (threshold buyers, stock 1, budget 1.5 n^2), in a fresh process each time: the
    median of ``repeat``."""
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(repeat):
            done = subprocess.run([sys.executable, "-c", EPISODE_CPU, seller, str(n)], cwd=folder, capture_output=True,
                                  text=True, check=True)
            runs.append(orjson.loads(done.stdout.strip().splitlines()[-1]))
    runs.sort(key=lambda run: run["cpu_s"])
    median = runs[len(runs) // 2]
    return {"seller": seller, "n": n, "turns": median["turns"], "cpu_s": median["cpu_s"], "min_s": runs[0]["cpu_s"],
            "max_s": runs[-1]["cpu_s"], "solver_s": median["solver_s"], "solves": median["solves"],
            "rest_s": median["cpu_s"] - median["solver_s"], "tree": median["tree"]}


def exponent(rows: list[dict], key: str = "cpu_s") -> float:
    """The slope of log CPU (``key``) on log n, least squares: CPU ~ n^slope."""
    xs, ys = [math.log(row["n"]) for row in rows], [math.log(max(row[key], 1e-9)) for row in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def cpu_table(sizes: list[int], sellers: list[str], repeat: int, label: str) -> None:
    print(f"CPU of one n x n episode ({label}; threshold buyers, stock 1, budget 1.5 n^2; median of {repeat} fresh processes), "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'seller':>8} {'n':>4} {'turns':>7} {'CPU s':>8} {'min-max':>13} {'us/turn':>8} {'per 2x':>7} {'solver s':>9} "
          f"{'solves':>7} {'rest s':>7}")
    for seller in sellers:
        rows: list[dict] = []
        for n in sizes:
            row = episode_cpu(seller, n, repeat)
            if not rows:
                print(f"  (tree: {row['tree']})")
            ratio = "" if not rows else f"{(row['cpu_s'] / rows[-1]['cpu_s']) ** (1 / math.log2(n / rows[-1]['n'])):.2f}x"
            rows.append(row)
            print(f"{seller:>8} {n:>4} {row['turns']:>7,} {row['cpu_s']:>8.2f} {row['min_s']:>6.2f}-{row['max_s']:<6.2f} "
                  f"{row['cpu_s'] / max(1, row['turns']) * 1e6:>8.0f} {ratio:>7} {row['solver_s']:>9.2f} {row['solves']:>7,} "
                  f"{row['rest_s']:>7.2f}", flush=True)
        if len(rows) > 1:
            print(f"{seller:>8} CPU ~ n^{exponent(rows):.2f}; the solver's ~ n^{exponent(rows, 'solver_s'):.2f}, the rest's ~ "
                  f"n^{exponent(rows, 'rest_s'):.2f} (least squares over n = {', '.join(str(n) for n in sizes)})", flush=True)


def sigterm(seller: str, n: int, after: float) -> dict:
    """Seconds from SIGTERM to the exit of a process ``after`` seconds into an n x n episode."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        child = subprocess.Popen(_command(seller, _spec(Path(folder), n), out), cwd=folder,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (out / f"{seller}.jsonl").exists() and child.poll() is None:  # the run has started its episode
            time.sleep(0.05)
        time.sleep(after)
        sent = time.perf_counter()
        child.send_signal(signal.SIGTERM)
        code = child.wait(120)
        return {"seller": seller, "n": n, "after_s": after, "exit_s": time.perf_counter() - sent, "code": code}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cost of one n x n episode, and SIGTERM latency in a large one.")
    parser.add_argument("--sizes", default=None, help="values of n, comma-separated (default: 10,50,100,200; with --cpu, 25,50,100,200)")
    parser.add_argument("--sellers", default="greedy,planner", help="seller specs, comma-separated (default: greedy,planner)")
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds one episode may take before it is killed")
    parser.add_argument("--sigterm", type=int, default=200, help="n of the SIGTERM check, 0 for none (default: 200)")
    parser.add_argument("--after", type=float, default=8.0, help="seconds into the episode SIGTERM is sent (default: 8)")
    parser.add_argument("--cpu", type=int, default=0, metavar="R",
                        help="instead: each episode's CPU seconds, the median of R fresh processes, and the fitted exponent "
                             "(sizes default to 25,50,100,200)")
    parser.add_argument("--label", default="this tree", help="what the --cpu table's header calls the tree measured")
    args = parser.parse_args(argv)
    if args.cpu:
        cpu_table([int(part) for part in (args.sizes or "25,50,100,200").split(",")], args.sellers.split(","), args.cpu, args.label)
        return 0
    print(f"one episode of an n x n market per row (threshold buyers, budget 1.5 n^2), Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'seller':>8} {'n':>4} {'turns':>7} {'episode s':>10} {'us/turn':>8} {'process s':>10} {'peak MB':>8} {'profit/OPT':>11}")
    for n in (int(part) for part in (args.sizes or "10,50,100,200").split(",")):
        for seller in args.sellers.split(","):
            row = episode(seller, n, args.limit)
            if not row["done"]:
                print(f"{seller:>8} {n:>4} did not finish in {args.limit:.0f} s")
                continue
            ratio = "-" if row["profit_ratio"] is None else f"{row['profit_ratio']:.3f}"
            print(f"{seller:>8} {n:>4} {row['turns']:>7,} {row['episode_s']:>10.2f} {row['us_per_turn']:>8.0f} "
                  f"{row['wall_s']:>10.2f} {row['peak_mb']:>8.0f} {ratio:>11}", flush=True)
    if args.sigterm:
        for seller in args.sellers.split(","):
            row = sigterm(seller, args.sigterm, args.after)
            print(f"SIGTERM {row['after_s']:.0f} s into a {args.sigterm} x {args.sigterm} episode ({seller}): exited in "
                  f"{row['exit_s']:.2f} s with code {row['code']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
