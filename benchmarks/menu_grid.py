"""How fine the menu's price grid must be: the planner with its offers snapped to the grid, against the planner.

The menu (``negotiate.agents.menu``) prices offers on a grid of ``GRID`` steps across the public value range. A grid
too coarse costs profit; one too fine makes more options than a policy can tell apart. ``menu?pick=planner`` is the
planner with its prices snapped to the grid (its beliefs follow the snapped price it sent); this script plays it and
the planner on the same markets (the compact splits, paired, synchronous play-outs of the ``--fresh`` game) for each
grid size and prints the paired difference of profit/OPT with its 95% interval::

    python benchmarks/menu_grid.py --grids 20,35,50,80 --markets 200 --seed 424242

The menu's target (issue 49): the snapped planner loses at most 0.005 profit/OPT.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import negotiate.agents.menu as menu
from negotiate.agents.registry import parse_agent
from negotiate.market import resolve_spec
from negotiate.metrics import mean_ci, opt
from negotiate.regulator import EpisodeState
from negotiate.rollout import play_out, profit
from negotiate.runner import build_episode

SPLITS = ("specs/compact.toml", "specs/compact-correlated.toml", "specs/compact-shapes.toml")


def ratios(seller: str, buyers: str, splits, markets: int, seed: int) -> np.ndarray:
    out = []
    for split in splits:
        spec = resolve_spec(split)
        for index in range(markets):
            market, agent, players = build_episode(spec, parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), seed, index)
            best = opt(market)[0]
            out.append(profit(play_out(EpisodeState(market), agent, players)) / best if best > 0 else 0.0)
    return np.array(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grids", default="20,35,50,80")
    parser.add_argument("--markets", type=int, default=200, help="markets per split")
    parser.add_argument("--seed", type=int, default=424242, help="run seed (not one a training or evaluation run uses)")
    parser.add_argument("--buyers", default="threshold,concession")
    args = parser.parse_args(argv)
    for buyers in args.buyers.split(","):
        base = ratios("planner", buyers, SPLITS, args.markets, args.seed)
        print(f"{buyers} buyers, {len(base)} markets: planner {base.mean():.4f}")
        for grid in (int(g) for g in args.grids.split(",")):
            menu.GRID = grid
            began = time.perf_counter()
            snapped = ratios("menu", buyers, SPLITS, args.markets, args.seed)
            diff, half = mean_ci(snapped - base)
            print(f"  grid {grid:3d}: snapped planner {snapped.mean():.4f}, paired {diff:+.4f} ± {half:.4f} "
                  f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
