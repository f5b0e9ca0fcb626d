"""The rollout seller (``rollout``): every option of the menu played out in worlds drawn from the observation and the
spec's prior, the planner continuing; it sends the best on average. It sees no private information."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from negotiate.agents.registry import parse_agent
from negotiate.agents.rollout import _behaviour, _conceding
from negotiate.errors import UserError
from negotiate.market import SPLITS, Buyer, resolve_spec
from negotiate.metrics import opt
from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import EpisodeState
from negotiate.rollout import play_out, profit
from negotiate.runner import build_episode


def _ratio(seller: str, buyers: str, index: int) -> float:
    market, agent, players = build_episode(resolve_spec("specs/compact.toml"), parse_agent(seller, "seller"),
                                           parse_agent(buyers, "buyer"), 31, index)
    return profit(play_out(EpisodeState(market), agent, players)) / max(1, opt(market)[0])


def test_it_never_reads_the_markets_values():
    market, _, _ = build_episode(SPLITS["train"], parse_agent("planner", "seller"), parse_agent("threshold", "buyer"), 2, 0)
    other = dataclasses.replace(market, buyers=tuple(Buyer(b.id, tuple(v // 2 + 7 for v in b.values)) for b in market.buyers))
    state = EpisodeState(market)
    state.seller_send(Message(SELLER, "b1", "", Action("offer", "p1", 900)))
    state.buyer_reply("b1", Message("b1", SELLER, "", Action("reject")))
    obs = state.seller_observation()
    said = [parse_agent("rollout?worlds=3", "seller").build(m, [m.seed, 2]) for m in (market, other)]
    for seller in said:
        seller.follow(state.seller_observation(consume=False)._replace(new=(), history=obs.history[:1]), obs.history[0])
    assert said[0].decide(obs) == said[1].decide(obs)


def test_a_buyers_kind_is_told_by_its_replies():
    market, _, _ = build_episode(SPLITS["train"], parse_agent("planner", "seller"), parse_agent("threshold", "buyer"), 2, 1)
    state = EpisodeState(market)
    state.seller_send(Message(SELLER, "b1", "", Action("offer", "p1", 900)))
    state.buyer_reply("b1", Message("b1", SELLER, "", Action("reject")))
    state.seller_send(Message(SELLER, "b2", "", Action("offer", "p1", 950)))
    state.buyer_reply("b2", Message("b2", SELLER, "", Action("bid", "p2", 300)))
    kinds, history = _behaviour(state.seller_observation())
    assert kinds[:2] == ["threshold", "concession"] and all(k is None for k in kinds[2:])
    assert history[1] == [(1, 0, 950, 1, 300)] and history[0] == []


def test_a_conceding_buyers_draw_gives_the_bids_it_made():
    # start 0.5, patience 3, value 800 for p1: offered p1 at $1000 twice, it bid int(800 x 0.5) = 400, then
    # int(800 x 0.75) = 600. (start 0.4, patience 4 and value 1000 give the same two bids: either may be drawn.)
    history = [(1, 0, 1000, 0, 400), (2, 0, 1000, 0, 600)]
    lo, hi = np.array([600.0, 100.0]), np.array([1000.0, 1000.0])
    errors = []
    for seed in range(40):
        start, patience, values = _conceding(history, lo, hi, 900.0, np.random.default_rng(seed))
        fraction = lambda r: start + (1 - start) * min(1.0, (r - 1) / max(1, patience - 1))
        errors.append(max(abs(int(values[0] * fraction(1)) - 400), abs(int(values[0] * fraction(2)) - 600)))
        assert set(values) == {0} and 600 <= values[0] <= 1000  # read back for the product it bid on alone, within its bounds
    # The kernel is 1% of the $900 range: most draws give both bids back within $9, none beyond four widths.
    assert np.median(errors) <= 9 and max(errors) <= 36, errors


def test_it_beats_the_planner_against_conceding_buyers_on_these_markets():
    # Seeded and deterministic: 10 compact markets of run seed 31 (no study uses it), 4 worlds a decision.
    planner = [_ratio("planner", "concession", i) for i in range(10)]
    rollout = [_ratio("rollout?worlds=4&buyers=concession", "concession", i) for i in range(10)]
    assert np.mean(rollout) > np.mean(planner) + 0.02, (np.mean(rollout), np.mean(planner))


def test_its_parameters_are_checked():
    with pytest.raises(UserError, match="parameter buyers='stubborn': choose from concession, threshold, mixed"):
        parse_agent("rollout?buyers=stubborn", "seller")
    with pytest.raises(UserError, match=r"worlds=0 is outside \[1, 1000\]"):
        parse_agent("rollout?worlds=0", "seller")
