"""Cost of long episodes: time per turn as the turn budget grows, and whether a long episode stalls others.

Two measurements, both on the real async runtime (:func:`negotiate.episode.run_episode`):

* **Growth.** One 1x1 market (concession seller, threshold buyer) whose buyer values the
  product below its cost, so no deal is possible and the episode runs its whole budget:
  exactly B seller turns and B buyer replies. It runs once per budget in ``--budgets``
  (default 10,000, 20,000 and 40,000) and reports the wall and CPU time, the CPU time per
  turn and, for each budget against the one before it, the CPU time ratio over the turn
  ratio (CPU time of this process: the machine is shared, and wall time moves with the
  other processes' load). The
  target (issue #13): twice the turns cost at most 2.2x the time, a ratio of at most 1.1
  per doubling. Costs that grow with the history (an observation copying every past
  message) show up as a ratio near 2.
* **Stall** (``--stall``). The same long episode started together with ``--short``
  ordinary episodes (train split, dutch seller, threshold buyers) in one task group: it
  reports how many short episodes finished before the long one, and when the last of them
  finished. Scripted agents never await, so a bus that never yields would hold the event
  loop for the long episode's whole length, and every short one would finish after it.

Both run with ``gc.set_threshold(50_000, 20, 20)``, as ``run_batch`` does.

* **Memory** (``--rss``). ``negotiate serve`` of one episode of a 1x1 spec with ``budget = B`` (run seed 3: no
  deal, so the whole budget is spent), each budget in a fresh process: its wall and CPU time, peak RSS (``ru_maxrss``
  from ``wait4``: the run and its end-of-run table, which reads the trace back), RSS per turn above the smallest
  budget's, and the trace's size. The spec caps B at 10^6 (``negotiate.market.MAX_BUDGET``); issue 51's target is a
  peak flat in B, under 300 MB at the cap. ``--batch N`` serves N episodes of the train split's shape (2-4 buyers x
  2-4 products) with ``budget = B`` instead, 256 in flight (``serve``'s default): ordinary episodes that may run long.

    python benchmarks/bench_long.py                            # budgets 10,000 / 20,000 / 40,000, then --stall
    python benchmarks/bench_long.py --budgets 10000,20000,100000 --no-stall
    python benchmarks/bench_long.py --budgets 100000 --short 200 --json long.json
    python benchmarks/bench_long.py --rss --budgets 1000,10000,100000,1000000   # peak RSS of `serve` per budget
    python benchmarks/bench_long.py --rss --batch 2000 --seller greedy --budgets 1000000   # 2,000 train-shaped episodes
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import SPLITS, MarketSpec, generate
from negotiate.regulator import EpisodeState
from negotiate.runner import build_episode
from negotiate.run import build_buyers, seller_seed

GC_THRESHOLD = (50_000, 20, 20)
"""What negotiate.runner.run_batch sets while a batch runs."""
SEED = 3
"""A 1x1 market whose buyer values the product (177) below its cost (207): no deal, so every budget is spent."""
TARGET_RATIO = 1.1
"""Time ratio over turn ratio between two budgets: 2.2x the time for twice the turns."""


def _run(main) -> None:
    """``anyio.run(main)`` under the garbage collector settings of run_batch."""
    gc.collect()
    old = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        anyio.run(main)
    finally:
        gc.set_threshold(*old)


def long_episode(budget: int, seller_spec: str = "concession", buyer_spec: str = "threshold"):
    """The long episode's market, seller and buyers (fresh agents: they are stateful)."""
    market = generate(MarketSpec(name="long", buyers=1, products=1, budget=budget), SEED)
    seller = parse_agent(seller_spec, "seller").build(market, seller_seed(market.seed))
    buyers = build_buyers(market, parse_agent(buyer_spec, "buyer"))
    return market, seller, buyers


def growth(budget: int, seller_spec: str = "concession", buyer_spec: str = "threshold") -> dict:
    """Play the long episode once with this budget; its wall time and counts."""
    market, seller, buyers = long_episode(budget, seller_spec, buyer_spec)
    state = EpisodeState(market, episode=f"long-{budget}")
    result: dict = {}

    async def main() -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        episode = await run_episode(market, seller, buyers, episode_id=state.episode, state=state)
        result["wall_s"], result["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
        result["outcome"] = f"{episode.outcome}/{episode.reason}"

    _run(main)
    return {"budget": budget, "turns": state.turns_used, "messages": sum(state.messages_by.values()), "outcome": result["outcome"],
            "wall_s": result["wall_s"], "cpu_s": result["cpu_s"], "us_per_turn": result["cpu_s"] / budget * 1e6}


def stall(budget: int, short: int) -> dict:
    """The long episode beside ``short`` short ones, all started at once: the order they finish in."""
    long_market, long_seller, long_buyers = long_episode(budget)
    seller, buyers = parse_agent("dutch", "seller"), parse_agent("threshold", "buyer")
    shorts = [build_episode(SPLITS["train"], seller, buyers, 0, index) for index in range(short)]
    finished: list[tuple[str, float]] = []

    async def play(episode_id: str, market, seller_agent, buyer_agents, t0: float) -> None:
        await run_episode(market, seller_agent, buyer_agents, episode_id=episode_id)
        finished.append((episode_id, time.perf_counter() - t0))

    async def main() -> None:
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(play, "long", long_market, long_seller, long_buyers, t0)  # started first: the worst case
            for index, (market, seller_agent, buyer_agents) in enumerate(shorts):
                tg.start_soon(play, f"short-{index}", market, seller_agent, buyer_agents, t0)

    _run(main)
    order = [episode_id for episode_id, _ in finished]
    at = dict(finished)
    before = order.index("long")
    last_short = max((t for episode_id, t in finished if episode_id != "long"), default=0.0)
    return {"budget": budget, "short": short, "short_before_long": before, "long_s": at["long"], "last_short_s": last_short}


def rss(budget: int, seller_spec: str = "concession", batch: int = 0) -> dict:
    """``negotiate serve`` of one 1x1 episode with this budget (or ``batch`` episodes of the train split's shape) in a
    fresh process: wall time, peak RSS, trace size."""
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "long.toml"
        shape = "" if batch else "buyers = 1\nproducts = 1\n"  # a batch: the train split's shape, MarketSpec's default
        spec.write_text(f'name = "long"\n{shape}budget = {budget}\n')
        out = Path(folder) / "out"
        command = [sys.executable, "-m", "negotiate", "serve", "--seller", seller_spec, "--split", str(spec),
                   "--episodes", str(batch or 1), "--seed", "3", "--out", str(out), "--quiet"]
        t0 = time.perf_counter()
        child = subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        error = child.stderr.read().decode(errors="replace").strip()
        child.stderr.close()
        traces = [path for path in out.glob("*.jsonl") if not path.name.endswith(".log.jsonl")]
        size = sum(path.stat().st_size for path in traces)
        turns = 0
        for path in traces:
            with open(path, "rb") as lines:
                turns += sum(1 for line in lines if b'"sender":"seller"' in line)
    return {"budget": budget, "episodes": batch or 1, "turns": turns, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_mb": usage.ru_maxrss / 1024, "trace_mb": size / 1e6,
            "exit": os.waitstatus_to_exitcode(status), "error": error.splitlines()[-1] if error else ""}


def rss_table(budgets: list[int], seller_spec: str, batch: int = 0) -> list[dict]:
    if batch:
        print(f"negotiate serve, {batch:,} episodes of the train split's shape (run seed 3), {seller_spec} seller, threshold buyers: peak RSS")
    else:
        print(f"negotiate serve, one episode of a 1x1 market (run seed 3, no deal), {seller_spec} seller, threshold buyer: peak RSS")
    print(f"{'budget':>10} {'seller turns':>13} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} {'KB/turn':>8} {'trace MB':>9}  exit")
    rows: list[dict] = []
    for budget in budgets:
        row = rss(budget, seller_spec, batch)
        base = rows[0] if rows else None
        per_turn = ((row["peak_mb"] - base["peak_mb"]) * 1024 / (row["turns"] - base["turns"])
                    if base and row["turns"] > base["turns"] else None)
        rows.append(row)
        print(f"{budget:>10,} {row['turns']:>13,} {row['wall_s']:>8.1f} {row['cpu_s']:>8.1f} {row['peak_mb']:>12,.0f} "
              f"{'-' if per_turn is None else f'{per_turn:.2f}':>8} {row['trace_mb']:>9.1f}  {row['exit']} {row['error']}")
    return rows


def _budgets(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budgets: {text!r} is not a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--budgets: {text!r}: every budget must be at least 1")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Time per turn of one long episode as its budget grows, and whether it stalls others.")
    parser.add_argument("--budgets", type=_budgets, default=[10_000, 20_000, 40_000],
                        help="turn budgets of the long episode, comma-separated (default: 10000,20000,40000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per budget, the least CPU time kept (default: 1)")
    parser.add_argument("--stall", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the longest budget beside --short short episodes (default: on)")
    parser.add_argument("--short", type=int, default=100, help="short episodes beside the long one with --stall (default: 100)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--rss", action="store_true", help="instead: peak RSS of `negotiate serve` of one episode per budget")
    parser.add_argument("--batch", type=int, default=0, metavar="N",
                        help="with --rss: N episodes of the train split's shape per budget instead of one 1x1 episode")
    parser.add_argument("--seller", default="concession", help="the long episode's seller spec (default: concession)")
    parser.add_argument("--buyer", default="threshold", help="the long episode's buyer spec (default: threshold)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.rss:
        rows = rss_table(args.budgets, args.seller, args.batch)
        if args.json:
            Path(args.json).write_text(json.dumps({"python": platform.python_version(), "rss": rows}, indent=2))
        return 0 if all(row["exit"] == 0 for row in rows) else 1
    print(f"negotiate long-episode benchmark: 1x1 market (seed {SEED}, no deal possible), {args.seller} seller, {args.buyer} buyer, "
          f"Python {platform.python_version()}, gc.set_threshold{GC_THRESHOLD}")
    growth(1_000, args.seller, args.buyer)  # warm-up: imports, first-call caches
    rows = []
    print(f"{'budget':>9} {'turns':>9} {'messages':>9} {'wall s':>8} {'CPU s':>8} {'CPU us/turn':>12} {'CPU ratio':>11} {'turn ratio':>11} {'per 2x':>7}  outcome")
    for budget in args.budgets:
        row = min((growth(budget, args.seller, args.buyer) for _ in range(max(1, args.repeat))), key=lambda r: r["cpu_s"])
        if rows:
            prev = rows[-1]
            row["time_ratio"] = row["cpu_s"] / prev["cpu_s"]
            row["turn_ratio"] = row["budget"] / prev["budget"]
            row["normalized"] = row["time_ratio"] / row["turn_ratio"]
        rows.append(row)
        ratios = (f"{row['time_ratio']:>10.2f}x {row['turn_ratio']:>10.2f}x {2 * row['normalized']:>6.2f}x" if "time_ratio" in row
                  else f"{'-':>11} {'-':>11} {'-':>7}")
        print(f"{budget:>9,} {row['turns']:>9,} {row['messages']:>9,} {row['wall_s']:>8.2f} {row['cpu_s']:>8.2f} {row['us_per_turn']:>12.1f} {ratios}  {row['outcome']}")
    compared = [row for row in rows if "normalized" in row]
    met = all(row["normalized"] <= TARGET_RATIO for row in compared)
    if compared:
        worst = max(row["normalized"] for row in compared)
        print(f"target: twice the turns cost at most 2.2x the time: worst {2 * worst:.2f}x per doubling -> {'met' if met else 'NOT met'}")
    stalled = None
    if args.stall:
        stalled = stall(max(args.budgets), args.short)
        print(f"stall: a {stalled['budget']:,}-turn episode started first beside {stalled['short']} short ones: "
              f"{stalled['short_before_long']}/{stalled['short']} short episodes finished before it; "
              f"the last short one at {stalled['last_short_s']:.3f} s, the long one at {stalled['long_s']:.2f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"python": platform.python_version(), "rows": rows, "met": met, "stall": stalled}, indent=2))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
