"""The openai backend's HTTP clients against the fake server (tests/fake_openai.py).

Every client (``client=http``, the default, ``aiohttp`` and ``openai``, whose own retries are off) goes through our
one loop: its retries (408/409/429/5xx and connection errors, exponential backoff with jitter, Retry-After honored),
its deadline (the spec's ``timeout``, retries included) and its error classification; these tests pin that down, and
check that every client returns the same :class:`Completion` for the same answer. Every test ends in a few seconds.
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate

import pytest

pytest.importorskip("aiohttp", reason="the aiohttp client and the fake server need aiohttp")

from fake_openai import FakeOpenAI, Fault, free_port  # noqa: E402
from tiny_model import small_market  # noqa: E402

from negotiate.agents.clients import _Limiter, _shared, aclose_clients  # noqa: E402
from negotiate.agents.contract import LLMError, LLMTimeout  # noqa: E402
from negotiate.agents.openai_server import OpenAIBackend, OpenAIOptions, _backoff, _retry_after  # noqa: E402
from negotiate.agents.pools import current_pools  # noqa: E402
from negotiate.agents.registry import parse_agent  # noqa: E402
from negotiate.errors import UserError  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Say something."}]
ANSWER = '{"thought": "t", "to": "b1", "talk": "hello there", "action": {"kind": "end", "product": null, "price": null}}'


@pytest.fixture(params=["http", "aiohttp", "openai"])
def ours(request) -> str:
    """Every client, through our loop: the same retries, deadline and errors."""
    if request.param == "openai":
        from needs import openai_client_missing

        if openai_client_missing():
            pytest.skip(openai_client_missing())
    return request.param


@pytest.fixture
async def server():
    async with FakeOpenAI(lambda body: ANSWER) as fake:
        yield fake
        await aclose_clients()


def backend(server: FakeOpenAI | None, *, url: str | None = None, **options) -> OpenAIBackend:
    values = {"model": server.model if server else "m", "base_url": url or server.url, "retries": 1, "timeout": 5.0} | options
    return OpenAIBackend(OpenAIOptions(**values))


# -- the spec key --------------------------------------------------------------------------------------


def test_the_client_key_defaults_to_http_and_takes_aiohttp_and_openai():
    assert OpenAIOptions(**parse_agent("openai:m@http://h/v1", "seller").params).client == "http"
    assert OpenAIOptions(**parse_agent("openai:m@http://h/v1?client=aiohttp", "seller").params).client == "aiohttp"
    assert OpenAIOptions(**parse_agent("openai:m@http://h/v1?client=openai", "buyer").params).client == "openai"
    with pytest.raises(UserError, match="client='httpx' is not one of http, aiohttp, openai"):
        parse_agent("openai:m@http://h/v1?client=httpx", "seller")


# -- answers: the same Completion from either client --------------------------------------------------


@pytest.mark.parametrize("client", ["http", "aiohttp", "openai"])
async def test_every_client_reads_the_same_completion(server, client):
    if client == "openai":
        pytest.importorskip("openai")
    completion = await backend(server, client=client).complete(MESSAGES, role="seller", seed=7)
    assert completion.text == ANSWER and completion.finish_reason == "stop" and completion.model == server.model
    assert completion.retries == 0 and completion.latency_s > 0
    words = ANSWER.split(" ")
    assert completion.token_ids == [1000 + k for k in range(len(words))] and completion.logprobs == [-0.25] * len(words)
    assert completion.usage["completion_tokens"] == len(words) and completion.prompt_token_ids
    body = server.requests[-1]
    assert body["seed"] == 7 and body["messages"] == MESSAGES and body["return_token_ids"] is True
    assert body["_headers"]["Content-Type"].startswith("application/json")


async def test_the_key_is_sent_as_a_bearer_token(server, monkeypatch):
    monkeypatch.setenv("NEGOTIATE_CLIENT_TEST_KEY", "sk-test")
    await backend(server, key_env="NEGOTIATE_CLIENT_TEST_KEY").complete(MESSAGES, role="buyer")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    await backend(server).complete(MESSAGES, role="buyer")
    assert [r["_headers"]["Authorization"] for r in server.requests] == ["Bearer sk-test", "Bearer EMPTY"]


async def test_one_client_per_server_and_key_closed_at_the_end(server, ours):
    a, b = backend(server, client=ours), backend(server, client=ours, format="tagged", max_inflight=3)
    await a.complete(MESSAGES, role="seller")
    await b.complete(MESSAGES, role="seller")
    shared = _shared(a.options)
    assert shared is _shared(b.options) and shared.limiter.total_tokens == 3
    client = shared.http if ours == "http" else shared.session
    assert client is not None and (shared.session if ours == "http" else shared.http) is None  # only the one used
    if ours == "http":
        # Two requests in turn: every connection kept alive (the second opens its own unless the first has settled).
        assert 1 <= len(client._open) == len(client._idle) <= 2
    await aclose_clients()
    assert client.closed and not current_pools().has_clients()


async def test_a_runs_pools_are_its_own_and_close_with_it(server):
    from negotiate.agents.clients import shared_clients
    from negotiate.agents.pools import Pools, use_pools

    pools = Pools(max_inflight=5)
    with use_pools(pools):
        inside = backend(server)
        await inside.complete(MESSAGES, role="seller")
        assert current_pools() is pools and pools.has_clients()
    assert current_pools() is not pools and not current_pools().has_clients()  # nothing leaked outside the run
    assert shared_clients(pools, inside.options).limiter.total_tokens == 5  # the run's --max-inflight, not the spec's 256
    pool = shared_clients(pools, inside.options).http
    await pools.aclose()
    assert pool.closed and not pools.has_clients()


# -- retries -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503])
async def test_retryable_statuses_are_retried(server, status, ours):
    server.faults.append(Fault(status=status, headers={"retry-after-ms": "10"}))
    completion = await backend(server, client=ours).complete(MESSAGES, role="seller")
    assert completion.retries == 1 and completion.text == ANSWER and len(server.requests) == 2


async def test_retry_after_in_seconds_is_honored(server, ours):
    server.faults.append(Fault(status=429, headers={"retry-after": "0.4"}))
    began = time.perf_counter()
    completion = await backend(server, client=ours).complete(MESSAGES, role="seller")
    assert completion.retries == 1 and time.perf_counter() - began >= 0.38
    assert completion.latency_s >= 0.38  # the wait counts in the request's latency


async def test_without_retry_after_the_backoff_is_exponential_with_jitter(server, ours):
    server.faults.extend([Fault(status=500), Fault(status=500)])
    began = time.perf_counter()
    completion = await backend(server, client=ours, retries=2).complete(MESSAGES, role="seller")
    waited = time.perf_counter() - began
    assert completion.retries == 2 and waited >= 0.375 + 0.75 - 0.02  # 0.5 s then 1 s, less up to a quarter (at most: the rules' test)


def test_backoff_and_retry_after_rules(monkeypatch):
    from types import SimpleNamespace

    from negotiate.agents import openai_server

    assert _retry_after(None) is None and _retry_after({}) is None
    assert _retry_after({"retry-after-ms": "250"}) == 0.25 and _retry_after({"retry-after": "3"}) == 3.0
    # an HTTP date (whole seconds) 2 s after the clock's now (it was the real clock's: a now late in its second,
    # or read a moment later, made it less than the 1 s asserted)
    monkeypatch.setattr(openai_server, "time", SimpleNamespace(time=lambda: 1_800_000_000.0))
    assert _retry_after({"retry-after": formatdate(1_800_000_002, usegmt=True)}) == 2.0
    monkeypatch.undo()
    assert _retry_after({"retry-after": "soon"}) is None
    assert _backoff(0, {"retry-after": "2"}) == 2.0
    for attempt, high in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (10, 8.0)]:
        for _ in range(50):
            assert 0.75 * high <= _backoff(attempt, None) <= high
    # A Retry-After beyond a minute, zero or negative gets the usual backoff instead.
    for value in ("120", "0", "-1"):
        assert 0.375 <= _backoff(0, {"retry-after": value}) <= 0.5


async def test_x_should_retry_overrides_the_status(server, ours):
    server.faults.append(Fault(status=500, message="do not retry me", headers={"x-should-retry": "false"}))
    with pytest.raises(LLMError, match=r"request failed \(500\): do not retry me"):
        await backend(server, client=ours, retries=2).complete(MESSAGES, role="seller")
    assert len(server.requests) == 1
    server.faults.append(Fault(status=400, headers={"x-should-retry": "true", "retry-after-ms": "1"}))
    assert (await backend(server, client=ours).complete(MESSAGES, role="seller")).retries == 1


async def test_5xx_after_its_retries_is_an_error_with_the_servers_message(server, ours):
    server.faults.extend([Fault(status=503, message="overloaded", headers={"retry-after-ms": "1"})] * 3)
    with pytest.raises(LLMError, match=r"request failed \(503\): overloaded") as caught:
        await backend(server, client=ours, retries=2).complete(MESSAGES, role="seller")
    assert len(server.requests) == 3 and server.url in str(caught.value)


async def test_429_after_its_retries_says_rate_limited(server, ours):
    server.faults.extend([Fault(status=429, headers={"retry-after-ms": "1"})] * 2)
    with pytest.raises(LLMError, match=r"rate limited \(429\) after 1 retries: Rate limit reached"):
        await backend(server, client=ours).complete(MESSAGES, role="seller")


# -- errors that are not retried -------------------------------------------------------------------


async def test_400_is_not_retried_and_keeps_the_servers_message(server, ours):
    server.faults.append(Fault(status=400, message="maximum context length is 2048 tokens"))
    with pytest.raises(LLMError, match=r"request failed \(400\): maximum context length is 2048 tokens"):
        await backend(server, client=ours, retries=3).complete(MESSAGES, role="seller")
    assert len(server.requests) == 1


async def test_401_names_the_key_variable_and_is_not_retried(monkeypatch, ours):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    async with FakeOpenAI(lambda body: ANSWER, api_key="sk-right") as fake:
        with pytest.raises(LLMError, match=r"authentication failed \(401\): Incorrect API key provided.; set the key in \$OPENAI_API_KEY") as caught:
            await backend(fake, client=ours, retries=3).complete(MESSAGES, role="seller")
        await aclose_clients()
    assert len(fake.requests) == 1 and "sk-wrong" not in str(caught.value)


async def test_403_and_404(server, ours):
    server.faults.append(Fault(status=403, message="no access"))
    with pytest.raises(LLMError, match=r"permission denied \(403\): no access"):
        await backend(server, client=ours).complete(MESSAGES, role="seller")
    with pytest.raises(LLMError, match=r"not found \(404\): The model `nope` does not exist.*GET .*/models"):
        await backend(server, client=ours, model="nope").complete(MESSAGES, role="seller")


# -- timeouts and a server that is down ------------------------------------------------------------


async def test_a_hang_is_an_llm_timeout_at_the_spec_timeout_not_one_per_retry(server, ours):
    # timeout is the request's deadline, retries included: a hang takes all of it, and no retry follows (each
    # attempt had a timeout of its own before: 0.2 s, a backoff, 0.2 s more).
    server.faults.extend([Fault(delay=30), Fault(delay=30)])
    began = time.perf_counter()
    with pytest.raises(LLMTimeout, match=r"no reply within 0.2s \(the spec's timeout, 0 retries included\)") as caught:
        await backend(server, client=ours, timeout=0.2).complete(MESSAGES, role="seller")
    assert isinstance(caught.value, TimeoutError) and len(server.requests) == 1
    assert time.perf_counter() - began < 0.7


async def test_the_deadline_counts_every_attempt_and_every_wait(server, ours):
    # A 503 (0.2 s to wait), then a hang: the retry gets what is left of the 0.6 s, not 0.6 s of its own.
    server.faults.extend([Fault(status=503, headers={"retry-after-ms": "200"}), Fault(delay=30)])
    began = time.perf_counter()
    with pytest.raises(LLMTimeout, match=r"no reply within 0.6s \(the spec's timeout, 1 retry included\)"):
        await backend(server, client=ours, timeout=0.6, retries=2).complete(MESSAGES, role="seller")
    took = time.perf_counter() - began
    assert len(server.requests) == 2 and 0.6 <= took < 1.5  # a timeout per attempt: 2.1 s at the least


async def test_a_refused_connection_says_cannot_reach_the_server(ours):
    url = f"http://127.0.0.1:{free_port()}/v1"
    began = time.perf_counter()
    with pytest.raises(LLMError, match=r"cannot reach the server \(ConnectionRefusedError") as caught:
        await backend(None, client=ours, url=url, retries=1).complete(MESSAGES, role="seller")
    await aclose_clients()
    assert url in str(caught.value) and time.perf_counter() - began > 0.3  # retried once, after a backoff (0.375-0.5 s)


async def test_an_answer_that_is_not_json_is_an_llm_error(ours):
    from aiohttp import web

    async def chat(request):
        return web.Response(text="<html>proxy error</html>", content_type="text/html")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
    try:
        with pytest.raises(LLMError, match="the server's answer is not JSON"):
            await backend(None, client=ours, url=url).complete(MESSAGES, role="seller")
    finally:
        await aclose_clients()
        await runner.cleanup()


# -- the in-flight bound ----------------------------------------------------------------------------


async def settle() -> None:
    """Let every task run till it waits on something outside the loop: some turns of the loop, not a time."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_limiter_is_fifo_resizable_and_survives_cancellation():
    limiter = _Limiter(1)
    order: list[int] = []
    release = asyncio.Event()

    async def hold(k: int):
        async with limiter:
            order.append(k)
            await release.wait()

    first = asyncio.create_task(hold(0))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(hold(k)) for k in (1, 2, 3)]
    await settle()
    assert order == [0] and limiter.borrowed_tokens == 1
    waiting[0].cancel()  # a cancelled waiter gives up its place
    await settle()
    limiter.total_tokens = 2  # a larger bound wakes the next waiter at once
    await settle()
    assert order == [0, 2] and limiter.borrowed_tokens == 2
    release.set()
    await asyncio.gather(first, *waiting[1:])
    assert order == [0, 2, 3] and limiter.borrowed_tokens == 0


async def test_a_waiter_cancelled_after_its_grant_passes_the_slot_on():
    limiter = _Limiter(1)
    await limiter.__aenter__()
    late = asyncio.create_task(limiter.__aenter__())
    after = asyncio.create_task(limiter.__aenter__())
    await asyncio.sleep(0)
    await limiter.__aexit__(None, None, None)  # grants the slot to `late` ...
    late.cancel()  # ... which is cancelled before it runs
    await settle()
    assert after.done() and limiter.borrowed_tokens == 1
    await limiter.__aexit__(None, None, None)
    assert limiter.borrowed_tokens == 0


async def test_the_max_inflight_flag_overrides_every_spec():
    from negotiate.agents import clients
    from negotiate.agents.clients import set_max_inflight
    from negotiate.agents.openai_server import parse_openai_spec

    options = parse_openai_spec("m@http://127.0.0.1:9/v1?max_inflight=50", field="--seller", text="x")
    set_max_inflight(3)
    try:
        assert clients._shared(options).limiter.total_tokens == 3
    finally:
        set_max_inflight(None)
        await clients.aclose_clients()
    assert clients._shared(options).limiter.total_tokens == 50
    await clients.aclose_clients()


def test_the_max_inflight_flag_reaches_the_runs_pools_and_ends_with_the_command(tmp_path, monkeypatch):
    from negotiate.agents import pools
    from negotiate.cli import main

    made = []

    class Recorded(pools.Pools):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            made.append(self)

    monkeypatch.setattr("negotiate.cli_runs.Pools", Recorded)
    assert main(["serve", "--seller", "greedy", "--episodes", "1", "--max-inflight", "7", "--out", str(tmp_path / "r"), "--quiet"]) == 0
    assert [p.max_inflight for p in made] == [7]  # one pools object for the command, holding the flag
    assert pools.current_pools() is not made[0] and pools.current_pools().max_inflight is None  # nothing left behind


# -- before a run: GET /models (the server answers, the key works, the model is served, which server) ----


@pytest.mark.parametrize(("owned_by", "kind", "field"), [("vllm", "vllm", "structured_outputs"), ("me", "llamacpp", "response_format"),
                                                          ("someone", "vllm", "structured_outputs")])
async def test_server_auto_shapes_requests_for_the_server_found(owned_by, kind, field):
    from negotiate.agents.llm import preflight

    async with FakeOpenAI(lambda body: ANSWER, owned_by=owned_by) as server:
        spec = parse_agent(f"openai:{server.model}@{server.url}?max_tokens=32", "seller")
        await preflight(spec)
        agent = spec.build(small_market(), 0)
        assert agent.backend.server == kind and agent.describe()["server"] == kind
        await agent.backend.complete([{"role": "user", "content": "x"}], role="seller")
        body = server.requests[-1]
        assert field in body and ("response_format" in body) == (kind == "llamacpp")
        if kind == "llamacpp":
            assert body["response_format"]["type"] == "json_object" and body["response_format"]["schema"]["title"] == "SellerMessage"
        await preflight(spec)
        assert server.model_lists == 2  # asked before each run
    await aclose_clients()


async def test_an_explicit_server_kind_is_kept_whatever_the_server_says():
    from negotiate.agents.llm import preflight

    async with FakeOpenAI(owned_by="me") as server:
        spec = parse_agent(f"openai:{server.model}@{server.url}?server=generic", "buyer")
        await preflight(spec)
        assert spec.build(small_market(), 0).backend.server == "generic"
    await aclose_clients()


def serve_llm(out, seller: str) -> int:
    from negotiate.cli import main

    return main(["serve", "--seller", seller, "--episodes", "3", "--out", str(out), "--quiet"])


def test_a_run_against_a_server_that_is_down_stops_before_any_episode(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    assert serve_llm(tmp_path / "r", f"openai:m@{url}") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("negotiate serve: error: --seller: ") and "cannot reach the server" in last and url in last, last
    assert not (tmp_path / "r").exists()  # nothing written: the same command runs once the server is up


@pytest.mark.parametrize(("kwargs", "model", "expected"), [
    ({}, "no-such-model", "does not serve 'no-such-model'; it serves fake-model"),
    ({"api_key": "right"}, "fake-model", "authentication failed (401)"),
])
def test_a_wrong_model_or_key_stops_the_run_naming_the_spec(tmp_path, capsys, monkeypatch, kwargs, model, expected):
    from fake_openai import serve_in_thread

    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    with serve_in_thread(**kwargs) as server:
        assert serve_llm(tmp_path / "r", f"openai:{model}@{server.url}") == 2
        assert server.requests == []  # no chat request was made
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("negotiate serve: error: --seller: ") and expected in last, last


def test_a_server_without_a_models_list_is_taken_on_trust(tmp_path):
    from fake_openai import serve_in_thread

    with serve_in_thread(owned_by=None) as server:
        assert serve_llm(tmp_path / "r", f"openai:{server.model}@{server.url}?max_tokens=32") == 0
        assert server.model_lists == 2 and server.requests  # before anything is written, and as the run starts


def test_every_request_is_logged_with_its_latency(tmp_path):
    import orjson

    from fake_openai import serve_in_thread

    with serve_in_thread(latency=0.01) as server:
        assert serve_llm(tmp_path / "r", f"openai:{server.model}@{server.url}?max_tokens=32") == 0
        requests = len(server.requests)
    lines = [orjson.loads(line) for line in (tmp_path / "r" / "requests.log.jsonl").read_bytes().splitlines()]
    assert requests and requests - 3 <= len(lines) <= requests + 3  # a cancelled request may or may not have gone out
    assert {line["role"] for line in lines} == {"seller"} and all(line["model"] == server.model and line["timestamp"] for line in lines)
    answered = [line for line in lines if line["event"] == "llm request"]
    assert all(line["latency_s"] >= 0.01 and line["completion_tokens"] > 0 for line in answered)
    # A request still out when its market closed (the last unit sold) is logged as cancelled.
    assert {line["event"] for line in lines} <= {"llm request", "llm request cancelled"} and len(answered) >= requests - 3


def test_a_base_url_without_v1_is_named(tmp_path, capsys):
    from fake_openai import serve_in_thread

    with serve_in_thread() as server:
        root = server.url.removesuffix("/v1")
        assert serve_llm(tmp_path / "r", f"openai:{server.model}@{root}") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "not found (404)" in last and f"like {root}/v1" in last, last


def test_eval_names_its_own_flag(tmp_path, capsys):
    from negotiate.cli import main

    url = f"http://127.0.0.1:{free_port()}/v1"
    assert main(["eval", "--sellers", f"greedy,openai:m@{url}", "--splits", "train", "--episodes", "2", "--out", str(tmp_path / "e"),
                 "--quiet"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("negotiate eval: error: --seller: ") and "cannot reach the server" in last, last  # one spelling (--sellers: an alias)
    assert not (tmp_path / "e").exists()


def test_revive_takes_the_server_for_up_again():
    # What a replica set calls when a drained replica answers or is tried again (it no longer writes the fields itself).
    backend = OpenAIBackend(OpenAIOptions("m", "http://127.0.0.1:9/v1"))
    backend.down, backend.timeouts_in_a_row = "the server at http://127.0.0.1:9/v1 is down", 3
    backend.revive()
    assert (backend.down, backend.timeouts_in_a_row) == (None, 0)
