"""negotiate.rules: the market's rules, one pure check that the regulator and the person's composer share."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import negotiate.rules as rules
from negotiate.agents.human import DraftError, HumanAgent
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import BuyerView, EpisodeState, ProductView, observe
from negotiate.rules import buyer_violation, seller_violation


def market(buyers=("b1", "b2")) -> Market:
    """Two products, p1 costs 100 (1 unit), p2 costs 50 (1 unit); b1 values (300, 200), b2 (250, 90), b3 (150, 120)."""
    values = {"b1": (300, 200), "b2": (250, 90), "b3": (150, 120)}
    return Market(MarketSpec(), 0, (Product("p1", "A", 100, 1), Product("p2", "B", 50, 1)),
                  tuple(Buyer(b, values[b]) for b in buyers), 20, 0, 400)


def test_doctests():
    result = doctest.testmod(rules, report=False)
    assert result.attempted >= 5 and result.failed == 0


FREE = BuyerView("b1", "active", False, None, ("p1", 150))
P1 = ProductView("p1", "A", 100, 1)


@pytest.mark.parametrize(("action", "to", "buyer", "product", "expected"), [
    (Action("offer", "p1", 120), "b1", FREE, P1, None),
    (Action("reject"), "b1", FREE, None, None),
    (Action("offer", "p1", 120), "b7", None, P1, ("unknown_buyer", "no buyer 'b7'")),
    (Action("offer", "p1", 120), "b1", FREE._replace(status="served"), P1, ("buyer_served", "b1 has already bought")),
    (Action("reject"), "b1", FREE._replace(status="gone"), None, ("buyer_gone", "b1 has left")),
    (Action("offer", "p1", 120), "b1", FREE._replace(awaiting=True), P1, ("awaiting_reply", "b1 has not answered the last message yet")),
    (Action("offer", "p9", 120), "b1", FREE, None, ("unknown_product", "no product 'p9'")),
    (Action("offer", "p1", 120), "b1", FREE, P1._replace(stock=0), ("sold_out", "p1 is sold out")),
    (Action("offer", "p1", 99), "b1", FREE, P1, ("below_cost", "offer of p1 at $99 is below its cost $100")),
    (Action("offer", "p1", 100), "b1", FREE, P1, None),  # at cost is allowed
    (Action("accept", "p1", 150), "b1", FREE, P1, None),
    (Action("accept", "p1", 151), "b1", FREE, P1,
     ("no_standing", "accept p1 $151 matches no standing bid of b1 (standing: p1 $150)")),
    (Action("accept", "p1", 150), "b1", FREE._replace(bid=None), P1,
     ("no_standing", "accept p1 $150 matches no standing bid of b1 (standing: none)")),
    # the addressee's rules come first: a served buyer with a sold-out product is "served"
    (Action("offer", "p1", 120), "b1", FREE._replace(status="served"), P1._replace(stock=0), ("buyer_served", "b1 has already bought")),
])
def test_seller_rules_worked_by_hand(action, to, buyer, product, expected):
    assert seller_violation(action, to, buyer, product) == expected


@pytest.mark.parametrize(("action", "value", "offer", "expected"), [
    (Action("bid", "p1", 300), 300, None, None),  # at one's value is allowed
    (Action("bid", "p1", 301), 300, None, ("overpay", "bid of p1 at $301 is above the buyer's valuation")),
    (Action("accept", "p1", 280), 300, ("p1", 280), None),
    (Action("accept", "p1", 279), 300, ("p1", 280), ("no_standing", "accept p1 $279 matches no standing offer (standing: p1 $280)")),
    (Action("accept", "p2", 280), 300, ("p1", 280), ("no_standing", "accept p2 $280 matches no standing offer (standing: p1 $280)")),
    (Action("accept", "p1", 100), 300, None, ("no_standing", "accept p1 $100 matches no standing offer (standing: none)")),
    (Action("bid", "p9", 10), None, None, ("unknown_product", "no product 'p9'")),
    (Action("reject"), None, None, None),
    (Action("quit"), None, None, None),
])
def test_buyer_rules_worked_by_hand(action, value, offer, expected):
    assert buyer_violation(action, value, offer) == expected


# -- the regulator and the composer agree with the rules, message by message -------------------------

_SELLER_ACTIONS = st.one_of(
    st.builds(Action, st.sampled_from(["offer", "accept"]), st.sampled_from(["p1", "p2", "p3"]), st.integers(0, 400)),
    st.sampled_from([Action("reject"), "accept the standing bid"]),
)
_REPLIES = st.one_of(
    st.builds(Action, st.sampled_from(["bid", "accept"]), st.sampled_from(["p1", "p2", "p3"]), st.integers(0, 400)),
    st.sampled_from([Action("reject"), Action("quit"), "accept the standing offer", "no reply yet"]),
)


_SEEN: set = set()
"""The verdicts the property test met (checked below: it must reach every rule)."""


def _regulator_verdict(state: EpisodeState, send) -> tuple[str, str] | None:
    before = len(state.violations)
    send()
    return (state.violations[-1].kind, state.violations[-1].detail) if len(state.violations) > before else None


def _refused(agent: HumanAgent, obs, action: Action, **to) -> bool:
    try:
        agent.draft(obs, action.kind, product=action.product, price=action.price, **to)
    except DraftError:
        return True
    return False


def _agree(steps, buyers=("b1", "b2")) -> list[str]:
    """Play ``steps`` (addressee, seller action, buyer reply) on :func:`market`; at every message assert that the
    rules, the regulator and the person's composer agree. Returns the verdicts met, in order (``ok`` for none)."""
    state = EpisodeState(market(buyers))
    seller, verdicts = HumanAgent(SELLER), []
    for to, action, reply in steps:
        if state.done:
            break
        obs = observe(state, SELLER, consume=False)
        buyer = next((b for b in obs.buyers if b.id == to), None)
        if action == "accept the standing bid":  # deals happen: served buyers, sold-out products
            action = Action("accept", *buyer.bid) if buyer and buyer.bid else Action("accept", "p1", 150)
        product = next((p for p in obs.products if p.id == action.product), None)
        expected = seller_violation(action, to, buyer, product)
        verdicts.append(expected[0] if expected else "ok")
        if action.product in (None, "p1", "p2"):  # the composer has no line for another product: it says so itself
            assert _refused(seller, obs, action, to=to) == (expected is not None)
        assert _regulator_verdict(state, lambda: state.seller_send(Message(SELLER, to, "", action))) == expected
        if expected is not None or action.kind == "accept" or state.done or not state._buyer_by_id[to].awaiting:
            continue
        if reply == "no reply yet":  # the buyer still owes a reply: the seller's next message to it breaks a rule
            continue
        view = observe(state, to, None)
        if reply == "accept the standing offer":
            reply = Action("accept", *view.offer) if view.offer else Action("accept", "p1", 150)
        values = dict(zip([p.id for p in view.products], view.values, strict=True))
        expected = buyer_violation(reply, values.get(reply.product), view.offer)
        verdicts.append(f"buyer {expected[0]}" if expected else "buyer ok")
        stock = {p.id: p.stock for p in view.products}
        if reply.product in (None, "p1", "p2") and stock.get(reply.product, 1):  # a bid for a sold-out unit is the composer's own refusal
            assert _refused(HumanAgent(to), view, reply) == (expected is not None)
        assert _regulator_verdict(state, lambda: state.buyer_reply(to, Message(to, SELLER, "", reply))) == expected
    return verdicts


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["b1", "b2", "b3", "b4"]), _SELLER_ACTIONS, _REPLIES), min_size=1, max_size=12))
def test_regulator_composer_and_rules_agree(steps):
    _agree(steps, ("b1", "b2", "b3"))


def test_regulator_composer_and_rules_agree_on_every_rule():
    # A market played by hand so that every verdict comes up once (b3 values p1 at 150, p2 at 120).
    offer = Action("offer", "p2", 60)
    steps = [
        ("b4", Action("offer", "p1", 120), None),
        ("b1", Action("offer", "p3", 120), None),
        ("b1", Action("offer", "p1", 99), None),
        ("b1", Action("accept", "p1", 150), None),
        ("b2", offer, Action("bid", "p2", 95)),  # b2 values p2 at 90
        ("b2", offer, Action("accept", "p2", 59)),
        ("b2", offer, Action("bid", "p3", 10)),
        ("b2", offer, Action("bid", "p2", 70)),
        ("b2", "accept the standing bid", None),  # b2 buys p2 at 70: p2 is sold out
        ("b2", Action("offer", "p1", 120), None),
        ("b1", Action("offer", "p2", 120), None),
        ("b3", Action("offer", "p1", 140), Action("quit")),
        ("b3", Action("reject"), None),
        ("b1", Action("offer", "p1", 200), "no reply yet"),
        ("b1", Action("offer", "p1", 210), None),
    ]
    assert _agree(steps, ("b1", "b2", "b3")) == [
        "unknown_buyer", "unknown_product", "below_cost", "no_standing",
        "ok", "buyer overpay", "ok", "buyer no_standing", "ok", "buyer unknown_product", "ok", "buyer ok",
        "ok", "buyer_served", "sold_out", "ok", "buyer ok", "buyer_gone", "ok", "awaiting_reply",
    ]
