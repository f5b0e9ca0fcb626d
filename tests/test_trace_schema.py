"""negotiate.trace: the typed schema. Schema 2 as the engine writes it, schema 1 still read (a golden
v1 trace in tests/fixtures), timeouts as data, enums that keep the JSON unchanged."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from negotiate.agents.scripted import ThresholdBuyer
from negotiate.episode import run_episode
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Action, Message
from negotiate.report import rows_from_traces
from negotiate.trace import (
    SCHEMA_VERSION, DealEvent, EndReason, EpisodeEnd, EpisodeRecord, EpisodeStart, EventType, MessageEvent, NoticeEvent,
    OtherEvent, Outcome, TraceWriter, ViolationEvent, parse_event, read_records,
)
from negotiate.training.dataset import decisions, load_episodes, replay
from negotiate.training.rewards import profit_penalized
from negotiate.tui.transcript import load_trace, plain_transcript

V1 = Path(__file__).parent / "fixtures" / "trace_v1.jsonl"
"""A schema 1 episode written by hand in the layout v1 writers used: a seller timeout (2.5 s), an
offer below cost, then an offer at 400 that b1 (value 700, cost 100) accepts. OPT 600, profit 300."""


def test_the_v1_golden_trace_reads_into_typed_records():
    [episode] = read_records(V1)
    start, end = episode.start, episode.end
    assert (start.schema, start.episode, start.seller, start.run, start.group) == (1, "greedy-000000", "greedy", None, None)
    assert [type(e) for e in episode.events] == [
        EpisodeStart, MessageEvent, ViolationEvent, NoticeEvent, MessageEvent, ViolationEvent, NoticeEvent,
        MessageEvent, MessageEvent, DealEvent, NoticeEvent, NoticeEvent, NoticeEvent, EpisodeEnd,
    ]
    timeout, below, offer, accept = episode.messages()
    # v1 wrote a timeout as English only: the reader recovers it as data
    assert (timeout.error_kind, timeout.timeout_s, timeout.timed_out) == ("timeout", 2.5, True)
    assert (below.error_kind, below.timeout_s, below.kind, below.price) == ("below_cost", None, "offer", 50)
    assert (offer.error_kind, offer.valid, accept.sender, accept.kind) == (None, True, "b1", "accept")
    assert [(d.buyer, d.product, d.price, d.by) for d in episode.deals()] == [("b1", "p1", 400, "b1")]
    assert (end.outcome, end.reason, end.turns_used, episode.id, episode.failed) == ("terminated", "sold_out", 3, "greedy-000000", False)


def test_the_v1_golden_trace_reports_scores_and_replays():
    [row] = rows_from_traces([V1])
    assert (row["seller"], row["outcome"], row["metrics"]["profit_ratio"], row["metrics"]["violations"]) == (
        "greedy", "terminated", 0.5, {"timeout": 1, "below_cost": 1})
    [episode] = read_records(V1)
    assert profit_penalized(episode.events) == pytest.approx(0.5 - 2 * 0.1)
    seen, state = replay(episode)
    # the timeout is replayed from its recovered seconds: the same turn spent, the same violation
    assert [(obs.turns_used, event.turn) for obs, event in seen] == [(0, 1), (1, 2), (2, 3)]
    assert (state.turns_used, [v.kind for v in state.violations], [d.price for d in state.deals]) == (3, ["timeout", "below_cost"], [400])
    replayed = [e for e in state.events if isinstance(e, MessageEvent)]
    assert (replayed[0].error, replayed[0].error_kind, replayed[0].timeout_s) == ("timeout after 2.5s", "timeout", 2.5)
    assert [(e.turn, e.valid, e.error) for e in replayed] == [(e.turn, e.valid, e.error) for e in episode.messages()]
    made = decisions(episode, 1.0, "g")
    assert [(d.turn, d.valid) for d in made] == [(2, False), (3, True)]  # the timeout wrote nothing: no decision
    [loaded] = load_episodes([V1])
    assert (loaded.id, loaded.seller, loaded.split, loaded.record.id) == ("greedy-000000", "greedy", "doc", "greedy-000000")
    out = plain_transcript(load_trace(V1)[0])
    assert "invalid: timeout after 2.5s" in out and "DEAL b1 buys p1 at $400 (seller +300, buyer +300)" in out


class _SlowSeller:
    """A seller that thinks past its deadline once, then offers p1 at 400."""

    instant = False

    def __init__(self):
        self.calls = 0

    async def act(self, obs):
        self.calls += 1
        if self.calls == 1:
            await asyncio.sleep(5)
        free = [b.id for b in obs.buyers if b.status == "active" and not b.awaiting]
        return Message(SELLER, free[0], "", Action("offer", "p1", 400)) if free else None

    def describe(self) -> dict:
        return {"kind": "test"}


async def test_the_engine_writes_schema_2_with_a_timeout_as_data(tmp_path):
    market = Market(MarketSpec(), 0, (Product("p1", "Tent", 100, 1),), (Buyer("b1", (700,)),), 4, 100, 1000)
    episode = await run_episode(market, _SlowSeller(), {"b1": ThresholdBuyer("threshold")}, episode_id="e", seller_timeout=0.05)
    assert episode.outcome == "terminated" and episode.start.schema == SCHEMA_VERSION == 2
    timeout = episode.messages()[0]
    assert (timeout.turn, timeout.error_kind, timeout.timeout_s, timeout.error) == (1, "timeout", 0.05, "timeout after 0.05s")
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as writer:
        writer.write(episode.events)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    # a message's keys are schema 1's, with error_kind and timeout_s where they apply; unset ones are left out
    v1_keys = {"type", "episode", "ts", "turn", "sender", "to", "thought", "talk", "action", "valid"}
    assert set(lines[1]) == v1_keys | {"error", "error_kind", "timeout_s"}
    assert (lines[1]["type"], lines[1]["error_kind"], lines[1]["timeout_s"]) == ("message", "timeout", 0.05)
    valid = next(line for line in lines if line["type"] == "message" and line["valid"])
    assert set(valid) == v1_keys and valid["action"] == {"kind": "offer", "product": "p1", "price": 400}
    assert "run" not in lines[0] and lines[0]["schema"] == 2 and lines[0]["seller"] is None  # start: run, group, repeat, play only where they apply
    [back] = read_records(path)
    assert back.events == episode.events  # a v2 trace reads back into the very records the engine built


def test_enums_write_plain_strings():
    end = EpisodeEnd(episode="e", outcome=Outcome.TERMINATED, reason=EndReason.SOLD_OUT, turns_used=1, budget=2)
    data = orjson.loads(orjson.dumps(end))
    assert (data["type"], data["outcome"], data["reason"]) == ("episode_end", "terminated", "sold_out")
    assert EventType.DEAL == "deal" and Outcome.FAILED == "failed" and EndReason.BUDGET == "budget"


def test_an_unknown_event_type_is_kept_not_interpreted():
    event = parse_event({"type": "surprise", "episode": "x", "n": 1})
    assert isinstance(event, OtherEvent) and (event.type, event.data["n"]) == ("surprise", 1)
    episode = EpisodeRecord.of([{"type": "episode_start", "episode": "x"}, event, {"type": "episode_end", "outcome": "failed", "reason": "boom"}])
    assert (episode.id, episode.failed, episode.reason, episode.metrics, episode.start.schema) == ("x", True, "boom", None, 1)


def test_dict_style_access_still_works_for_code_written_against_v1():
    event = MessageEvent(episode="e", ts=0.0, turn=1, sender="seller", to="b1", action={"kind": "offer", "product": "p1", "price": 5})
    assert (event["sender"], event.get("raw"), event.get("raw", "-"), "error" in event, "to" in event) == ("seller", None, "-", False, True)
    with pytest.raises(KeyError):
        event["nothing"]
    assert dict(event)["type"] == "message" and "error" not in dict(event)


@pytest.mark.parametrize("record", [EpisodeStart, MessageEvent, ViolationEvent, DealEvent, NoticeEvent, EpisodeEnd])
def test_each_record_writes_its_own_type(record):
    # the hot records set their type as a literal in their own __init__: it must be the enum's value
    built = record()
    assert built.type == record.type and built.type in set(EventType) and orjson.loads(orjson.dumps(built))["type"] == built.type
    assert isinstance(parse_event({"type": built.type}), record)


class _Raising:
    instant = True

    def decide(self, obs):
        raise RuntimeError("boom")

    def describe(self) -> dict:
        return {"kind": "test"}


async def test_an_agent_that_raises_is_a_failed_row_in_the_report(tmp_path):
    market = Market(MarketSpec(), 0, (Product("p1", "Tent", 100, 1),), (Buyer("b1", (700,)),), 4, 100, 1000)
    episode = await run_episode(market, _Raising(), {"b1": ThresholdBuyer("threshold")}, episode_id="x", labels={"seller": "raising"})
    with TraceWriter(tmp_path / "t.jsonl") as writer:
        writer.write(episode.events)
    [row] = rows_from_traces([tmp_path / "t.jsonl"])
    assert (row["seller"], row["outcome"], row["reason"], row["metrics"]) == ("raising", "failed", "RuntimeError: boom", None)
