"""Time per decision of the planner seller beside greedy's.

Plays the same markets with each seller (threshold, concession and stubborn buyers) and
times every call of the seller's ``decide`` with ``time.perf_counter_ns``; reports the
median, p90 and max per split, and the episodes' wall time. Nothing is written.

    python benchmarks/bench_planner.py                    # 100 markets per split and buyer type
    python benchmarks/bench_planner.py --episodes 300 --splits train,shapes
"""

from __future__ import annotations

import argparse
import time

import anyio
import numpy as np

from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import SPLITS
from negotiate.runner import build_episode


def timed(seller, sink: list[int]):
    """Wrap ``seller.decide`` so each call's duration (ns) lands in ``sink``."""
    decide = seller.decide

    def wrapper(obs):
        start = time.perf_counter_ns()
        try:
            return decide(obs)
        finally:
            sink.append(time.perf_counter_ns() - start)

    seller.decide = wrapper
    return seller


async def measure(seller_name: str, split: str, buyers: str, episodes: int) -> tuple[list[int], float]:
    sink: list[int] = []
    spec, buyer_spec = parse_agent(seller_name, "seller"), parse_agent(buyers, "buyer")
    began = time.perf_counter()
    for index in range(episodes):
        market, seller, agents = build_episode(SPLITS[split], spec, buyer_spec, 0, index)
        await run_episode(market, timed(seller, sink), agents)
    return sink, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sellers", default="greedy,planner")
    parser.add_argument("--buyers", default="threshold,concession,stubborn")
    parser.add_argument("--splits", default=",".join(SPLITS))
    parser.add_argument("--episodes", type=int, default=100)
    args = parser.parse_args()
    print(f"{'split':11s} {'seller':9s} {'decisions':>9s} {'median ms':>9s} {'p90 ms':>7s} {'max ms':>7s} {'s/100 episodes':>14s}")
    for split in args.splits.split(","):
        for name in args.sellers.split(","):
            times, wall, count = [], 0.0, 0
            for buyers in args.buyers.split(","):
                sink, seconds = anyio.run(measure, name, split, buyers, args.episodes)
                times += sink
                wall += seconds
                count += args.episodes
            ms = np.array(times) / 1e6
            print(f"{split:11s} {name:9s} {len(ms):9d} {np.median(ms):9.3f} {np.percentile(ms, 90):7.3f} {ms.max():7.2f} {100 * wall / count:14.2f}")


if __name__ == "__main__":
    main()
