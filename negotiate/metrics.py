"""Verifiable metrics: pure functions of a market and what happened in it.

OPT is the max-weight matching of buyers to units on ``max(0, v_ij - c_j)``: the
ceiling for seller profit and for welfare alike. :func:`episode_metrics` computes
the three families of DESIGN.md (constraint adherence, surplus extraction,
allocation quality) for one episode; :func:`metrics_from_events` computes the same
from a trace alone; :func:`aggregate` gives means with 95% confidence intervals
over groups of episodes.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import linear_sum_assignment

from negotiate.market import Market, spec_from_dict
from negotiate.protocol import SELLER
from negotiate.regulator import Deal
from negotiate.trace import DealEvent, EpisodeStart, Event, MessageEvent, ViolationEvent, iter_events

__all__ = ["opt", "episode_metrics", "metrics_from_events", "aggregate", "mean_ci", "RATIO_METRICS", "Summary"]


def opt(market: Market) -> tuple[int, frozenset[tuple[str, str]]]:
    """OPT and the buyer-product pairs of one optimal matching (pairs with positive margin).

    >>> from negotiate.market import Buyer, Market, MarketSpec, Product
    >>> m = Market(MarketSpec(), 0, (Product("p1", "A", 100, 1), Product("p2", "B", 50, 1)),
    ...            (Buyer("b1", (300, 200)), Buyer("b2", (250, 90))), 4, 0, 400)
    >>> opt(m)[0]   # b1-p2 (150) + b2-p1 (150) beats b1-p1 (200) + b2-p2 (40)
    300
    """
    n = len(market.buyers)
    cols = [j for j, p in enumerate(market.products) for _ in range(min(p.stock, n))]
    if not cols or not n:
        return 0, frozenset()
    values = np.array([b.values for b in market.buyers], dtype=np.int64)
    costs = np.array([p.cost for p in market.products], dtype=np.int64)
    margin = np.maximum(values - costs[None, :], 0)[:, cols]
    rows, picks = linear_sum_assignment(margin, maximize=True)
    total = int(margin[rows, picks].sum())
    pairs = frozenset(
        (market.buyers[r].id, market.products[cols[k]].id) for r, k in zip(rows, picks) if margin[r, k] > 0
    )
    return total, pairs


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def episode_metrics(
    market: Market,
    deals: Sequence[Deal],
    *,
    turns_used: int,
    seller_messages: int,
    seller_invalid: int,
    buyer_messages: int,
    buyer_invalid: int,
    violations: dict[str, Counter],
    opt_value: tuple[int, frozenset] | None = None,
) -> dict:
    """The per-episode metrics. ``violations`` maps ``seller``/``buyer`` to counts by kind."""
    best, pairs = opt_value if opt_value is not None else opt(market)
    profit = sum(d.price - d.cost for d in deals)
    welfare = sum(d.value - d.cost for d in deals)
    captures = [(d.price - d.cost) / (d.value - d.cost) for d in deals if d.value > d.cost]
    realized = sum(1 for d in deals if (d.buyer, d.product) in pairs)
    return {
        # constraint adherence
        "seller_messages": seller_messages,
        "seller_invalid": seller_invalid,
        "valid_rate": _ratio(seller_messages - seller_invalid, seller_messages),
        "buyer_messages": buyer_messages,
        "buyer_invalid": buyer_invalid,
        "violations": dict(violations.get(SELLER, {})),
        "buyer_violations": dict(violations.get("buyer", {})),
        "budget_overrun": max(0, turns_used - market.budget),
        # surplus extraction
        "opt": best,
        "profit": profit,
        "profit_ratio": _ratio(profit, best),
        "capture": sum(captures) / len(captures) if captures else None,
        "deals": len(deals),
        "deal_rate": len(deals) / len(market.buyers),
        "buyer_surplus": sum(d.value - d.price for d in deals),
        # allocation quality
        "welfare": welfare,
        "welfare_ratio": _ratio(welfare, best),
        "opt_pairs": len(pairs),
        "opt_pairs_share": _ratio(realized, len(pairs)),
        "regret": best - welfare,
        "turns_used": turns_used,
        "budget": market.budget,
        "turns_per_deal": turns_used / len(deals) if deals else None,
    }


def metrics_from_events(events: Iterable[Event | dict]) -> dict:
    """Recompute an episode's metrics from its trace events alone (records, or dicts of schema 1 or 2), read once, in order."""
    market = None
    deals: list[Deal] = []
    turns = 0
    counts = Counter()
    violations: dict[str, Counter] = {SELLER: Counter(), "buyer": Counter()}
    for event in iter_events(events):  # one at a time: a long episode read from its trace is never in memory whole
        if isinstance(event, MessageEvent):
            role = SELLER if event.sender == SELLER else "buyer"
            counts[role] += 1
            if not event.valid:
                counts[role + "_invalid"] += 1
            if event.turn:
                turns = max(turns, event.turn)
        elif isinstance(event, DealEvent):
            deals.append(Deal(event.buyer, event.product, event.price, event.cost, event.value, event.turn, event.by))
        elif isinstance(event, ViolationEvent):
            violations[SELLER if event.who == SELLER else "buyer"][event.kind] += 1
        elif isinstance(event, EpisodeStart):
            if not isinstance(event.spec, dict):
                raise ValueError("the episode_start has no spec")
            market = Market.from_dict(spec_from_dict(event.spec, "its spec"), event.market)
    if market is None:
        raise ValueError("no episode_start event")
    products, buyers = {p.id for p in market.products}, {b.id for b in market.buyers}
    for deal in deals:
        if deal.product not in products or deal.buyer not in buyers:
            raise ValueError(f"a deal of {deal.buyer!r} for {deal.product!r} names a buyer or product its market lacks")
    return episode_metrics(
        market, deals, turns_used=turns,
        seller_messages=counts[SELLER], seller_invalid=counts[SELLER + "_invalid"],
        buyer_messages=counts["buyer"], buyer_invalid=counts["buyer_invalid"],
        violations=violations,
    )


# -- aggregation ---------------------------------------------------------------

RATIO_METRICS = (
    ("valid_rate", "valid"),
    ("violations_per_episode", "viol/ep"),
    ("profit_ratio", "profit/OPT"),
    ("capture", "capture"),
    ("deal_rate", "deal rate"),
    ("welfare_ratio", "welfare/OPT"),
    ("opt_pairs_share", "OPT pairs"),
    ("regret", "regret"),
    ("turns_per_deal", "turns/deal"),
)
"""Metrics shown in report tables, with their column titles."""


def mean_ci(values: Sequence[float], level: float = 0.95, clusters: Sequence[Hashable] | None = None) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval (nan with fewer than two values: one value tells
    nothing of the spread, and tables show the mean alone).

    >>> mean_ci([1.0, 2.0, 3.0])  # sd 1, t(0.975, 2) = 4.303: 4.303 / sqrt(3) = 2.484
    (2.0, 2.484...)

    ``clusters`` (one label per value) marks values that are not independent, such as a ``--group`` run's
    repeats of one market: the mean stays the mean of the values, the half-width is the cluster-robust one,
    ``sqrt(G / (G - 1) * sum_g (sum of cluster g's deviations)^2) / n`` with t on G - 1 degrees of freedom
    (G clusters). With one value per cluster it is the plain interval; with one cluster of several values there
    is none (nan; tables show the mean alone).

    >>> mean_ci([1.0, 2.0, 3.0, 4.0], clusters="aabb")  # deviations sum to -2 and +2: sqrt(2 * 8) / 4 = 1; t(0.975, 1) = 12.706
    (2.5, 12.706...)
    >>> mean_ci([1.0, 2.0, 3.0], clusters="abc")  # one value per cluster: the plain interval
    (2.0, 2.484...)
    >>> mean_ci([1.0, 2.0, 3.0], clusters="aaa")  # one market: no interval
    (2.0, nan)
    >>> mean_ci([0.55])  # one value: no interval either
    (0.55, nan)
    """
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = float(np.mean(values))
    if clusters is None:
        if n < 2:
            return mean, math.nan
        sd = float(np.std(values, ddof=1))
        return mean, float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    if len(clusters) != n:
        raise ValueError(f"{len(clusters)} cluster labels for {n} values")
    sums: dict[Hashable, float] = defaultdict(float)
    for value, cluster in zip(values, clusters):
        sums[cluster] += value - mean
    g = len(sums)
    if g < 2:  # one market, however many repeats: nothing to tell how another market would go
        return mean, math.nan
    se = math.sqrt(g / (g - 1) * sum(d * d for d in sums.values())) / n
    return mean, float(stats.t.ppf(0.5 + level / 2, g - 1)) * se


@dataclass(frozen=True)
class Summary:
    """Aggregated metrics of one group of episodes."""

    key: tuple[str, ...]
    episodes: int
    failed: int
    stats: dict[str, tuple[float, float, int]]
    """metric -> (mean, 95% CI half-width, episodes counted)."""
    violations: dict[str, int]
    """Seller violations by kind, summed."""
    budget_overruns: int


def sort_key(key: tuple, by: Sequence[str], order: dict[str, Sequence[str]]) -> tuple:
    """Known values in the given order first, the rest alphabetically."""
    parts = []
    for name, value in zip(by, key):
        known = list(order.get(name, ()))
        parts.append((known.index(value), "") if value in known else (len(known), value))
    return tuple(parts)


def aggregate(rows: Iterable[dict], by: Sequence[str], order: dict[str, Sequence[str]] | None = None, *,
              cluster: Callable[[dict], Hashable] | None = None) -> list[Summary]:
    """Group episode rows (``metrics`` plus labels such as seller, split, shape, tier) and summarize.

    Groups come out sorted: values listed in ``order`` (per label) first, in that order, then the rest.
    ``cluster`` labels each row's market: a group's episodes of one market count as one unit in the
    confidence intervals (:func:`mean_ci`); without it every episode is independent.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(str(row.get(k)) for k in by)].append(row)
    out = []
    for key in sorted(groups, key=lambda k: sort_key(k, by, order or {})):
        members = groups[key]
        ok = [r for r in members if r.get("metrics")]
        summary_stats = {}
        for name, _title in RATIO_METRICS:
            if name == "violations_per_episode":
                counted = ok
                values = [float(sum(r["metrics"]["violations"].values())) for r in ok]
            else:
                counted = [r for r in ok if r["metrics"].get(name) is not None]
                values = [float(r["metrics"][name]) for r in counted]
            mean, half = mean_ci(values, clusters=[cluster(r) for r in counted] if cluster else None)
            summary_stats[name] = (mean, half, len(values))
        violations: Counter = Counter()
        for r in ok:
            violations.update(r["metrics"]["violations"])
        out.append(Summary(key, len(members), len(members) - len(ok), summary_stats, dict(violations),
                           sum(r["metrics"]["budget_overrun"] for r in ok)))
    return out
