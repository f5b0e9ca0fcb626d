"""Model pools: every HTTP client, shared backend and loaded model a run holds, in one object.

A :class:`Pools` belongs to a run (``negotiate.run.Run`` makes or is given one) and is
closed by it. It is a store and knows no agent: the backends (``negotiate.agents.backends``
names each) keep what they share in it, through :meth:`Pools.clients` and
:meth:`Pools.memo`, so nothing here imports them. What it holds, and why it is shared:

* the HTTP clients of ``openai:`` agents, one per (base URL, key) and event loop, with the
  in-flight bound (a FIFO limiter) every agent of that server waits on, so a vLLM server can
  batch the requests without being flooded. Sessions belong to the loop that made them: a
  command that checks its servers on one loop and plays on another gets a client per loop,
  and :meth:`Pools.aclose` closes the running loop's;
* the ``--max-inflight`` override and this process's share of the bounds (``--workers``);
  changing either bumps :attr:`Pools.generation`, so backends look their client up again;
* one :class:`~negotiate.agents.openai_server.OpenAIBackend` per distinct spec (an agent is built
  per episode; the backend, its parsed schema and URL, once per run);
* the request log, where every backend of the run writes a line per model request;
* the local models (``hf:``): one per (path, dtype), loaded once and batched across every
  episode of the run, and one backend per ``hf:``/``vllm:`` spec; the in-process vLLM engines
  (``vllm:``), one per engine settings. Local models outlive a loop: an evaluation's splits and
  the check before a run share them.

Agents built outside any run (a test, a script that builds one agent) use the pools of the
current context (:func:`current_pools`): a run installs its own for its duration; otherwise the
context's own, made on first use, which :func:`negotiate.agents.clients.aclose_clients` closes.
Nothing here is module state: the pools are the run's, or the context's.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref

from negotiate.logs import RequestLog

__all__ = ["Pools", "current_pools", "use_pools"]


class Pools:
    """The model clients, backends and local models of one run."""

    def __init__(self, *, max_inflight: int | None = None, share: tuple[int, int] = (0, 1)):
        self.max_inflight = max_inflight
        """``--max-inflight``: requests in flight per server, overriding every spec's ``max_inflight`` (None: the specs')."""
        self.share = share
        """(worker, workers): this process's share of the run's in-flight bounds (the whole of them outside workers)."""
        self.generation = 0
        """Bumped whenever the in-flight settings change or clients close, so backends look their client up again."""
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        """event loop -> {key: client}: what :meth:`clients` hands out."""
        self._made: dict[tuple, object] = {}
        """What :meth:`memo` made: key -> object."""
        self._lock = threading.RLock()
        self.requests = RequestLog()
        """Every model request of the run, one JSON line each, once a command opens it in the run folder."""

    # -- openai: ----------------------------------------------------------------------------------

    def set_max_inflight(self, limit: int | None, *, share: tuple[int, int] = (0, 1)) -> None:
        """The ``--max-inflight`` flag for this run (None goes back to the specs). In worker ``share[0]`` of
        ``share[1]``, a spec's ``max_inflight`` is this worker's part of it (the parts add up to it, at least
        1 each), so the bound stays the run's."""
        self.max_inflight = limit
        self.share = share
        self.generation += 1

    def spec_limit(self, max_inflight: int) -> int:
        """This process's part of a spec's ``max_inflight`` (the parts of the workers add up to it, at least 1 each)."""
        worker, workers = self.share
        return max(1, max_inflight // workers + (1 if worker < max_inflight % workers else 0))

    def clients(self, loop=None) -> dict:
        """The client table of the loop (the running one by default), made on first use: key -> an object with an
        async ``aclose`` (``negotiate.agents.clients`` keeps one per base URL and key)."""
        loop = loop or asyncio.get_running_loop()
        table = self._clients.get(loop)
        if table is None:
            table = self._clients[loop] = {}
        return table

    def has_clients(self, loop=None) -> bool:
        """Whether the loop (the running one by default) holds open clients."""
        return bool(self._clients.get(loop or asyncio.get_running_loop()))

    def memo(self, key: tuple, make):
        """The one object of ``key`` in this run: ``make()`` the first time (under a lock: local models load from
        worker threads), the same object after. The backends, their options and the local models live here."""
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = make()
            return made

    async def aclose(self) -> None:
        """Close every HTTP client of the running event loop (once at the end of a run; later use opens new ones)."""
        clients = self._clients.pop(asyncio.get_running_loop(), {})
        self.generation += 1  # backends holding one of these look again
        for shared in clients.values():
            await shared.aclose()


_CURRENT: contextvars.ContextVar[Pools] = contextvars.ContextVar("negotiate_pools")
"""The pools of the run in progress in this context (:class:`use_pools`), or this context's own (:func:`current_pools`)."""


def current_pools() -> Pools:
    """The pools of the run in progress in this context; outside any run, this context's own, made on first use and
    shared by every agent built in it (a script's, a test's). There are no process-wide pools: a context that
    never ran anything has none, and tasks started from a context share what it held when they started."""
    try:
        return _CURRENT.get()
    except LookupError:
        pools = Pools()
        _CURRENT.set(pools)
        return pools


class use_pools:
    """``with use_pools(pools):`` agents built and backends used in this context take ``pools``."""

    def __init__(self, pools: Pools):
        self.pools = pools
        self._token = None

    def __enter__(self) -> Pools:
        self._token = _CURRENT.set(self.pools)
        return self.pools

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._token)
