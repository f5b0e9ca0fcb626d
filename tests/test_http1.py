"""The lean HTTP/1.1 client (negotiate.agents.http1) against a server that writes scripted bytes.

Each request the server reads is answered with the next script in its queue: byte strings
written one at a time (a pause between them, so the client reads them apart), then the
connection kept or closed. The server records every request's exact bytes and counts the
connections it accepted, so the tests see what went over the wire and when a connection was
reused.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections import deque
from dataclasses import dataclass

import pytest

from negotiate.agents.http1 import BrokenAnswer, HTTP1Pool, _Connection

HEADERS = {"Authorization": "Bearer sk-x", "Content-Type": "application/json"}
# Tests of reuse make their pools with settle=0.0: a connection is reused at once, not after SETTLE_S idle
# (the settling, and the late answers it is for, are tested in tests/test_hostile_server.py).
TARGET = "/v1/chat/completions"


@dataclass
class Script:
    parts: tuple[bytes, ...]
    """Written in turn, with a pause between them."""
    close: bool = False
    """Close the connection after the last part."""


def ok(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{line}\r\n" for line in extra)
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body


class RawServer:
    def __init__(self):
        self.scripts: deque[Script] = deque()
        self.requests: list[bytes] = []
        self.connections = 0
        self._handlers: set[tuple[asyncio.Task, asyncio.StreamWriter]] = set()

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for _, writer in self._handlers:  # each handler then reads the end of its stream and returns
            writer.transport.abort()
        await asyncio.gather(*(task for task, _ in self._handlers), return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._handlers.add((asyncio.current_task(), writer))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                script = self.scripts.popleft()
                for part in script.parts:
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.01)
                if script.close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw():
    async with RawServer() as server:
        yield server


async def test_a_request_is_one_exact_write_and_the_connection_is_kept(raw):
    raw.scripts.extend([Script((ok(b'{"a": 1}'),)), Script((ok(b'{"a": 2}'),))])
    pool = HTTP1Pool(raw.url, HEADERS, settle=0.0)
    assert await pool.request(b"POST", TARGET, b'{"q": 1}', 5.0) == (200, {"content-type": "application/json", "content-length": "8"}, b'{"a": 1}')
    assert (await pool.request(b"POST", TARGET, b'{"q": 22}', 5.0))[2] == b'{"a": 2}'
    await pool.close()
    assert raw.requests[0] == (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{raw.port}\r\nAuthorization: Bearer sk-x\r\n"
                               "Content-Type: application/json\r\nContent-Length: 8\r\n\r\n").encode() + b'{"q": 1}'
    assert raw.requests[1].endswith(b'Content-Length: 9\r\n\r\n{"q": 22}')
    assert raw.connections == 1  # the second request went on the kept-alive connection


async def test_an_answer_read_in_pieces_is_put_together(raw):
    answer = ok(b'{"text": "hello"}', "X-Extra: 1")
    cut = answer.index(b"\r\n\r\n") + 2  # inside the blank line that ends the head
    raw.scripts.append(Script((answer[:5], answer[5:cut], answer[cut:cut + 3], answer[cut + 3:])))
    pool = HTTP1Pool(raw.url, HEADERS)
    status, headers, body = await pool.request(b"POST", TARGET, b"{}", 5.0)
    await pool.close()
    assert (status, headers["x-extra"], body) == (200, "1", b'{"text": "hello"}')


async def test_a_chunked_answer_with_extensions_and_trailers(raw):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw.scripts.extend([Script((head + b"5;name=x\r\nhello\r\n", b"7\r\n, world\r\n", b"0\r\nX-Trailer: t\r\n\r\n")),
                        Script((ok(b"next"),))])
    pool = HTTP1Pool(raw.url, HEADERS, settle=0.0)
    assert (await pool.request(b"POST", TARGET, b"{}", 5.0))[2] == b"hello, world"
    assert (await pool.request(b"POST", TARGET, b"{}", 5.0))[2] == b"next"
    await pool.close()
    assert raw.connections == 1


async def test_connection_close_and_a_close_delimited_answer_are_not_reused(raw):
    raw.scripts.extend([Script((ok(b"one", "Connection: close"),), close=True),
                        Script((b"HTTP/1.1 200 OK\r\n\r\nread until ", b"the end"), close=True),
                        Script((b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nthree",), close=True)])
    pool = HTTP1Pool(raw.url, HEADERS)
    bodies = [(await pool.request(b"POST", TARGET, b"{}", 5.0))[2] for _ in range(3)]
    await pool.close()
    assert bodies == [b"one", b"read until the end", b"three"] and raw.connections == 3


async def test_a_gzip_answer_is_inflated_and_1xx_heads_are_skipped(raw):
    packed = gzip.compress(b'{"zipped": true}')
    raw.scripts.append(Script((b"HTTP/1.1 100 Continue\r\n\r\n", ok(packed, "Content-Encoding: gzip"))))
    pool = HTTP1Pool(raw.url, HEADERS)
    status, _, body = await pool.request(b"POST", TARGET, b"{}", 5.0)
    await pool.close()
    assert (status, body) == (200, b'{"zipped": true}')


async def test_a_body_in_1_byte_chunks_is_held_as_its_bytes_its_framing_dropped_as_read():
    # A chunked answer was kept as one bytes object per chunk, and its whole framing in the buffer till the end:
    # 20 MB sent in 1-byte chunks (120 MB on the wire) took 4 requests' client to 422 MB of RSS before the cap.
    class Pool:
        def _lost(self, connection) -> None:
            pass

    class Transport:
        def abort(self) -> None:
            pass

    connection = _Connection(Pool())
    connection.connection_made(Transport())
    connection.waiter = waiter = asyncio.get_running_loop().create_future()
    connection.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for k in range(50):  # 4,096 chunks of 1 byte at a time: 24 KiB on the wire, 4 KiB of body
        connection.data_received(b"1\r\nx\r\n" * 4096)
        assert len(connection.buffer) == 0  # each chunk read, its framing gone
        assert len(connection._data) == 4096 * (k + 1)  # and its byte kept in the one buffer of the body
    connection.data_received(b"1\r")  # a chunk cut short waits in the buffer for its rest
    assert bytes(connection.buffer) == b"1\r" and not waiter.done()
    connection.data_received(b"\nz\r\n0\r\n\r\n")
    status, _, body = waiter.result()
    assert (status, len(body), body[-2:]) == (200, 50 * 4096 + 1, b"xz")


async def test_a_kept_alive_connection_the_server_closed_is_replaced_once(raw):
    # The server closes after its answer without saying so (an idle timeout): the next request
    # finds the connection gone and goes out again on a new one.
    raw.scripts.extend([Script((ok(b"first"),), close=True), Script((ok(b"second"),))])
    pool = HTTP1Pool(raw.url, HEADERS, settle=0.0)
    assert (await pool.request(b"POST", TARGET, b"{}", 5.0))[2] == b"first"
    assert (await pool.request(b"POST", TARGET, b"{}", 5.0))[2] == b"second"
    await pool.close()
    assert raw.connections == 2 and len(raw.requests) == 2


async def test_an_answer_cut_off_or_not_http_is_a_broken_answer(raw):
    raw.scripts.extend([Script((b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",), close=True),
                        Script((b"SSH-2.0-OpenSSH\r\n\r\n",))])
    pool = HTTP1Pool(raw.url, HEADERS)
    with pytest.raises(BrokenAnswer, match="closed the connection inside its answer"):
        await pool.request(b"POST", TARGET, b"{}", 5.0)
    with pytest.raises(BrokenAnswer, match="not an HTTP/1.x answer: 'SSH-2.0-OpenSSH'"):
        await pool.request(b"POST", TARGET, b"{}", 5.0)
    await pool.close()
    assert isinstance(BrokenAnswer("x"), OSError)  # the backend retries it as a connection error


async def test_a_close_delimited_answer_that_cannot_be_read_is_a_broken_answer_at_once(raw):
    # Read until the close, in an encoding it cannot inflate: a BrokenAnswer when the server
    # closes, not a wait for the request's timeout.
    raw.scripts.append(Script((b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\n\r\nnot brotli",), close=True))
    pool = HTTP1Pool(raw.url, HEADERS)
    with pytest.raises(BrokenAnswer, match="br"):
        await pool.request(b"POST", TARGET, b"{}", 30.0)
    await pool.close()


async def test_a_timeout_or_a_cancellation_drops_the_connection(raw):
    hang = Script((b"HTTP/1.1 200 OK\r\n", b"", b"", b"", b""))  # a head that does not end in time
    raw.scripts.extend([hang, hang, Script((ok(b"late"),))])
    pool = HTTP1Pool(raw.url, HEADERS)
    began = time.perf_counter()
    with pytest.raises(TimeoutError):
        await pool.request(b"POST", TARGET, b"{}", 0.02)
    assert time.perf_counter() - began < 0.5
    task = asyncio.create_task(pool.request(b"POST", TARGET, b"{}", 5.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await pool.request(b"POST", TARGET, b"{}", 5.0))[2] == b"late"
    await pool.close()
    assert raw.connections == 3  # neither half-read connection was used again


async def test_a_refused_connection_and_a_closed_pool_raise():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pool = HTTP1Pool(f"http://127.0.0.1:{port}/v1", HEADERS)
    with pytest.raises(ConnectionRefusedError):
        await pool.request(b"POST", TARGET, b"{}", 5.0)
    await pool.close()
    with pytest.raises(BrokenAnswer, match="closed"):
        await pool.request(b"POST", TARGET, b"{}", 5.0)
