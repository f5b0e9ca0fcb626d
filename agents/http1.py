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
  the timeout is one deadline for the whole answer, not reset by each read (a server that
  trickles a byte a second does not hold a request past it);
* ``OSError`` (``ConnectionRefusedError``, ``ConnectionResetError``, :class:`BrokenAnswer`, ...):
  the server could not be reached, went away mid-answer, or answered something that is not HTTP.

Whatever a server sends, nothing hangs and nothing grows without bound (issue 44's hostile
server): the framing is read strictly (a chunk size is hex digits, with an optional
``;extension``; ``Content-Length`` decimal digits; ``Transfer-Encoding`` only ``chunked``:
anything else, ``-6``, ``+5``, ``0x10``, ``1_0``, fails the request at once), the same as h11
(tests/test_hostile_server.py fuzzes the two against each other); an answer's body is capped
(``limit`` bytes, :class:`AnswerTooLarge`) as it arrives, before it is buffered (a
``Content-Length`` past the cap fails at the head), and again once inflated, in one
``decompressobj`` call bounded by the cap (a gzip bomb costs at most the cap). A chunked body is
kept as one buffer of its data, its framing dropped as it is read (a body in 1-byte chunks costs
its bytes, not an object per chunk), and at most :data:`INFORMATIONAL_MAX` 1xx heads may come before
an answer. An exception in a protocol callback never escapes it: it fails the request waiting there.

A connection is reused only once it has been idle for :data:`SETTLE_S` (its oldest idle one
first; otherwise a new one is opened), and bytes that arrive on an idle connection close it and
answer nothing: a server that sends a late second answer (50 ms after the first, say) cannot
have it taken for the next request's answer.

A request cancelled mid-answer closes its connection (the answer would otherwise arrive on
the next request's).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import zlib
from collections import deque
from urllib.parse import urlsplit

__all__ = ["HTTP1Pool", "BrokenAnswer", "AnswerTooLarge", "inflate", "MAX_ANSWER", "SETTLE_S", "INFORMATIONAL_MAX"]

MAX_ANSWER = 8 * 2**20
"""Bytes an answer's body may have by default, on the wire and inflated (the spec's ``max_answer_mb`` changes it)."""
HEAD_MAX = 65536
"""Bytes of an answer's head (1xx heads, and a chunked body's framing, count against it too)."""
SETTLE_S = 0.25
"""Seconds a connection stays idle before it is reused: a late second answer arrives on an idle connection."""
INFORMATIONAL_MAX = 16
"""1xx heads (``100 Continue``, ``103 Early Hints``) an answer may have before its own head; a server that sends more
fails the request at once (every client: a flood of them is read at no cost to the server)."""


class BrokenAnswer(ConnectionError):
    """The server's answer is not well-formed HTTP/1.x, or the connection ended inside it."""


class AnswerTooLarge(BrokenAnswer):
    """The answer's body, as sent or inflated, is over the request's cap (not worth a retry)."""

    def __init__(self, limit: int, what: str = "answer"):
        super().__init__(f"the server's {what} is over the cap of {_size(limit)}")
        self.limit = limit


def _size(count: int) -> str:
    return f"{count / 2**20:g} MiB" if count >= 2**20 else f"{count} bytes"


_NO_BODY = frozenset({204, 304})
_DIGITS = re.compile(rb"[0-9]{1,20}")
"""A Content-Length: decimal digits, at most 20 (h11's bound)."""
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")
"""A chunk-size line without its CRLF, as h11 reads it: hex digits, an optional extension, optional whitespace."""
_FIELD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[ \t]*[\t\x20-\x7e\x80-\xff]*")
"""A trailer line: a token, a colon, a value with no control characters."""


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` in its ``Content-Encoding`` (identity, gzip or deflate) inflated, at most ``limit`` bytes of it:
    one ``decompressobj`` call whose output stops at the cap, so a bomb costs at most ``limit`` bytes.
    Raises :class:`AnswerTooLarge` past the cap, :class:`BrokenAnswer` for what does not inflate."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity") or not body:  # nothing to inflate (a 204's head may still name an encoding)
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise BrokenAnswer(f"an answer in an encoding this client does not read ({encoding})")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding != "deflate" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise BrokenAnswer(f"a {encoding} answer that does not inflate ({error})") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise AnswerTooLarge(limit, f"{encoding} answer, inflated,")
    if not inflater.eof:
        raise BrokenAnswer(f"a {encoding} answer that ends before its stream does")
    return out


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request on it at a time."""

    __slots__ = ("pool", "transport", "buffer", "waiter", "closed", "idle_since", "used", "limit", "_scan", "_head",
                 "_length", "_data", "_informational", "_received", "keep_alive")

    def __init__(self, pool: HTTP1Pool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.idle_since = 0.0
        self.used = False
        """Whether a request was answered on it (a reused connection may have been closed by the server)."""
        self.limit = MAX_ANSWER
        """The cap on the current answer's body, in bytes (the request's)."""
        self._reset()

    def _reset(self) -> None:
        self._scan = 0
        """Where to look for the end of the head next (not from 0 at each read)."""
        self._head: tuple[int, dict] | None = None
        """(status, headers) once the head is read."""
        self._length = -1
        """Body bytes expected; -1: not known yet; -2: chunked; -3: until the connection closes."""
        self._data = bytearray()
        """Chunked: the body's data so far (the buffer keeps only what is not read yet: the framing is dropped)."""
        self._informational = 0
        """1xx heads read before this answer's head."""
        self._received = 0
        """Bytes received for this answer, heads and framing included."""
        self.keep_alive = True

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # bytes nobody asked for (a late answer): they answer nothing
            self.buffer.clear()
            self.close()
            return
        try:
            self._received += len(data)
            if self._received > self.limit + HEAD_MAX:
                raise AnswerTooLarge(self.limit)
            self.buffer += data
            answer = self._parse()
        except Exception as error:  # a broken answer, or a fault of ours: the request fails, the callback does not
            self._fail(waiter, error)
            return
        if answer is not None:
            waiter.set_result(answer)

    def _fail(self, waiter: asyncio.Future, error: Exception) -> None:
        self.close()
        if not isinstance(error, BrokenAnswer):
            error = BrokenAnswer(f"the answer could not be read ({type(error).__name__}: {error})")
        if not waiter.done():
            waiter.set_exception(error)

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost finishes a read-until-close answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        try:
            self.pool._lost(self)
            if waiter is None or waiter.done():
                return
            if self._head is not None and self._length == -3:  # an answer delimited by the close
                self.keep_alive = False
                waiter.set_result(self._answer(bytes(self.buffer)))
                return
            error = BrokenAnswer("the server closed the connection before answering" if not self.buffer and self._head is None
                                 else "the server closed the connection inside its answer")
            if exc is not None:
                error.__cause__ = exc
            waiter.set_exception(error)
        except Exception as error:  # an encoding it cannot read: said now, not at the timeout
            if waiter is not None:
                self._fail(waiter, error)

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
                if len(buffer) > HEAD_MAX:
                    raise BrokenAnswer(f"the answer's head is over {HEAD_MAX // 1024} KiB")
                return None
            status, headers, version = _head(bytes(buffer[:end]))
            del buffer[:end + 4]
            self._scan = 0
            if 100 <= status < 200:  # 100 Continue, 103 Early Hints: the answer follows
                self._informational += 1
                if self._informational > INFORMATIONAL_MAX:
                    raise BrokenAnswer(informational_flood())
                continue
            self._head = (status, headers)
            self._length = self._framing(status, headers, version)
        length = self._length
        if length >= 0:
            if len(buffer) < length:
                return None
            if len(buffer) > length:  # more than the answer: the connection's framing is lost
                self.keep_alive = False
            return self._answer(bytes(buffer[:length]))
        if length == -2:
            return self._chunked()
        if len(buffer) > self.limit:  # until the connection closes
            raise AnswerTooLarge(self.limit)
        return None

    def _framing(self, status: int, headers: dict, version: str) -> int:
        """How the body is delimited (a length, -2: chunked, -3: the close), read strictly; the keep-alive it allows."""
        connection = headers.get("connection", "").lower()
        if "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection):
            self.keep_alive = False
        length = None
        if "content-length" in headers:  # repeated, it must repeat one value (h11's rule)
            values = {value.strip() for value in headers["content-length"].split(",")}
            if len(values) != 1 or not _DIGITS.fullmatch(next(iter(values)).encode("latin-1")):
                raise BrokenAnswer(f"Content-Length {headers['content-length'][:40]!r} is not a number of bytes")
            length = int(values.pop())
        chunked = "transfer-encoding" in headers
        if chunked and headers["transfer-encoding"].strip().lower() != "chunked":
            raise BrokenAnswer(f"Transfer-Encoding {headers['transfer-encoding'][:40]!r} is not chunked")
        if status in _NO_BODY:
            return 0
        if chunked:
            return -2
        if length is not None:
            if length > self.limit:  # refused at the head, before a byte of it is buffered
                raise AnswerTooLarge(self.limit)
            return length
        self.keep_alive = False
        return -3

    def _chunked(self):
        """The body once its last chunk and trailer are in; each chunk's data is moved to ``_data`` and its framing
        dropped from the buffer as it is read, so the buffer holds only what is not read yet."""
        buffer, data = self.buffer, self._data
        at = 0
        try:
            while True:
                line_end = _line_end(buffer, at, "a chunk-size line")
                if line_end < 0:
                    return None
                line = bytes(buffer[at:line_end])
                found = _CHUNK_SIZE.fullmatch(line)
                if found is None:
                    raise BrokenAnswer(f"bad chunk size {line[:40]!r}")
                size = int(found[1], 16)
                if size == 0:  # the last chunk, then trailer lines up to an empty one
                    start = line_end + 2
                    while True:
                        end = _line_end(buffer, start, "a trailer")
                        if end < 0:
                            return None
                        if end == start:
                            if len(buffer) > end + 2:
                                self.keep_alive = False
                            return self._answer(bytes(data))
                        if not _FIELD.fullmatch(buffer[start:end]):
                            raise BrokenAnswer(f"bad trailer line {bytes(buffer[start:end])[:40]!r}")
                        start = end + 2
                if size > self.limit - len(data):  # refused at its size line, before it is buffered
                    raise AnswerTooLarge(self.limit)
                if len(buffer) < line_end + 2 + size + 2:
                    return None
                data_end = line_end + 2 + size
                if buffer[data_end:data_end + 2] != b"\r\n":
                    raise BrokenAnswer(f"a chunk of {size} bytes not followed by CRLF: {bytes(buffer[data_end:data_end + 2])!r}")
                data += buffer[line_end + 2:data_end]
                at = data_end + 2
        finally:
            del buffer[:at]  # what was read (the chunks' framing and data): the buffer keeps the rest

    def _answer(self, body: bytes) -> tuple[int, dict, bytes]:
        status, headers = self._head
        return status, headers, inflate(body, headers.get("content-encoding", "identity"), self.limit)


def _line_end(buffer: bytearray, start: int, what: str) -> int:
    """Where the CRLF that ends the line at ``start`` is; -1 while it has not come (``what``, over :data:`HEAD_MAX`, fails)."""
    end = buffer.find(b"\r\n", start)
    if end < 0 and len(buffer) - start > HEAD_MAX:
        raise BrokenAnswer(f"{what} over {HEAD_MAX // 1024} KiB")
    return end


def _head(raw: bytes) -> tuple[int, dict, str]:
    """(status, headers, HTTP version) of an answer's head; header names lower-cased."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise BrokenAnswer(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    if not re.fullmatch(r"[0-9]{3}(?: .*)?", rest):
        raise BrokenAnswer(f"bad status line {lines[0][:80]!r}")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise BrokenAnswer(f"bad header line {line[:80]!r}")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return status, headers, version


def informational_flood() -> str:
    """The reason a request fails when its server sends more than :data:`INFORMATIONAL_MAX` 1xx heads (every client)."""
    return f"more than {INFORMATIONAL_MAX} informational (1xx) heads before the answer"


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class HTTP1Pool:
    """Keep-alive connections to one server (``base_url``'s scheme, host and port), in one event loop.

    ``await pool.request(b"POST", "/v1/chat/completions", body, timeout)`` -> (status, headers, body);
    ``headers`` has lower-cased names. ``headers=`` are sent with every request.
    """

    def __init__(self, base_url: str, headers: dict[str, str], *, keepalive: float = 30.0, settle: float = SETTLE_S):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if url.scheme == "https" else None
        self.keepalive = keepalive
        """Seconds an idle connection is kept (a server's own idle timeout may be shorter: it closes, and we notice)."""
        self.settle = settle
        """Seconds a connection stays idle before it is reused (:data:`SETTLE_S`)."""
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

    async def request(self, method: bytes, target: str, body: bytes, timeout: float,
                      limit: int = MAX_ANSWER) -> tuple[int, dict, bytes]:
        """One request and its answer within ``timeout`` seconds, connecting included, its body at most
        ``limit`` bytes (as sent and inflated). Raises ``TimeoutError`` or another ``OSError``
        (:class:`AnswerTooLarge` past the cap)."""
        if self.closed:
            raise BrokenAnswer("the client is closed")
        loop = self._loop
        data = self._prefix(method, target) + b"%d\r\n\r\n" % len(body) + body
        waiter = loop.create_future()
        deadline = loop.time() + timeout  # one deadline for the whole answer, whatever trickles in
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            while True:
                connection = self._take(loop)
                if connection is None:
                    connection = await self._connect(waiter)
                connection.waiter = waiter
                connection.limit = limit
                connection.transport.write(data)
                try:
                    answer = await waiter
                except BrokenAnswer:
                    if connection.used and not connection.buffer and connection._head is None and connection.closed:
                        # A kept-alive connection the server had closed (its idle timeout): once more, on a fresh one.
                        waiter = loop.create_future()
                        timer.cancel()
                        timer = loop.call_at(deadline, _expire, waiter)
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
        """The connection idle longest, if it has settled (``settle``); None: open a new one."""
        idle = self._idle
        now = loop.time()
        while idle:
            connection = idle[0]
            if connection.closed:
                idle.popleft()
                continue
            if now - connection.idle_since > self.keepalive:
                idle.popleft()
                connection.close()
                continue
            if now - connection.idle_since < self.settle:  # a late answer may still be on its way; the rest are newer
                return None
            return idle.popleft()
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
