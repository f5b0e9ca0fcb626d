"""negotiate.agents: agent specs, and the scripted strategies' moves worked out by hand."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from negotiate.agents.registry import parse_agent
from negotiate.agents.scripted import BUYERS, SELLERS
from negotiate.episode import run_episode
from negotiate.errors import UserError
from negotiate.market import SPLITS, Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import EpisodeState, observe
from negotiate.runner import build_episode


def test_parse_agent_specs():
    spec = parse_agent("greedy", "seller")
    assert (spec.text, spec.role, spec.backend, spec.name, spec.params) == ("greedy", "seller", "scripted", "greedy", {})
    spec = parse_agent(" scripted:concession?beta=2 ", "seller")
    assert (spec.text, spec.name, spec.params) == ("scripted:concession?beta=2", "concession", {"beta": 2})
    assert parse_agent("concession?start=0.4&patience=5", "buyer").params == {"start": 0.4, "patience": 5}
    assert parse_agent("stubborn?share=0.8", "buyer").params == {"share": 0.8}


@pytest.mark.parametrize(
    ("text", "role", "match"),
    [
        ("nope:gpt-4o", "seller", "unknown agent backend"),
        ("openai:gpt-4o", "seller", "openai:MODEL@BASE_URL"),
        ("nobody", "seller", "unknown seller agent 'nobody'"),
        ("stubborn", "seller", "unknown seller agent"),
        ("greedy", "buyer", "unknown buyer agent"),
        ("greedy?beta=2", "seller", "unknown parameter 'beta' for greedy; it takes none"),
        ("concession?gamma=2", "seller", "it takes beta"),
        ("concession?beta=high", "seller", "not a number"),
    ],
)
def test_parse_agent_errors_name_the_flag_and_the_value(text, role, match):
    with pytest.raises(UserError, match=match) as caught:
        parse_agent(text, role)
    assert ("--seller" if role == "seller" else "--buyers") in str(caught.value)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize("text", ["concession?beta=0", "concession?beta=-1"])
def test_a_parameter_out_of_range_is_refused_up_front_or_harmless(text):
    try:
        seller = parse_agent(text, "seller")
    except UserError:
        return
    market, s, b = build_episode(SPLITS["train"], seller, parse_agent("threshold", "buyer"), 0, 0)
    episode = anyio.run(lambda: run_episode(market, s, b))
    assert episode.outcome != "failed", episode.reason


def test_every_scripted_agent_builds_and_describes_itself():
    market = Market(MarketSpec(), 0, (Product("p1", "A", 100, 1),), (Buyer("b1", (400,)),), 4, 0, 1000)
    for role, table in (("seller", SELLERS), ("buyer", BUYERS)):
        for name in table:
            agent = parse_agent(name, role).build(market, np.random.default_rng(0))
            described = agent.describe()
            assert described["name"] == name and described["kind"] == "scripted"


# -- scripted moves, by hand ------------------------------------------------------------------------


def market_2x2() -> Market:
    return Market(MarketSpec(), 0, (Product("p1", "Alpha", 100, 1), Product("p2", "Beta", 40, 1)),
                  (Buyer("b1", (400, 250)), Buyer("b2", (300, 100))), 6, 0, 500)


def buyer_move(name: str, offer: tuple[str, int], rounds: int = 1):
    market = market_2x2()
    state = EpisodeState(market)
    agent = parse_agent(name, "buyer").build(market, np.random.default_rng(0))
    for r in range(rounds):
        if r:
            state.buyer_reply("b1", Message("b1", SELLER, "", Action("reject")))
        message = Message(SELLER, "b1", "", Action("offer", *offer))
        state.seller_send(message)
    return agent.decide(observe(state, "b1", message))


def test_threshold_buyer_accepts_up_to_its_value():
    assert buyer_move("threshold", ("p1", 400)).action == Action("accept", "p1", 400)  # b1 values p1 at 400
    assert buyer_move("threshold", ("p1", 401)).action == Action("reject")
    assert buyer_move("threshold", ("p2", 250)).action == Action("accept", "p2", 250)


def test_stubborn_buyer_bids_its_anchor():
    # share 0.5: anchors int(400 * 0.5) = 200 for p1, int(250 * 0.5) = 125 for p2
    assert buyer_move("stubborn?share=0.5", ("p1", 350)).action == Action("bid", "p1", 200)
    assert buyer_move("stubborn?share=0.5", ("p1", 200)).action == Action("accept", "p1", 200)


def test_concession_buyer_concedes_toward_its_value():
    # target = v * (start + (1 - start) * min(1, (r - 1) / (patience - 1))) with start 0.5, patience 3:
    # round 1: 400 * 0.5 = 200; round 2: 400 * 0.75 = 300; round 3: 400
    agent = "concession?start=0.5&patience=3"
    assert buyer_move(agent, ("p1", 350), rounds=1).action == Action("bid", "p1", 200)
    assert buyer_move(agent, ("p1", 350), rounds=2).action == Action("bid", "p1", 300)
    assert buyer_move(agent, ("p1", 350), rounds=3).action == Action("accept", "p1", 350)
    # p2 is worth 250 < 0.9 * 400 to b1: it bids on its favourite, p1, instead (round 1: 200)
    assert buyer_move(agent, ("p2", 240), rounds=1).action == Action("bid", "p1", 200)


def test_a_mixed_buyer_is_a_threshold_or_a_conceding_one_drawn_from_its_seed():
    # conceding=0: always a threshold buyer (accepts up to its value, never bids); conceding=1: always one that bids
    assert buyer_move("mixed?conceding=0", ("p1", 350)).action == Action("accept", "p1", 350)
    assert buyer_move("mixed?conceding=0", ("p1", 401)).action == Action("reject")
    assert buyer_move("mixed?conceding=1", ("p1", 401)).action.kind == "bid"
    # at the default half, about half of the buyers bid; the same seed is the same kind every time
    market = market_2x2()
    kinds = [parse_agent("mixed", "buyer").build(market, [7, 1, k]).describe()["as"] for k in range(400)]
    assert set(kinds) == {"threshold", "concession"} and 160 < kinds.count("concession") < 240
    assert kinds == [parse_agent("mixed", "buyer").build(market, [7, 1, k]).describe()["as"] for k in range(400)]
    with pytest.raises(UserError, match="conceding"):
        parse_agent("mixed?conceding=1.5", "buyer")


def test_oracle_offers_the_best_pair_at_full_value():
    # OPT matches b1-p2 (250 - 40 = 210) and b2-p1 (300 - 100 = 200); the larger margin goes first.
    market = market_2x2()
    oracle = parse_agent("oracle", "seller").build(market, np.random.default_rng(0))
    message = oracle.decide(observe(EpisodeState(market), SELLER))
    assert (message.to, message.action) == ("b1", Action("offer", "p2", 250))
