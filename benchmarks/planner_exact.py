"""How far the planner is from the best possible seller on small markets: an exact dynamic programme.

With threshold buyers and independent values, a seller's belief is one upper bound per
buyer-product pair (a reject of p: v < p; an accept ends the buyer and the unit), so with
prices restricted to the edges of G equal value cells the best policy (most expected
profit) of a small market can be computed exactly: a lower bound on what any seller can
make. Values are uniform on [100, 1000] and costs drawn as in ``train``; each cost draw is
solved once, then the programme's policy, the planner and greedy play the same value draws.
Printed: mean profit/OPT of each, and for the planner's offers while every pair is still
open, the expected profit it gives up against the programme's best move, split into the
choice of pair and of price (its price taken to the next cell edge up: approximate).

    python benchmarks/planner_exact.py                       # 2x2, G=16, 6 cost draws x 150 worlds
    python benchmarks/planner_exact.py --grid 12 --costs 10
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
from collections import defaultdict

import numpy as np
from scipy.optimize import linear_sum_assignment

from negotiate.agents.scripted import BUYERS, SELLERS
from negotiate.episode import run_episode
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER
from negotiate.trace import MessageEvent

LOW, HIGH = 100, 1000


def solve(costs: list[int], n: int, edges: list[int]):
    """V(turns, buyers, products, bounds) -> (expected profit, best offer (i, j, q)); bounds[i*m+j] = h: v < edges[h]."""
    m = len(costs)

    @functools.lru_cache(maxsize=None)
    def V(turns: int, buyers: tuple, products: tuple, bounds: tuple):
        best, arg = 0.0, None
        if turns == 0:
            return best, arg
        for i in buyers:
            for j in products:
                for q in range(bounds[i * m + j]):
                    value = Q(turns, buyers, products, bounds, i, j, q)
                    if value > best + 1e-12:
                        best, arg = value, (i, j, q)
        return best, arg

    def Q(turns, buyers, products, bounds, i, j, q):
        """Expected profit of offering buyer i product j at edges[q], then playing on optimally."""
        margin = edges[q] - costs[j]
        if margin <= 0:
            return 0.0
        h = bounds[i * m + j]
        accept = (h - q) / h
        sold = margin + V(turns - 1, tuple(b for b in buyers if b != i), tuple(p for p in products if p != j), bounds)[0]
        lower = list(bounds)
        lower[i * m + j] = q
        return accept * sold + (1 - accept) * V(turns - 1, buyers, products, tuple(lower))[0]

    return V, Q


async def play(name: str, costs, values, budget: int):
    market = Market(MarketSpec(), 0, tuple(Product(f"p{j + 1}", "A", c, 1) for j, c in enumerate(costs)),
                    tuple(Buyer(f"b{i + 1}", tuple(v)) for i, v in enumerate(values)), budget, LOW, HIGH)
    seller = SELLERS[name].create(name, {}, market=market, seed=0)
    return await run_episode(market, seller, {b.id: BUYERS["threshold"]("threshold", {}) for b in market.buyers})


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buyers", type=int, default=2)
    parser.add_argument("--products", type=int, default=2)
    parser.add_argument("--grid", type=int, default=16, help="value levels G")
    parser.add_argument("--costs", type=int, default=6, help="cost draws (one programme each)")
    parser.add_argument("--worlds", type=int, default=150, help="value draws per cost draw")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    n, m, G = args.buyers, args.products, args.grid
    edges = [round(LOW + (HIGH - LOW) * k / G) for k in range(G + 1)]
    budget = math.ceil(1.5 * n * m)
    rng = np.random.default_rng(args.seed)
    ratios = defaultdict(list)
    lost = defaultdict(list)
    for _ in range(args.costs):
        costs = [round(LOW + (HIGH - LOW) * rng.uniform(0, 0.5)) for _ in range(m)]
        V, Q = solve(costs, n, edges)
        for _ in range(args.worlds):
            cells = rng.integers(0, G, size=(n, m))
            inside = rng.random((n, m))
            values = [[min(edges[x] + int(u * (edges[x + 1] - edges[x])), edges[x + 1] - 1) for x, u in zip(row, us)] for row, us in zip(cells, inside)]
            margin = np.maximum(np.array(values) - np.array(costs)[None, :], 0)
            rows, cols = linear_sum_assignment(margin, maximize=True)
            best = margin[rows, cols].sum()
            if best <= 0:
                continue
            # The programme's own play.
            buyers, products, bounds, turns, profit = tuple(range(n)), tuple(range(m)), tuple([G] * (n * m)), budget, 0
            while (arg := V(turns, buyers, products, bounds)[1]) is not None:
                i, j, q = arg
                if cells[i][j] >= q:
                    profit += edges[q] - costs[j]
                    buyers, products = tuple(b for b in buyers if b != i), tuple(p for p in products if p != j)
                else:
                    bounds = bounds[: i * m + j] + (q,) + bounds[i * m + j + 1 :]
                turns -= 1
            ratios["exact programme"].append(profit / best)
            for name in ("planner", "greedy"):
                episode = await play(name, costs, values, budget)
                ratios[name].append(episode.metrics["profit"] / best)
                if name != "planner":
                    continue
                # The planner's offers while every pair is open, valued by the programme.
                buyers, products, bounds, turns, step = tuple(range(n)), tuple(range(m)), list([G] * (n * m)), budget, 0
                for e in episode.events:
                    if not isinstance(e, MessageEvent) or e.sender != SELLER or e.kind != "offer":
                        continue
                    price = e.price
                    i, j = int(e.to[1:]) - 1, int(e.product[1:]) - 1
                    q = next((x for x in range(G) if edges[x] >= price), G)
                    if len(buyers) == n and len(products) == m and q < bounds[i * m + j]:
                        state = (turns, buyers, products, tuple(bounds))
                        top = V(*state)[0]
                        same = max(Q(*state, i, j, x) for x in range(bounds[i * m + j]))
                        lost["pair", step].append(top - same)
                        lost["price", step].append(same - Q(*state, i, j, q))
                    if values[i][j] >= price:
                        buyers, products = tuple(b for b in buyers if b != i), tuple(p for p in products if p != j)
                    else:
                        bounds[i * m + j] = min(bounds[i * m + j], q)
                    turns -= 1
                    step += 1
    print(f"{n}x{m}, {budget} turns, {G} value levels, {args.costs} cost draws x {args.worlds} worlds: profit/OPT")
    for name, values in ratios.items():
        print(f"  {name:16s} {np.mean(values):.3f}")
    print("planner's offers with every pair open: expected profit given up (mean per offer made; offers)")
    for step in sorted({s for _, s in lost}):
        pair, price = lost["pair", step], lost["price", step]
        print(f"  offer {step + 1}: pair {np.mean(pair):5.1f}  price {np.mean(price):5.1f}  ({len(pair)})")


if __name__ == "__main__":
    asyncio.run(main())
