"""The LLM agent and the openai backend against a fake OpenAI-compatible server (tests/fake_openai.py).

Whole episodes with LLM sellers and buyers, the structured-output field each server
kind reads, retries, malformed and truncated replies, re-asks, hangs, a server that is
down, bad keys, unknown models, context overflows, the in-flight bound, and what the
trace keeps (prompt, token ids, log-probs, latency, re-asks). Every test ends in seconds.
"""

from __future__ import annotations

import time

import anyio
import orjson
import pytest

pytest.importorskip("openai", reason="the openai backend needs the llm extra: pip install -e '.[llm]'")
pytest.importorskip("aiohttp", reason="the fake server and the openai backend's transport need aiohttp")

from fake_openai import FakeOpenAI, Fault, free_port  # noqa: E402

from negotiate.agents.clients import _shared, aclose_clients  # noqa: E402
from negotiate.agents.contract import LLMTimeout  # noqa: E402
from negotiate.agents.llm import legal_pattern, render_seller_compact  # noqa: E402
from negotiate.agents.registry import parse_agent  # noqa: E402
from negotiate.episode import run_episode  # noqa: E402
from negotiate.market import Buyer, Market, MarketSpec, Product  # noqa: E402
from negotiate.metrics import metrics_from_events  # noqa: E402
from negotiate.protocol import SELLER, Action, Generated, Message, ParseFailure, json_schema  # noqa: E402
from negotiate.regulator import EpisodeState, observe  # noqa: E402
from negotiate.trace import TraceWriter, encode, read_episodes  # noqa: E402

FAST = "retries=1&timeout=5"


def market() -> Market:
    return Market(
        MarketSpec(name="llm-test"), 11,
        (Product("p1", "Basic laptop", 300, 1), Product("p2", "Pro laptop", 500, 1)),
        (Buyer("b1", (650, 900), "begging"), Buyer("b2", (420, 780))),
        6, 100, 1000,
    )


@pytest.fixture
async def server():
    async with FakeOpenAI() as fake:
        yield fake
        await aclose_clients()


def spec(server: FakeOpenAI, query: str = FAST, *, model: str | None = None) -> str:
    return f"openai:{model or server.model}@{server.url}?{query}"


def agents(seller: str, buyers: str):
    m = market()
    seller_spec, buyer_spec = parse_agent(seller, "seller"), parse_agent(buyers, "buyer")
    return m, seller_spec.build(m, [1, 2]), {b.id: buyer_spec.build(m, [1, 1, k]) for k, b in enumerate(m.buyers)}


async def episode(seller: str, buyers: str, **timeouts):
    m, s, b = agents(seller, buyers)
    with anyio.fail_after(20):
        return await run_episode(m, s, b, **({"seller_timeout": 10, "reply_timeout": 10} | timeouts))


def messages(ep, sender=None) -> list[dict]:
    return [e for e in ep.events if e["type"] == "message" and (sender is None or (e["sender"] == SELLER) == (sender == SELLER))]


def violations(ep) -> list[tuple[str, str]]:
    return [(e["who"], e["kind"]) for e in ep.events if e["type"] == "violation"]


def seller_obs():
    return observe(EpisodeState(market()), SELLER)


# -- the request: structured output per server kind, log-probs, token ids ------------------------------


@pytest.mark.parametrize("role", [SELLER, "buyer"])
@pytest.mark.parametrize("kind", ["vllm", "openai", "llamacpp", "generic"])
async def test_the_schema_goes_where_each_server_reads_it(server, kind, role):
    agent = parse_agent(spec(server, f"server={kind}&format=json"), role).build(market(), 0)
    state = EpisodeState(market())
    if role == SELLER:
        obs = observe(state, SELLER)
    else:
        offer = Message(SELLER, "b1", "", Action("offer", "p1", 400))
        state.seller_send(offer)
        obs = observe(state, "b1", offer)
    generated = await agent.act(obs)
    assert isinstance(generated.result, Message), generated
    body = server.requests[-1]
    schema = json_schema(role)
    assert "guided_json" not in body
    assert (body["logprobs"], body["top_logprobs"]) == (True, 0)
    if kind == "vllm":
        assert body["structured_outputs"] == {"json": schema}  # what current vLLM reads
        assert body["return_token_ids"] is True and "response_format" not in body
        assert body["max_tokens"] == 512
    elif kind == "openai":
        assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": schema["title"], "schema": schema, "strict": False}}
        assert body["max_completion_tokens"] == 512 and "structured_outputs" not in body
    elif kind == "llamacpp":
        assert body["response_format"] == {"type": "json_object", "schema": schema}
    else:
        assert "response_format" not in body and "structured_outputs" not in body
        assert '"action"' in body["messages"][0]["content"]  # the prompt describes the object instead
    # The schema round trip: what the server was told to produce parses back into the message.
    reply = orjson.loads(generated.raw)
    assert set(reply) == set(schema["required"])
    assert generated.result.action.to_dict() == reply["action"]


async def test_tagged_format_sends_no_schema_and_options_reach_the_server(server):
    agent = parse_agent(spec(server, "format=tagged&temperature=0.2&top_p=0.5&max_tokens=77&logprobs=0&think=0"), "seller").build(market(), 5)
    generated = await agent.act(seller_obs())
    assert isinstance(generated.result, Message)
    body = server.requests[-1]
    assert "structured_outputs" not in body and "response_format" not in body
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.2, 0.5, 77)
    assert "logprobs" not in body and "return_token_ids" not in body
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert isinstance(body["seed"], int) and body["seed"] == generated.extra["seed"]
    assert body["messages"] == generated.extra["prompt"]
    assert generated.raw.startswith("Thought:")


async def test_legal_sends_the_regex_of_the_replies_the_rules_allow(server):
    """b1 owes a reply and p1 is on offer to it: the regex lets the seller write only to b2."""
    agent = parse_agent(spec(server, "format=tagged&server=vllm&legal=1"), "seller").build(market(), 5)
    state = EpisodeState(market())
    state.seller_send(Message(SELLER, "b1", "", Action("offer", "p1", 600)))
    obs = observe(state, SELLER)
    await agent.act(obs)
    body = server.requests[-1]
    assert body["structured_outputs"] == {"regex": legal_pattern(obs)}
    assert body["structured_outputs"]["regex"].startswith(r"(Thought: [^\n]{0,160}\n)?(To: b2\nTalk: ")
    assert "To: b1" not in body["structured_outputs"]["regex"]
    assert agent.describe()["params"]["legal"] is True


async def test_the_compact_prompt_is_what_the_server_is_sent(server):
    agent = parse_agent(spec(server, "format=tagged&prompt=compact"), "seller").build(market(), 5)
    state = EpisodeState(market())
    state.seller_send(Message(SELLER, "b1", "", Action("offer", "p1", 600)))
    obs = observe(state, SELLER)
    generated = await agent.act(obs)
    body = server.requests[-1]
    assert body["messages"] == render_seller_compact(obs) == generated.extra["prompt"]
    assert "b1: owes you a reply\n  you: [OFFER] p1 $600\nb2: free" in body["messages"][1]["content"]
    assert agent.describe()["prompt"] == "compact"


# -- whole episodes -------------------------------------------------------------------------------


async def test_an_llm_seller_against_scripted_buyers(server, tmp_path):
    ep = await episode(spec(server), "threshold")
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    sent = messages(ep, SELLER)
    # Buyers answer while the seller's model thinks, so an offer can meet a unit sold meanwhile: a
    # regulator violation, never a malformed message.
    assert sent and not [v for v in violations(ep) if v[1] == "malformed"] and ep.metrics["deals"] >= 1
    extra = sent[0]["extra"]
    assert extra["backend"] == "openai" and extra["model"] == server.model and extra["format"] == "json"
    assert extra["prompt"][0]["role"] == "system" and "You are the seller" in extra["prompt"][0]["content"]
    assert extra["finish_reason"] == "stop" and extra["reasks"] == 0 and extra["retries"] == 0
    assert extra["latency_s"] > 0 and extra["usage"]["completion_tokens"] == len(extra["token_ids"])
    assert len(extra["token_ids"]) == len(extra["logprobs"]) > 0 and extra["prompt_token_ids"]
    assert ep.events[0]["agents"]["seller"]["kind"] == "llm"
    # The trace survives a round trip through a file, and its metrics recompute from it alone.
    with TraceWriter(tmp_path / "t.jsonl") as writer:
        writer.write(ep.events)
    (events,) = list(read_episodes(tmp_path / "t.jsonl"))
    assert events == [orjson.loads(line) for line in encode(ep.events).splitlines()]  # what the writer wrote, read back
    recomputed = metrics_from_events(events)
    assert {k: recomputed[k] for k in ("profit", "welfare", "deals", "valid_rate")} == {k: ep.metrics[k] for k in ("profit", "welfare", "deals", "valid_rate")}


@pytest.mark.parametrize("fmt", ["json", "tagged"])
async def test_llm_buyers_against_a_scripted_seller(server, fmt):
    ep = await episode("greedy", spec(server, f"{FAST}&format={fmt}"))
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    replies = messages(ep, "buyer")
    assert replies and all(e["valid"] for e in replies), replies
    assert all(e["extra"]["prompt"][0]["content"].startswith(f"You are buyer {e['sender']}") for e in replies)
    assert ep.events[0]["agents"]["buyers"]["b1"]["model"] == server.model


async def test_llm_seller_and_llm_buyers_together(server):
    ep = await episode(spec(server), spec(server, f"{FAST}&format=tagged"))
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    assert messages(ep, SELLER) and messages(ep, "buyer")
    assert ep.metrics["deals"] >= 1


# -- retries, malformed and truncated replies, re-asks ---------------------------------------------------


async def test_429_and_500_are_retried(server):
    fast = {"retry-after-ms": "10"}
    server.faults.extend([Fault(status=429, headers=fast), Fault(status=500, headers=fast)])
    agent = parse_agent(spec(server, "retries=2&timeout=5"), SELLER).build(market(), 0)
    generated = await agent.act(seller_obs())
    assert isinstance(generated.result, Message)
    assert generated.extra["retries"] == 2 and len(server.requests) == 3


async def test_a_malformed_reply_is_an_invalid_message_with_its_raw_text(server):
    server.faults.append(Fault(content="{not json at all"))
    ep = await episode(spec(server), "threshold")
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    first = messages(ep, SELLER)[0]
    assert first["valid"] is False and first["raw"] == "{not json at all" and "not valid JSON" in first["error"]
    assert first["extra"]["reasks"] == 0 and first["extra"]["prompt"]
    assert violations(ep).count((SELLER, "malformed")) == 1
    assert messages(ep, SELLER)[1]["valid"]


async def test_a_reask_fixes_a_malformed_reply_and_is_counted(server):
    server.faults.append(Fault(content="Sure! I offer p1 for $400."))
    agent = parse_agent(spec(server, f"{FAST}&format=tagged&reask=2"), SELLER).build(market(), 0)
    generated = await agent.act(seller_obs())
    assert isinstance(generated.result, Message)
    assert generated.extra["reasks"] == 1
    assert generated.extra["attempts"][0]["raw"] == "Sure! I offer p1 for $400."
    second = server.requests[1]["messages"]
    assert second[-2] == {"role": "assistant", "content": "Sure! I offer p1 for $400."}
    assert "no 'Action:' line" in second[-1]["content"] and second[-1]["role"] == "user"
    assert generated.extra["prompt"] == second


async def test_reasks_are_bounded(server):
    server.faults.extend([Fault(content="nope"), Fault(content="still nope"), Fault(content="never")])
    agent = parse_agent(spec(server, f"{FAST}&reask=1"), "buyer").build(market(), 0)
    state = EpisodeState(market())
    offer = Message(SELLER, "b2", "", Action("offer", "p1", 400))
    state.seller_send(offer)
    generated = await agent.act(observe(state, "b2", offer))
    assert isinstance(generated.result, ParseFailure) and generated.raw == "still nope"
    assert generated.extra["reasks"] == 1 and len(server.requests) == 2


async def test_truncated_output_says_it_was_cut_off(server):
    server.faults.append(Fault(content='{"thought": "Let me think about b1, who', finish_reason="length"))
    generated = await parse_agent(spec(server), SELLER).build(market(), 0).act(seller_obs())
    assert isinstance(generated.result, ParseFailure)
    assert "cut off at max_tokens" in generated.result.reason and generated.extra["finish_reason"] == "length"


async def test_an_overpaying_llm_buyer_meets_the_buyer_guard(server):
    def greedy_buyer(body):
        return '{"thought": "", "to": "seller", "talk": "Mine!", "action": {"kind": "accept", "product": "p2", "price": 2000}}'

    server.reply = greedy_buyer
    ep = await episode("scripted:posted", spec(server))
    assert ("b1", "overpay") in violations(ep) or ("b2", "overpay") in violations(ep) or ("b1", "no_standing") in violations(ep)
    assert not [e for e in ep.events if e["type"] == "deal" and e["price"] > e["value"]]


# -- failures that are not the model's: timeouts, a server down, bad keys, unknown models --------------


async def test_a_hanging_seller_request_times_out_and_the_episode_goes_on(server):
    server.faults.append(Fault(delay=30))
    ep = await episode(spec(server, "retries=0&timeout=0.3"), "threshold")  # its 30 s would pass episode()'s 20 s guard
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    assert violations(ep)[0] == (SELLER, "timeout")
    assert messages(ep, SELLER)[1]["valid"]


async def test_a_hanging_buyer_request_is_a_timeout_taken_as_a_reject(server):
    server.faults.append(Fault(delay=30))
    ep = await episode("greedy", spec(server, "retries=0&timeout=0.3"))
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    assert [kind for who, kind in violations(ep) if who != SELLER][:1] == ["timeout"]


async def test_the_bus_deadline_bounds_a_slow_server_too(server):
    server.latency = 30
    ep = await episode(spec(server, "retries=0&timeout=60"), "threshold", seller_timeout=0.2)
    assert ep.outcome == "truncated" and {kind for _, kind in violations(ep)} == {"timeout"}


async def test_a_server_that_is_down_fails_the_episode_with_the_reason():
    url = f"http://127.0.0.1:{free_port()}/v1"
    ep = await episode(f"openai:m@{url}?retries=0&timeout=2", "threshold")
    await aclose_clients()
    assert ep.outcome == "failed" and "LLMError" in ep.reason and "cannot reach the server" in ep.reason and url in ep.reason


async def test_a_wrong_key_fails_the_episode_with_401(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    async with FakeOpenAI(api_key="sk-right") as fake:
        ep = await episode(spec(fake), "threshold")
        await aclose_clients()
    assert ep.outcome == "failed" and "authentication failed (401)" in ep.reason and "$OPENAI_API_KEY" in ep.reason
    assert "sk-wrong" not in orjson.dumps(ep.events).decode()


async def test_the_key_comes_from_the_named_environment_variable(monkeypatch):
    monkeypatch.setenv("NEGOTIATE_TEST_KEY", "sk-right")
    async with FakeOpenAI(api_key="sk-right") as fake:
        ep = await episode(spec(fake, f"{FAST}&key_env=NEGOTIATE_TEST_KEY"), "threshold")
        await aclose_clients()
    assert ep.outcome != "failed", ep.reason
    assert fake.requests[0]["_headers"]["Authorization"] == "Bearer sk-right"
    assert "sk-right" not in orjson.dumps(ep.events).decode()


async def test_an_unknown_model_fails_the_episode_with_404(server):
    ep = await episode(spec(server, model="no-such-model"), "threshold")
    assert ep.outcome == "failed" and "not found (404)" in ep.reason and "no-such-model" in ep.reason


async def test_a_context_overflow_fails_the_episode_with_the_servers_message(server):
    server.faults.append(Fault(status=400, message="This model's maximum context length is 2048 tokens. However, you requested 4100 tokens."))
    ep = await episode("greedy", spec(server))
    assert ep.outcome == "failed" and "request failed (400)" in ep.reason and "maximum context length is 2048" in ep.reason


async def test_a_timeout_is_a_timeout_error_for_the_bus(server):
    server.faults.append(Fault(delay=30))
    agent = parse_agent(spec(server, "retries=0&timeout=0.2"), SELLER).build(market(), 0)
    with pytest.raises(LLMTimeout, match="no reply within 0.2s"):
        await agent.act(seller_obs())
    assert issubclass(LLMTimeout, TimeoutError)


# -- one client per server, and the in-flight bound -------------------------------------------------------


async def test_requests_in_flight_are_bounded_per_server():
    async with FakeOpenAI(latency=0.1, hold=2) as server:  # nothing answered till 2 are in flight
        try:
            agent = parse_agent(spec(server, f"{FAST}&max_inflight=2"), SELLER).build(market(), 0)
            other = parse_agent(spec(server, f"{FAST}&max_inflight=2&format=tagged"), SELLER).build(market(), 1)
            assert _shared(agent.backend.options) is _shared(other.backend.options)  # one client per (URL, key)
            results: list[Generated] = []

            async def one(a):
                results.append(await a.act(seller_obs()))

            began = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for k in range(6):
                    tg.start_soon(one, agent if k % 2 else other)
            assert len(results) == 6 and all(isinstance(r.result, Message) for r in results)
            assert server.max_in_flight == 2
            assert time.perf_counter() - began >= 0.3 - 0.02
            assert min(r.extra["latency_s"] for r in results) >= 0.09  # injected latency shows; queueing does not
        finally:
            await aclose_clients()
