"""Long episodes: observations cost the same at any length, a long scripted episode lets others run, and what an
episode holds does not grow with its turns.

The figures behind these are in benchmarks/bench_long.py; these tests pin the behaviour
without timing anything: memory allocated per observation, the order episodes finish in, and
the items a long episode keeps (its events spilled to a file, its histories cut to their windows).
"""

from __future__ import annotations

import gc
import pickle
import tracemalloc
import weakref

from itertools import islice

import anyio
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from negotiate import bus, regulator
from negotiate.agents.base import ScriptedAgent
from negotiate.agents.scripted import ThresholdBuyer
from negotiate.agents.views.buyer import render_buyer
from negotiate.agents.views.text import THREAD_SHOWN
from negotiate.episode import live_metrics, run_episode
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.metrics import metrics_from_events
from negotiate.protocol import SELLER, Action, Message, ParseFailure
from negotiate.regulator import HISTORY_KEPT, THREAD_KEPT, VIOLATIONS_KEPT, EpisodeState, History, observe
from negotiate.report import rows_from_traces
from negotiate.run import RunConfig
from negotiate.runner import prepare, run_batch
from negotiate.trace import (
    SPILL_EVENTS, EpisodeEnd, EpisodeStart, MessageEvent, Spill, StoredEvents, TraceWriteError, TraceWriter, encode, read_episodes,
    read_records, scan,
)


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


def test_a_window_of_a_history_is_a_view_of_its_latest_items():
    items = list(range(10))
    view = regulator._latest(items, 4, 5)  # the latest 4 of 10 items, 5 more cut off before the list's first
    assert view == (6, 7, 8, 9) and len(view) == 4 and view.dropped == 11
    assert view[0] == 6 and view[-1] == 9 and view[-4] == 6
    with pytest.raises(IndexError):
        view[4]
    with pytest.raises(IndexError):
        view[-5]
    assert view[1:3] == (7, 8) and view[::-1] == (9, 8, 7, 6) and view[::2] == (6, 8) and view[-2:] == (8, 9) and view[9:] == ()
    assert list(reversed(view)) == [9, 8, 7, 6] and 5 not in view and 6 in view and view.index(8) == 2
    items.append(10)
    assert view == (6, 7, 8, 9)
    again = pickle.loads(pickle.dumps(view))
    assert again == view and again.dropped == 11
    assert (regulator._latest(items, 20, 0), regulator._latest(items, 20, 0).dropped) == (tuple(items), 0)


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
        # Offers and rejections, the latest of them (the views' bounds).
        assert (len(seller.history), len(buyer.thread)) == (min(2 * state.turns_used, HISTORY_KEPT), min(2 * state.turns_used, THREAD_KEPT))
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
    # Cancelled at its first yield: after YIELD_TURNS turns, or sooner where a loaded machine made those turns take
    # longer than the loop's time between yields; long before its 2,000th.
    assert 0 < state.turns_used <= bus.YIELD_TURNS
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
    from negotiate.agents.buyers import _reply
    from negotiate.agents.moves import _accept_bid, _offer

    offer = _offer("b2", "p3", 450, thought="start high")
    assert (offer.sender, offer.to, offer.talk, offer.thought) == (SELLER, "b2", "I can let you have p3 for $450.", "start high")
    assert (offer.action.kind, offer.action.product, offer.action.price) == ("offer", "p3", 450)
    accept = _accept_bid("b1", "p1", 300)
    assert (accept.to, accept.talk, accept.action, accept.thought) == ("b1", "Deal: p1 at $300.", ("accept", "p1", 300), "")
    reply = _reply(observe(played(1, budget=2), "b1"), "bid", "p1", 250, "How about $250?")
    assert (reply.sender, reply.to, reply.talk, reply.action.kind, reply.action.price) == ("b1", SELLER, "How about $250?", "bid", 250)
    assert reply == Message("b1", SELLER, "How about $250?", Action("bid", "p1", 250))


# -- memory: what a long episode holds (issue 51) --------------------------------------------------------
# The peak RSS figures are benchmarks/bench_long.py --rss's; these count the items an episode keeps.


class WatchingFirmSeller(FirmSeller):
    """The firm seller, noting before each decision how many items the state holds (the most of each)."""

    def __init__(self, name, state):
        super().__init__(name)
        self.state = state
        self.most = {"events": 0, "history": 0, "thread": 0}

    def decide(self, obs):
        state, most = self.state, self.most
        for key, held in (("events", state.events), ("history", state._seller_history), ("thread", state.buyers[0].thread)):
            most[key] = max(most[key], len(held))
        return super().decide(obs)


def _untimed_lines(data: bytes) -> list[dict]:
    """A trace's lines less what the clock wrote (the episode's start time and wall seconds)."""
    return [{k: v for k, v in orjson.loads(line).items() if k not in ("time", "wall_s")} for line in data.splitlines()]


async def _long(budget: int, spill_dir, *, spill: bool = True):
    state = EpisodeState(no_deal_market(budget), clock=lambda: 0.0, episode="long", spill_dir=spill_dir)
    if not spill:
        state._bound_at = 10**9  # never spills, never cuts: what every episode held before
    seller = WatchingFirmSeller("firm", state)
    episode = await run_episode(state.market, seller, {"b1": ThresholdBuyer("threshold")}, episode_id="long", state=state)
    return state, seller, episode


async def test_a_long_episode_holds_a_bounded_number_of_items_however_many_turns_it_plays(tmp_path):
    state, seller, episode = await _long(5_000, tmp_path)
    assert (state.outcome, state.turns_used) == ("truncated", 5_000)
    # 10,000 events and history items, 5,000 offers and rejections each way: kept, at most, a bound's worth.
    assert seller.most["events"] <= SPILL_EVENTS + 2
    assert seller.most["history"] <= HISTORY_KEPT + SPILL_EVENTS
    assert seller.most["thread"] <= THREAD_KEPT + SPILL_EVENTS
    # What it returns still has every event: start, 5,000 offers and 5,000 replies, end.
    events = episode.events
    assert isinstance(events, StoredEvents) and len(events) == 10_002
    assert isinstance(events[0], EpisodeStart) and isinstance(events[-1], EpisodeEnd) and events[-1].outcome == "truncated"
    assert [e.turn for e in events if isinstance(e, MessageEvent) and e.sender == SELLER] == list(range(1, 5_001))
    assert list(tmp_path.iterdir()) == []  # the spill file has no name


async def test_a_spilled_episode_writes_the_trace_one_held_whole_would(tmp_path):
    _, _, spilled = await _long(3_000, tmp_path)
    _, _, held = await _long(3_000, tmp_path, spill=False)
    assert isinstance(spilled.events, StoredEvents) and isinstance(held.events, list)
    with TraceWriter(tmp_path / "spilled.jsonl") as writer:
        writer.write(spilled.events)
        writer.write(spilled.events)  # the spill reads again: an episode may be written twice (tests, tools)
    with TraceWriter(tmp_path / "held.jsonl") as writer:
        writer.write(held.events)
    spilled_lines, held_lines = _untimed_lines((tmp_path / "spilled.jsonl").read_bytes()), _untimed_lines((tmp_path / "held.jsonl").read_bytes())
    assert spilled_lines == held_lines * 2 and len(held_lines) == 6_002
    data = bytes(encode(spilled.events))  # what a worker process sends its parent: the same bytes
    assert (tmp_path / "spilled.jsonl").read_bytes() == data * 2
    # Read back, a long episode's events stay in the file until asked for, and give the same metrics as its end.
    first, second = read_records(tmp_path / "spilled.jsonl")
    assert isinstance(first.events, StoredEvents) and len(first.events) == 6_002
    assert first.id == second.id == "long" and first.outcome == "truncated"
    assert metrics_from_events(first.events) == first.metrics == held.metrics
    assert [vars(e) for e in first.events][1:-1] == [vars(e) for e in held.events][1:-1]


async def test_a_run_of_long_episodes_writes_them_whole_and_leaves_nothing_beside_its_traces(tmp_path):
    spec = tmp_path / "long.toml"
    spec.write_text('name = "long"\nbuyers = 1\nproducts = 1\nbudget = 2000\n')
    out = tmp_path / "run"
    prepared = prepare(RunConfig(sellers=("concession",), split=str(spec), episodes=3, seed=3), out, resume=False)
    assert await run_batch(prepared, out, concurrency=3) == 3
    assert sorted(p.name for p in out.iterdir()) == ["concession.jsonl"]
    episodes = list(read_episodes(out / "concession.jsonl"))  # each whole and contiguous, or this raises
    assert sorted(events[0]["index"] for events in episodes) == [0, 1, 2]
    for events in episodes:
        assert {e["episode"] for e in events} == {events[0]["episode"]}
        messages = events[-1]["metrics"]["seller_messages"] + events[-1]["metrics"]["buyer_messages"]
        assert sum(e["type"] == "message" for e in events) == messages
    assert max(len(events) for events in episodes) == 4_002 > SPILL_EVENTS  # no deal: 2,000 offers and replies
    rows = rows_from_traces([out])
    assert [row["metrics"] for row in rows] == [events[-1]["metrics"] for events in episodes]


def test_a_worker_sends_a_long_episode_a_megabyte_at_a_time_and_the_traces_match_one_process(tmp_path):
    """--workers: a long episode's stored lines go to the parent as "part" messages of at most 1 MiB before the
    "episode" message with the rest, so no process encodes it whole; the parent's traces are one process's."""
    from negotiate.workers import play_share, run_workers, shard_task, worker_task

    spec = tmp_path / "long.toml"
    spec.write_text('name = "long"\nbuyers = 1\nproducts = 1\nbudget = 20000\n')
    config = RunConfig(sellers=("concession",), split=str(spec), episodes=2, seed=3)
    one = tmp_path / "one"
    anyio.run(lambda: run_batch(prepare(config, one, resume=False), one, concurrency=2))
    sent = []
    prepared = prepare(config, tmp_path / "shard", resume=False)
    task = {**worker_task(shard_task([(prepared, tmp_path / "shard")], 1, log_file=None), 1, concurrency=2, max_inflight=None),
            "parts": True}
    play_share(task, sent.append)
    kinds = [message[0] for message in sent]
    assert kinds[-1] == "done" and kinds.count("episode") == 2 and kinds.count("part") >= 2
    assert all(len(message[3]) <= 1 << 20 for message in sent if message[0] == "part")
    by_index, parts = {}, b""
    for message in sent[:-1]:
        if message[0] == "part":
            parts += message[3]
        else:
            by_index[message[4]["index"]], parts = parts + bytes(message[3]), b""
    untimed = lambda lines: sorted(orjson.dumps({k: v for k, v in line.items() if k != "ts"}) for line in lines)  # noqa: E731
    whole = {events[0]["index"]: events for events in read_episodes(one / "concession.jsonl")}
    assert sorted(by_index) == sorted(whole) == [0, 1]
    for index, data in by_index.items():
        assert len(data) > 2 << 20 and untimed(_untimed_lines(data)) == untimed(_untimed_lines(b"".join(orjson.dumps(e) + b"\n" for e in whole[index])))
    # through the processes and the parent's spill: the same trace as one process wrote (the workers' order aside)
    two = tmp_path / "two"
    assert run_workers([(prepare(config, two, resume=False), two)], 2, concurrency=2, max_inflight=None, log_file=None) == 2
    assert untimed(_untimed_lines((two / "concession.jsonl").read_bytes())) == untimed(_untimed_lines((one / "concession.jsonl").read_bytes()))
    assert [events[0]["index"] for events in read_episodes(two / "concession.jsonl")] in ([0, 1], [1, 0])  # each whole


async def test_a_long_episode_cut_off_mid_write_is_never_taken_for_a_whole_one(tmp_path, monkeypatch):
    _, _, episode = await _long(2_000, tmp_path)
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path)

    chunks = Spill.chunks

    def one_chunk_then_a_full_disk(self, size=1 << 20):
        yield from islice(chunks(self, 4096), 1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Spill, "chunks", one_chunk_then_a_full_disk)
    with pytest.raises(TraceWriteError, match="No space left"):
        writer.write(episode.events)
    with pytest.raises(TraceWriteError, match="an earlier write failed"):
        writer.write(episode.events)  # nothing may follow half an episode
    writer.close()
    result = scan(path)
    assert (result.complete, result.good_bytes, result.partial) == ([], 0, "long")


async def test_a_long_episode_that_cannot_spill_keeps_its_events_and_plays_on(tmp_path):
    state, seller, episode = await _long(3_000, tmp_path / "gone")  # no such folder: no spill file can be made there
    assert isinstance(episode.events, list) and len(episode.events) == 6_002 and state.outcome == "truncated"
    assert seller.most["history"] <= HISTORY_KEPT + SPILL_EVENTS  # its histories are cut all the same


def test_a_view_taken_before_a_cut_shows_what_it_showed_and_a_new_one_the_latest():
    state = played(HISTORY_KEPT // 2)  # as many items as the seller's history shows: nothing cut yet
    early = observe(state, SELLER, consume=False)
    early_items = tuple(early.history)
    assert (len(early.history), early.history.dropped) == (HISTORY_KEPT, 0)
    offer = Message(SELLER, "b1", "Still $1,000.", Action("offer", "p1", 1000))
    reject = Message("b1", SELLER, "No.", Action("reject"))
    for _ in range(SPILL_EVENTS):
        state.market = no_deal_market(state.turns_used + 1)
        state.seller_send(offer)
        state.buyer_reply("b1", reject)
    later, buyer = observe(state, SELLER, consume=False), observe(state, "b1")
    assert early.history == early_items  # a view of the list before the cut
    total = 2 * state.turns_used
    assert (len(later.history), later.history.dropped) == (HISTORY_KEPT, total - HISTORY_KEPT)
    assert (len(buyer.thread), buyer.thread.dropped) == (THREAD_KEPT, total - THREAD_KEPT)
    assert later.history[-1] == reject and later.history[-2] == offer
    # The buyer's prompt counts what came before its window too.
    assert f"({total - THREAD_SHOWN} earlier messages)" in render_buyer(buyer)[1]["content"]


def test_every_violation_is_counted_and_the_latest_kept():
    state = EpisodeState(no_deal_market(300))
    below_cost = Message(SELLER, "b1", "Cheap!", Action("offer", "p1", 150))  # p1 costs 200
    for _ in range(300):
        assert state.seller_send(below_cost) is None
    assert len(state.violations) == VIOLATIONS_KEPT and state.violations[-1].turn == 300 and state.violations[0].turn == 201
    assert state.violation_counts == {"below_cost": 300}
    assert live_metrics(state)["violations"] == {"below_cost": 300}


async def test_a_fork_of_a_spilled_state_plays_on_with_events_of_its_own(tmp_path):
    state, _, _ = await _long(SPILL_EVENTS, tmp_path)
    assert isinstance(state.trace(), StoredEvents)
    state.outcome = None  # played on past its end, for the test: a fork of a state in mid-episode
    state.market = no_deal_market(state.turns_used + 2)
    fork = state.fork()
    offer = Message(SELLER, "b1", "Still $1,000.", Action("offer", "p1", 1000))
    fork.seller_send(offer)
    assert [e.turn for e in fork.trace()] == [SPILL_EVENTS + 1]
    assert len(state.trace()) == 2 * SPILL_EVENTS + 2  # its own, untouched
    assert fork._seller_history[:-1] == state._seller_history and fork._seller_history is not state._seller_history


# A bounded state (small bounds, to reach them in a few steps) and an unbounded one, played in lockstep.
_STEPS = st.lists(st.sampled_from(["offer", "below_cost", "malformed", "to_b2", "end_b1_turn"]), max_size=120)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_STEPS, replies=st.lists(st.sampled_from(["reject", "bid", "malformed", "bad_bid"]), min_size=1, max_size=7))
def test_a_bounded_state_shows_and_traces_what_an_unbounded_one_does(steps, replies):
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (("HISTORY_KEPT", 7), ("THREAD_KEPT", 5), ("VIOLATIONS_KEPT", 3), ("SPILL_EVENTS", 11)):
            patch.setattr(regulator, name, value)
        market = Market(MarketSpec(), 0, (Product("p1", "Alpha", 200, 1),), (Buyer("b1", (400,)), Buyer("b2", (300,))),
                        len(steps) + 1, 100, 1000)
        bounded, whole = EpisodeState(market, clock=lambda: 0.0), EpisodeState(market, clock=lambda: 0.0)
        bounded._bound_at, whole._bound_at = 11, 10**9
        cycle = iter(replies * len(steps))
        for step in steps:
            to = "b2" if step == "to_b2" else "b1"
            if bounded._buyer_by_id[to].awaiting:
                reply = next(cycle)
                result = (ParseFailure("not a message", "??") if reply == "malformed" else
                          Message(to, SELLER, "", Action("bid", "p1", 999 if reply == "bad_bid" else 250)) if reply in ("bid", "bad_bid") else
                          Message(to, SELLER, "No.", Action("reject")))
                for state in (bounded, whole):
                    state.buyer_reply(to, result)
                continue
            message = (ParseFailure("not a message", "??") if step == "malformed" else
                       Message(SELLER, to, "", Action("offer", "p1", 150 if step == "below_cost" else 900)))
            for state in (bounded, whole):
                state.seller_send(message)
            seller, full = observe(bounded, SELLER, consume=False), whole._seller_history
            assert tuple(seller.history) == tuple(full[-7:]) and seller.history.dropped == len(full) - len(seller.history)
            for b in ("b1", "b2"):
                thread, full_thread = observe(bounded, b).thread, whole._buyer_by_id[b].thread
                assert tuple(thread) == tuple(full_thread[-5:]) and thread.dropped == len(full_thread) - len(thread)
            assert bounded.violations == whole.violations[-3:] and bounded.violation_counts == whole.violation_counts
            assert len(bounded.events) <= 11 + 6
        assert [vars(e) for e in bounded.trace()] == [vars(e) for e in whole.events]
        assert live_metrics(bounded) == live_metrics(whole)
