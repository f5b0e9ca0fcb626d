"""Headroom above the planner and greedy: sellers that take, at each decision, one or the other's message.

A mixture walks the episode with both (each decides on a copy of itself, then both take the message
sent, as a teacher walks a trace) and sends the planner's message with probability ``--p``, greedy's
otherwise. On the same markets (a run seed other than the eval's) it prints the planner, greedy, the
better of the two per market (after the fact), the mixture's mean over ``--k`` seeds, and the best of
those ``--k`` per market (after the fact), with paired 95% CIs against the better of the two policies.

The best of k per market, chosen after the fact, bounds what a seller choosing per state between
the two tools could reach (it chooses with the buyers' values in hand); the mean says what choosing
at random gives. A round that learns the choice has to find the gap between them by exploration::

    python benchmarks/mixtures.py --split specs/compact.toml --buyers threshold --markets 128 --k 8
"""

from __future__ import annotations

import argparse
import asyncio
import copy

import numpy as np

from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import resolve_spec
from negotiate.metrics import mean_ci
from negotiate.protocol import Message
from negotiate.regulator import SellerObservation
from negotiate.run import seller_seed
from negotiate.runner import build_episode


class Mixture:
    """Planner or greedy, drawn per decision; both follow whatever was sent."""

    instant = True

    def __init__(self, market, seed, p: float, rng: np.random.Generator):
        self.tools = [parse_agent(name, "seller").build(market, seed) for name in ("planner", "greedy")]
        self.p, self.rng = p, rng

    def decide(self, obs: SellerObservation) -> Message | None:
        planner, greedy = (copy.deepcopy(tool).decide(obs) for tool in self.tools)
        message = planner if greedy is None or (planner is not None and self.rng.random() < self.p) else greedy
        for tool in self.tools:
            tool.follow(obs, message)
        return message

    def describe(self) -> dict:
        return {"kind": "scripted", "name": "mixture", "params": {"p": self.p}}


def ratio(episode) -> float:
    value = episode.metrics.get("profit_ratio")
    return 0.0 if value is None else float(value)


async def play(split: str, buyers: str, markets: int, k: int, p: float, seed: int) -> dict[str, np.ndarray]:
    spec = resolve_spec(split)
    buyer_spec = parse_agent(buyers, "buyer")
    rows: dict[str, list[float]] = {"planner": [], "greedy": [], "mixture mean": [], f"mixture best of {k}": []}
    for index in range(markets):
        for name in ("planner", "greedy"):
            market, seller, players = build_episode(spec, parse_agent(name, "seller"), buyer_spec, seed, index)
            rows[name].append(ratio(await run_episode(market, seller, players, fresh=True)))
        mixed = []
        for j in range(k):
            market, _, players = build_episode(spec, parse_agent("planner", "seller"), buyer_spec, seed, index)
            mixture = Mixture(market, seller_seed(market.seed), p, np.random.default_rng([seed, index, j]))
            mixed.append(ratio(await run_episode(market, mixture, players, fresh=True)))
        rows["mixture mean"].append(float(np.mean(mixed)))
        rows[f"mixture best of {k}"].append(max(mixed))
    out = {name: np.array(values) for name, values in rows.items()}
    out["better of the two"] = np.maximum(out["planner"], out["greedy"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="specs/compact.toml")
    parser.add_argument("--buyers", default="threshold")
    parser.add_argument("--markets", type=int, default=128)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--p", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=7, help="run seed (the eval's is 0; the loop's held-out 1000003)")
    args = parser.parse_args()
    rows = asyncio.run(play(args.split, args.buyers, args.markets, args.k, args.p, args.seed))
    best = rows["better of the two"]
    print(f"{args.split}, {args.buyers} buyers, {args.markets} markets: profit/OPT (95% CI); paired against the better of the two")
    for name in ("planner", "greedy", "better of the two", "mixture mean", f"mixture best of {args.k}"):
        mean, half = mean_ci(rows[name])
        diff, dhalf = mean_ci(rows[name] - best)
        print(f"  {name:22s} {mean:.3f} ± {half:.3f}   {diff:+.3f} ± {dhalf:.3f}")


if __name__ == "__main__":
    main()
