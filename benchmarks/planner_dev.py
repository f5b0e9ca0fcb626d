"""Development harness for the planner: paired profit/OPT of seller variants on many markets.

Plays the same markets (a run seed other than the eval's 0, so tuning does not fit the
published markets) with each variant and prints mean profit/OPT, capture, welfare/OPT and
the paired difference against the first variant, overall and by shape. A variant is
``planner`` or ``greedy`` with planner parameters given as ``KEY=VALUE`` (including ones
the command line does not accept, for experiments), e.g.::

    python benchmarks/planner_dev.py --split train --buyers threshold --episodes 600 \\
        greedy planner 'planner?patience=2'
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from urllib.parse import parse_qsl

import numpy as np

from negotiate.agents.registry import parse_agent
from negotiate.agents.scripted import SELLERS
from negotiate.episode import run_episode
from negotiate.market import resolve_spec
from negotiate.metrics import mean_ci, opt
from negotiate.runner import build_episode


def variant(text: str):
    name, _, query = text.partition("?")
    params = {k: (float(v) if v.replace(".", "", 1).lstrip("-").isdigit() else v) for k, v in parse_qsl(query)}
    return name, params


async def play_all(split: str, buyers: str, episodes: int, seed: int, variants: list[str]) -> dict:
    rows: dict[str, list[dict]] = defaultdict(list)
    buyer_spec = parse_agent(buyers, "buyer")
    base_spec = parse_agent("greedy", "seller")
    for index in range(episodes):
        market, _, agents = build_episode(resolve_spec(split), base_spec, buyer_spec, seed, index)
        best = opt(market)
        for text in variants:
            name, params = variant(text)
            market, _, agents = build_episode(resolve_spec(split), base_spec, buyer_spec, seed, index)
            seller = SELLERS[name].create(name, params, market=market, seed=[market.seed, 2])
            if best[0] <= 0:
                continue  # no profit to be made: profit/OPT is undefined (eval leaves these out too)
            episode = await run_episode(market, seller, agents, opt_value=best)
            rows[text].append({"shape": market.shape, **episode.metrics})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--split", default="train")
    parser.add_argument("--buyers", default="threshold")
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shapes", action="store_true", help="also break down by shape")
    args = parser.parse_args()
    began = time.perf_counter()
    rows = asyncio.run(play_all(args.split, args.buyers, args.episodes, args.seed, args.variants))
    base = args.variants[0]
    ref = np.array([r["profit_ratio"] for r in rows[base]])
    print(f"{args.split} / {args.buyers} / {args.episodes} markets (seed {args.seed}), {time.perf_counter() - began:.1f}s")
    for text in args.variants:
        rs = rows[text]
        pr = np.array([r["profit_ratio"] for r in rs])
        wr = np.array([r["welfare_ratio"] or 0.0 for r in rs])
        cap = [r["capture"] for r in rs if r["capture"] is not None]
        op = [r["opt_pairs_share"] for r in rs if r["opt_pairs_share"] is not None]
        viol = sum(sum(r["violations"].values()) for r in rs)
        d, h = mean_ci(list(pr - ref))
        print(f"  {text:40s} profit/OPT {pr.mean():.4f}  welfare {wr.mean():.3f}  capture {np.mean(cap):.3f}  "
              f"OPT pairs {np.mean(op):.3f}  deals {np.mean([r['deal_rate'] for r in rs]):.3f}  viol {viol}  "
              f"d {d:+.4f} ± {h:.4f}")
        if args.shapes:
            by = defaultdict(list)
            for r, b in zip(rs, rows[base]):
                by[r["shape"]].append(((r["profit_ratio"]), b["profit_ratio"]))
            print("    " + "  ".join(f"{s}:{np.mean([a for a, _ in v]):.3f}({np.mean([a - b for a, b in v]):+.3f})" for s, v in sorted(by.items())))


if __name__ == "__main__":
    main()
