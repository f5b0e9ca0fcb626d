"""negotiate.metrics: OPT, per-episode metrics and aggregates, on hand-worked examples."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.metrics import aggregate, episode_metrics, mean_ci, opt
from negotiate.regulator import Deal


def test_opt_with_stock_two():
    # margins:        p1 (c=10, 2 units)   p2 (c=0, 1 unit)
    #   b1 (100, 50)        90                  50
    #   b2 (90, 80)         80                  80
    #   b3 (20, 5)          10                   5
    # b1-p1 + b2-p2 + b3-p1 = 90 + 80 + 10 = 180 beats b1-p1 + b2-p1 + b3-p2 = 175.
    market = Market(MarketSpec(), 0, (Product("p1", "A", 10, 2), Product("p2", "B", 0, 1)),
                    (Buyer("b1", (100, 50)), Buyer("b2", (90, 80)), Buyer("b3", (20, 5))), 9, 0, 100)
    assert opt(market) == (180, frozenset({("b1", "p1"), ("b2", "p2"), ("b3", "p1")}))


def test_opt_ignores_pairs_below_cost_and_extra_stock():
    market = Market(MarketSpec(), 0, (Product("p1", "A", 500, 5),), (Buyer("b1", (400,)), Buyer("b2", (650,))), 4, 0, 1000)
    # b1 values p1 below its cost: no margin. b2: 650 - 500 = 150. Five units, but one buyer to sell to.
    assert opt(market) == (150, frozenset({("b2", "p1")}))
    nothing = Market(MarketSpec(), 0, (Product("p1", "A", 500, 1),), (Buyer("b1", (400,)),), 4, 0, 1000)
    assert opt(nothing) == (0, frozenset())


def test_episode_metrics_with_no_deals_and_no_opt():
    market = Market(MarketSpec(), 0, (Product("p1", "A", 500, 1),), (Buyer("b1", (400,)),), 4, 0, 1000)
    m = episode_metrics(market, [], turns_used=4, seller_messages=4, seller_invalid=1, buyer_messages=3, buyer_invalid=0,
                        violations={"seller": Counter({"below_cost": 1})})
    assert (m["opt"], m["profit"], m["welfare"], m["regret"], m["deals"], m["deal_rate"]) == (0, 0, 0, 0, 0, 0.0)
    assert m["profit_ratio"] is None and m["welfare_ratio"] is None and m["opt_pairs_share"] is None
    assert m["capture"] is None and m["turns_per_deal"] is None
    assert m["valid_rate"] == 0.75 and m["violations"] == {"below_cost": 1} and m["buyer_violations"] == {}


def test_capture_skips_deals_at_zero_margin():
    market = Market(MarketSpec(), 0, (Product("p1", "A", 100, 1), Product("p2", "B", 100, 1)),
                    (Buyer("b1", (100, 0)), Buyer("b2", (0, 300))), 4, 0, 1000)
    deals = [Deal("b1", "p1", 100, 100, 100, 1, "b1"), Deal("b2", "p2", 150, 100, 300, 2, "b2")]
    m = episode_metrics(market, deals, turns_used=2, seller_messages=2, seller_invalid=0, buyer_messages=2,
                        buyer_invalid=0, violations={})
    assert m["capture"] == 0.25  # only b2's deal counts: (150 - 100) / (300 - 100)
    assert (m["profit"], m["welfare"], m["buyer_surplus"], m["opt"]) == (50, 200, 150, 200)


def test_mean_ci():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.302652729911275 / math.sqrt(3))  # t(0.975, 2) * sd 1 / sqrt(3) = 2.484
    assert mean_ci([5.0])[0] == 5.0 and math.isnan(mean_ci([5.0])[1])  # one value: no interval
    assert all(math.isnan(x) for x in mean_ci([]))


def _row(seller, ratio, violations=None, overrun=0):
    metrics = {"valid_rate": 1.0, "violations": violations or {}, "profit_ratio": ratio, "capture": None, "deal_rate": 1.0,
               "welfare_ratio": 1.0, "opt_pairs_share": 1.0, "regret": 0, "turns_per_deal": 2.0, "budget_overrun": overrun}
    return {"seller": seller, "split": "train", "metrics": metrics}


def test_aggregate_groups_and_sums():
    rows = [_row("a", 0.5, {"below_cost": 2}), _row("a", 1.0, {"below_cost": 1, "sold_out": 1}), _row("b", 0.2),
            {"seller": "b", "split": "train", "metrics": None}]
    a, b = aggregate(rows, ["seller"])
    assert (a.key, a.episodes, a.failed, b.key, b.episodes, b.failed) == (("a",), 2, 0, ("b",), 2, 1)
    assert a.stats["profit_ratio"][0] == 0.75 and a.stats["profit_ratio"][2] == 2
    assert a.stats["violations_per_episode"][0] == 2.0  # (2 + 2) / 2
    assert a.violations == {"below_cost": 3, "sold_out": 1}
    assert math.isnan(a.stats["capture"][0]) and a.stats["capture"][2] == 0
    assert b.stats["profit_ratio"][::2] == (0.2, 1) and math.isnan(b.stats["profit_ratio"][1])
    assert aggregate([_row("a", 1.0, overrun=1)], ["seller"])[0].budget_overruns == 1
