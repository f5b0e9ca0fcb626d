"""Cost of one episode as the market grows: n buyers x n products (issue 44).

For each n in ``--sizes`` and each seller in ``--sellers``, ``negotiate serve`` plays one episode of an n x n market
(threshold buyers, stock 1, the default budget of 1.5 turns a pair: 1.5 n^2) in a fresh process. The table gives
its wall time, the seller turns it took, the time per turn, the peak RSS (``ru_maxrss`` from ``wait4``) and the
profit/OPT. Each turn's work is what the seller's rule asks: greedy and the planner each solve an assignment of the
free buyers to the products in stock (``scipy.optimize.linear_sum_assignment``, n^3 at worst), so a turn's cost grows
with n, and an episode's with n^2 turns beside it.

``--sigterm N``: then starts an N x N episode (each seller), sends SIGTERM ``--after`` seconds after its trace file
appears (the run has started) and times how long the process takes to exit (exit code 143: stopped, every finished episode kept).

    python benchmarks/scale_markets.py                                  # n = 10, 50, 100, 200; greedy, planner
    python benchmarks/scale_markets.py --sizes 10,50 --sellers greedy --sigterm 0
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
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
    parser.add_argument("--sizes", default="10,50,100,200", help="values of n, comma-separated (default: 10,50,100,200)")
    parser.add_argument("--sellers", default="greedy,planner", help="seller specs, comma-separated (default: greedy,planner)")
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds one episode may take before it is killed")
    parser.add_argument("--sigterm", type=int, default=200, help="n of the SIGTERM check, 0 for none (default: 200)")
    parser.add_argument("--after", type=float, default=8.0, help="seconds into the episode SIGTERM is sent (default: 8)")
    args = parser.parse_args(argv)
    print(f"one episode of an n x n market per row (threshold buyers, budget 1.5 n^2), Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'seller':>8} {'n':>4} {'turns':>7} {'episode s':>10} {'us/turn':>8} {'process s':>10} {'peak MB':>8} {'profit/OPT':>11}")
    for n in (int(part) for part in args.sizes.split(",")):
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
