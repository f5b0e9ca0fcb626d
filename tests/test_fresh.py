"""``fresh``: the seller is asked only once every scripted buyer has answered it.

Without it a seller that thinks (a model) is asked right after it sends, so its prompt lacks the
reply that a scripted buyer gives at once, and the trace (which ``replay`` and the trainers read)
places that reply before the seller's message: the model is trained on prompts it never saw.
With it a seller that thinks plays exactly the game the same seller plays instantly.
"""

from __future__ import annotations

import anyio
import pytest

from negotiate.agents.llm import render_seller
from negotiate.agents.registry import parse_agent
from negotiate.agents.scripted import ThresholdBuyer
from negotiate.episode import run_episode
from negotiate.market import SPLITS, Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Action, Message
from negotiate.run import Run, RunConfig
from negotiate.runner import build_episode
from negotiate.training.dataset import replay

_TIMING = {"ts", "wall_s", "time"}


def _untimed(events):
    return [{k: v for k, v in vars(e).items() if k not in _TIMING} for e in events]


class Thinking:
    """A scripted seller made to think: it awaits before deciding, as a model does, on the observation it was given."""

    instant = False

    def __init__(self, agent, pause: float = 0.0):
        self.agent = agent
        self.pause = pause
        self.prompts: list[str] = []
        """The full prompt of each observation it answered with a message, rendered when asked."""

    def __getattr__(self, name):
        return getattr(self.agent, name)

    async def act(self, obs):
        prompt = render_seller(obs, "tagged")[-1]["content"]
        await anyio.sleep(self.pause)
        decision = self.agent.decide(obs)
        if decision is not None:
            self.prompts.append(prompt)
        return decision


class Script:
    """Sends a fixed list of (to, price) offers for p1 and records what it saw when asked."""

    instant = True

    def __init__(self, offers):
        self.offers = list(offers)
        self.seen: list[tuple[tuple[bool, ...], tuple[str, ...]]] = []
        """Per decision: each buyer's ``awaiting``, and the senders of the new replies."""

    def describe(self):
        return {"kind": "test", "name": "Script"}

    def decide(self, obs):
        self.seen.append((tuple(b.awaiting for b in obs.buyers), tuple(m.sender for m in obs.new)))
        if not self.offers:
            return None
        to, price = self.offers.pop(0)
        return Message(SELLER, to, "", Action("offer", "p1", price))


def _market() -> Market:
    # One unit of p1 (cost 100); b1 values it 400, b2 300; four turns.
    return Market(MarketSpec(), 0, (Product("p1", "Alpha", 100, 1),), (Buyer("b1", (400,)), Buyer("b2", (300,))), 4, 0, 1000)


def _buyers():
    return {"b1": ThresholdBuyer("threshold"), "b2": ThresholdBuyer("threshold")}


@pytest.mark.parametrize("thinks", [False, True])
async def test_by_hand_a_fresh_seller_reads_each_reply_before_it_writes(thinks):
    # b1 is offered 500 (above its 400: it rejects), then b2 250 (below its 300: it buys, the unit is gone).
    seller = Script([("b1", 500), ("b2", 250)])
    agent = Thinking(seller) if thinks else seller
    episode = await run_episode(_market(), agent, _buyers(), fresh=True)
    # The second decision comes after b1's reject: b1 no longer owes a reply, and its reject is new.
    assert seller.seen == [((False, False), ()), ((False, False), ("b1",))]
    assert [(e.sender, e.kind) for e in episode.messages()] == [("seller", "offer"), ("b1", "reject"), ("seller", "offer"),
                                                                  ("b2", "accept")]


async def test_by_hand_without_fresh_a_thinking_seller_is_asked_before_the_reply():
    seller = Script([("b1", 500), ("b2", 250)])
    episode = await run_episode(_market(), Thinking(seller), _buyers())
    # Asked right after its first send: b1 still owes the reply it gives while the seller thinks.
    assert seller.seen[:2] == [((False, False), ()), ((True, False), ())]
    # The trace still puts that reply before the second offer: the order replay() rebuilds prompts in.
    assert [(e.sender, e.kind) for e in episode.messages()][:3] == [("seller", "offer"), ("b1", "reject"), ("seller", "offer")]


async def test_a_scripted_seller_under_fresh_hears_each_reply_before_its_next_message():
    # Without fresh an instant seller writes to every free buyer before any reply (b1, then b2 at once).
    plain, fresh = Script([("b1", 500), ("b2", 250)]), Script([("b1", 500), ("b2", 250)])
    await run_episode(_market(), plain, _buyers())
    await run_episode(_market(), fresh, _buyers(), fresh=True)
    assert plain.seen[1] == ((True, False), ())
    assert fresh.seen[1] == ((False, False), ("b1",))


@pytest.mark.parametrize("seller", ["planner", "greedy", "concession", "posted", "dutch", "oracle", "random"])
@pytest.mark.parametrize("buyers", ["threshold", "concession", "stubborn", "random"])
async def test_under_fresh_a_seller_that_thinks_plays_the_game_it_plays_instantly(seller, buyers):
    for split, index in (("train", 0), ("shapes", 1), ("correlated", 2)):
        traces = []
        for thinks, inline in ((False, True), (False, False), (True, False)):
            market, s, b = build_episode(SPLITS[split], parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 7, index)
            traces.append(await run_episode(market, Thinking(s) if thinks else s, b, episode_id="x", inline_instant=inline,
                                            fresh=True))
        assert traces[0].metrics is not None
        assert _untimed(traces[0].events) == _untimed(traces[1].events)
        # The thinking seller's description is the scripted one's: the whole trace matches, agents included.
        assert _untimed(traces[0].events) == _untimed(traces[2].events)


@pytest.mark.parametrize("fresh", [False, True])
async def test_replay_rebuilds_the_prompts_a_thinking_seller_saw_only_under_fresh(fresh):
    # What the trainers read (replay: the observation before each seller message in the trace) against what
    # the seller was shown. Greedy against conceding buyers writes to several buyers, so replies cross.
    same, total = 0, 0
    for index in range(6):
        market, s, b = build_episode(SPLITS["train"], parse_agent("greedy", "seller"), parse_agent("concession", "buyer"), 3, index)
        seller = Thinking(s)
        episode = await run_episode(market, seller, b, fresh=fresh)
        rebuilt = [render_seller(obs, "tagged")[-1]["content"] for obs, _ in replay(episode)[0]]
        # (Without fresh the last message may never be sent: the market closed while the seller thought.)
        assert len(rebuilt) == len(seller.prompts) if fresh else len(seller.prompts) - len(rebuilt) in (0, 1)
        same += sum(a == b for a, b in zip(rebuilt, seller.prompts))
        total += len(rebuilt)
    if fresh:
        assert same == total
    else:
        assert same < total / 2  # most prompts lack the reply that landed while the seller thought


class SlowBuyer:
    """A buyer that thinks for ``pause`` seconds, then rejects."""

    instant = False

    def __init__(self, pause: float):
        self.pause = pause

    def describe(self):
        return {"kind": "test", "name": "SlowBuyer"}

    async def act(self, obs):
        await anyio.sleep(self.pause)
        return Message(obs.buyer, SELLER, "", Action("reject"))


async def test_fresh_does_not_wait_for_a_buyer_that_thinks():
    # b1 thinks for an hour (it is still thinking when the market sells out, however slow the machine); b2 is
    # scripted. The seller writes to b2 while b1 is still thinking, and the sale ends the episode, without b1.
    seller = Script([("b1", 500), ("b2", 250)])
    with anyio.fail_after(60):  # a hang guard: waiting for b1 would take the hour
        episode = await run_episode(_market(), seller, {"b1": SlowBuyer(3600), "b2": ThresholdBuyer("threshold")}, fresh=True)
    order = [(e.sender, e.kind) for e in episode.messages()]
    assert order == [("seller", "offer"), ("seller", "offer"), ("b2", "accept")]
    assert seller.seen[1] == ((True, False), ())


async def test_a_fresh_run_records_it_in_every_episode_start():
    for fresh in (False, True):
        run = Run(RunConfig(sellers=("greedy",), buyers="threshold", episodes=2, fresh=fresh))
        async with run:
            episode = await run.episode(parse_agent("greedy", "seller"), 0).play()
        assert episode.start.fresh is (True if fresh else None)
