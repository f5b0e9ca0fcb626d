"""What the lenient parser repairs reaches the trace: ``extra.clamped`` of the message event.

A stub backend (anything with ``complete``) writes control characters into its reply, escaped in the JSON;
the trace's message holds them removed, and its ``extra.clamped`` says which and where.
"""

from __future__ import annotations

import anyio
import orjson

from negotiate.agents.contract import Completion
from negotiate.agents.llm import LLMSeller
from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER
from negotiate.trace import TraceWriter, read_episodes

REPLY = {"thought": "ring\u0007 then \u009bclear", "to": "b1", "talk": "Yours for $5\u001b[0m.",
         "action": {"kind": "offer", "product": "p1", "price": 5}}


class StubBackend:
    """Always the same reply (an offer of p1 at 5 to b1), JSON with escaped control characters."""

    name = "stub"

    def describe(self) -> dict:
        return {"backend": self.name}

    async def complete(self, messages, *, role, seed=None, **_) -> Completion:
        return Completion(orjson.dumps(REPLY).decode(), "stop", "stub-model", 0.001)


async def test_a_repaired_reply_is_recorded_in_extra_clamped(tmp_path):
    assert b"\\u0007" in orjson.dumps(REPLY) and b"\\u001b" in orjson.dumps(REPLY)  # escaped as a server sends them
    market = Market(MarketSpec(name="clamp"), 1, (Product("p1", "Basic", 3, 1),), (Buyer("b1", (9,)),), 2, 1, 10)
    buyers = {"b1": parse_agent("threshold", "buyer").build(market, [1, 1, 0])}
    with anyio.fail_after(20):
        ep = await run_episode(market, LLMSeller(StubBackend()), buyers)
    with TraceWriter(tmp_path / "t.jsonl") as writer:
        writer.write(ep.events)
    (events,) = list(read_episodes(tmp_path / "t.jsonl"))
    sent = [e for e in events if e["type"] == "message" and e["sender"] == SELLER]
    assert sent, events
    first = sent[0]
    assert (first["thought"], first["talk"]) == ("ring then clear", "Yours for $5[0m.")
    assert first["extra"]["clamped"] == ["removed 2 control characters from thought: U+0007, U+009B",
                                         "removed 1 control character from talk: U+001B"]
