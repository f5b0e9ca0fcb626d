"""negotiate.regulator: every market rule, the race for a last unit, termination, observations.

Markets are built by hand and the EpisodeState is driven directly (no bus, no agents), so
each value below can be checked on paper.
"""

from __future__ import annotations

import pytest

from negotiate.episode import live_metrics, start_event
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.metrics import metrics_from_events, opt
from negotiate.protocol import SELLER, Action, Message, Notice, ParseFailure
from negotiate.regulator import VIOLATIONS, BudgetExceeded, EpisodeState, observe

# -- fixtures and helpers ------------------------------------------------------------------


def market_2x2(budget: int = 6) -> Market:
    # margins v - c:   p1 (c=100)   p2 (c=40)
    #   b1 (400, 250)     300          210
    #   b2 (300, 100)     200           60
    # b1-p1 + b2-p2 = 360 < b1-p2 + b2-p1 = 410 = OPT
    return Market(
        MarketSpec(), 0,
        (Product("p1", "Alpha", 100, 1), Product("p2", "Beta", 40, 1)),
        (Buyer("b1", (400, 250)), Buyer("b2", (300, 100))),
        budget, 0, 500,
    )


def market_3x2() -> Market:
    # margins v - c:   p1 (c=200)   p2 (c=100)
    #   b1 (500, 300)     300          200
    #   b2 (450, 420)     250          320
    #   b3 (260, 150)      60           50
    # b1-p1 + b2-p2 = 620 beats b1-p2 + b2-p1 = 450, b2-p2 + b3-p1 = 380, b1-p1 + b3-p2 = 350, ...
    return Market(
        MarketSpec(), 1,
        (Product("p1", "Alpha", 200, 1), Product("p2", "Beta", 100, 1)),
        (Buyer("b1", (500, 300)), Buyer("b2", (450, 420)), Buyer("b3", (260, 150))),
        8, 0, 600,
    )


def send(state: EpisodeState, to: str, kind: str, product: str | None = None, price: int | None = None, thought: str = ""):
    return state.seller_send(Message(SELLER, to, "", Action(kind, product, price), thought))


def reply(state: EpisodeState, buyer: str, kind: str, product: str | None = None, price: int | None = None, thought: str = ""):
    state.buyer_reply(buyer, Message(buyer, SELLER, "", Action(kind, product, price), thought))


def snapshot(state: EpisodeState):
    """Everything a rule-breaking message must leave untouched."""
    return (
        tuple(state.stock), state.units_left, tuple(state.deals), state.outcome,
        tuple((b.status, b.awaiting, b.offer, b.bid) for b in state.buyers),
    )


class _Stub:
    def describe(self) -> dict:
        return {"kind": "test"}


def trace_of(state: EpisodeState) -> list[dict]:
    return [start_event("e", state.market, _Stub(), {b.id: _Stub() for b in state.market.buyers}, {})] + state.events


def assert_metrics(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert actual[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def seller_notices(state: EpisodeState) -> list[Notice]:
    return [item for item in observe(state, SELLER).history if isinstance(item, Notice)]


# -- OPT ---------------------------------------------------------------------------------------


def test_opt_of_the_2x2_market():
    assert opt(market_2x2()) == (410, frozenset({("b1", "p2"), ("b2", "p1")}))


def test_opt_of_the_3x2_market():
    assert opt(market_3x2()) == (620, frozenset({("b1", "p1"), ("b2", "p2")}))


# -- worked episodes ---------------------------------------------------------------------------

EXPECTED_2X2 = {
    "seller_messages": 4, "seller_invalid": 0, "valid_rate": 1.0,
    "buyer_messages": 3, "buyer_invalid": 0,
    "violations": {}, "buyer_violations": {}, "budget_overrun": 0,
    "opt": 410,
    "profit": 290,  # (200 - 100) + (230 - 40)
    "profit_ratio": 290 / 410,
    "capture": (100 / 200 + 190 / 210) / 2,  # (p - c) / (v - c): 100/200 and 190/210
    "deals": 2, "deal_rate": 1.0,
    "buyer_surplus": 120,  # (300 - 200) + (250 - 230)
    "welfare": 410,  # (300 - 100) + (250 - 40)
    "welfare_ratio": 1.0,
    "opt_pairs": 2, "opt_pairs_share": 1.0,  # b2-p1 and b1-p2 are both OPT pairs
    "regret": 0,
    "turns_used": 4, "budget": 6,
    "turns_per_deal": 2.0,  # 4 turns / 2 deals
}


def play_2x2() -> EpisodeState:
    state = EpisodeState(market_2x2())
    assert send(state, "b1", "offer", "p1", 350) == "b1"
    reply(state, "b1", "reject")  # 350 <= 400, but b1 refuses
    assert send(state, "b2", "offer", "p1", 280) == "b2"
    reply(state, "b2", "bid", "p1", 200)
    assert send(state, "b2", "accept", "p1", 200) is None  # the seller accepts b2's bid: no reply owed
    assert send(state, "b1", "offer", "p2", 230) == "b1"
    reply(state, "b1", "accept", "p2", 230)
    return state


def test_2x2_episode_deals_and_outcome():
    state = play_2x2()
    assert [(d.buyer, d.product, d.price, d.cost, d.value, d.turn, d.by) for d in state.deals] == [
        ("b2", "p1", 200, 100, 300, 3, SELLER),
        ("b1", "p2", 230, 40, 250, 4, "b1"),
    ]
    assert (state.outcome, state.reason) == ("terminated", "sold_out")
    assert state.stock == [0, 0] and state.units_left == 0
    assert state.violations == []


def test_2x2_live_metrics_pinned():
    assert_metrics(live_metrics(play_2x2()), EXPECTED_2X2)


def test_2x2_metrics_from_trace_pinned():
    assert_metrics(metrics_from_events(trace_of(play_2x2())), EXPECTED_2X2)


EXPECTED_3X2 = {
    "seller_messages": 4, "seller_invalid": 1, "valid_rate": 0.75,  # one below-cost offer in four
    "buyer_messages": 3, "buyer_invalid": 0,
    "violations": {"below_cost": 1}, "buyer_violations": {}, "budget_overrun": 0,
    "opt": 620,
    "profit": 240,  # (400 - 200) + (140 - 100)
    "profit_ratio": 240 / 620,
    "capture": 0.8,  # 200/250 and 40/50
    "deals": 2, "deal_rate": 2 / 3,
    "buyer_surplus": 60,  # (450 - 400) + (150 - 140)
    "welfare": 300,  # (450 - 200) + (150 - 100)
    "welfare_ratio": 300 / 620,
    "opt_pairs": 2, "opt_pairs_share": 0.0,  # b2-p1 and b3-p2: neither is an OPT pair
    "regret": 320,  # 620 - 300
    "turns_used": 4, "budget": 8,
    "turns_per_deal": 2.0,
}


def play_3x2() -> EpisodeState:
    state = EpisodeState(market_3x2())
    assert send(state, "b2", "offer", "p2", 50) is None  # below p2's cost of 100: a violation
    assert send(state, "b2", "offer", "p1", 400) == "b2"
    reply(state, "b2", "accept", "p1", 400)
    assert send(state, "b1", "offer", "p2", 290) == "b1"
    reply(state, "b1", "quit")
    assert send(state, "b3", "offer", "p2", 140) == "b3"
    reply(state, "b3", "accept", "p2", 140)
    return state


def test_3x2_episode_deals_and_outcome():
    state = play_3x2()
    assert [(d.buyer, d.product, d.price, d.turn, d.by) for d in state.deals] == [("b2", "p1", 400, 2, "b2"), ("b3", "p2", 140, 4, "b3")]
    assert (state.outcome, state.reason) == ("terminated", "sold_out")
    assert [b.status for b in state.buyers] == ["gone", "served", "served"]
    assert [(v.who, v.kind, v.turn) for v in state.violations] == [(SELLER, "below_cost", 1)]


def test_3x2_live_metrics_pinned():
    assert_metrics(live_metrics(play_3x2()), EXPECTED_3X2)


def test_3x2_metrics_from_trace_pinned():
    # The below-cost offer must count as invalid in the trace too (valid_rate 0.75, not 1.0).
    assert_metrics(metrics_from_events(trace_of(play_3x2())), EXPECTED_3X2)


# -- seller rules: typed violation, no effect, one turn spent --------------------------------------


def _sell_p1_to_b2(state):
    send(state, "b2", "offer", "p1", 250)
    reply(state, "b2", "accept", "p1", 250)


def _b1_bids_p1(price):
    def setup(state):
        send(state, "b1", "offer", "p1", 350)
        reply(state, "b1", "bid", "p1", price)
    return setup


def _b1_quits(state):
    send(state, "b1", "offer", "p1", 350)
    reply(state, "b1", "quit")


def _b1_owes_a_reply(state):
    send(state, "b1", "offer", "p1", 350)


def _b1_bids_then_b2_buys_p1(state):
    _b1_bids_p1(300)(state)
    _sell_p1_to_b2(state)


SELLER_RULES = [
    # (id, setup, message, violation kind)
    ("below-cost offer", None, ("b1", "offer", "p1", 99), "below_cost"),  # p1 costs 100
    ("below-cost accept", _b1_bids_p1(90), ("b1", "accept", "p1", 90), "below_cost"),
    ("unknown product", None, ("b1", "offer", "p3", 200), "unknown_product"),
    ("unknown product accept", None, ("b1", "accept", "p9", 200), "unknown_product"),
    ("sold-out offer", _sell_p1_to_b2, ("b1", "offer", "p1", 300), "sold_out"),
    ("sold-out accept", _b1_bids_then_b2_buys_p1, ("b1", "accept", "p1", 300), "sold_out"),
    ("unknown buyer", None, ("b3", "offer", "p1", 200), "unknown_buyer"),
    ("unknown buyer: seller", None, ("seller", "reject", None, None), "unknown_buyer"),
    ("buyer served", _sell_p1_to_b2, ("b2", "offer", "p2", 60), "buyer_served"),
    ("buyer gone", _b1_quits, ("b1", "offer", "p2", 200), "buyer_gone"),
    ("accept with no bid", None, ("b1", "accept", "p1", 300), "no_standing"),
    ("accept at another price", _b1_bids_p1(200), ("b1", "accept", "p1", 210), "no_standing"),
    ("accept of another product", _b1_bids_p1(200), ("b1", "accept", "p2", 200), "no_standing"),
    ("message to a buyer owing a reply", _b1_owes_a_reply, ("b1", "offer", "p2", 200), "awaiting_reply"),
    ("reject to a buyer owing a reply", _b1_owes_a_reply, ("b1", "reject", None, None), "awaiting_reply"),
]


@pytest.mark.parametrize(("setup", "message", "kind"), [case[1:] for case in SELLER_RULES], ids=[case[0] for case in SELLER_RULES])
def test_seller_rule_is_a_typed_violation_with_no_effect_that_costs_a_turn(setup, message, kind):
    state = EpisodeState(market_2x2())
    if setup is not None:
        setup(state)
    before, turns, violations = snapshot(state), state.turns_used, len(state.violations)
    assert not state.done
    assert send(state, *message) is None  # nobody owes a reply to a rule-breaking message
    assert state.turns_used == turns + 1
    assert snapshot(state) == before
    assert len(state.violations) == violations + 1
    violation = state.violations[-1]
    assert (violation.who, violation.kind, violation.turn) == (SELLER, kind, turns + 1)
    assert kind in VIOLATIONS
    assert state.violation_counts[kind] == 1
    assert seller_notices(state)[-1].kind == "violation" and seller_notices(state)[-1].text.startswith(kind)
    metrics = live_metrics(state)
    assert metrics["violations"] == {kind: 1}
    assert metrics["seller_invalid"] == 1
    event = [e for e in state.events if e["type"] == "violation"][-1]
    assert (event["who"], event["kind"], event["turn"]) == (SELLER, kind, turns + 1)


def test_malformed_seller_message_is_a_violation_that_costs_a_turn():
    state = EpisodeState(market_2x2())
    before = snapshot(state)
    assert state.seller_send(ParseFailure("no 'Action:' line", "hello there"), raw="hello there") is None
    assert state.turns_used == 1
    assert snapshot(state) == before
    assert [(v.who, v.kind) for v in state.violations] == [(SELLER, "malformed")]
    message = [e for e in state.events if e["type"] == "message"][-1]
    assert (message["valid"], message["error"], message["raw"]) == (False, "no 'Action:' line", "hello there")
    assert metrics_from_events(trace_of(state))["seller_invalid"] == live_metrics(state)["seller_invalid"] == 1


def test_an_unknown_buyer_never_becomes_a_buyer_state():
    state = EpisodeState(market_2x2())
    send(state, "b3", "offer", "p1", 200)
    assert [b.id for b in observe(state, SELLER).buyers] == ["b1", "b2"]


# -- buyer rules ---------------------------------------------------------------------------------------


def _last_seen_by_seller(state) -> Message:
    return [item for item in observe(state, SELLER).history if isinstance(item, Message) and item.sender != SELLER][-1]


@pytest.mark.parametrize(
    ("offer", "answer", "kind"),
    [
        # b2 values p1 at 300
        (("p1", 280), ("bid", "p1", 350), "overpay"),
        (("p1", 320), ("accept", "p1", 320), "overpay"),
        (("p1", 280), ("accept", "p2", 90), "no_standing"),  # b2 values p2 at 100
        (("p1", 280), ("accept", "p1", 270), "no_standing"),
        (("p1", 280), ("bid", "p7", 10), "unknown_product"),
        (("p1", 280), ("accept", "p7", 10), "unknown_product"),
    ],
)
def test_buyer_rule_is_a_violation_turned_into_a_reject(offer, answer, kind):
    state = EpisodeState(market_2x2())
    send(state, "b2", "offer", *offer)
    reply(state, "b2", *answer)
    assert state.turns_used == 1  # a reply costs no turn
    assert state.deals == [] and state.stock == [1, 1]
    assert [(v.who, v.kind) for v in state.violations] == [("b2", kind)]
    seen = _last_seen_by_seller(state)
    assert (seen.sender, seen.action) == ("b2", Action("reject"))
    view = observe(state, SELLER).buyers[1]
    assert (view.status, view.awaiting, view.bid) == ("active", False, None)
    message = [e for e in state.events if e["type"] == "message"][-1]
    assert message["sender"] == "b2" and message["valid"] is False
    metrics = live_metrics(state)
    assert metrics["buyer_violations"] == {kind: 1} and metrics["violations"] == {}
    assert metrics["buyer_invalid"] == 1
    assert metrics_from_events(trace_of(state))["buyer_invalid"] == 1
    # the violation notice goes to the buyer, not to the seller
    assert [n.kind for n in observe(state, "b2").thread if isinstance(n, Notice)] == ["violation"]
    assert all(n.kind != "violation" for n in seller_notices(state))


def test_buyer_accept_with_no_offer_at_all_is_no_standing():
    state = EpisodeState(market_2x2())
    send(state, "b1", "reject")  # nothing to refuse, but legal: b1 must answer
    reply(state, "b1", "accept", "p1", 100)
    assert [v.kind for v in state.violations] == ["no_standing"] and state.deals == []


def test_malformed_buyer_reply_is_a_violation_seen_as_a_reject():
    state = EpisodeState(market_2x2())
    send(state, "b1", "offer", "p1", 350)
    state.buyer_reply("b1", ParseFailure("no 'Action:' line", "hmm"))
    assert [(v.who, v.kind) for v in state.violations] == [("b1", "malformed")]
    assert _last_seen_by_seller(state).action == Action("reject")
    assert state.buyers[0].awaiting is False
    assert live_metrics(state)["buyer_invalid"] == 1


def test_buyer_timeout_is_a_violation_seen_as_a_reject():
    state = EpisodeState(market_2x2())
    send(state, "b1", "offer", "p1", 350)
    state.buyer_timeout("b1", 1.5)
    assert [(v.who, v.kind) for v in state.violations] == [("b1", "timeout")]
    assert _last_seen_by_seller(state).action == Action("reject")
    assert state.free_buyers() == ["b1", "b2"]


def test_a_real_reject_clears_the_standing_offer():
    state = EpisodeState(market_2x2())
    send(state, "b1", "offer", "p1", 350)
    reply(state, "b1", "reject")
    assert observe(state, SELLER).buyers[0].offer is None


@pytest.mark.parametrize("how", ["overpay", "malformed", "timeout"])
def test_a_reply_taken_as_a_reject_clears_the_standing_offer(how):
    state = EpisodeState(market_2x2())
    send(state, "b2", "offer", "p1", 280)
    if how == "overpay":
        reply(state, "b2", "bid", "p1", 350)
    elif how == "malformed":
        state.buyer_reply("b2", ParseFailure("bad", "bad"))
    else:
        state.buyer_timeout("b2", 1.0)
    assert observe(state, SELLER).buyers[1].offer is None


def test_buyer_reply_without_a_message_is_a_runtime_error():
    state = EpisodeState(market_2x2())
    with pytest.raises(RuntimeError):
        reply(state, "b1", "reject")


# -- the race for the last unit -----------------------------------------------------------------------


def test_race_for_the_last_unit_first_accept_wins_second_gets_a_notice():
    state = EpisodeState(market_2x2())
    # Two offers for p1's only unit in flight at once: legal.
    assert send(state, "b1", "offer", "p1", 250) == "b1"
    assert send(state, "b2", "offer", "p1", 250) == "b2"
    assert state.violations == [] and state.pending == 2
    reply(state, "b1", "accept", "p1", 250)
    reply(state, "b2", "accept", "p1", 250)
    assert [(d.buyer, d.product, d.price) for d in state.deals] == [("b1", "p1", 250)]
    assert state.violations == []  # losing the race is not b2's fault
    notices = [n for n in observe(state, "b2").thread if isinstance(n, Notice)]
    assert [(n.kind, n.text) for n in notices] == [("sold_out", "p1 is sold out")]
    assert _last_seen_by_seller(state).action == Action("reject")
    assert not state.done  # p2 is still in stock and b2 still active
    assert state.free_buyers() == ["b2"]
    assert observe(state, SELLER).buyers[1].offer is None
    assert live_metrics(state)["buyer_invalid"] == 0


def test_race_for_the_markets_very_last_unit_still_notifies_the_loser():
    market = Market(MarketSpec(), 0, (Product("p1", "Alpha", 10, 1),), (Buyer("b1", (100,)), Buyer("b2", (100,))), 6, 0, 200)
    state = EpisodeState(market)
    send(state, "b1", "offer", "p1", 50)
    send(state, "b2", "offer", "p1", 50)
    reply(state, "b1", "accept", "p1", 50)
    assert (state.outcome, state.reason) == ("terminated", "sold_out")
    reply(state, "b2", "accept", "p1", 50)
    assert len(state.deals) == 1 and state.violations == []
    assert [n.kind for n in observe(state, "b2").thread if isinstance(n, Notice)] == ["sold_out"]


def test_a_bid_for_a_sold_out_product_is_a_notice_not_a_violation():
    state = EpisodeState(market_2x2())
    send(state, "b1", "offer", "p2", 240)
    _sell_p1_to_b2(state)
    reply(state, "b1", "bid", "p1", 300)
    assert state.violations == []
    assert [n.kind for n in observe(state, "b1").thread if isinstance(n, Notice)] == ["sold_out"]
    assert observe(state, SELLER).buyers[0].bid is None


# -- termination, truncation, budget ----------------------------------------------------------------------


def test_terminated_when_sold_out():
    state = play_2x2()
    assert (state.outcome, state.reason) == ("terminated", "sold_out")
    with pytest.raises(RuntimeError):
        send(state, "b1", "offer", "p1", 300)


def test_terminated_when_no_buyers_are_left():
    state = EpisodeState(market_2x2())
    _sell_p1_to_b2(state)
    send(state, "b1", "offer", "p2", 240)
    reply(state, "b1", "quit")
    assert (state.outcome, state.reason) == ("terminated", "no_buyers")
    assert state.stock == [0, 1]  # p2 unsold: the market ended for lack of buyers, not stock


def test_terminated_when_every_buyer_quits():
    state = EpisodeState(market_2x2())
    send(state, "b1", "offer", "p1", 350)
    send(state, "b2", "offer", "p1", 290)
    reply(state, "b1", "quit")
    assert not state.done
    reply(state, "b2", "quit")
    assert (state.outcome, state.reason) == ("terminated", "no_buyers")


def test_seller_end_terminates_and_costs_a_turn():
    state = EpisodeState(market_2x2())
    send(state, "b1", "offer", "p1", 350)
    reply(state, "b1", "reject")
    assert state.seller_send(Message(SELLER, "", "bye", Action("end"))) is None
    assert (state.outcome, state.reason, state.turns_used) == ("terminated", "seller_end", 2)
    with pytest.raises(RuntimeError):
        send(state, "b1", "offer", "p1", 300)


def test_sending_past_the_budget_raises_and_changes_nothing():
    state = EpisodeState(market_2x2(budget=2))
    send(state, "b1", "offer", "p1", 350)
    reply(state, "b1", "reject")
    send(state, "b1", "offer", "p1", 340)
    reply(state, "b1", "reject")
    assert state.budget_left == 0
    events = len(state.events)
    with pytest.raises(BudgetExceeded):
        send(state, "b2", "offer", "p1", 290)
    assert state.turns_used == 2 and len(state.events) == events
    assert live_metrics(state)["budget_overrun"] == 0
    assert not state.done  # truncation is the bus's call, once no reply is pending (see test_episode)


def test_finish_keeps_the_first_outcome():
    state = EpisodeState(market_2x2())
    state.finish("truncated", "budget")
    state.finish("terminated", "seller_end")
    assert (state.outcome, state.reason) == ("truncated", "budget")


# -- observations -----------------------------------------------------------------------------------------

# Distinctive numbers, so a leak shows up as a substring of the observation's repr.
B1_VALUES, B2_VALUES, COSTS = (5011, 4013), (6029, 3037), (1117, 1213)


def market_secret() -> Market:
    return Market(
        MarketSpec(), 0,
        (Product("p1", "Alpha", COSTS[0], 1), Product("p2", "Beta", COSTS[1], 1)),
        (Buyer("b1", B1_VALUES), Buyer("b2", B2_VALUES)),
        10, 1000, 9000,
    )


def play_secret() -> tuple[EpisodeState, dict]:
    state = EpisodeState(market_secret())
    mid = {}
    send(state, "b1", "offer", "p1", 4500, thought="cost is 1117")
    mid["b1"] = observe(state, "b1", Message(SELLER, "b1", "", Action("offer", "p1", 4500), "cost is 1117"))
    reply(state, "b1", "bid", "p1", 4400, thought="I value p1 at 5011 and p2 at 4013")
    send(state, "b2", "offer", "p2", 1100)  # below cost: the violation notice names the cost ($1213)
    send(state, "b2", "offer", "p2", 2500, thought="1213 is my floor")
    reply(state, "b2", "accept", "p2", 2500, thought="worth 3037 to me")
    mid["seller"] = observe(state, SELLER)
    send(state, "b1", "accept", "p1", 4400)
    return state, mid


def _numbers_in(obs) -> str:
    return repr(obs)


@pytest.mark.parametrize(("buyer", "own", "others"), [("b1", B1_VALUES, B2_VALUES), ("b2", B2_VALUES, B1_VALUES)])
def test_buyer_observation_never_shows_other_values_or_costs(buyer, own, others):
    state, mid = play_secret()
    assert len(state.deals) == 2
    views = [observe(state, buyer)] + ([mid[buyer]] if buyer in mid else [])
    for obs in views:
        assert obs.values == own
        assert all(p.cost is None for p in obs.products)
        text = _numbers_in(obs)
        for secret in (*others, *COSTS):
            assert str(secret) not in text, f"{secret} leaked into {buyer}'s observation"
        # the seller's private reasoning is never delivered
        assert all(m.thought == "" for m in obs.thread if isinstance(m, Message) and m.sender == SELLER)
        assert obs.message is None or obs.message.thought == ""


def test_buyer_observation_of_its_own_state():
    state, mid = play_secret()
    obs = mid["b1"]
    assert (obs.buyer, obs.offer, obs.bid, obs.rounds) == ("b1", ("p1", 4500), None, 1)
    assert obs.message.action == Action("offer", "p1", 4500)
    assert [p.stock for p in observe(state, "b1").products] == [0, 0]


def test_seller_observation_never_shows_valuations():
    state, mid = play_secret()
    assert not hasattr(observe(state, SELLER), "values")
    for obs in (observe(state, SELLER), mid["seller"]):
        text = _numbers_in(obs)
        for secret in (*B1_VALUES, *B2_VALUES):
            assert str(secret) not in text, f"{secret} leaked into the seller's observation"
        assert all(m.thought == "" for m in obs.history if isinstance(m, Message) and m.sender != SELLER)
        assert [p.cost for p in obs.products] == list(COSTS)  # the seller knows its own costs


def test_observed_stock_follows_every_deal():
    state = EpisodeState(market_2x2())
    assert [p.stock for p in observe(state, SELLER).products] == [1, 1]
    assert [p.stock for p in observe(state, "b1").products] == [1, 1]
    _sell_p1_to_b2(state)
    assert [p.stock for p in observe(state, SELLER).products] == [0, 1]
    assert [p.stock for p in observe(state, "b1").products] == [0, 1]
    send(state, "b1", "offer", "p2", 240)
    reply(state, "b1", "accept", "p2", 240)
    assert [p.stock for p in observe(state, SELLER).products] == [0, 0]
    assert [p.stock for p in observe(state, "b2").products] == [0, 0]


def test_seller_observation_new_items_are_delivered_once():
    state = EpisodeState(market_2x2())
    send(state, "b1", "offer", "p1", 350)
    reply(state, "b1", "bid", "p1", 300)
    first = observe(state, SELLER)
    assert [(m.sender, m.action) for m in first.new] == [("b1", Action("bid", "p1", 300))]
    assert observe(state, SELLER).new == ()
    assert first.budget_left == 5 and first.buyers[0].bid == ("p1", 300)
