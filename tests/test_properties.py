"""Invariants of whole episodes over random small markets and random, scripted or adversarial agents."""

from __future__ import annotations

from collections import Counter

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from negotiate.agents.base import ScriptedAgent
from negotiate.agents.registry import parse_agent
from negotiate.agents.scripted import BUYERS, SELLERS
from negotiate.episode import run_episode
from negotiate.market import MarketSpec
from negotiate.metrics import metrics_from_events, opt
from negotiate.protocol import SELLER, Action, Message, ParseFailure
from negotiate.runner import build_episode

SPECS = st.builds(
    MarketSpec,
    buyers=st.integers(1, 5),
    products=st.integers(1, 5),
    stock=st.integers(1, 2),
    valuation=st.sampled_from(["uniform", "correlated"]),
    correlation=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    cost_low=st.sampled_from([0.0, 0.3]),
    cost_high=st.sampled_from([0.5, 1.0]),
    budget_per_pair=st.sampled_from([0.5, 1.0, 1.5, 3.0]),
)


def check_invariants(market, episode) -> None:
    """Every rule of DESIGN.md's regulator that shows in a finished episode."""
    assert episode.outcome in ("terminated", "truncated"), episode.reason
    m = episode.metrics
    assert m["turns_used"] <= market.budget and m["budget_overrun"] == 0
    if episode.outcome == "truncated":
        assert episode.reason == "budget" and m["turns_used"] == market.budget
    deals = [e for e in episode.events if e["type"] == "deal"]
    sold = Counter(d["product"] for d in deals)
    stock = {p.id: p.stock for p in market.products}
    assert all(sold[p] <= stock[p] for p in sold), "a unit sold beyond stock"
    assert len({d["buyer"] for d in deals}) == len(deals), "a buyer served twice"
    for d in deals:
        j, i = market.product_index(d["product"]), market.buyer_index(d["buyer"])
        assert (d["cost"], d["value"]) == (market.products[j].cost, market.buyers[i].values[j])
        assert d["cost"] <= d["price"] <= d["value"]
    best, _ = opt(market)
    assert 0 <= m["profit"] <= m["welfare"] <= m["opt"] == best
    assert m["buyer_surplus"] >= 0
    assert m["buyer_messages"] <= m["seller_messages"]  # one reply per seller message at most
    assert metrics_from_events(episode.events) == m, "metrics recomputed from the trace differ from the live ones"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=SPECS,
    seed=st.integers(0, 2**32 - 1),
    index=st.integers(0, 10**6),
    seller=st.sampled_from(list(SELLERS)),
    buyers=st.sampled_from(list(BUYERS)),
    fresh=st.booleans(),
)
def test_scripted_agents_on_random_markets_keep_every_invariant(spec, seed, index, seller, buyers, fresh):
    market, s, b = build_episode(spec, parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), seed, index)
    episode = anyio.run(lambda: run_episode(market, s, b, fresh=fresh))
    check_invariants(market, episode)


# -- adversarial agents drawn by hypothesis ----------------------------------------------------------


class ChaosSeller(ScriptedAgent):
    """Any message at all: unknown buyers and products, any price, malformed text, waits and ends."""

    def __init__(self, data, market):
        super().__init__("chaos")
        self.data, self.market = data, market

    def decide(self, obs):
        draw = self.data.draw
        roll = draw(st.integers(0, 40), label="seller roll")
        if roll == 0:
            return Message(SELLER, "", "", Action("end"))
        if roll == 1:
            return None
        if roll == 2:
            return ParseFailure("garbage", "garbage")
        n, m = len(obs.buyers), len(obs.products)
        to = draw(st.sampled_from([f"b{i}" for i in range(1, n + 2)] + ["seller"]), label="to")
        kind = draw(st.sampled_from(["offer", "offer", "accept", "reject"]), label="kind")
        if kind == "reject":
            return Message(SELLER, to, "", Action("reject"))
        buyer = next((b for b in obs.buyers if b.id == to), None)
        if kind == "accept" and buyer is not None and buyer.bid is not None and draw(st.booleans(), label="take bid"):
            return Message(SELLER, to, "", Action("accept", *buyer.bid))
        product = draw(st.sampled_from([f"p{j}" for j in range(1, m + 2)]), label="product")
        price = draw(st.integers(0, obs.price_high + 100), label="price")
        return Message(SELLER, to, "", Action(kind, product, price))



class ChaosBuyer(ScriptedAgent):
    """Any reply at all: overpaying, unknown products, accepts that match nothing, malformed text."""

    def __init__(self, data, buyer_id):
        super().__init__("chaos")
        self.data, self.id = data, buyer_id

    def decide(self, obs):
        draw = self.data.draw
        kind = draw(st.sampled_from(["accept", "accept", "bid", "reject", "quit", "malformed"]), label="reply")
        if kind == "malformed":
            return ParseFailure("garbage", "garbage")
        if kind in ("reject", "quit"):
            return Message(self.id, SELLER, "", Action(kind))
        if kind == "accept" and obs.offer is not None and draw(st.booleans(), label="take offer"):
            return Message(self.id, SELLER, "", Action("accept", *obs.offer))
        product = draw(st.sampled_from([f"p{j}" for j in range(1, len(obs.values) + 2)]), label="product")
        price = draw(st.integers(0, max(obs.values) * 2), label="price")
        return Message(self.id, SELLER, "", Action(kind, product, price))



@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=SPECS, seed=st.integers(0, 2**32 - 1), data=st.data(),
       seller=st.sampled_from(["chaos", *SELLERS]), buyers=st.sampled_from(["chaos", *BUYERS]), fresh=st.booleans())
def test_adversarial_agents_cannot_break_the_rules(spec, seed, data, seller, buyers, fresh):
    market, s, b = build_episode(spec, parse_agent("greedy" if seller == "chaos" else seller, "seller"),
                                 parse_agent("threshold" if buyers == "chaos" else buyers, "buyer"), seed, 0)
    if seller == "chaos":
        s = ChaosSeller(data, market)
    if buyers == "chaos":
        b = {buyer.id: ChaosBuyer(data, buyer.id) for buyer in market.buyers}
    episode = anyio.run(lambda: run_episode(market, s, b, fresh=fresh))
    check_invariants(market, episode)
