"""Synchronous play-outs and forks (``negotiate.rollout``): the exact replays the menu teacher and the rollout seller
stand on. A play-out is the game ``run_episode(fresh=True)`` plays, event for event; a fork played on with the move the
original made reaches the original's end; a fork shares nothing a message changes with the state it came from."""

from __future__ import annotations

import pytest

from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import SPLITS, Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import EpisodeState
from negotiate.rollout import fork_agents, play_out, profit
from negotiate.runner import build_episode

_TIMING = {"ts", "wall_s", "time"}


def _untimed(events):
    return [{k: v for k, v in vars(e).items() if k not in _TIMING} for e in events]


CASES = [("greedy", "threshold"), ("planner", "concession"), ("planner?reasons=1", "mixed"), ("greedy", "stubborn"),
         ("random", "random"), ("dutch", "concession")]


@pytest.mark.parametrize("seller,buyers", CASES)
async def test_a_play_out_is_the_game_a_fresh_episode_plays_event_for_event(seller, buyers):
    for index in range(12):
        market, agent, players = build_episode(SPLITS["train"], parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 5, index)
        episode = await run_episode(market, agent, players, fresh=True, episode_id="e")
        _, agent2, players2 = build_episode(SPLITS["train"], parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 5, index)
        state = play_out(EpisodeState(market, episode="e"), agent2, players2)
        assert _untimed(state.events) == _untimed(episode.events[1:-1])
        assert (state.outcome, state.reason, state.turns_used) == (episode.outcome, episode.reason, episode.events[-1].turns_used)


class Recording:
    """A seller that records, before each decision, a fork of the state and of every agent: the points a replay starts from."""

    instant = True

    def __init__(self, agent, state, buyers):
        self.agent, self.state, self.buyers = agent, state, buyers
        self.forks = []

    def decide(self, obs):
        before = fork_agents(self.agent, self.buyers)
        message = self.agent.decide(obs)
        self.forks.append((self.state.fork(), before, obs, message))
        return message


@pytest.mark.parametrize("seller,buyers", CASES)
def test_a_fork_played_on_with_the_move_made_reaches_the_same_end(seller, buyers):
    for index in range(6):
        market, agent, players = build_episode(SPLITS["train"], parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 9, index)
        state = EpisodeState(market, episode="e")
        recording = Recording(agent, state, players)
        play_out(state, recording, players)
        assert recording.forks, "the seller decided at least once"
        for fork, (seller_copy, buyers_copy), obs, message in recording.forks:
            seller_copy.decide(obs)  # the copy learns what the original learned from this observation
            play_out(fork, seller_copy, buyers_copy, first=message)
            assert fork.deals == state.deals
            assert (fork.outcome, fork.reason, fork.turns_used) == (state.outcome, state.reason, state.turns_used)
            assert profit(fork) == profit(state)


def test_a_fork_shares_nothing_a_message_changes():
    market = Market(MarketSpec(), 0, (Product("p1", "A", 100, 1), Product("p2", "B", 50, 2)),
                    (Buyer("b1", (300, 200)), Buyer("b2", (250, 90))), 6, 0, 400)
    state = EpisodeState(market, episode="e")
    state.seller_send(Message(SELLER, "b1", "", Action("offer", "p1", 280)))
    state.buyer_reply("b1", Message("b1", SELLER, "", Action("bid", "p1", 150)))
    state.seller_observation()
    fork = state.fork()
    for name, value in vars(fork).items():
        if isinstance(value, (list, dict, set)) and name != "_product_index":
            assert value is not vars(state)[name] or not value, name
    for mine, theirs in zip(fork.buyers, state.buyers):
        assert mine is not theirs and mine.thread is not theirs.thread and mine.thread == theirs.thread
    # The fork sells p1 to b1 at the bid; the original is untouched.
    fork.seller_send(Message(SELLER, "b1", "", Action("accept", "p1", 150)))
    assert (fork.units_left, len(fork.deals), fork.turns_used, profit(fork)) == (2, 1, 2, 50)
    assert (state.units_left, len(state.deals), state.turns_used, state.buyers[0].bid) == (3, 0, 1, ("p1", 150))
    assert [type(e).__name__ for e in fork.events] == ["MessageEvent", "DealEvent", "NoticeEvent", "NoticeEvent", "NoticeEvent"]
    assert len(state.events) == 2  # the offer and the bid: the fork's events are its own


def test_a_play_out_can_stop_after_a_number_of_turns():
    market, agent, players = build_episode(SPLITS["train"], parse_agent("greedy", "seller"), parse_agent("threshold", "buyer"), 1, 0)
    state = play_out(EpisodeState(market), agent, players, limit=3)
    assert (state.turns_used, state.outcome) == (3, None)
