"""Every HTTP client (``client=http``, ``client=aiohttp``, ``client=openai``) against a hostile or broken model server
(issues 44 and 51).

A raw-TCP stand-in server on 127.0.0.1 answers each request with one misbehaviour: a chunk size or a
Content-Length that is not a plain number, an answer past the cap (as sent, or a gzip bomb once
inflated, or a Content-Length of 100 GB with zeros streamed), a flood of 1xx heads, a late second
answer, a trickle of one byte at a time, no answer at all. Each must fail its request with a clear
reason, within the spec's timeout (or, for the late answer, give every request its own answer), and
the same with every client. The framing parser is fuzzed against h11, the reference for what is
well-formed. Every request is bounded in count and time, and goes to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import time
from collections.abc import Awaitable, Callable

import anyio
import orjson
import pytest

pytest.importorskip("aiohttp", reason="the aiohttp client needs aiohttp")

from negotiate.agents.clients import aclose_clients  # noqa: E402
from negotiate.agents.contract import Completion, LLMError, LLMTimeout  # noqa: E402
from negotiate.agents.openai_server import DOWN_AFTER, REPLY_MAX, OpenAIBackend, OpenAIOptions  # noqa: E402
from negotiate.agents.http1 import INFORMATIONAL_MAX, MAX_ANSWER, BrokenAnswer, HTTP1Pool, _Connection  # noqa: E402
from negotiate.agents.registry import parse_agent  # noqa: E402
from negotiate.errors import UserError  # noqa: E402

Answer = Callable[[int, bytes, asyncio.StreamWriter], Awaitable[bool]]
"""What the server does for request ``index`` with ``body``: writes to ``writer``; True keeps the connection."""


class Hostile:
    """A raw-TCP server on 127.0.0.1 whose every answer is written by ``answer``; it records the request bodies."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.bodies: list[bytes] = []
        self.heads: list[bytes] = []
        self.connections = 0
        self._handlers: set[tuple[asyncio.Task, asyncio.StreamWriter]] = set()

    async def __aenter__(self) -> Hostile:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc) -> None:
        await aclose_clients()
        self.server.close()
        for task, writer in self._handlers:
            writer.transport.abort()
            task.cancel()
        await asyncio.gather(*(task for task, _ in self._handlers), return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        entry = (asyncio.current_task(), writer)
        self._handlers.add(entry)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                body = await reader.readexactly(int(length[1]) if length else 0)
                self.heads.append(head)
                self.bodies.append(body)
                if not await self.answer(len(self.bodies) - 1, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def completion(content: str) -> bytes:
    return orjson.dumps({"id": "c", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                                               "finish_reason": "stop"}]})


def head(*lines: str, status: str = "200 OK") -> bytes:
    return ("\r\n".join((f"HTTP/1.1 {status}", *lines)) + "\r\n\r\n").encode()


def ok(body: bytes, *lines: str) -> bytes:
    return head("Content-Type: application/json", *lines, f"Content-Length: {len(body)}") + body


def nonce(body: bytes) -> str:
    """The request's own word (the last message's content), which the echo servers answer with."""
    return orjson.loads(body)["messages"][-1]["content"]


def ask(word: str = "hello") -> list[dict]:
    return [{"role": "user", "content": word}]


def _needs_openai_client() -> None:
    """Skip where the openai package's aiohttp client cannot be built (openai 2 needs httpx_aiohttp)."""
    from needs import openai_client_missing

    if openai_client_missing():
        pytest.skip(openai_client_missing())


@pytest.fixture(params=["http", "aiohttp", "openai"])
def client(request) -> str:
    """Every client: the same bounds, the same reasons."""
    if request.param == "openai":
        _needs_openai_client()
    return request.param


def backend(server: Hostile, client: str, **options) -> OpenAIBackend:
    values = {"model": "m", "base_url": server.url, "retries": 0, "timeout": 20.0, "client": client} | options
    return OpenAIBackend(OpenAIOptions(**values))


def script(*parts: bytes, keep: bool = False) -> Answer:
    """Every request answered with ``parts`` written in turn; the connection closed after unless ``keep``."""

    async def answer(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        for part in parts:
            writer.write(part)
            await writer.drain()
        return keep

    return answer


async def fails(server: Hostile, client: str, match: str, **options) -> LLMError:
    """The one request's LLMError, which must come long before the spec's timeout (20 s)."""
    with anyio.fail_after(10):
        with pytest.raises(LLMError, match=match) as caught:
            await backend(server, client, **options).complete(ask(), role="seller")
    return caught.value


# -- framing: plain numbers only --------------------------------------------------------------------


@pytest.mark.parametrize("size", [b"-6", b"-13", b"+5", b"0x10", b"1_0", b"", b"5 5", b"g"])
async def test_a_chunk_size_that_is_not_hex_digits_fails_the_request_at_once(client, size):
    chunked = head("Transfer-Encoding: chunked") + size + b"\r\nhello\r\n0\r\n\r\n"
    async with Hostile(script(chunked, keep=True)) as server:
        error = await fails(server, client, "answer is broken|cannot reach the server")
    if client == "http":
        assert f"bad chunk size {size!r}" in str(error)


@pytest.mark.parametrize("length", ["-2", "-3", "+5", "0x5", "1_0", "", "5, 6", "five"])
async def test_a_content_length_that_is_not_decimal_digits_fails_the_request_at_once(client, length):
    answer = head(f"Content-Length: {length}") + b"hello"
    async with Hostile(script(answer, keep=True)) as server:
        error = await fails(server, client, "answer is broken|cannot reach the server")
    if client == "http":
        assert f"Content-Length {length!r} is not a number of bytes" in str(error)


async def test_a_broken_answer_is_worded_as_one_by_every_client_not_as_a_status_the_server_never_sent(client):
    # aiohttp's parser reports a broken answer as ClientResponseError(400); the openai client passed that on as
    # "cannot reach the server (ClientResponseError: 400, ...)", as if the server had answered 400.
    chunked = head("Transfer-Encoding: chunked") + b"-6\r\nhello!\r\n0\r\n\r\n"
    async with Hostile(script(chunked, keep=True)) as server:
        error = await fails(server, client, "the server's answer is broken: ", retries=1)
        assert len(server.bodies) == 2  # retried once, as a broken answer is
        said = str(error).removeprefix(f"m at {server.url}: ")  # the URL's port may hold a 400
    assert said.startswith("the server's answer is broken: ") and "400" not in said and "ClientResponseError" not in said
    assert error.status is None and not error.unreachable  # the server is there, sent no status; what it sent is wrong


async def test_a_transfer_encoding_other_than_chunked_fails_the_request():
    async with Hostile(script(head("Transfer-Encoding: gzip, chunked") + b"5\r\nhello\r\n0\r\n\r\n")) as server:
        await fails(server, "http", r"Transfer-Encoding 'gzip, chunked' is not chunked")


# -- the cap on an answer's bytes -------------------------------------------------------------------


CAP_MB = 0.0625
"""A 64 KiB cap (the default is 8 MiB): the same code, in a test's time."""
CAP = int(CAP_MB * 2**20)


def over_the_cap(framing: str) -> bytes:
    """A completion 10 bytes over the test's cap, framed by Content-Length, chunks, or the connection's close."""
    content = completion("x" * (CAP + 10))
    if framing == "content-length":
        return ok(content)
    if framing == "chunked":
        pieces = [content[at:at + 4096] for at in range(0, len(content), 4096)]
        return head("Transfer-Encoding: chunked") + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return head() + content


@pytest.mark.parametrize("framing", ["content-length", "chunked", "close"])
async def test_an_answer_over_the_cap_fails_naming_the_cap_and_the_key(client, framing):
    answer = over_the_cap(framing)
    async with Hostile(script(answer)) as server:
        await fails(server, client, r"answer is over the cap of 65536 bytes \(the spec's max_answer_mb=0.0625 raises it\)",
                    max_answer_mb=CAP_MB)
        assert len(server.bodies) == 1  # not retried: the same answer again would be as large
        # Raised, the same answer passes.
        with anyio.fail_after(10):
            reply = await backend(server, client, max_answer_mb=1).complete(ask(), role="seller")
    assert reply.text == "x" * (CAP + 10)


def endless(start: bytes, block: bytes, blocks: int, sent: list[int]) -> Answer:
    """Every request answered with ``start``, then ``block`` written ``blocks`` times should the client read on (``sent``
    counts the bytes), then the connection closed."""

    async def answer(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(start)
        for _ in range(blocks):
            writer.write(block)
            sent.append(len(block))
            await writer.drain()
        return False

    return answer


async def test_a_content_length_of_100_gb_with_zeros_streamed_fails_at_the_cap(client):
    sent: list[int] = []
    zeros = endless(head("Content-Length: 100000000000"), bytes(65536), 1024, sent)  # at most 64 MiB
    async with Hostile(zeros) as server:
        await fails(server, client, "over the cap of 64 KiB|over the cap of 65536 bytes", max_answer_mb=CAP_MB)
    assert sum(sent) < 32 * 2**20  # the client hung up long before the server's bound


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_an_error_answer_is_read_under_the_cap_too(client, framing):
    # A 500 whose body never ends: the openai client read an error answer's body whole (and retried it on its own).
    sent: list[int] = []
    block = bytes(65536)
    if framing == "content-length":
        zeros = endless(head("Content-Length: 100000000000", status="500 Internal Server Error"), block, 512, sent)
    else:
        zeros = endless(head("Transfer-Encoding: chunked", status="500 Internal Server Error"),
                        b"%x\r\n%s\r\n" % (len(block), block), 512, sent)  # at most 32 MiB
    async with Hostile(zeros) as server:
        await fails(server, client, r"over the cap of 65536 bytes \(the spec's max_answer_mb=0.0625 raises it\)",
                    max_answer_mb=CAP_MB, retries=2)
        assert len(server.bodies) == 1  # not retried: the same answer again would be as large
    assert sum(sent) < 16 * 2**20


async def test_a_gzip_bomb_fails_once_inflated_past_the_cap(client):
    bomb = gzip.compress(bytes(16 * 2**20), compresslevel=9)  # 16 KiB of gzip, 16 MiB inflated
    assert len(bomb) < CAP
    async with Hostile(script(ok(bomb, "Content-Encoding: gzip"))) as server:
        await fails(server, client, r"gzip answer, inflated, is over the cap of 65536 bytes", max_answer_mb=CAP_MB)


async def test_a_gzip_answer_under_the_cap_is_read_the_same_by_both_clients(client):
    packed = gzip.compress(completion("zipped"))
    async with Hostile(script(ok(packed, "Content-Encoding: gzip"), keep=True)) as server:
        with anyio.fail_after(10):
            reply = await backend(server, client).complete(ask(), role="seller")
    assert reply.text == "zipped"


async def test_no_client_asks_for_compression(client):
    async with Hostile(script(ok(completion("plain")))) as server:
        with anyio.fail_after(10):
            await backend(server, client).complete(ask(), role="seller")
    assert len(server.heads) == 1
    encodings = re.findall(rb"(?im)^accept-encoding:(.*)$", server.heads[0])
    assert encodings in ([], [b" identity\r"])  # the openai client sends its own unless told identity


async def test_the_check_before_a_run_reads_its_answer_under_the_cap_too():
    bomb = gzip.compress(bytes(16 * 2**20), compresslevel=9)
    async with Hostile(script(ok(bomb, "Content-Encoding: gzip"))) as server:
        with anyio.fail_after(10):
            with pytest.raises(LLMError, match=r"GET /models: the server's gzip answer, inflated, is over the cap of 65536 bytes"):
                await backend(server, "http", max_answer_mb=CAP_MB).preflight()
    assert server.heads[0].startswith(b"GET /v1/models ")


async def test_the_cap_is_a_spec_key_with_a_checked_value():
    assert OpenAIOptions(**parse_agent("openai:m@http://h/v1", "seller").params).max_answer_mb == 8.0
    assert OpenAIOptions(**parse_agent("openai:m@http://h/v1?max_answer_mb=64", "seller").params).max_answer_mb == 64.0
    with pytest.raises(UserError, match=r"max_answer_mb=0 is outside \(0.0, 4096.0\]"):
        parse_agent("openai:m@http://h/v1?max_answer_mb=0", "seller")
    assert MAX_ANSWER == 8 * 2**20 == int(OpenAIOptions("m", "http://h/v1").max_answer_mb * 2**20)


# -- a late second answer, a trickle, a server that never answers -----------------------------------


async def twice(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
    """Each answer says the request's own word; 50 ms later the server sends it again, on the same connection."""
    answer = ok(completion(nonce(body)))
    writer.write(answer)
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(answer)
    await writer.drain()
    return True


async def test_a_late_second_answer_never_reaches_another_request(client):
    # client=openai gave 8 of 16 such requests another request's answer (issue 51): the openai client's aiohttp
    # transport pooled connections with a stock aiohttp connector, which reuses an idle connection that has read a
    # late answer and hands that answer to the next request sent on it.
    async with Hostile(twice) as server:
        model = backend(server, client)
        words = [f"word{n}" for n in range(8)]
        replies = []
        with anyio.fail_after(20):
            for n, word in enumerate(words):  # asked back to back, and 0.1 s apart: the late answer lands on an idle connection
                replies.append((await model.complete(ask(word), role="seller")).text)
                await asyncio.sleep(0.1 * (n % 2))

            async def asker(k: int) -> list[tuple[str, str]]:  # four at once, each in turn
                pairs = []
                for n in range(3):
                    word = f"together{k}-{n}"
                    pairs.append(((await model.complete(ask(word), role="seller")).text, word))
                    await asyncio.sleep(0.1)
                return pairs

            together = await asyncio.gather(*(asker(k) for k in range(4)))
        assert replies == words
        assert all(reply == word for pairs in together for reply, word in pairs)
        assert len(server.bodies) == 8 + 12  # each asked once


async def test_bytes_on_an_idle_connection_close_it_and_answer_nothing():
    late = asyncio.Event()

    async def twice(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(nonce(body).encode()))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(ok(b"late " + nonce(body).encode()))
        await writer.drain()
        late.set()
        return True

    async with Hostile(twice) as server:
        pool = HTTP1Pool(server.url, {}, settle=0.0)  # reused at once, were it still open
        first = await pool.request(b"POST", "/v1/chat/completions", orjson.dumps({"messages": ask("one")}), 10.0)
        with anyio.fail_after(10):
            await late.wait()
            while pool._open:  # the late answer reaches the idle connection, which closes
                await asyncio.sleep(0.01)
        second = await pool.request(b"POST", "/v1/chat/completions", orjson.dumps({"messages": ask("two")}), 10.0)
        await pool.close()
    assert (first[2], second[2], server.connections) == (b"one", b"two", 2)


@pytest.mark.parametrize("late", ["answer", "part of a head"])
@pytest.mark.parametrize("pooled", ["aiohttp", "openai"])
async def test_an_aiohttp_connection_that_heard_a_byte_while_idle_is_not_reused(monkeypatch, pooled, late):
    # Stock aiohttp closes an idle connection only once it has parsed a whole late answer; the start of one stays in
    # its parser, to be read as the head of the next request's answer. Any byte heard while idle closes it here.
    from negotiate.agents import http1

    if pooled == "openai":
        _needs_openai_client()
    monkeypatch.setattr(http1, "SETTLE_S", 0.0)  # reused at once, were it not for what it heard
    heard = asyncio.Event()

    async def once_and_late(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(completion(nonce(body))))
        await writer.drain()
        if index == 0:
            await asyncio.sleep(0.05)
            writer.write(ok(completion("late")) if late == "answer" else b"HTTP/1.1 200 OK\r\nContent-Le")
            await writer.drain()
            heard.set()
        return True

    async with Hostile(once_and_late) as server:
        model = backend(server, pooled)
        first = await model.complete(ask("one"), role="seller")
        connector = model._shared[3].session.connector  # client=openai's transport is on the same session
        with anyio.fail_after(10):
            await heard.wait()
            while not any(protocol.heard_while_idle for conns in connector._conns.values() for protocol, _ in conns):
                await asyncio.sleep(0.01)  # the idle connection has read the late bytes
        second = await model.complete(ask("two"), role="seller")
    assert (first.text, second.text, server.connections) == ("one", "two", 2)


async def test_a_flood_of_100_continue_heads_fails_at_the_17th(client):
    # Stock aiohttp reads any number of 1xx heads (a minute of them held the aiohttp and openai clients to their
    # timeout); each client now fails the answer at the 17th, at once.
    async def flood(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        for _ in range(200):  # 200 blocks of 100 heads (500 KB) at most, should the client read on
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * 100)
            await writer.drain()
            await asyncio.sleep(0.01)
        return False

    assert INFORMATIONAL_MAX == 16
    async with Hostile(flood) as server:
        error = await fails(server, client, r"the server's answer is broken: more than 16 informational \(1xx\) heads "
                                            r"before the answer$")
        assert len(server.bodies) == 1  # retries=0 here
    assert not error.unreachable and error.status is None  # the server is there, and sent no status of its own


async def test_a_few_1xx_heads_before_the_answer_are_skipped(client):
    # 100 Continue and 103 Early Hints, 16 in all: within the bound, and the answer is read.
    heads = b"HTTP/1.1 100 Continue\r\n\r\n" * 15 + b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    async with Hostile(script(heads, ok(completion("after the hints")), keep=True)) as server:
        with anyio.fail_after(10):
            reply = await backend(server, client).complete(ask(), role="seller")
    assert reply.text == "after the hints"


async def test_a_server_that_trickles_a_byte_at_a_time_is_held_to_the_timeout(client):
    answer = ok(completion("slow"))

    async def trickle(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        for at in range(len(answer)):  # about 10 s in all
            writer.write(answer[at:at + 1])
            await writer.drain()
            await asyncio.sleep(0.05)
        return False

    async with Hostile(trickle) as server:
        began = time.perf_counter()
        with anyio.fail_after(8):  # each read comes well inside the timeout; the whole answer does not
            with pytest.raises(LLMTimeout, match=r"no reply within 0.5s \(the spec's timeout, 0 retries included\)"):
                await backend(server, client, timeout=0.5, retries=2).complete(ask(), role="seller")
        took = time.perf_counter() - began
        # One deadline for the request, retries included: no retry starts after it (before, each attempt had its own
        # 0.5 s and the openai client its own per read: 2 to 3 s here, 41-58 s at timeout=10&retries=1).
        assert len(server.bodies) == 1
    assert 0.5 <= took < 2.0  # retries=2 each with its own 0.5 s took 2.6 s at the least


async def test_a_server_that_keeps_timing_out_is_declared_down(client):
    hang_for = {0, 1, 3, 4, 5}  # two timeouts, an answer, then three in a row

    async def answer(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if index in hang_for:
            await asyncio.Event().wait()
        writer.write(ok(completion("here")))
        await writer.drain()
        return True

    async with Hostile(answer) as server:
        model = backend(server, client, timeout=0.5)  # the answer at index 2 well inside it, on a busy machine too
        outcomes = []
        with anyio.fail_after(20):
            for _ in range(7):
                try:
                    outcomes.append((await model.complete(ask(), role="seller")).text)
                except LLMTimeout:
                    outcomes.append("timeout")
                except LLMError as error:
                    outcomes.append(str(error))
    down = f"m at {server.url}: the server at {server.url} is down: 3 requests in a row timed out"
    assert DOWN_AFTER == 3
    assert outcomes == ["timeout", "timeout", "here", "timeout", "timeout", "timeout", down]
    assert len(server.bodies) == 6  # the seventh never went out


async def test_a_retry_whose_wait_would_end_past_the_deadline_is_not_made(client):
    # A 503 asking for 5 s: with timeout=1 the retry could not start in time, so the request fails at once, with
    # the server's own words, instead of waiting 5 s (or being cut in its wait and called a timeout).
    unavailable = head("Retry-After: 5", "Content-Length: 10", status="503 Service Unavailable") + b"overloaded"
    quick = head("Retry-After: 0.05", "Content-Length: 10", status="503 Service Unavailable") + b"overloaded"
    async with Hostile(script(unavailable, keep=True)) as server:
        began = time.perf_counter()
        with anyio.fail_after(4):
            with pytest.raises(LLMError, match=r"request failed \(503\): overloaded$"):
                await backend(server, client, timeout=1.0, retries=2).complete(ask(), role="seller")
        assert time.perf_counter() - began < 1.0 and len(server.bodies) == 1
    answers = iter([quick, quick, ok(completion("third time"))])

    async def then_answer(index: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(next(answers))
        await writer.drain()
        return True

    async with Hostile(then_answer) as server:  # retries that fit in the deadline are made
        with anyio.fail_after(4):
            reply = await backend(server, client, timeout=1.0, retries=2).complete(ask(), role="seller")
    assert (reply.text, reply.retries, len(server.bodies)) == ("third time", 2, 3)


# -- the protocol callbacks, and what the trace keeps -----------------------------------------------


async def test_no_exception_escapes_the_protocol_callbacks(monkeypatch):
    def broken(self):
        raise RuntimeError("a fault of ours")

    monkeypatch.setattr(_Connection, "_parse", broken)
    async with Hostile(script(ok(b"{}"))) as server:
        pool = HTTP1Pool(server.url, {})
        with anyio.fail_after(10):
            with pytest.raises(BrokenAnswer, match=r"could not be read \(RuntimeError: a fault of ours\)"):
                await pool.request(b"POST", "/v1/chat/completions", b"{}", 10.0)
        await pool.close()


async def test_a_reply_past_its_bound_is_cut_and_the_cut_noted(client):
    async with Hostile(script(ok(completion("y" * (REPLY_MAX + 5))), keep=True)) as server:
        with anyio.fail_after(10):
            reply = await backend(server, client).complete(ask(), role="seller")
    assert reply.text == "y" * REPLY_MAX
    assert reply.clamped == (f"the reply cut from {REPLY_MAX + 5} to {REPLY_MAX} characters",)


async def test_the_backends_cut_comes_first_in_the_messages_clamped_notes():
    from negotiate.agents.llm import LLMSeller
    from negotiate.episode import run_episode
    from negotiate.market import Buyer, Market, MarketSpec, Product

    reply = orjson.dumps({"thought": "t", "to": "b1", "talk": "hi", "action": {"kind": "end", "product": None, "price": None}})

    class Cut:
        name = "stub"

        def describe(self) -> dict:
            return {"backend": self.name}

        async def complete(self, messages, *, role, seed=None, **_) -> Completion:
            return Completion(reply.decode(), "stop", "stub", 0.001, clamped=("the reply cut from 9 to 8 characters",))

    market = Market(MarketSpec(name="cut"), 1, (Product("p1", "Basic", 3, 1),), (Buyer("b1", (9,)),), 2, 1, 10)
    with anyio.fail_after(20):
        ep = await run_episode(market, LLMSeller(Cut()), {"b1": parse_agent("threshold", "buyer").build(market, [1, 1, 0])})
    sent = [e for e in ep.events if getattr(e, "type", None) == "message" and e.sender == "seller"]
    assert sent and sent[0].extra["clamped"] == ["the reply cut from 9 to 8 characters"]


# -- the framing parser, fuzzed against h11 ---------------------------------------------------------

h11 = pytest.importorskip("h11", reason="the fuzz takes h11 as its oracle")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NUMBERS = [b"-6", b"-13", b"+5", b"0x10", b"1_0", b"", b" ", b"5 5", b"g", b"00000000000000000000005", b"1" * 21]
"""Sizes and lengths that are not plain numbers (or too many digits for h11), mixed in with the right ones."""


class _Transport:
    def abort(self) -> None:
        pass


class _Pool:
    def _lost(self, connection) -> None:
        pass


def ours(data: bytes, cuts: list[int]) -> tuple[str, bytes | None]:
    """Our parser fed ``data`` in pieces (cut at ``cuts``), then the connection's end: ("body", body) or ("error", None).
    It must decide by then: a request left waiting after the close would hang till its timeout."""
    loop = asyncio.new_event_loop()
    try:
        connection = _Connection(_Pool())
        connection.connection_made(_Transport())
        connection.waiter = waiter = loop.create_future()
        bounds = [0, *sorted(set(cut for cut in cuts if 0 < cut < len(data))), len(data)]
        for start, end in zip(bounds, bounds[1:]):
            if waiter.done():
                break
            connection.data_received(data[start:end])
        if not waiter.done():
            connection.connection_lost(None)
        assert waiter.done(), "still waiting after the connection closed"
        if waiter.exception() is not None:
            assert isinstance(waiter.exception(), BrokenAnswer)
            return "error", None
        return "body", waiter.result()[2]
    finally:
        loop.close()


def theirs(data: bytes) -> tuple[str, bytes | None]:
    """h11's reading of ``data`` as the answer to a POST, the connection closed after it."""
    connection = h11.Connection(h11.CLIENT)
    connection.send(h11.Request(method="POST", target="/", headers=[("Host", "h"), ("Content-Length", "0")]))
    connection.send(h11.EndOfMessage())
    connection.receive_data(data)
    connection.receive_data(b"")
    body = b""
    try:
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return "body", body
            elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return "error", None
    except h11.RemoteProtocolError:
        return "error", None


@st.composite
def answers(draw) -> bytes:
    """An answer's bytes: a head whose framing headers vary, and a body framed by them, right or wrong."""
    status = draw(st.sampled_from([b"200 OK", b"200 OK", b"201 Created", b"204 No Content", b"304 Not Modified"]))
    data = draw(st.binary(max_size=40))
    lines = []
    framing = draw(st.sampled_from(["length", "chunked", "both", "close"]))
    if framing in ("length", "both"):
        right = str(len(data)).encode()
        value = draw(st.sampled_from([right, right, right, b"0" + right, right + b", " + right, right + b", 9",
                                      str(len(data) + 3).encode(), *NUMBERS]))
        lines.append(b"Content-Length: " + value)
    if framing in ("chunked", "both"):
        lines.append(b"Transfer-Encoding: " + draw(st.sampled_from([b"chunked", b"chunked", b"Chunked", b" chunked",
                                                                   b"gzip", b"chunked, chunked", b"identity"])))
        body = b""
        for _ in range(draw(st.integers(0, 3))):
            piece = draw(st.binary(min_size=1, max_size=12))
            size = draw(st.sampled_from([b"%x" % len(piece), b"%X" % len(piece), b"0%x" % len(piece), *NUMBERS]))
            size += draw(st.sampled_from([b"", b"", b";a=b", b";x", b" ", b";q=\"1\" "]))
            end = draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"XY", b""]))
            body += size + b"\r\n" + piece + end
        last = draw(st.sampled_from([b"0", b"0", b"00", b"0;end", b"-0", b""]))
        trailer = draw(st.sampled_from([b"", b"", b"X-T: v\r\n", b"X-T:v\r\nX-U: w\r\n", b"no colon\r\n", b"X T: v\r\n"]))
        data = body + last + b"\r\n" + trailer + b"\r\n"
    informational = draw(st.sampled_from([b"", b"", b"HTTP/1.1 100 Continue\r\n\r\n"]))
    answer = informational + b"HTTP/1.1 " + status + b"\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n" + data
    return answer[:draw(st.integers(0, len(answer)))] if draw(st.integers(0, 4)) == 0 else answer


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(answers(), st.lists(st.integers(0, 400), max_size=4))
def test_the_parser_agrees_with_h11_on_what_is_well_formed(answer, cuts):
    verdict = theirs(answer)
    assert ours(answer, cuts) == verdict, (answer, verdict)


# -- client=openai: the openai package's errors, said as what happened ---------------------------------------------


def test_the_openai_clients_errors_are_unwrapped_to_what_happened():
    # The openai client wraps its transport's httpx error, which wraps aiohttp's: the request's error names aiohttp's
    # (or the OS's), and a chain with neither names its innermost cause, not "APIConnectionError: Connection error.".
    _needs_openai_client()
    import aiohttp
    import anyio as anyio_
    import openai

    from negotiate.agents.clients import _broken, _openai_httpx, _under

    httpx2 = _openai_httpx()
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")

    def wrapped(cause: BaseException) -> openai.APIConnectionError:
        try:
            try:
                raise cause
            except BaseException as error:
                raise httpx2.ReadError(str(error)) from error
        except httpx2.ReadError as error:
            try:
                raise openai.APIConnectionError(request=request) from error
            except openai.APIConnectionError as outer:
                return outer

    gone = aiohttp.ServerDisconnectedError()
    assert _under(wrapped(gone)) is gone and _broken(gone) is gone
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert _under(wrapped(reset)) is reset
    payload = aiohttp.ClientPayloadError("Response payload is not completed")
    assert isinstance(_broken(_under(wrapped(payload))), BrokenAnswer)
    assert str(_broken(_under(wrapped(payload)))) == "Response payload is not completed"
    neither = _under(wrapped(anyio_.EndOfStream()))
    assert type(neither) is ConnectionError and str(neither) == "EndOfStream"


def test_an_error_answer_read_by_the_hook_is_found_under_openai_2s_wrapping():
    # openai 2 wraps whatever its response hook raises in APIConnectionError (openai 3 lets it through): the error
    # answer the hook read is found among the causes, so it is worded as the server's status, never as unreachable.
    _needs_openai_client()
    import openai

    from negotiate.agents.clients import _openai_httpx, _status_answer_in, _StatusAnswer

    request = _openai_httpx().Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    answer = _StatusAnswer(503, {"retry-after": "1"}, b"overloaded")
    try:
        try:
            raise answer
        except _StatusAnswer as error:
            raise openai.APIConnectionError(request=request) from error
    except openai.APIConnectionError as outer:
        assert _status_answer_in(outer) is answer
        assert _status_answer_in(answer) is answer
        assert _status_answer_in(ConnectionResetError(104, "reset")) is None
        assert (answer.status, answer.body) == (503, b"overloaded")
