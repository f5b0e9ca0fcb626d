"""Long episodes: observations cost the same at any length, and a long scripted episode lets others run.

The figures behind both are in benchmarks/bench_long.py; these tests pin the behaviour
without timing anything: memory allocated per observation, and the order episodes finish in.
"""

from __future__ import annotations

import gc
import pickle
import tracemalloc
import weakref

import anyio
import pytest

from negotiate import bus
from negotiate.agents.base import ScriptedAgent
from negotiate.agents.scripted import ThresholdBuyer
from negotiate.episode import run_episode
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import EpisodeState, History, observe


class FirmSeller(ScriptedAgent):
    """Offers p1 at $1,000 to b1 whenever b1 is free: a buyer valuing it less rejects every time."""

    name = "firm"

    def decide(self, obs):
        b1 = obs.buyers[0]
        return Message(SELLER, "b1", "Still $1,000.", Action("offer", "p1", 1000)) if not b1.awaiting else None


def no_deal_market(budget: int) -> Market:
    """b1 values p1 at $400 and the seller never asks less than $1,000: the budget is spent to the last turn."""
    return Market(MarketSpec(), 0, (Product("p1", "Alpha", 200, 1),), (Buyer("b1", (400,)),), budget, 100, 1000)


def played(turns: int, budget: int | None = None) -> EpisodeState:
    """A state after ``turns`` offers and as many rejections: 2 x turns items in the seller's history."""
    state = EpisodeState(no_deal_market(budget or turns))
    offer = Message(SELLER, "b1", "Still $1,000.", Action("offer", "p1", 1000))
    reject = Message("b1", SELLER, "No.", Action("reject"))
    for _ in range(turns):
        state.seller_send(offer)
        state.buyer_reply("b1", reject)
    return state


# -- the view ------------------------------------------------------------------------------------------


def test_a_history_view_shows_the_list_as_it_was_when_taken():
    items = ["a", "b", "c"]
    view = History(items)
    items.append("d")  # the regulator appends after the agent has decided
    assert len(view) == 3
    assert list(view) == ["a", "b", "c"]
    assert view == ("a", "b", "c")
    assert view != ("a", "b", "c", "d")
    assert view == History(["a", "b", "c", "x"], 3)
    assert "c" in view and "d" not in view
    assert view[0] == "a" and view[-1] == "c" and view[-3] == "a"
    with pytest.raises(IndexError):
        view[3]  # in the list, but after the view
    with pytest.raises(IndexError):
        view[-4]
    assert view[1:] == ("b", "c")
    assert view[::-1] == ("c", "b", "a")
    assert view[-2:10] == ("b", "c")
    assert view[5:] == ()
    assert list(reversed(view)) == ["c", "b", "a"]
    assert view.index("b") == 1 and view.count("a") == 1
    assert view + ("z",) == ("a", "b", "c", "z")
    assert ("z",) + view == ("z", "a", "b", "c")
    assert hash(view) == hash(("a", "b", "c"))
    assert pickle.loads(pickle.dumps(view)) == ("a", "b", "c")


def test_an_observation_keeps_what_its_agent_saw_while_the_episode_goes_on():
    state = played(2, budget=3)
    seller = observe(state, SELLER)
    buyer = observe(state, "b1")
    assert len(seller.history) == 4 and len(buyer.thread) == 4
    seen = tuple(seller.history)
    state.seller_send(Message(SELLER, "b1", "Last chance: $900.", Action("offer", "p1", 900)))
    state.buyer_reply("b1", Message("b1", SELLER, "No.", Action("reject")))
    assert seller.history == seen  # 4 items, not 6
    assert len(buyer.thread) == 4
    later = observe(state, SELLER)
    assert len(later.history) == 6
    assert [m.action.price for m in later.history[4:]] == [900, None]
    assert later.history[:4] == seen


def _bytes_to_observe(state: EpisodeState) -> int:
    """Peak memory allocated while building the seller's and b1's observations."""
    observe(state, SELLER)  # takes the replies not yet seen as ``new``, and builds (and caches) the catalog views
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        seller, buyer = observe(state, SELLER, consume=False), observe(state, "b1")  # held, as an agent holds them
        peak = tracemalloc.get_traced_memory()[1] - before
        assert len(seller.history) == len(buyer.thread) == 2 * state.turns_used  # offers and rejections
        return peak
    finally:
        tracemalloc.stop()


def test_observing_costs_the_same_after_10_turns_as_after_20000():
    short, long = _bytes_to_observe(played(10)), _bytes_to_observe(played(20_000))
    # Copies of the long histories would be 40,000 pointers each (320,000 bytes for the seller's alone).
    assert short < 2_000 and long < 2_000


# -- yielding to the event loop --------------------------------------------------------------------------


async def test_a_long_scripted_episode_lets_a_short_one_beside_it_finish_first():
    finished: list[str] = []

    async def play(name: str, budget: int) -> None:
        state = EpisodeState(no_deal_market(budget), episode=name)
        await run_episode(state.market, FirmSeller("firm"), {"b1": ThresholdBuyer("threshold")}, episode_id=name, state=state)
        assert (state.outcome, state.reason, state.turns_used) == ("truncated", "budget", budget)
        finished.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(play, "long", 20 * bus.YIELD_TURNS)  # started first, and never awaits an agent
        tg.start_soon(play, "short", 10)
    assert finished == ["short", "long"]


class SlowRejecter(ThresholdBuyer):
    """A buyer that waits before it answers (like a model): it runs in its own task."""

    instant = False

    async def act(self, obs):
        await anyio.sleep(0)
        return Message(obs.buyer, SELLER, "No.", Action("reject"))


async def test_a_long_episode_with_a_waiting_buyer_beside_inline_ones_lets_others_run():
    # b2 waits (its own task), b1 is inline and the seller only ever talks to b1: nothing in
    # the episode awaits but the bus's own yields.
    two_buyers = Market(MarketSpec(), 0, (Product("p1", "Alpha", 200, 1),), (Buyer("b1", (400,)), Buyer("b2", (400,))),
                        20 * bus.YIELD_TURNS, 100, 1000)
    long_state = EpisodeState(two_buyers)
    long_turns_when_short_ended: list[int] = []

    async def long() -> None:
        await run_episode(two_buyers, FirmSeller("firm"), {"b1": ThresholdBuyer("threshold"), "b2": SlowRejecter("slow")}, state=long_state)
        assert (long_state.outcome, long_state.reason, long_state.turns_used) == ("truncated", "budget", 20 * bus.YIELD_TURNS)

    async def short() -> None:
        while long_state.turns_used == 0:  # starts once the long one is under way
            await anyio.sleep(0)
        state = EpisodeState(no_deal_market(10))
        await run_episode(state.market, FirmSeller("firm"), {"b1": ThresholdBuyer("threshold")}, state=state)
        long_turns_when_short_ended.append(long_state.turns_used)

    async with anyio.create_task_group() as tg:
        tg.start_soon(long)
        tg.start_soon(short)
    # The short episode ran at the long one's first yields, not after its 2,000 turns.
    assert long_turns_when_short_ended[0] <= 3 * bus.YIELD_TURNS


async def test_a_long_scripted_episode_can_be_cancelled_while_it_runs():
    state = EpisodeState(no_deal_market(20 * bus.YIELD_TURNS))

    async def cancel_once_started(scope: anyio.CancelScope) -> None:
        while state.turns_used == 0:
            await anyio.sleep(0)
        scope.cancel()

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_once_started, scope)
            await run_episode(state.market, FirmSeller("firm"), {"b1": ThresholdBuyer("threshold")}, state=state)
    # Cancelled at its first yield: after YIELD_TURNS turns, long before its 2,000th.
    assert state.turns_used == bus.YIELD_TURNS
    assert state.outcome is None


async def test_yielding_does_not_change_what_a_long_episode_plays():
    async def alone() -> EpisodeState:
        state = EpisodeState(no_deal_market(5 * bus.YIELD_TURNS + 7))
        await run_episode(state.market, FirmSeller("firm"), {"b1": ThresholdBuyer("threshold")}, state=state)
        return state

    first = await alone()
    async with anyio.create_task_group() as tg:
        results: list[EpisodeState] = []

        async def collect() -> None:
            results.append(await alone())

        for _ in range(3):
            tg.start_soon(collect)
    for state in results:
        assert state.turns_used == first.turns_used == 507
        assert state.messages_by == first.messages_by == {SELLER: 507, "buyer": 507}
        assert observe(state, SELLER, consume=False).history == observe(first, SELLER, consume=False).history
        assert observe(state, "b1").thread == observe(first, "b1").thread


def test_observations_are_built_field_by_field_in_order():
    # The observations are built positionally (for speed): every field must land under its own name.
    state = played(2, budget=5)
    seller = observe(state, SELLER)
    assert (seller.turns_used, seller.budget, seller.price_low, seller.price_high) == (2, 5, 100, 1000)
    assert seller.products == (("p1", "Alpha", 200, 1),) and seller.products[0].cost == 200
    assert seller.buyers == (("b1", "active", False, None, None),) and seller.buyers[0].status == "active"
    assert [m.action.kind for m in seller.new] == ["reject", "reject"]
    assert len(seller.history) == 4 and seller.budget_left == 3
    offer = Message(SELLER, "b1", "Yours for $350.", Action("offer", "p1", 350), "b1 might go to 400")
    state.seller_send(offer)
    buyer = observe(state, "b1", offer)
    assert (buyer.buyer, buyer.persona, buyer.values) == ("b1", "neutral", (400,))
    assert buyer.message == offer._replace(thought="")  # never the seller's thought
    assert buyer.products == (("p1", "Alpha", None, 1),)
    assert (buyer.offer, buyer.bid, buyer.rounds) == (("p1", 350), None, 3)
    assert len(buyer.thread) == 5 and buyer.thread[-1].action.price == 350


class ThinkingFirmSeller(FirmSeller):
    """The same offers from a seller that may wait (like a model): the bus can stop it when the market closes."""

    instant = False

    async def act(self, obs):
        await anyio.sleep(0)
        return self.decide(obs)


@pytest.mark.parametrize(("seller", "inline_instant"), [(FirmSeller, True), (FirmSeller, False), (ThinkingFirmSeller, True)],
                         ids=["inline buyers", "buyer tasks", "thinking seller"])
async def test_a_finished_episode_is_freed_without_the_garbage_collector(seller, inline_instant):
    # A reference cycle (the state holding the bus through a callback) once left every finished
    # episode, trace and all, to the cyclic collector: a quarter of a scripted batch's CPU.
    state = EpisodeState(no_deal_market(10))
    gone = weakref.ref(state)
    gc.disable()
    try:
        episode = await run_episode(state.market, seller("firm"), {"b1": ThresholdBuyer("threshold")}, state=state,
                                    inline_instant=inline_instant)
        assert state.turns_used == 10
        del episode, state
        assert gone() is None
    finally:
        gc.enable()


def test_scripted_messages_are_built_field_by_field_in_order():
    # Scripted agents build their messages positionally too (for speed).
    from negotiate.agents.scripted import _accept_bid, _offer, _reply

    offer = _offer("b2", "p3", 450, thought="start high")
    assert (offer.sender, offer.to, offer.talk, offer.thought) == (SELLER, "b2", "I can let you have p3 for $450.", "start high")
    assert (offer.action.kind, offer.action.product, offer.action.price) == ("offer", "p3", 450)
    accept = _accept_bid("b1", "p1", 300)
    assert (accept.to, accept.talk, accept.action, accept.thought) == ("b1", "Deal: p1 at $300.", ("accept", "p1", 300), "")
    reply = _reply(observe(played(1, budget=2), "b1"), "bid", "p1", 250, "How about $250?")
    assert (reply.sender, reply.to, reply.talk, reply.action.kind, reply.action.price) == ("b1", SELLER, "How about $250?", "bid", 250)
    assert reply == Message("b1", SELLER, "How about $250?", Action("bid", "p1", 250))
