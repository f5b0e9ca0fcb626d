"""The HTTP clients of the ``openai:`` backend, shared per (base URL, key) and event loop in a run's pools.

One :class:`_Shared` per server and key (``negotiate.agents.pools``: the run owns and closes them) holds an in-flight
bound (a FIFO :class:`_Limiter`) on the requests, so a vLLM server can batch them without being flooded, and the
clients made on first use: our own HTTP/1.1 pool (``client=http``, :mod:`negotiate.agents.http1`), one
``aiohttp.ClientSession`` (``client=aiohttp``, and every backend's check before a run) and ``AsyncOpenAI`` over its
aiohttp transport on that same session (``client=openai``). The request loop over them (retries, deadline, errors) is
:meth:`negotiate.agents.openai_server.OpenAIBackend._post`.

Whatever a server sends, the three clients stay bounded and strict alike (issues 44 and 51; ``client=openai``
reads its answer, an error answer included, under the same cap, through the openai client's streamed body): an
answer's body is capped as it arrives (``max_answer_mb``; :class:`~negotiate.agents.http1.AnswerTooLarge`, not
retried), none asks for compression and all inflate gzip or deflate under the same cap
(:func:`~negotiate.agents.http1.inflate`; aiohttp's own inflating is off), at most
:data:`~negotiate.agents.http1.INFORMATIONAL_MAX` 1xx heads may come before an answer, and a connection is reused
only after it has been idle a moment and one that receives a byte while idle is closed (a late second answer never
reaches another request); no redirect is followed.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from negotiate.agents.contract import LLMError
from negotiate.agents.pools import current_pools

__all__ = ["shared_clients", "set_max_inflight", "aclose_clients", "read_bounded", "LLM_INSTALL", "CONNECTIONS", "MAX_INFLIGHT"]

MAX_INFLIGHT = 256
"""Requests in flight per server and key where a spec names no ``max_inflight``."""

LLM_INSTALL = "pip install 'negotiate[llm]'"
"""The install hint for ``openai:`` agents (the openai client, aiohttp, uvloop)."""


class _Limiter:
    """A bound on requests in flight: ``async with limiter`` (FIFO waiters; ``total_tokens`` may change).

    ``anyio.CapacityLimiter`` costs an extra trip through the event loop per acquisition (its
    checkpoints), a few percent of a request's CPU here; this one takes a free slot without yielding.
    Waiters are woken in order; a cancelled waiter passes its slot on.
    """

    __slots__ = ("_total", "_used", "_waiters")

    def __init__(self, total: int):
        self._total = total
        self._used = 0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def total_tokens(self) -> int:
        return self._total

    @total_tokens.setter
    def total_tokens(self, value: int) -> None:
        self._total = value
        self._wake()

    @property
    def borrowed_tokens(self) -> int:
        return self._used

    def _wake(self) -> None:
        while self._waiters and self._used < self._total:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._used += 1
                waiter.set_result(None)

    async def __aenter__(self) -> None:
        if self._used < self._total and not self._waiters:
            self._used += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # granted, then cancelled: hand the slot on
                self._used -= 1
                self._wake()
            raise

    async def __aexit__(self, *exc) -> None:
        self._used -= 1
        self._wake()


@dataclass
class _Shared:
    """The HTTP clients and the in-flight bound of one (base URL, key) in one event loop.

    Both client kinds share the one limiter: ``max_inflight`` bounds the server's load whichever
    client an agent uses.
    """

    base_url: str
    key: str
    limiter: _Limiter
    session: object = None
    """``aiohttp.ClientSession`` (``client=aiohttp``, and every backend's preflight), made on first use."""
    http: object = None
    """:class:`~negotiate.agents.http1.HTTP1Pool` (``client=http``), made on first use."""
    openai: object = None
    """``openai.AsyncOpenAI`` over the aiohttp transport on :attr:`session` (``client=openai``), made on first use."""

    @property
    def client(self):
        """The openai client (made on first use), its transport on the aiohttp session's settling connections."""
        if self.openai is None:
            self.openai = _openai_client(self.base_url, self.key, self.aiohttp())
        return self.openai

    def http1(self):
        """The HTTP/1.1 connection pool (made on first use)."""
        if self.http is None:
            from negotiate.agents.http1 import HTTP1Pool

            self.http = HTTP1Pool(self.base_url, _headers(self.key), keepalive=30.0)
        return self.http

    async def aclose(self) -> None:
        """Close every client made (the run's pools call this at its end)."""
        if self.openai is not None:
            await self.openai.close()  # and its transport's session, which is ours: closing it twice is harmless
        if self.session is not None:
            await self.session.close()
        if self.http is not None:
            await self.http.close()

    def aiohttp(self):
        """The aiohttp session (made on first use)."""
        if self.session is None:
            import aiohttp

            # The limiter is the real bound; the connector never makes a request wait on top of it.
            connector = _settling_connector()(limit=max(CONNECTIONS, self.limiter.total_tokens), limit_per_host=0,
                                              keepalive_timeout=30.0, ttl_dns_cache=300)
            # No Accept-Encoding, and no inflating by aiohttp (unbounded): read_bounded inflates under the cap.
            self.session = aiohttp.ClientSession(connector=connector, headers=_headers(self.key), cookie_jar=aiohttp.DummyCookieJar(),
                                                 skip_auto_headers=("User-Agent", "Accept-Encoding"), auto_decompress=False,
                                                 raise_for_status=False, trust_env=False)
        return self.session


async def read_bounded(response, limit: int) -> bytes:
    """An aiohttp response's body, at most ``limit`` bytes as sent (counted as it arrives, a larger
    ``Content-Length`` refused before a byte is read) and inflated (:func:`~negotiate.agents.http1.inflate`).
    Raises :class:`~negotiate.agents.http1.AnswerTooLarge` or ``BrokenAnswer``."""
    async def chunks():
        while chunk := await response.content.readany():
            yield chunk

    return await _capped(response.content_length, chunks(), response.headers.get("Content-Encoding", "identity"), limit)


async def _capped(length: int | None, chunks, encoding: str, limit: int) -> bytes:
    """A body of at most ``limit`` bytes as sent (``length``, its Content-Length, refused before a byte is read;
    ``chunks`` counted as they arrive) and inflated: what every client reads an answer through."""
    from negotiate.agents.http1 import AnswerTooLarge, inflate

    if length is not None and length > limit:
        raise AnswerTooLarge(limit)
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(limit)
        parts.append(chunk)
    return inflate(b"".join(parts), encoding, limit)


@functools.cache
def _settling_connector():
    """An ``aiohttp.TCPConnector`` that, like :class:`~negotiate.agents.http1.HTTP1Pool`, reuses a connection only
    once it has been idle :data:`~negotiate.agents.http1.SETTLE_S` and never one that received a byte while idle:
    stock aiohttp parses a late second answer on an idle connection (whole, or the start of one) and hands it to
    the next request sent on it (``client=aiohttp``, and ``client=openai``, whose transport is this session's).
    Its connections also fail an answer with more than :data:`~negotiate.agents.http1.INFORMATIONAL_MAX` 1xx heads
    (aiohttp reads any number)."""
    import aiohttp
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.http_exceptions import HttpProcessingError

    from negotiate.agents.http1 import INFORMATIONAL_MAX, SETTLE_S, informational_flood

    class Handler(ResponseHandler):
        """aiohttp's connection protocol, counting the bytes it receives and the 1xx heads before an answer."""

        heard = 0
        """Bytes received on the connection."""
        heard_when_idle = -1
        """:attr:`heard` when the connection went back to the pool."""
        informational = 0

        def data_received(self, data: bytes) -> None:
            self.heard += len(data)
            super().data_received(data)

        def feed_data(self, data, size: int = 0) -> None:  # one parsed answer head and its body's reader
            if self.informational > INFORMATIONAL_MAX:  # a flood failed the connection: nothing after it is read
                return
            code = data[0].code
            if 100 <= code < 200 and code != 101:
                self.informational += 1
                if self.informational > INFORMATIONAL_MAX:  # the reader raises it (as a ClientResponseError)
                    if self.transport is not None:
                        self.transport.close()
                    self.set_exception(HttpProcessingError(message=informational_flood()))
                    return
            else:
                self.informational = 0
            super().feed_data(data, size)

        @property
        def heard_while_idle(self) -> bool:
            """Bytes came while the connection sat in the pool (a late answer, whole or in part): it answers nothing."""
            return self.heard != self.heard_when_idle

    class SettlingConnector(aiohttp.TCPConnector):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._factory = functools.partial(Handler, loop=self._loop)  # the protocol of each new connection

        def _release(self, key, protocol, *, should_close: bool = False) -> None:
            protocol.heard_when_idle = getattr(protocol, "heard", -1)
            super()._release(key, protocol, should_close=should_close)

        async def _get(self, key, traces):
            conns = self._conns.get(key)  # (protocol, released at), oldest first; the base class takes the first
            if conns:
                # Bytes arrived while it was idle: they answer nothing, and it goes.
                while conns and (conns[0][0].should_close or not conns[0][0].is_connected()
                                 or getattr(conns[0][0], "heard_while_idle", True)):
                    conns.popleft()[0].close()
                if conns and time.monotonic() - conns[0][1] < SETTLE_S:
                    return None  # none has settled: a new connection
            return await super()._get(key, traces)

    return SettlingConnector


def _headers(key: str) -> dict[str, str]:
    """The headers of every request to a server, either client."""
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json", "Accept": "application/json"}


CONNECTIONS = 4096
"""Connection pool size of a shared client; ``max_inflight`` is the real bound."""


@functools.cache
def _openai_httpx():
    """The HTTP package the installed openai client is built on: ``httpx`` (openai 2) or ``httpx2`` (openai 3); its
    timeouts and responses must be that package's own."""
    import openai._base_client as base

    return getattr(base, "httpx2", None) or base.httpx


_ANSWER_CAP: contextvars.ContextVar[int] = contextvars.ContextVar("negotiate_answer_cap")
"""The cap on the answer of the request this task is making (``client=openai``'s response hook reads it)."""


class _StatusAnswer(Exception):
    """An answer with a status of 300 or more, read under the cap by ``client=openai``'s response hook: ours to retry
    or to word (the openai client would read its body whole)."""

    def __init__(self, status: int, headers, body: bytes):
        super().__init__(status)
        self.status, self.headers, self.body = status, headers, body


async def _read_status_answer(response) -> None:
    """The openai client's response hook: an answer whose status is 300 or more is read here, under the request's
    cap (:data:`_ANSWER_CAP`), and raised as :class:`_StatusAnswer`, which the openai client lets through."""
    if response.status_code >= 300:
        from negotiate.agents.http1 import MAX_ANSWER

        body = await _read_capped(response, _ANSWER_CAP.get(MAX_ANSWER))
        raise _StatusAnswer(response.status_code, response.headers, body)


def _openai_client(base_url: str, key: str, session):
    """``AsyncOpenAI`` over the aiohttp transport on ``session`` (its settling connector), its own retries and redirects
    off, its error answers read under the cap by :func:`_read_status_answer`."""
    try:
        import openai

        httpx2 = _openai_httpx()
        try:
            from openai._vendor.httpx_aiohttp import AiohttpTransport  # openai 3, on httpx2
        except ImportError:
            from httpx_aiohttp import AiohttpTransport  # openai 2, on httpx: the httpx-aiohttp package
    except ImportError:
        raise LLMError(f"client=openai needs the openai client: {LLM_INSTALL}") from None
    # Timeouts are per request (each backend's deadline); these are placeholders.
    http = openai.DefaultAioHttpClient(transport=AiohttpTransport(client=session), follow_redirects=False,
                                       event_hooks={"response": [_read_status_answer]}, timeout=httpx2.Timeout(60.0, connect=10.0))
    return openai.AsyncOpenAI(api_key=key, base_url=base_url, http_client=http, max_retries=0, timeout=60.0)


def _under(error: BaseException) -> BaseException:
    """What happened, under one of the openai client's errors: the outermost aiohttp or OS error among its causes (its
    transport maps aiohttp's errors to httpx's, a refused connection to ``ConnectTimeout``, and the openai client wraps
    those in turn), else the innermost cause as a ``ConnectionError`` naming it."""
    import aiohttp

    last = error
    for last in _causes(error):
        if isinstance(last, (aiohttp.ClientError, OSError)):
            return last
    return ConnectionError(f"{type(last).__name__}: {last}" if str(last) else type(last).__name__)


def _status_answer_in(error: BaseException) -> _StatusAnswer | None:
    """The :class:`_StatusAnswer` among an error's causes: openai 2 wraps what its response hook raises in
    ``APIConnectionError`` (openai 3 lets it through)."""
    return next((cause for cause in _causes(error) if isinstance(cause, _StatusAnswer)), None)


def _causes(error: BaseException | None) -> Iterator[BaseException]:
    """An error, then what it was raised from or during, outermost first (each once: a chain may loop)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _broken(error) -> BaseException:
    """What an aiohttp error stands for, in our words: its parser's verdict on a broken answer (it says ``400``, as if
    the server had) is a :class:`~negotiate.agents.http1.BrokenAnswer`; any other error is itself."""
    import aiohttp

    from negotiate.agents.http1 import BrokenAnswer

    if isinstance(error, (aiohttp.ClientResponseError, aiohttp.ClientPayloadError)):
        return BrokenAnswer(" ".join(str(getattr(error, "message", None) or error).split())[:200])
    return error


# The clients live in a run's pools (negotiate.agents.pools); these act on the current context's.

async def _read_capped(response, limit: int) -> bytes:
    """An httpx response's body (``client=openai``), at most ``limit`` bytes as sent and inflated, as
    :func:`read_bounded` reads aiohttp's."""
    length = response.headers.get("Content-Length")
    return await _capped(int(length) if length is not None and length.isdigit() else None, response.aiter_raw(),
                         response.headers.get("Content-Encoding", "identity"), limit)


def set_max_inflight(limit: int | None, *, share: tuple[int, int] = (0, 1)) -> None:
    """The ``--max-inflight`` override on the current pools (:meth:`Pools.set_max_inflight`)."""
    current_pools().set_max_inflight(limit, share=share)


def shared_clients(pools, options) -> _Shared:
    """The HTTP clients and in-flight bound of ``options``' server and key in the running loop (``options``: an
    ``openai:`` spec's :class:`~negotiate.agents.openai_server.OpenAIOptions`), kept in ``pools`` (made on first use). ``--max-inflight`` (the pools') wins over a spec's ``max_inflight``; an explicit one
    over the default."""
    clients = pools.clients()
    key = os.environ.get(options.key_env) or "EMPTY"  # local servers take any key; vLLM's convention
    shared = clients.get((options.base_url, key))
    limit = pools.max_inflight or pools.spec_limit(options.max_inflight)
    if shared is None:
        shared = clients[(options.base_url, key)] = _Shared(options.base_url, key, _Limiter(limit))
    elif pools.max_inflight is not None:
        shared.limiter.total_tokens = pools.max_inflight  # the command line wins
    elif shared.limiter.total_tokens != limit and options.max_inflight != MAX_INFLIGHT:
        shared.limiter.total_tokens = limit  # an explicit max_inflight wins
    return shared


def _shared(options) -> _Shared:
    return shared_clients(current_pools(), options)


async def aclose_clients() -> None:
    """Close every shared client of the running event loop in the current pools (once at the end of a run)."""
    await current_pools().aclose()

