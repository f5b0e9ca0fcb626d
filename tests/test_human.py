"""negotiate.agents.human: a person's messages are checked before sending, and act() waits for them."""

from __future__ import annotations

import asyncio
import doctest

import pytest

import negotiate.agents.human as human_module
from negotiate.agents.human import DraftError, HumanAgent, parse_price
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import EpisodeState, observe


@pytest.fixture
def state() -> EpisodeState:
    """The 2x2 market: p1 costs 100, p2 costs 50; b1 values (300, 200), b2 (250, 90)."""
    market = Market(MarketSpec(), 0, (Product("p1", "A", 100, 1), Product("p2", "B", 50, 1)),
                    (Buyer("b1", (300, 200)), Buyer("b2", (250, 90))), 6, 0, 400)
    return EpisodeState(market, episode="t")


def test_doctests():
    assert doctest.testmod(human_module, optionflags=doctest.ELLIPSIS).failed == 0


@pytest.mark.parametrize(("text", "value"), [("450", 450), (" $1,200 ", 1200), (0, 0), ("0", 0), ("250.00", 250), ("250.", 250),
                                                 ("$12,345,678", 12345678), ("1,250.0", 1250)])
def test_parse_price(text, value):
    assert parse_price(text) == value


@pytest.mark.parametrize(("text", "problem"), [
    ("", "give a price"),
    (None, "give a price"),
    ("12.5", "price '12.5' is not a whole number of dollars"),
    ("1,250.5", "price '1,250.5' is not a whole number of dollars"),
    (".0", "price '.0' is not a whole number of dollars"),
    ("1,2,5,0", "price '1,2,5,0': commas go between groups of three digits, as in 1,250"),  # was read as 1250
    ("12,50", "price '12,50': commas go between groups of three digits, as in 1,250"),
    ("abc", "price 'abc' is not a whole number of dollars"),
    ("1e3", "price '1e3' is not a whole number of dollars"),
    ("\u00b2", "price '\u00b2' is not a whole number of dollars"),  # a digit to str.isdigit, not to int()
    ("-3", "price -3 is negative"),
    ("$-5", "price -5 is negative"),
    (-1, "price -1 is negative"),
    ("9" * 20, "price 999999... (20 digits) is far too large"),
])
def test_parse_price_refuses_and_says_why(text, problem):
    with pytest.raises(DraftError) as raised:
        parse_price(text)
    assert str(raised.value) == problem and raised.value.field == "price"


def test_seller_prices_stop_at_the_top_of_the_public_range(state):
    person = HumanAgent(SELLER)
    obs = observe(state, SELLER)
    assert person.draft(obs, "offer", product="p1", price=400, to="b1").action == Action("offer", "p1", 400)
    with pytest.raises(DraftError) as raised:
        person.draft(obs, "offer", product="p1", price=401, to="b1")
    assert str(raised.value) == "$401 is above every buyer's value (the range is $0-$400)"
    assert raised.value.field == "price"


def test_buyer_drafts(state):
    person = HumanAgent("b1")
    state.seller_send(Message(SELLER, "b1", "", Action("offer", "p1", 280)))
    obs = observe(state, "b1", None)
    accept = person.draft(obs, "accept", product="p1", price="280", talk=" fine ")
    assert accept == Message("b1", SELLER, "fine", Action("accept", "p1", 280))
    with pytest.raises(DraftError, match="standing offer is p1 \\$280"):
        person.draft(obs, "accept", product="p1", price=279)
    with pytest.raises(DraftError, match="above your value"):
        person.draft(obs, "bid", product="p2", price=201)
    with pytest.raises(DraftError, match="no product 'p9'"):
        person.draft(obs, "bid", product="p9", price=10)
    with pytest.raises(DraftError, match="choose a product"):
        person.draft(obs, "bid", product=None, price=10)
    with pytest.raises(DraftError, match="a buyer can"):
        person.draft(obs, "offer", product="p1", price=10)
    assert person.draft(obs, "bid", product="p2", price="150").action == Action("bid", "p2", 150)
    assert person.draft(obs, "quit").action == Action("quit")
    with pytest.raises(DraftError, match="at most 600"):
        person.draft(obs, "reject", talk="x" * 601)


def test_buyer_cannot_accept_without_an_offer(state):
    state.seller_send(Message(SELLER, "b1", "", Action("reject")))
    with pytest.raises(DraftError, match="no standing offer"):
        HumanAgent("b1").draft(observe(state, "b1", None), "accept", product="p1", price=100)


def test_seller_drafts(state):
    person = HumanAgent(SELLER)
    obs = observe(state, SELLER)
    offer = person.draft(obs, "offer", product="p2", price="180", to="b1", talk="A good one")
    assert offer == Message(SELLER, "b1", "A good one", Action("offer", "p2", 180))
    with pytest.raises(DraftError, match="below the cost"):
        person.draft(obs, "offer", product="p1", price=99, to="b1")
    with pytest.raises(DraftError, match="no standing bid"):
        person.draft(obs, "accept", product="p1", price=150, to="b1")
    with pytest.raises(DraftError, match="no buyer 'b7'"):
        person.draft(obs, "offer", product="p1", price=150, to="b7")
    assert person.draft(obs, "end") == Message(SELLER, "", "", Action("end"))
    state.seller_send(offer)
    obs = observe(state, SELLER)
    with pytest.raises(DraftError, match="not answered"):
        person.draft(obs, "offer", product="p1", price=150, to="b1")
    state.buyer_reply("b1", Message("b1", SELLER, "", Action("bid", "p1", 150)))
    obs = observe(state, SELLER)
    with pytest.raises(DraftError, match="standing bid is p1 \\$150"):
        person.draft(obs, "accept", product="p1", price=160, to="b1")
    assert person.draft(obs, "accept", product="p1", price=150, to="b1").action == Action("accept", "p1", 150)


async def test_act_waits_for_send_and_release():
    person = HumanAgent("b2")
    turns = []
    asked = asyncio.Event()

    def on_turn(obs) -> None:
        turns.append(obs)
        asked.set()

    person.on_turn = on_turn
    with pytest.raises(RuntimeError):
        person.send(Message("b2", SELLER, "", Action("reject")))  # nobody asked yet
    task = asyncio.ensure_future(person.act("obs-1"))
    await asyncio.wait_for(asked.wait(), 10)  # act() has asked the person
    assert person.waiting and person.observation == "obs-1" and turns == ["obs-1"]
    with pytest.raises(ValueError):
        person.send(Message("b1", SELLER, "", Action("reject")))  # not this person's seat
    person.send(Message("b2", SELLER, "no", Action("reject")))
    assert not person.waiting
    with pytest.raises(RuntimeError):
        person.send(Message("b2", SELLER, "", Action("reject")))  # one message per turn
    assert (await task).talk == "no"
    asked.clear()
    task = asyncio.ensure_future(person.act("obs-2"))
    await asyncio.wait_for(asked.wait(), 10)
    person.release()
    assert await task is None and not person.waiting
    assert person.decisions == 1
    assert person.describe()["kind"] == "human" and HumanAgent.instant is False
