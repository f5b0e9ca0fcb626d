"""A lean HTTP/1.1 client for model requests: one server, keep-alive connections, nothing else.

The ``openai:`` backend's default client (``client=http``). It holds a pool of keep-alive
connections to one server (``http`` or ``https``) in one event loop, and makes a request as
one write of prebuilt header bytes and the body, then one parse of the answer in the
connection's ``data_received``: no per-request URL, header-dict, cookie, tracing or timer
objects. Measured here (benchmarks/bench_llm.py's server, 256 in flight, uvloop): about
45 us of CPU per request, against about 180 us for an ``aiohttp.ClientSession`` doing the
same requests, the largest single cost of an LLM agent's turn before.

What it does not do, because a model server needs none of it: proxies, redirects, cookies,
pipelining, request streaming, ``Expect: 100-continue``. It reads ``Content-Length``,
chunked and read-until-close answers, skips 1xx heads, honours ``Connection: close``, and
inflates a gzip or deflate answer (it asks for none). A request on a kept-alive connection
that the server closed before answering (an idle timeout racing the request) is sent once
more on a fresh connection; any other failure raises, for the backend's retries:

* ``TimeoutError``: no complete answer within the request's timeout (connecting included);
* ``OSError`` (``ConnectionRefusedError``, ``ConnectionResetError``, :class:`BrokenAnswer`, ...):
  the server could not be reached, went away mid-answer, or answered something that is not HTTP.

A request cancelled mid-answer closes its connection (the answer would otherwise arrive on
the next request's).
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from urllib.parse import urlsplit

__all__ = ["HTTP1Pool", "BrokenAnswer"]


class BrokenAnswer(ConnectionError):
    """The server's answer is not well-formed HTTP/1.x, or the connection ended inside it."""


_NO_BODY = frozenset({204, 304})


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request on it at a time."""

    __slots__ = ("pool", "transport", "buffer", "waiter", "closed", "idle_since", "used", "_scan", "_head",
                 "_length", "_chunks", "_at", "keep_alive")

    def __init__(self, pool: HTTP1Pool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.idle_since = 0.0
        self.used = False
        """Whether a request was answered on it (a reused connection may have been closed by the server)."""
        self._reset()

    def _reset(self) -> None:
        self._scan = 0
        """Where to look for the end of the head next (not from 0 at each read)."""
        self._head: tuple[int, dict] | None = None
        """(status, headers) once the head is read."""
        self._length = -1
        """Body bytes expected; -1: not known yet; -2: chunked; -3: until the connection closes."""
        self._chunks: list[bytes] = []
        self._at = 0
        """Chunked: where the next chunk-size line starts in the buffer."""
        self.keep_alive = True

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # bytes nobody asked for: the connection is not reusable
            self.buffer.clear()
            self.close()
            return
        self.buffer += data
        try:
            answer = self._parse()
        except BrokenAnswer as error:
            self.close()
            waiter.set_exception(error)
            return
        if answer is not None:
            waiter.set_result(answer)

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost finishes a read-until-close answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._lost(self)
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self._head is not None and self._length == -3:  # an answer delimited by the close
            self.keep_alive = False
            try:
                waiter.set_result(self._answer(bytes(self.buffer)))
            except BrokenAnswer as error:  # an encoding it cannot read: said now, not at the timeout
                waiter.set_exception(error)
            return
        error = BrokenAnswer("the server closed the connection before answering" if not self.buffer and self._head is None
                             else "the server closed the connection inside its answer")
        if exc is not None:
            error.__cause__ = exc
        waiter.set_exception(error)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()  # nothing of ours is left to send

    # -- reading the answer ----------------------------------------------------------------------

    def _parse(self):
        buffer = self.buffer
        while self._head is None:
            end = buffer.find(b"\r\n\r\n", self._scan)
            if end < 0:
                self._scan = max(0, len(buffer) - 3)
                if len(buffer) > 65536:
                    raise BrokenAnswer("the answer's head is over 64 KiB")
                return None
            status, headers, version = _head(bytes(buffer[:end]))
            del buffer[:end + 4]
            self._scan = 0
            if 100 <= status < 200:  # 100 Continue, 103 Early Hints: the answer follows
                continue
            self._head = (status, headers)
            connection = headers.get("connection", "").lower()
            if "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection):
                self.keep_alive = False
            if status in _NO_BODY:
                self._length = 0
            elif "chunked" in headers.get("transfer-encoding", "").lower():
                self._length = -2
            elif "content-length" in headers:
                try:
                    self._length = int(headers["content-length"])
                except ValueError:
                    raise BrokenAnswer(f"Content-Length {headers['content-length']!r} is not a number") from None
            else:
                self._length = -3
                self.keep_alive = False
        length = self._length
        if length >= 0:
            if len(buffer) < length:
                return None
            if len(buffer) > length:  # more than the answer: the connection's framing is lost
                self.keep_alive = False
            return self._answer(bytes(buffer[:length]))
        if length == -2:
            return self._chunked()
        return None  # until the connection closes

    def _chunked(self):
        buffer, at = self.buffer, self._at
        while True:
            line_end = buffer.find(b"\r\n", at)
            if line_end < 0:
                break
            try:
                size = int(bytes(buffer[at:line_end]).split(b";", 1)[0], 16)
            except ValueError:
                raise BrokenAnswer(f"bad chunk size {bytes(buffer[at:line_end])[:40]!r}") from None
            if size == 0:  # the last chunk, then trailer lines up to an empty one
                start = line_end + 2
                while True:
                    end = buffer.find(b"\r\n", start)
                    if end < 0:
                        self._at = at
                        return None
                    if end == start:
                        if len(buffer) > end + 2:
                            self.keep_alive = False
                        return self._answer(b"".join(self._chunks))
                    start = end + 2
            if len(buffer) < line_end + 2 + size + 2:
                break
            self._chunks.append(bytes(buffer[line_end + 2:line_end + 2 + size]))
            at = line_end + 2 + size + 2
        self._at = at
        return None

    def _answer(self, body: bytes) -> tuple[int, dict, bytes]:
        status, headers = self._head
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            try:
                body = zlib.decompress(body, 16 + zlib.MAX_WBITS if encoding != "deflate" else zlib.MAX_WBITS)
            except zlib.error as error:
                raise BrokenAnswer(f"a {encoding} answer that does not inflate ({error})") from None
        elif encoding != "identity":
            raise BrokenAnswer(f"an answer in an encoding this client does not read ({encoding})")
        return status, headers, body


def _head(raw: bytes) -> tuple[int, dict, str]:
    """(status, headers, HTTP version) of an answer's head; header names lower-cased."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise BrokenAnswer(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    try:
        status = int(rest[:3])
    except ValueError:
        raise BrokenAnswer(f"bad status line {lines[0][:80]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise BrokenAnswer(f"bad header line {line[:80]!r}")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return status, headers, version


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class HTTP1Pool:
    """Keep-alive connections to one server (``base_url``'s scheme, host and port), in one event loop.

    ``await pool.request(b"POST", "/v1/chat/completions", body, timeout)`` -> (status, headers, body);
    ``headers`` has lower-cased names. ``headers=`` are sent with every request.
    """

    def __init__(self, base_url: str, headers: dict[str, str], *, keepalive: float = 30.0):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.keepalive = keepalive
        """Seconds an idle connection is kept (a server's own idle timeout may be shorter: it closes, and we notice)."""
        self.closed = False
        self._netloc = url.netloc
        self._headers = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self._heads: dict[tuple[bytes, str], bytes] = {}
        """(method, target) -> the request's head up to its Content-Length value."""
        self._idle: deque[_Connection] = deque()
        self._open: set[_Connection] = set()
        self._loop = asyncio.get_running_loop()

    def _prefix(self, method: bytes, target: str) -> bytes:
        head = self._heads.get((method, target))
        if head is None:
            head = self._heads[(method, target)] = (
                f"{method.decode()} {target} HTTP/1.1\r\nHost: {self._netloc}\r\n{self._headers}Content-Length: ").encode("latin-1")
        return head

    async def request(self, method: bytes, target: str, body: bytes, timeout: float) -> tuple[int, dict, bytes]:
        """One request and its answer within ``timeout`` seconds, connecting included. Raises
        ``TimeoutError`` or another ``OSError``."""
        if self.closed:
            raise BrokenAnswer("the client is closed")
        loop = self._loop
        data = self._prefix(method, target) + b"%d\r\n\r\n" % len(body) + body
        waiter = loop.create_future()
        timer = loop.call_at(loop.time() + timeout, _expire, waiter)
        try:
            while True:
                connection = self._take(loop)
                if connection is None:
                    connection = await self._connect(waiter)
                connection.waiter = waiter
                connection.transport.write(data)
                try:
                    answer = await waiter
                except BrokenAnswer:
                    if connection.used and not connection.buffer and connection._head is None and connection.closed:
                        # A kept-alive connection the server had closed (its idle timeout): once more, on a fresh one.
                        waiter = loop.create_future()
                        timer.cancel()
                        timer = loop.call_at(loop.time() + timeout, _expire, waiter)
                        continue
                    raise
                break
        except BaseException:  # a timeout, a cancellation, a broken answer: this connection's framing is lost
            if connection is not None and not connection.closed:
                connection.close()
            raise
        finally:
            timer.cancel()
        connection.waiter = None
        if connection.keep_alive and not connection.closed and not self.closed:
            connection.buffer.clear()
            connection._reset()
            connection.used = True
            connection.idle_since = loop.time()
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    def _take(self, loop) -> _Connection | None:
        idle = self._idle
        while idle:
            connection = idle.pop()  # the most recently used: warm, and the others age out
            if connection.closed:
                continue
            if loop.time() - connection.idle_since > self.keepalive:
                connection.close()
                continue
            return connection
        return None

    async def _connect(self, waiter: asyncio.Future) -> _Connection:
        """A new connection, raced against the request's timer (``waiter`` failing first wins)."""
        connect = asyncio.ensure_future(self._loop.create_connection(
            lambda: _Connection(self), self.host, self.port, ssl=self.ssl,
            server_hostname=self.host if self.ssl is not None else None))
        try:
            await asyncio.wait((connect, waiter), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while connecting: a connection made meanwhile is closed, not leaked
            if connect.done() and not connect.cancelled() and connect.exception() is None:
                connect.result()[0].abort()
            connect.cancel()
            raise
        if not connect.done():
            connect.cancel()
            waiter.result()  # raises TimeoutError
        _, connection = connect.result()
        self._open.add(connection)
        return connection

    def _lost(self, connection: _Connection) -> None:
        self._open.discard(connection)
        try:
            self._idle.remove(connection)
        except ValueError:
            pass

    async def close(self) -> None:
        """Close every connection; later requests raise."""
        self.closed = True
        for connection in [*self._open]:
            connection.close()
        self._idle.clear()
        self._open.clear()
