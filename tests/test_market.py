"""negotiate.market: seeded generation, ranges, splits, correlated values, TOML specs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from negotiate.errors import UserError
from negotiate.market import SPLITS, Buyer, Market, MarketSpec, Product, generate, load_spec, resolve_spec

# -- generation ------------------------------------------------------------------


@pytest.mark.parametrize("split", list(SPLITS))
def test_same_spec_and_seed_give_the_same_market_bit_for_bit(split):
    spec = SPLITS[split]
    a, b = generate(spec, 12345), generate(spec, 12345)
    assert a == b
    assert a.to_dict() == b.to_dict()
    assert [p.name for p in a.products] == [p.name for p in b.products]


@pytest.mark.parametrize("split", list(SPLITS))
def test_different_seeds_give_different_markets(split):
    spec = SPLITS[split]
    markets = [generate(spec, seed).to_dict() for seed in range(5)]
    # Seeds 0..4 must not collapse to one market: values are continuous draws rounded to ints.
    assert len({repr(m["buyers"]) for m in markets}) == 5


def test_generation_ignores_global_random_state():
    np.random.seed(1)
    a = generate(SPLITS["train"], 7)
    np.random.seed(2)
    b = generate(SPLITS["train"], 7)
    assert a == b


@pytest.mark.parametrize("split", ["train", "shapes", "correlated"])
def test_counts_prices_and_costs_stay_in_their_ranges(split):
    spec = SPLITS[split]
    blo, bhi = spec.buyers
    plo, phi = spec.products
    seen_buyers, seen_products = set(), set()
    for seed in range(150):
        m = generate(spec, seed)
        n, k = len(m.buyers), len(m.products)
        seen_buyers.add(n)
        seen_products.add(k)
        assert blo <= n <= bhi and plo <= k <= phi
        assert (m.price_low, m.price_high) == (100, 1000)
        # costs: lo + span * frac with frac in [0, 0.5] -> [100, 100 + 900 * 0.5] = [100, 550]
        assert all(100 <= p.cost <= 550 for p in m.products)
        assert all(p.stock == 1 for p in m.products)
        assert all(len(b.values) == k and all(100 <= v <= 1000 for v in b.values) for b in m.buyers)
        assert m.budget == math.ceil(1.5 * n * k)
        assert [p.id for p in m.products] == [f"p{j + 1}" for j in range(k)]
        assert [b.id for b in m.buyers] == [f"b{i + 1}" for i in range(n)]
    # the inclusive ranges are actually covered, both ends included
    assert seen_buyers == set(range(blo, bhi + 1))
    assert seen_products == set(range(plo, phi + 1))


def test_fixed_counts_stock_budget_and_cost_band():
    spec = MarketSpec(buyers=3, products=3, stock=2, cost_low=0.2, cost_high=0.3, budget_per_pair=1.5)
    for seed in range(30):
        m = generate(spec, seed)
        assert m.shape == "3x3"
        assert m.budget == 14  # ceil(1.5 * 3 * 3) = ceil(13.5) = 14
        assert all(p.stock == 2 for p in m.products)
        # lo + span * [0.2, 0.3] = 100 + 900 * [0.2, 0.3] = [280, 370]
        assert all(280 <= p.cost <= 370 for p in m.products)
    assert generate(MarketSpec(buyers=2, products=2, budget=5), 0).budget == 5  # absolute budget wins


def test_prices_x10_scales_range_values_and_costs():
    base, x10 = SPLITS["train"], SPLITS["prices-x10"]
    for seed in range(40):
        a, b = generate(base, seed), generate(x10, seed)
        assert (b.price_low, b.price_high) == (1000, 10000)
        assert b.tier == "1000-10000" and a.tier == "100-1000"
        assert a.shape == b.shape
        # Same random stream: v = rint(lo + span * u), so |v_x10 - 10 * v| <= 0.5 + 10 * 0.5 = 5.5
        for ba, bb in zip(a.buyers, b.buyers):
            assert all(abs(vb - 10 * va) <= 5.5 for va, vb in zip(ba.values, bb.values))
            assert all(1000 <= v <= 10000 for v in bb.values)
        for pa, pb in zip(a.products, b.products):
            assert abs(pb.cost - 10 * pa.cost) <= 5.5
            assert 1000 <= pb.cost <= 5500  # 1000 + 9000 * 0.5


def _pooled_correlation(spec: MarketSpec, seeds: range) -> float:
    first, second = [], []
    for seed in seeds:
        m = generate(spec, seed)
        for b in m.buyers:
            first.append(b.values[0])
            second.append(b.values[1])
    return float(np.corrcoef(first, second)[0, 1])


def test_correlated_values_are_positively_correlated_across_products():
    # z_ij = sqrt(rho/2) (q_j + t_i) + sqrt(1 - rho) e_ij: pooled over markets the buyer factor t_i
    # gives cov(z_i1, z_i2) = rho/2 = 0.35 of a unit variance, so corr ~ 0.35 (a bit less after the
    # normal CDF); uniform values are independent, corr ~ 0 (sd ~ 1/sqrt(2000) = 0.022).
    seeds = range(400)
    correlated = _pooled_correlation(MarketSpec(buyers=5, products=2, valuation="correlated", correlation=0.7), seeds)
    uniform = _pooled_correlation(MarketSpec(buyers=5, products=2), seeds)
    assert correlated > 0.2
    assert abs(uniform) < 0.1
    assert correlated > uniform + 0.15


def test_correlated_values_stay_in_range_and_costs_follow_quality():
    spec = SPLITS["correlated"]
    for seed in range(60):
        m = generate(spec, seed)
        assert all(100 <= v <= 1000 for b in m.buyers for v in b.values)
        assert all(100 <= p.cost <= 550 for p in m.products)


def test_correlation_zero_is_like_uniform():
    seeds = range(300)
    assert abs(_pooled_correlation(MarketSpec(buyers=5, products=2, valuation="correlated", correlation=0.0), seeds)) < 0.1


def test_product_names_are_unique_and_personas_come_from_the_spec():
    spec = MarketSpec(buyers=6, products=30, personas=("neutral", "begging", "insulting"))
    seen = set()
    for seed in range(20):
        m = generate(spec, seed)
        names = [p.name for p in m.products]
        assert len(set(names)) == len(names)
        seen.update(b.persona for b in m.buyers)
    assert seen == {"neutral", "begging", "insulting"}


def test_market_index_helpers_and_dict_round_trip():
    spec = MarketSpec()
    m = Market(spec, 3, (Product("p1", "A", 10, 1), Product("p2", "B", 20, 2)), (Buyer("b1", (50, 60)),), 4, 0, 100)
    assert [m.product_index(x) for x in ("p1", "p2", "p3", "p0", "px", "", "b1")] == [0, 1, None, None, None, None, None]
    assert [m.buyer_index(x) for x in ("b1", "b2", "b0", "p1", "")] == [0, None, None, None, None]
    assert Market.from_dict(spec, m.to_dict()) == m
    assert m.shape == "1x2" and m.tier == "0-100"


def test_spec_is_frozen_and_strict():
    spec = MarketSpec()
    with pytest.raises(Exception):
        spec.buyers = 3  # type: ignore[misc]
    with pytest.raises(Exception):
        MarketSpec(bogus=1)  # type: ignore[call-arg]


# -- TOML specs ---------------------------------------------------------------------


def _write(tmp_path, text: str, name: str = "spec.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_a_good_spec(tmp_path):
    path = _write(tmp_path, 'buyers = [2, 3]\nproducts = 4\nstock = 2\nvaluation = "correlated"\ncorrelation = 0.5\n'
                            "price_low = 10\nprice_high = 20\nbudget = 9\n", "small.toml")
    spec = load_spec(path)
    assert spec.name == "small"  # the file stem, when the file gives no name
    assert spec.buyers == (2, 3) and spec.products == 4 and spec.stock == 2
    assert spec.valuation == "correlated" and spec.correlation == 0.5
    assert (spec.price_low, spec.price_high, spec.budget) == (10.0, 20.0, 9)
    m = generate(spec, 0)
    assert m.budget == 9 and len(m.products) == 4 and 2 <= len(m.buyers) <= 3


def test_a_market_table_is_read_too(tmp_path):
    spec = load_spec(_write(tmp_path, '[market]\nname = "tbl"\nbuyers = 3\n'))
    assert spec.name == "tbl" and spec.buyers == 3


def test_split_base_with_overrides(tmp_path):
    spec = load_spec(_write(tmp_path, 'split = "shapes"\nstock = 2\n', "wide.toml"))
    assert spec.buyers == (5, 7) and spec.products == (3, 6)  # from the shapes split
    assert spec.stock == 2  # the override
    assert spec.name == "wide"
    spec = load_spec(_write(tmp_path, 'split = "train"\nprice_scale = 10.0\nname = "mine"\n'))
    assert spec.price_scale == 10.0 and spec.name == "mine" and spec.buyers == (2, 4)
    assert generate(spec, 1).price_high == 10000


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("bogus = 1\n", "bogus"),
        ("price_low = 500.0\nprice_high = 500.0\n", "price_low"),
        ("price_low = 900.0\nprice_high = 100.0\n", "price_low"),
        ("buyers = 0\n", "buyers"),
        ("buyers = [3, 2]\n", "buyers"),
        ("products = 0\n", "products"),
        ("stock = 0\n", "stock"),
        ("budget = 0\n", "budget"),
        ('valuation = "normal"\n', "valuation"),
        ("correlation = 1.5\n", "correlation"),
        ("cost_low = 0.6\ncost_high = 0.4\n", "cost_low"),
        ('split = "nope"\n', "split"),
        ("price_scale = inf\n", "price_scale: inf: must be a finite number"),
        ("price_high = nan\n", "price_high: nan: must be a finite number"),
        ("price_high = 1e20\n", "price_high: 1e+20: times price_scale (1.0) must be at most 1,000,000,000,000"),
        # 100.2 and 100.4 are apart, but both round to the whole price 100: a market with no price range
        ("price_low = 100.2\nprice_high = 100.4\n", "round to whole prices 100 and 100"),
        ("price_scale = 1e-9\n", "round to whole prices 0 and 0"),  # 100e-9 and 1000e-9
        ("price_high = 1e308\nprice_scale = 10.0\n", "price_high: 1e+308: times price_scale (10.0) must be at most"),  # inf
        ("budget_per_pair = 1e307\nbuyers = 10\nproducts = 10\n", "times the most buyer-product pairs (100) must be at most 1,000,000 turns"),
        ("budget = 100000000000000000000\n", "budget"),
        # issue 44: a budget an episode holds in memory whole is capped at 10**6 turns, with the cap in the message
        ("budget = 1000001\n", "budget: 1000001: must be at most 1,000,000"),
        ("buyers = 1000\nproducts = 1000\n", "budget_per_pair: 1.5: times the most buyer-product pairs (1000000) must be at most 1,000,000"),
        ("buyers = [1, 2, 3]\n", "buyers: [1, 2, 3]: must be a count or a [lo, hi] range within 1..1000"),
        ("stock = 1.5\n", "stock: 1.5: must be a whole number"),
        ('valuation = "z"\n', "valuation: 'z': must be one of 'uniform' or 'correlated'"),
        ('name = "  "\n', "name: '  ': must not be blank"),
        ('name = "two\\nlines"\n', "name: 'two\\nlines': must be one line of printable text"),
        ('personas = ["neutral", ""]\n', "personas: ['neutral', '']: a persona must not be blank"),
        ("personas = []\n", "personas: []: give at least one persona (neutral, "),
        ('personas = "begging"\n', "personas: 'begging': a list of personas: personas = [\"begging\"]"),
        # issue 51: true read as 1 (budget = true played with a budget of 1 turn) and as 1.0 in the number fields
        ("budget = true\n", "bad.toml: budget: True: must be a whole number"),
        ("budget = 6.0\n", "bad.toml: budget: 6.0: must be a whole number"),  # as stock: a budget is a count of turns
        ("correlation = true\n", "bad.toml: correlation: True: must be a number, not true or false"),
        ("price_low = false\n", "bad.toml: price_low: False: must be a number, not true or false"),
        ("budget_per_pair = true\n", "bad.toml: budget_per_pair: True: must be a number, not true or false"),
        ("cost_high = true\n", "bad.toml: cost_high: True: must be a number, not true or false"),
        ("price_scale = true\n", "bad.toml: price_scale: True: must be a number, not true or false"),
    ],
)
def test_bad_spec_is_a_user_error_naming_file_and_field(tmp_path, text, field):
    path = _write(tmp_path, text, "bad.toml")
    with pytest.raises(UserError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert str(path) in message
    assert field in message
    assert "\n" not in message
    assert "Input should" not in message and "type=" not in message and "Value error" not in message  # our words, not pydantic's


def test_unknown_field_error_carries_field_and_value(tmp_path):
    with pytest.raises(UserError) as caught:
        load_spec(_write(tmp_path, "bogus = 17\n"))
    assert caught.value.field == "bogus" and caught.value.value == 17


def test_invalid_toml_and_missing_file(tmp_path):
    path = _write(tmp_path, "buyers = [\n")
    with pytest.raises(UserError, match="not valid TOML") as caught:
        load_spec(path)
    assert str(path) in str(caught.value)
    with pytest.raises(UserError, match="no such spec file"):
        load_spec(tmp_path / "missing.toml")
    with pytest.raises(UserError, match="is a folder; give a .toml spec file"):
        load_spec(tmp_path)
    latin = tmp_path / "latin.toml"
    latin.write_bytes("name = 'caf\xe9'\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"not UTF-8 text \(byte 11\)"):
        load_spec(latin)


def test_boolean_count_is_rejected(tmp_path):
    with pytest.raises(UserError):
        load_spec(_write(tmp_path, "buyers = true\n"))


def test_whole_numbers_still_read_as_prices_and_budgets(tmp_path):
    spec = load_spec(_write(tmp_path, "budget = 6\nprice_low = 200\nprice_high = 2000\ncost_high = 1\n"))
    assert (spec.budget, spec.price_low, spec.price_high, spec.cost_high) == (6, 200.0, 2000.0, 1.0)


def test_the_example_spec_in_the_repository_loads():
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "specs" / "example.toml"
    if not path.exists():
        pytest.skip("no specs/example.toml")
    spec = load_spec(path)
    assert spec.name == "example"
    m = generate(spec, 0)
    assert m.budget >= 1 and m.buyers and m.products


def test_resolve_spec(tmp_path):
    assert resolve_spec("train") is SPLITS["train"]
    assert resolve_spec("prices-x10").price_scale == 10.0
    path = _write(tmp_path, "buyers = 2\n")
    assert resolve_spec(str(path)).buyers == 2
    with pytest.raises(UserError, match="unknown split") as caught:
        resolve_spec("no-such-split")
    assert "no-such-split" in str(caught.value)
