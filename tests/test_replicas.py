"""Several model servers behind one spec (``openai:MODEL@URL|URL``): balance, failover, revival, all down.

Against the stand-in server (tests/fake_openai.py): which replica a request goes to is decided before any
network work, so the counts below are exact. The last test runs two real llama.cpp servers (marked
``llamacpp``), kills one mid-run and checks that every episode finished exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pytest.importorskip("aiohttp", reason="the aiohttp client and the fake server need aiohttp")

from fake_openai import FakeOpenAI, Fault, free_port, serve_in_thread  # noqa: E402

from negotiate.agents.backends import LLMError, LLMTimeout, OpenAIOptions, aclose_clients  # noqa: E402
from negotiate.agents.registry import parse_agent  # noqa: E402
from negotiate.agents.replicas import ReplicaBackend  # noqa: E402
from negotiate.errors import UserError  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Say something."}]
ANSWER = '{"thought": "t", "to": "b1", "talk": "hello", "action": {"kind": "end", "product": null, "price": null}}'


@pytest.fixture(params=["http", "aiohttp", "openai"])
def client(request) -> str:
    """Every client fails over alike (their errors are the same classes)."""
    if request.param == "openai":
        from needs import openai_client_missing

        if openai_client_missing():
            pytest.skip(openai_client_missing())
    return request.param


POOLS: list = []
"""The pools of the test running (:func:`closing`): every replica backend a test makes uses them, whichever task
sends its requests (a task started by ``asyncio.gather`` would make pools of its own in its copy of the context, and
nothing would close their clients)."""


@pytest.fixture
async def closing():
    from negotiate.agents.pools import Pools

    POOLS.append(Pools())
    yield
    await POOLS.pop().aclose()
    await aclose_clients()


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


def replicas(*urls: str, revive_s: float = 30.0, **options) -> ReplicaBackend:
    values = {"model": "fake-model", "base_url": "|".join(urls), "retries": 1, "timeout": 5.0} | options
    return ReplicaBackend(OpenAIOptions(**values), revive_s=revive_s, pools=POOLS[-1] if POOLS else None)


# -- the spec ------------------------------------------------------------------------------------------


def test_a_spec_names_replicas_joined_by_a_bar():
    spec = parse_agent("openai:m@http://a:8000/v1|http://b:8001/v1/?format=tagged&retries=1", "seller")
    options = OpenAIOptions(**spec.params)
    assert options.base_urls == ("http://a:8000/v1", "http://b:8001/v1") and options.base_url == "http://a:8000/v1|http://b:8001/v1"
    assert (options.format, options.retries) == ("tagged", 1)
    assert OpenAIOptions(**parse_agent("openai:m@http://a:8000/v1", "buyer").params).base_urls == ("http://a:8000/v1",)


@pytest.mark.parametrize(("text", "problem"), [
    ("openai:m@http://a/v1|ftp://b/v1", "base URL 'ftp://b/v1' is not an http(s) URL"),
    ("openai:m@http://a/v1|", "base URL '' is not an http(s) URL"),
    ("openai:m@http://a/v1|http://a/v1/", "base URL http://a/v1 is given twice"),
    ("openai:m@http://a/v1|http://u:p@b/v1", "put no credentials in the base URL"),
    ("openai:m@http://a/v1|http://[::1/v1", "base URL 'http://[::1/v1' is not a valid URL (Invalid IPv6 URL)"),  # a traceback
])
def test_a_bad_replica_url_is_one_line_naming_it(text, problem):
    with pytest.raises(UserError, match="--seller") as caught:
        parse_agent(text, "seller")
    assert problem in str(caught.value) and text in str(caught.value)


def test_a_comma_between_urls_is_told_to_use_a_bar():
    with pytest.raises(UserError, match=r"holds several URLs; separate replicas with \|, like"):
        parse_agent("openai:m@http://a:1/v1,http://b:2/v1", "seller")  # --seller splits on commas first anyway


def test_one_backend_per_spec_and_its_agents_share_it():
    from tiny_model import small_market

    spec = parse_agent("openai:m@http://a:1/v1|http://b:2/v1", "seller")
    first, second = spec.build(small_market(), 1), spec.build(small_market(), 2)
    assert isinstance(first.backend, ReplicaBackend) and first.backend is second.backend
    assert [r.url for r in first.backend.replicas] == ["http://a:1/v1", "http://b:2/v1"]
    assert first.describe()["replicas"] == 2 and first.describe()["base_url"] == "http://a:1/v1|http://b:2/v1"


# -- balance -------------------------------------------------------------------------------------------


def test_the_pick_is_the_fewest_in_flight_and_ties_go_in_turn():
    backend = replicas("http://a:1/v1", "http://b:2/v1", "http://c:3/v1")
    a, b, c = backend.replicas
    a.in_flight, b.in_flight, c.in_flight = 2, 0, 1
    assert backend.pick() is b
    assert backend.pick(tried=[b]) is c
    a.in_flight = b.in_flight = c.in_flight = 1
    assert [backend.pick() for _ in range(4)] == [a, b, c, a]  # after c (picked above): the turn goes on from a
    backend.drain(b, "gone")
    assert [backend.pick() for _ in range(3)] == [c, a, c]
    assert backend.pick(tried=[a, c]) is None


def test_a_stalled_replica_gets_a_request_only_when_every_live_one_is_stalled():
    backend = replicas("http://a:1/v1", "http://b:2/v1", timeout=5.0)
    a, b = backend.replicas
    now = time.monotonic()
    a.in_flight, a.progress_at = 1, now - 6.0  # a hung server: one request out, nothing back for 6 s > timeout
    b.in_flight, b.progress_at = 3, now - 1.0  # busier, but answering
    assert [backend.pick() for _ in range(3)] == [b, b, b]
    b.progress_at = now - 7.0
    assert backend.pick() is a  # both stalled: fewest in flight again
    a.progress_at = now
    assert backend.pick() is a


async def test_concurrent_requests_are_spread_evenly(closing, client):
    async with FakeOpenAI(lambda body: ANSWER, latency=0.2) as one, FakeOpenAI(lambda body: ANSWER, latency=0.2) as two:
        backend = replicas(one.url, two.url, client=client)
        answers = await asyncio.gather(*(backend.complete(MESSAGES, role="seller") for _ in range(8)))
        assert [a.text for a in answers] == [ANSWER] * 8
        assert (len(one.requests), len(two.requests)) == (4, 4)  # each picked before any answer came: 4 in flight each
        assert (one.max_in_flight, two.max_in_flight) == (4, 4)
        assert [r.in_flight for r in backend.replicas] == [0, 0] and [r.answered for r in backend.replicas] == [4, 4]


async def test_one_request_at_a_time_takes_turns(closing):
    async with FakeOpenAI(lambda body: ANSWER) as one, FakeOpenAI(lambda body: ANSWER) as two:
        backend = replicas(one.url, two.url)
        for _ in range(5):
            await backend.complete(MESSAGES, role="seller")
        assert (len(one.requests), len(two.requests)) == (3, 2)


# -- failover --------------------------------------------------------------------------------------------


async def test_a_replica_that_is_down_is_drained_and_the_request_answered_by_another(closing, client):
    async with FakeOpenAI(lambda body: ANSWER) as up:
        down = dead_url()
        backend = replicas(down, up.url, client=client, retries=0)
        for _ in range(4):
            assert (await backend.complete(MESSAGES, role="seller")).text == ANSWER
        first, second = backend.replicas
        assert "cannot reach the server" in first.drained and "ConnectionRefused" in first.drained
        assert second.drained is None and len(up.requests) == 4 and (first.answered, second.answered) == (0, 4)


async def test_a_replica_that_dies_mid_answer_has_its_request_answered_by_another(closing, client):
    arrived = asyncio.Event()
    async with FakeOpenAI(lambda body: ANSWER) as dying, FakeOpenAI(lambda body: ANSWER) as other:
        dying.on_request = lambda body: arrived.set()
        dying.faults.append(Fault(delay=30))  # it holds the request until it dies
        backend = replicas(dying.url, other.url, client=client, retries=1)
        request = asyncio.ensure_future(backend.complete(MESSAGES, role="seller"))
        await asyncio.wait_for(arrived.wait(), 10)
        kill(dying)
        completion = await asyncio.wait_for(request, 20)
        assert completion.text == ANSWER and len(dying.requests) == 1 and len(other.requests) == 1
        assert "cannot reach the server" in backend.replicas[0].drained and backend.replicas[1].drained is None


async def test_a_timeout_is_retried_on_another_replica_and_three_in_a_row_drain_it(closing, client):
    async with FakeOpenAI(lambda body: ANSWER) as slow, FakeOpenAI(lambda body: ANSWER) as fast:
        slow.faults.extend(Fault(delay=30) for _ in range(3))
        backend = replicas(slow.url, fast.url, client=client, timeout=0.3, retries=0)
        for _ in range(4):  # slow first each time it is live (the turn comes back to it), fast after its timeout
            assert (await backend.complete(MESSAGES, role="seller")).text == ANSWER
        assert len(slow.requests) == 3 and len(fast.requests) == 4
        assert backend.replicas[0].drained.endswith("is down: 3 requests in a row timed out")


async def test_a_drained_replicas_queued_requests_go_to_the_live_one_without_reaching_it(closing, client):
    # One slot each, 10 requests dealt 5 and 5 before any answer: the hung replica's 5 queue for its slot. Its first
    # three time out in turn (0.3 s each) and drain it; the 2 still queued go to the other at once. (They used to take
    # its slot in turn and wait out a timeout each: 5 requests reached it.)
    async with FakeOpenAI(lambda body: ANSWER) as hung, FakeOpenAI(lambda body: ANSWER) as live:
        hung.faults.extend(Fault(delay=30) for _ in range(10))
        backend = replicas(hung.url, live.url, client=client, timeout=0.3, retries=0, max_inflight=1)
        answers = await asyncio.gather(*(backend.complete(MESSAGES, role="seller") for _ in range(10)))
        assert [a.text for a in answers] == [ANSWER] * 10
        assert len(hung.requests) == 3 and len(live.requests) == 10  # 5 its own, 3 after their timeout, 2 moved
        assert backend.replicas[0].drained.endswith("is down: 3 requests in a row timed out")
        assert [r.in_flight for r in backend.replicas] == [0, 0] and backend.replicas[0].attempts == set()


async def test_draining_a_replica_sends_its_unanswered_requests_to_another_at_once(closing):
    async with FakeOpenAI(lambda body: ANSWER) as stuck, FakeOpenAI(lambda body: ANSWER) as live:
        stuck.faults.extend(Fault(delay=30) for _ in range(2))  # sent, and held for 30 s
        backend = replicas(stuck.url, live.url, timeout=30.0, retries=0)
        requests = [asyncio.ensure_future(backend.complete(MESSAGES, role="seller")) for _ in range(4)]
        while len(stuck.requests) < 2 or len(live.requests) < 2:
            await asyncio.sleep(0.01)
        backend.drain(backend.replicas[0], "taken out by hand")
        answers = await asyncio.wait_for(asyncio.gather(*requests), 10)  # not the 30 s the stuck server holds them
        assert [a.text for a in answers] == [ANSWER] * 4 and len(live.requests) == 4
        assert backend.replicas[0].drained == "taken out by hand" and backend.replicas[0].answered == 0


async def test_a_5xx_goes_to_another_replica_and_a_400_does_not(closing):
    async with FakeOpenAI(lambda body: ANSWER) as one, FakeOpenAI(lambda body: ANSWER) as two:
        backend = replicas(one.url, two.url, retries=0)
        one.faults.append(Fault(status=503))
        assert (await backend.complete(MESSAGES, role="seller")).text == ANSWER
        assert (len(one.requests), len(two.requests)) == (1, 1) and backend.replicas[0].drained is None
        one.faults.append(Fault(status=400, message="context overflow"))
        with pytest.raises(LLMError, match=r"request failed \(400\): context overflow") as caught:
            await backend.complete(MESSAGES, role="seller")  # the same request would overflow any replica
        assert caught.value.status == 400 and (len(one.requests), len(two.requests)) == (2, 1)


async def test_when_every_replica_is_down_requests_fail_with_one_reason(closing, client):
    urls = dead_url(), dead_url()
    backend = replicas(*urls, client=client, retries=0)
    with pytest.raises(LLMError) as caught:
        await backend.complete(MESSAGES, role="seller")
    message = str(caught.value)
    assert caught.value.unreachable
    assert message.startswith(f"fake-model at {urls[0]}|{urls[1]}: all 2 replicas are down (")
    assert all(f"{url}: cannot reach the server" in message for url in urls), message
    drained_at = [r.drained_at for r in backend.replicas]
    with pytest.raises(LLMError, match="all 2 replicas are down"):
        await backend.complete(MESSAGES, role="seller")
    assert [r.drained_at for r in backend.replicas] == drained_at  # failed at once: neither was tried again


async def test_a_timeout_on_the_last_live_replica_stays_a_timeout(closing):
    async with FakeOpenAI(lambda body: ANSWER) as only:
        only.faults.append(Fault(delay=30))
        backend = replicas(dead_url(), only.url, timeout=0.3, retries=0)
        with pytest.raises(LLMTimeout):  # the bus takes it as the agent's silence, as with one server
            await backend.complete(MESSAGES, role="seller")
        assert backend.replicas[0].drained and backend.replicas[1].drained is None


async def test_a_drained_replica_that_answers_again_rejoins(closing):
    async with FakeOpenAI(lambda body: ANSWER) as flaky, FakeOpenAI(lambda body: ANSWER) as steady:
        flaky.faults.extend(Fault(delay=30) for _ in range(3))
        backend = replicas(flaky.url, steady.url, timeout=0.3, retries=0, revive_s=0.0)
        for _ in range(3):
            await backend.complete(MESSAGES, role="seller")
        assert backend.replicas[0].drained is not None and backend.replicas[0].backend.down is not None
        await backend.complete(MESSAGES, role="seller")  # revive_s has passed: this one tries it, and it answers
        assert backend.replicas[0].drained is None and backend.replicas[0].backend.down is None
        assert len(flaky.requests) == 4 and backend.replicas[0].answered == 1
        assert flaky.model_lists == 1  # never checked before: its models asked first


# -- the check before a run -----------------------------------------------------------------------------


async def test_the_check_before_a_run_drains_an_unreachable_replica_and_starts(closing):
    async with FakeOpenAI(lambda body: ANSWER) as up:
        backend = replicas(dead_url(), up.url)
        await backend.preflight()
        assert backend.replicas[0].drained and backend.replicas[1].drained is None and up.model_lists == 1
        with pytest.raises(LLMError, match="all 2 replicas are down"):
            await replicas(dead_url(), dead_url()).preflight()


async def test_the_check_before_a_run_stops_it_for_a_replica_that_serves_another_model(closing):
    async with FakeOpenAI(lambda body: ANSWER) as right, FakeOpenAI(lambda body: ANSWER, model="other") as wrong:
        with pytest.raises(LLMError, match=f"fake-model at {wrong.url}: the server does not serve 'fake-model'"):
            await replicas(right.url, wrong.url).preflight()


# -- a run -----------------------------------------------------------------------------------------------


def kill(server: FakeOpenAI) -> None:
    """From any thread: ``server`` dies as a killed process does. The requests it holds get no answer (their
    connections reset) and its port stops listening."""

    async def die() -> None:
        for site in [*server._runner.sites]:
            await site.stop()
        for transport in [*server._runner.server._connections.values()]:  # busy and idle keep-alive ones alike
            transport.abort()

    asyncio.run_coroutine_threadsafe(die(), server.loop)


def episodes_of(out) -> list[dict]:
    """Every episode_end of a run's traces."""
    ends = []
    for path in sorted(out.glob("*.jsonl")):
        if path.name.endswith(".log.jsonl"):
            continue
        ends += [event for line in path.read_bytes().splitlines() if (event := json.loads(line))["type"] == "episode_end"]
    return ends


def test_a_run_whose_replica_stops_mid_run_finishes_every_episode_once(tmp_path):
    from negotiate.cli import main

    with serve_in_thread(latency=0.02) as one, serve_in_thread(latency=0.02) as two:
        one.on_request = lambda body: kill(one) if len(one.requests) == 6 else None  # dies with its 6th request in flight
        spec = f"openai:{one.model}@{one.url}|{two.url}?format=tagged&max_tokens=32&retries=1"
        code = main(["serve", "--seller", spec, "--episodes", "12", "--concurrency", "4", "--out", str(tmp_path / "r"), "--quiet"])
    ends = episodes_of(tmp_path / "r")
    assert code == 0 and len(ends) == 12 and len({end["episode"] for end in ends}) == 12
    assert not [end for end in ends if end["outcome"] == "failed"]
    assert len(one.requests) == 6 and len(two.requests) > 12  # the first served until it stopped, the second the rest
    log = [json.loads(line) for line in (tmp_path / "r" / "requests.log.jsonl").read_bytes().splitlines()]
    drained = [line for line in log if line["event"] == "replica drained"]
    assert [line["base_url"] for line in drained] == [one.url] and "cannot reach the server" in drained[0]["reason"]


def test_a_run_whose_replicas_are_all_down_stops_before_any_episode_with_one_line(tmp_path, capsys):
    from negotiate.cli import main

    urls = dead_url(), dead_url()
    code = main(["serve", "--seller", f"openai:m@{urls[0]}|{urls[1]}", "--episodes", "2", "--out", str(tmp_path / "r"), "--quiet"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("negotiate serve: error: --seller: ") and "all 2 replicas are down" in last, last
    assert all(f"{url}: cannot reach the server" in last for url in urls) and not (tmp_path / "r").exists()


# -- two real llama.cpp servers ----------------------------------------------------------------------------


def _llamacpp_server(folder, name: str):
    """A llama-cpp-python server serving SmolLM2 (as tests/test_llamacpp.py starts it): (process, base URL)."""
    import test_llamacpp as real  # skips (or, where CI requires it, fails) without llama.cpp or the GGUF

    port = free_port()
    log_path = folder / f"{name}.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(real.GGUF), "--model_alias", real.MODEL,
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(real.N_CTX),
               "--n_threads", "1", "--n_threads_batch", "1", "--interrupt_requests", "False"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return process, f"http://127.0.0.1:{port}/v1", log_path


def _wait_ready(process, url: str, log_path, seconds: float) -> None:
    import test_llamacpp as real

    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"llama_cpp.server at {url} did not start; its log:\n{real._tail(log_path)}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2):
                return
        except OSError:
            time.sleep(0.25)


@pytest.mark.llamacpp
@pytest.mark.timeout(900)
def test_two_llamacpp_servers_one_killed_mid_run_every_episode_finishes_once(tmp_path):
    """Two real servers on loopback; one is killed (SIGKILL) while it answers; the run ends with every episode once."""
    from negotiate.cli import main

    servers = [_llamacpp_server(tmp_path, name) for name in ("a", "b")]
    try:
        for process, url, log_path in servers:
            _wait_ready(process, url, log_path, 120.0)
        (victim, victim_url, _), (_, survivor_url, _) = servers
        split = tmp_path / "tiny.toml"
        split.write_text('split = "train"\nname = "tiny"\nbuyers = 1\nproducts = 1\nbudget = 2\n')
        out = tmp_path / "r"
        killed = threading.Event()

        def kill_after_its_first_answer() -> None:  # its next request is then on its way: the one killed mid-answer
            log = out / "requests.log.jsonl"
            while not killed.is_set():
                lines = log.read_text().splitlines() if log.exists() else []
                if any(json.loads(line).get("base_url") == victim_url and json.loads(line)["event"] == "llm request" for line in lines):
                    os.kill(victim.pid, signal.SIGKILL)
                    killed.set()
                time.sleep(0.05)

        watcher = threading.Thread(target=kill_after_its_first_answer, daemon=True)
        watcher.start()
        spec = (f"openai:smollm2@{victim_url}|{survivor_url}?server=llamacpp&format=tagged&prompt=compact&max_tokens=24"
                "&temperature=0.7&logprobs=0&timeout=120&retries=1&max_inflight=1")
        code = main(["serve", "--seller", spec, "--split", str(split), "--episodes", "6", "--concurrency", "4",
                     "--seller-timeout", "600", "--out", str(out), "--quiet"])
        killed.set()
        watcher.join(5)
    finally:
        for process, _, _ in servers:
            if process.poll() is None:
                process.terminate()
                process.wait(15)
    ends = episodes_of(out)
    log = [json.loads(line) for line in (out / "requests.log.jsonl").read_bytes().splitlines()]
    drained = [line for line in log if line["event"] == "replica drained"]
    answered = {url: sum(1 for line in log if line["event"] == "llm request" and line["base_url"] == url)
                for url in (victim_url, survivor_url)}
    print(f"\nreplicas: {answered}, drained {[line['reason'] for line in drained]}")
    assert victim.returncode == -signal.SIGKILL
    assert code == 0 and len(ends) == 6 and len({end["episode"] for end in ends}) == 6, (code, ends)
    assert not [end for end in ends if end["outcome"] == "failed"]
    assert [line["base_url"] for line in drained] == [victim_url] and answered[victim_url] >= 1 and answered[survivor_url] >= 1
