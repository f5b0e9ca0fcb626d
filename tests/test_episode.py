"""negotiate.episode and negotiate.bus: whole episodes with agents, deadlines, failures, determinism."""

from __future__ import annotations

import anyio
import pytest

from negotiate.agents.registry import parse_agent
from negotiate.agents.base import ScriptedAgent
from negotiate.agents.scripted import ThresholdBuyer
from negotiate.bus import Mailbox
from negotiate.episode import SCHEMA_VERSION, run_episode
from negotiate.market import SPLITS, Buyer, Market, MarketSpec, Product
from negotiate.metrics import metrics_from_events
from negotiate.protocol import SELLER, Action, Generated, Message
from negotiate.regulator import BudgetExceeded, EpisodeState
from negotiate.runner import build_episode

# -- test agents ------------------------------------------------------------------------------


class _Agent(ScriptedAgent):
    """A test agent: a synchronous ``decide``, like the scripted ones (instant: no deadline)."""

    def __init__(self):
        super().__init__("test")

    def describe(self) -> dict:
        return {"kind": "test", "name": type(self).__name__}


class HighSeller(_Agent):
    """Offers p1 at ``price`` to the first free buyer; never ends."""

    def __init__(self, price: int = 1000):
        super().__init__()
        self.price = price

    def decide(self, obs):
        free = [b.id for b in obs.buyers if b.status == "active" and not b.awaiting]
        return Message(SELLER, free[0], "", Action("offer", "p1", self.price)) if free else None


class ScriptSeller(_Agent):
    """Sends a fixed list of (to, price) offers for p1, then waits."""

    def __init__(self, offers):
        super().__init__()
        self.offers = list(offers)

    def decide(self, obs):
        if not self.offers:
            return None
        to, price = self.offers.pop(0)
        return Message(SELLER, to, "", Action("offer", "p1", price))


class _Async:
    """An agent with only the async ``act`` of the SellerAgent/BuyerAgent protocol (a model, a person)."""

    instant = False

    def describe(self) -> dict:
        return {"kind": "test", "name": type(self).__name__}


class SleepyBuyer(_Async):
    async def act(self, obs):
        await anyio.sleep(3600)


class SleepySeller(_Async):
    async def act(self, obs):
        await anyio.sleep(3600)


class RaisingAgent(_Agent):
    def decide(self, obs):
        raise RuntimeError("boom")


class AsyncRaisingAgent(_Async):
    async def act(self, obs):
        await anyio.sleep(0)
        raise RuntimeError("boom")


class IdleSeller(_Agent):
    def decide(self, obs):
        return None


class Shuffled(_Async):
    """Wraps a scripted agent and yields to the loop a seeded number of times: replies arrive in any order."""

    def __init__(self, inner, rng):
        self.inner, self.rng = inner, rng

    async def act(self, obs):
        for _ in range(int(self.rng.integers(0, 6))):
            await anyio.sleep(0)
        return await self.inner.act(obs)

    def describe(self) -> dict:
        return self.inner.describe()


def one_product_market(values=(400, 300), budget=5, cost=100) -> Market:
    return Market(MarketSpec(), 0, (Product("p1", "Alpha", cost, 1),),
                  tuple(Buyer(f"b{i + 1}", (v,)) for i, v in enumerate(values)), budget, 0, 1000)


def thresholds(market):
    return {b.id: ThresholdBuyer("threshold") for b in market.buyers}


def _types(episode):
    return [e.type for e in episode.events]


# -- whole episodes with scripted agents --------------------------------------------------------------


@pytest.mark.parametrize("seller", ["oracle", "greedy", "concession", "posted", "dutch", "random"])
@pytest.mark.parametrize("buyers", ["threshold", "concession", "stubborn", "random"])
async def test_scripted_episodes_end_with_a_consistent_trace(seller, buyers):
    for index in range(3):
        market, s, b = build_episode(SPLITS["train"], parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 5, index)
        episode = await run_episode(market, s, b, episode_id=f"ep-{index}")
        assert episode.outcome in ("terminated", "truncated"), episode.reason
        types = _types(episode)
        assert types[0] == "episode_start" and types[-1] == "episode_end"
        assert types.count("episode_start") == types.count("episode_end") == 1
        assert all(e.episode == f"ep-{index}" for e in episode.events)
        start, end = episode.start, episode.end
        assert start.schema == SCHEMA_VERSION
        assert start.market == market.to_dict()
        assert (end.outcome, end.reason) == (episode.outcome, episode.reason)
        assert end.metrics == episode.metrics
        assert episode.metrics["turns_used"] <= market.budget
        if episode.outcome == "truncated":
            assert (episode.reason, end.turns_used) == ("budget", market.budget)
        assert metrics_from_events(episode.events) == episode.metrics


async def test_seller_loop_ends_when_the_budget_is_spent():
    market = one_product_market(values=(400, 300), budget=5)
    episode = await run_episode(market, HighSeller(1000), thresholds(market))  # 1000 is above every value
    assert (episode.outcome, episode.reason) == ("truncated", "budget")
    assert episode.metrics["turns_used"] == 5 and episode.metrics["seller_messages"] == 5
    assert episode.metrics["buyer_messages"] == 5  # every seller message got exactly one reply
    assert episode.metrics["deals"] == 0 and episode.metrics["budget_overrun"] == 0


async def test_a_reply_pending_at_the_last_turn_is_still_processed():
    # Turn 1 offers b1 at 900 (> 400: reject), turn 2, the last, offers b2 at 250 (<= 300: accept).
    # The bus waits for both replies before deciding: b2's accept sells the only unit.
    market = one_product_market(values=(400, 300), budget=2)
    episode = await run_episode(market, ScriptSeller([("b1", 900), ("b2", 250)]), thresholds(market))
    assert (episode.outcome, episode.reason) == ("terminated", "sold_out")
    assert episode.metrics["profit"] == 150  # 250 - 100


async def test_a_seller_that_waits_with_nothing_pending_ends_the_episode():
    market = one_product_market()
    episode = await run_episode(market, IdleSeller(), thresholds(market))
    assert episode.outcome == "terminated"
    assert episode.metrics["turns_used"] == 0


async def test_seller_end_terminates():
    class Ender(_Agent):
        def decide(self, obs):
            return Message(SELLER, "", "bye", Action("end"))

    market = one_product_market()
    episode = await run_episode(market, Ender(), thresholds(market))
    assert (episode.outcome, episode.reason) == ("terminated", "seller_end")
    assert episode.metrics["turns_used"] == 1


async def test_generated_decisions_keep_raw_text_and_backend_details():
    class Model(_Agent):
        def decide(self, obs):
            message = Message(SELLER, "b1", "p1 for 250", Action("offer", "p1", 250), "think")
            return Generated(message, raw="To: b1\nAction: [OFFER] p1 $250", extra={"token_ids": [1, 2, 3]})

    market = one_product_market(values=(400,))
    episode = await run_episode(market, Model(), thresholds(market))
    [sent] = episode.seller_messages()
    assert sent.raw == "To: b1\nAction: [OFFER] p1 $250" and sent.extra == {"token_ids": [1, 2, 3]}
    assert sent.thought == "think" and sent.valid is True
    assert episode.metrics["profit"] == 150


async def test_a_decision_that_is_not_a_message_is_malformed():
    class Confused(_Agent):
        def decide(self, obs):
            return 42

    market = one_product_market(values=(400,), budget=2)
    episode = await run_episode(market, Confused(), thresholds(market))
    assert (episode.outcome, episode.reason) == ("truncated", "budget")
    assert episode.metrics["violations"] == {"malformed": 2} and episode.metrics["valid_rate"] == 0.0


# -- deadlines --------------------------------------------------------------------------------------


async def test_a_buyer_past_its_deadline_is_a_timeout_and_the_episode_ends():
    market = one_product_market(values=(400,), budget=3)
    episode = await run_episode(market, HighSeller(200), {"b1": SleepyBuyer()}, reply_timeout=0.01)
    # Three offers, three silent replies, each taken as a reject: the budget runs out.
    assert (episode.outcome, episode.reason) == ("truncated", "budget")
    violations = [(e.who, e.kind) for e in episode.violations()]
    assert violations == [("b1", "timeout")] * 3
    assert episode.metrics["buyer_violations"] == {"timeout": 3}
    assert episode.metrics["buyer_invalid"] == 3 and episode.metrics["deals"] == 0
    assert metrics_from_events(episode.events) == episode.metrics


async def test_a_seller_past_its_deadline_loses_the_turn():
    market = one_product_market(budget=4)
    episode = await run_episode(market, SleepySeller(), thresholds(market), seller_timeout=0.01)
    assert (episode.outcome, episode.reason) == ("truncated", "budget")
    assert episode.metrics["violations"] == {"timeout": 4}
    assert episode.metrics["seller_invalid"] == 4 and episode.metrics["valid_rate"] == 0.0
    assert episode.metrics["turns_used"] == 4
    assert metrics_from_events(episode.events) == episode.metrics


async def test_one_slow_buyer_does_not_stall_the_others():
    market = one_product_market(values=(400, 300), budget=2)
    episode = await run_episode(market, ScriptSeller([("b1", 250), ("b2", 250)]),
                                {"b1": SleepyBuyer(), "b2": ThresholdBuyer("threshold")}, reply_timeout=0.05)
    assert [(e.buyer, e.price) for e in episode.deals()] == [("b2", 250)]
    assert (episode.outcome, episode.reason) == ("terminated", "sold_out")


# -- failures -----------------------------------------------------------------------------------------


async def test_a_raising_buyer_fails_the_episode_with_the_reason():
    market = one_product_market(values=(400,))
    episode = await run_episode(market, HighSeller(200), {"b1": RaisingAgent()})
    assert episode.outcome == "failed"
    assert "RuntimeError" in episode.reason and "boom" in episode.reason
    assert episode.metrics is None
    end = episode.events[-1]
    assert (end.type, end.outcome, end.metrics) == ("episode_end", "failed", None)
    assert "boom" in end.reason


async def test_a_raising_buyer_fails_the_episode_even_if_the_market_just_ended():
    # b1 and b2 both hold offers at 200; b1 raises, and in the same loop tick b2 accepts the only unit.
    market = one_product_market()
    episode = await run_episode(market, HighSeller(200), {"b1": RaisingAgent(), "b2": ThresholdBuyer("threshold")})
    assert episode.outcome == "failed"
    assert "RuntimeError" in episode.reason and "boom" in episode.reason
    assert episode.metrics is None
    end = episode.events[-1]
    assert (end.type, end.outcome, end.metrics) == ("episode_end", "failed", None)
    assert "boom" in end.reason


async def test_a_raising_seller_fails_the_episode_with_the_reason():
    market = one_product_market()
    episode = await run_episode(market, RaisingAgent(), thresholds(market))
    assert episode.outcome == "failed" and "boom" in episode.reason
    assert _types(episode)[-1] == "episode_end"


@pytest.mark.parametrize("role", ["seller", "buyer"])
async def test_an_async_agent_that_raises_fails_the_episode(role):
    market = one_product_market(values=(400,))
    if role == "seller":
        episode = await run_episode(market, AsyncRaisingAgent(), thresholds(market))
    else:
        episode = await run_episode(market, HighSeller(200), {"b1": AsyncRaisingAgent()})
    assert episode.outcome == "failed" and "RuntimeError: boom" in episode.reason
    assert episode.end.outcome == "failed"


async def test_an_agent_error_names_the_agent_and_keeps_its_error():
    market = one_product_market(values=(400,))
    episode = await run_episode(market, HighSeller(200), {"b1": AsyncRaisingAgent()})
    assert episode.reason == "RuntimeError: boom"  # the agent's own error, not a wrapper's
    assert [e.type for e in episode.events[-1:]] == ["episode_end"] and episode.failed


def _regulator_bug(self, *args, **kwargs):
    raise ZeroDivisionError("regulator bug")


async def test_an_engine_bug_propagates_out_of_run_episode(monkeypatch):
    # A regulator that raises is a bug of the engine, not an agent's failure: no failed row, the run stops.
    monkeypatch.setattr(EpisodeState, "seller_send", _regulator_bug)
    market = one_product_market(values=(400,))
    with pytest.raises(ZeroDivisionError, match="regulator bug"):
        await run_episode(market, HighSeller(200), thresholds(market))


async def test_budget_exceeded_is_a_bug_that_propagates(monkeypatch):
    # The bus never sends past the budget; if it did, BudgetExceeded must stop the run, not become data.
    monkeypatch.setattr(EpisodeState, "budget_left", property(lambda self: 1))  # the bus believes a turn is always left
    market = one_product_market(values=(1,), budget=2)  # nobody buys at 1000: the seller keeps offering
    with pytest.raises(BudgetExceeded):
        await run_episode(market, HighSeller(1000), {"b1": ThresholdBuyer("threshold")})


async def test_an_engine_bug_in_a_buyer_task_propagates_too(monkeypatch):
    monkeypatch.setattr(EpisodeState, "buyer_reply", _regulator_bug)
    market = one_product_market(values=(400,))
    with pytest.raises(ZeroDivisionError, match="regulator bug"):
        await run_episode(market, HighSeller(200), {"b1": ThresholdBuyer("threshold")}, inline_instant=False)


async def test_an_instant_agent_with_only_act_follows_the_documented_protocol():
    # agents/base.py: an agent is an object with an async ``act``; ``instant`` says it never waits.
    class ActOnly:
        instant = True

        async def act(self, obs):
            free = [b.id for b in obs.buyers if b.status == "active" and not b.awaiting]
            return Message(SELLER, free[0], "", Action("offer", "p1", 250)) if free else None

        def describe(self) -> dict:
            return {"kind": "test"}

    market = one_product_market(values=(400,))
    episode = await run_episode(market, ActOnly(), thresholds(market))
    assert (episode.outcome, episode.reason) == ("terminated", "sold_out"), episode.reason


async def test_cancellation_from_outside_propagates():
    market = one_product_market(values=(400,), budget=3)
    with anyio.move_on_after(0.05) as scope:
        await run_episode(market, HighSeller(200), {"b1": SleepyBuyer()}, reply_timeout=3600)
    assert scope.cancelled_caught


# -- concurrency ------------------------------------------------------------------------------------------


async def test_replies_in_any_order_keep_the_rules():
    import numpy as np

    for index in range(20):
        market, seller, buyers = build_episode(SPLITS["shapes"], parse_agent("greedy", "seller"),
                                               parse_agent("concession", "buyer"), 3, index)
        rng = np.random.default_rng(index)
        shuffled = {k: Shuffled(agent, rng) for k, agent in buyers.items()}
        episode = await run_episode(market, seller, shuffled, reply_timeout=30)
        assert episode.outcome in ("terminated", "truncated")
        deals = episode.deals()
        assert len({d["buyer"] for d in deals}) == len(deals)
        assert len(deals) <= sum(p.stock for p in market.products)
        assert all(d["cost"] <= d["price"] <= d["value"] for d in deals)
        assert episode.metrics["turns_used"] <= market.budget
        assert metrics_from_events(episode.events) == episode.metrics


async def test_a_seller_still_thinking_when_the_market_sells_out():
    class Thinker(_Async):
        """Offers b1, then thinks (yields) while b1 accepts the only unit, then offers b2."""

        calls = 0

        async def act(self, obs):
            self.calls += 1
            if self.calls > 1:
                for _ in range(10):
                    await anyio.sleep(0)
            free = [b.id for b in obs.buyers if b.status == "active" and not b.awaiting]
            return Message(SELLER, free[0], "", Action("offer", "p1", 250))

    market = one_product_market(values=(400, 300), budget=5)
    thinker = Thinker()
    episode = await run_episode(market, thinker, thresholds(market), seller_timeout=30, reply_timeout=30)
    assert thinker.calls == 2  # the second decision came back after the market had sold out
    # ... and is dropped: the episode ends as sold out, not failed, and no message goes to b2.
    assert (episode.outcome, episode.reason) == ("terminated", "sold_out")
    assert episode.metrics["deals"] == 1
    assert [e.to for e in episode.seller_messages()] == ["b1"]


# -- determinism ----------------------------------------------------------------------------------------

_TIMING = {"ts", "wall_s", "time"}


def _untimed(events):
    return [{k: v for k, v in vars(e).items() if k not in _TIMING} for e in events]


@pytest.mark.parametrize(("seller", "buyers"), [("greedy", "concession"), ("random", "random"), ("dutch", "stubborn")])
async def test_same_market_and_seeds_give_the_same_trace(seller, buyers):
    for index in range(3):
        runs = []
        for _ in range(2):
            market, s, b = build_episode(SPLITS["train"], parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 11, index)
            runs.append(await run_episode(market, s, b, episode_id="same"))
        assert _untimed(runs[0].events) == _untimed(runs[1].events)
        assert runs[0].messages()


async def test_different_runs_seeds_give_different_traces():
    traces = []
    for run_seed in (1, 2):
        market, s, b = build_episode(SPLITS["train"], parse_agent("random", "seller"), parse_agent("random", "buyer"), run_seed, 0)
        traces.append(_untimed((await run_episode(market, s, b, episode_id="x")).events))
    assert traces[0] != traces[1]


# -- mailboxes ----------------------------------------------------------------------------------------


async def test_mailbox_delivers_in_order_and_ends_when_closed():
    box = Mailbox("b1")
    box.put(1)
    box.put(2)
    assert await box.get() == 1
    stats = box.statistics()
    assert (stats.name, stats.queued, stats.sent, stats.received, stats.closed) == ("b1", 1, 2, 1, False)
    box.close()
    assert [item async for item in box] == [2]  # drained, then the loop ends on its own
    with pytest.raises(anyio.EndOfStream):
        await box.get()
    with pytest.raises(anyio.ClosedResourceError):
        box.put(3)
    assert box.statistics().closed


async def test_closing_a_mailbox_wakes_its_reader():
    box = Mailbox("b1")
    got = []

    async def reader():
        async for item in box:
            got.append(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await anyio.sleep(0)
        box.put("x")
        await anyio.sleep(0)
        box.close()
    assert got == ["x"]


@pytest.mark.parametrize("seller", ["oracle", "greedy", "concession", "posted", "dutch", "random"])
@pytest.mark.parametrize("buyers", ["threshold", "concession", "stubborn", "random"])
async def test_inline_scripted_buyers_play_exactly_as_buyer_tasks_do(seller, buyers):
    # The bus calls instant buyers where their tasks would have run; the traces must not differ.
    for split, index in (("train", 0), ("train", 1), ("shapes", 2)):
        runs = []
        for inline in (True, False):
            market, s, b = build_episode(SPLITS[split], parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 5, index)
            runs.append(await run_episode(market, s, b, episode_id="x", inline_instant=inline))
        assert _untimed(runs[0].events) == _untimed(runs[1].events)


async def test_a_seller_still_thinking_is_stopped_when_the_market_closes():
    class SlowThinker(_Async):
        """Offers b1 at once, then takes a minute over its next message."""

        calls = 0

        async def act(self, obs):
            self.calls += 1
            if self.calls > 1:
                await anyio.sleep(60)
            return Message(SELLER, "b1", "", Action("offer", "p1", 250))

    market = one_product_market(values=(400, 300), budget=5)
    with anyio.fail_after(10):  # without the stop, the episode would sit out the seller's minute
        episode = await run_episode(market, SlowThinker(), thresholds(market), seller_timeout=120, reply_timeout=120)
    assert (episode.outcome, episode.reason) == ("terminated", "sold_out")
    assert episode.metrics["deals"] == 1
