"""Replicas: several model servers behind one ``openai:`` spec, balanced by requests in flight, failed over.

``openai:MODEL@URL|URL|...`` names several OpenAI-compatible servers that serve the same model (data-parallel
``vllm serve`` replicas, say). The run holds one :class:`ReplicaBackend` per such spec, over one
:class:`~negotiate.agents.backends.OpenAIBackend` per URL, each with its own clients, its spec's ``max_inflight``
bound, retries and timeouts, exactly as a single server has them, whichever ``client=`` the spec names.
``|`` and not a comma: ``--seller`` already splits its specs on commas. A router in front of the replicas
(``vllm-router``) is one URL, and needs nothing of this module (docs/replicas.md).

* **Balance.** Each request goes to the live replica with the fewest of this backend's requests in flight (those
  waiting for the replica's ``max_inflight`` slot included); ties go round the replicas in turn, so at one request
  at a time they take turns. Least in flight, not round robin: a replica that answers slower holds more requests,
  and gets fewer new ones.
* **Failover.** A replica that is not there (refused, reset or closed mid-answer, after the request's own retries:
  an :class:`~negotiate.agents.backends.LLMError` with ``unreachable`` set) is drained: no request goes to it for
  :data:`REVIVE_S` seconds, and the request is sent again to another replica. A request that times out (its spec's
  ``timeout`` is one deadline on each replica, retries included) or fails with a 5xx is sent again to a replica it has
  not tried yet, with a deadline of its own there; a replica whose requests time out
  :data:`~negotiate.agents.backends.DOWN_AFTER` times in a row is drained too. Only a request that every live
  replica failed fails (with the last error), so an episode is lost only when every replica is.
* **Requests on a drained replica.** Draining a replica also takes back this set's requests still on it, those
  queued for its ``max_inflight`` slot and those sent and not answered: each is cancelled there (an
  ``asyncio.timeout`` per request, with no deadline until the drain sets one: 2.4 us a request measured) and sent
  to a live replica at once. A hung server (SIGSTOP) is drained after 3 timeouts; the requests queued behind them
  used to take its slots in turn, a batch of ``max_inflight`` at a time, each batch waiting out its full ``timeout``
  (400 episodes over two replicas, one hung: 135 s at ``timeout=5``, where the survivor alone took about 80; at the
  default ``timeout=60``, 398 of 400 done after 480 s). Now (``benchmarks/replicas.py --hang --only-faults``, one of
  two stand-in replicas stopped 25 s in, on a busy 2-core machine where the survivor alone took 100 s): 75 s at
  ``timeout=5``, 93 s at ``timeout=60``, all 400 episodes each, none failed.
* **Stall.** A replica with requests in flight that has neither answered nor been given its first of them for the
  spec's ``timeout`` (a hung server, whose requests count as timeouts only at their deadline, and never where the
  bus's deadline, ``--seller-timeout``, is the shorter) gets new requests only when every live replica is stalled.
* **Revival.** A drained replica is tried again by one request once :data:`REVIVE_S` seconds have passed: if it
  answers, it is live again (a restarted server rejoins the run); if not, it is drained again.
* **All down.** When every replica is drained, a request fails at once with one ``LLMError`` naming each replica
  and its reason; the episode fails with it, as it does with one server that is down.

Errors that would be the same on any replica (400, 401, 404, an answer too large) are raised as they are. Before a
run, :meth:`ReplicaBackend.preflight` asks every replica: one that cannot be reached is drained (a warning; it
rejoins when it comes up), any other refusal stops the run, and so does every replica being unreachable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import structlog

from negotiate.agents.contract import Completion, LLMError, LLMTimeout
from negotiate.agents.openai_server import OpenAIBackend, OpenAIOptions
from negotiate.agents.openai_server import openai_backend as single_backend

__all__ = ["ReplicaBackend", "Replica", "openai_backend", "REVIVE_S"]

log = structlog.get_logger("negotiate.llm")

REVIVE_S = 30.0
"""Seconds a drained replica is left alone before one request tries it again."""


@dataclasses.dataclass(eq=False)
class Replica:
    """One server of a replica set: its backend, this set's requests in flight on it, and whether it is drained."""

    url: str
    backend: OpenAIBackend
    in_flight: int = 0
    """Requests of this set sent to it and not yet answered (those waiting for its ``max_inflight`` slot included)."""
    answered: int = 0
    """Requests it answered."""
    progress_at: float = 0.0
    """When it last answered, or went from no request in flight to one (``time.monotonic``): with requests in flight
    and no progress for the spec's ``timeout``, it is stalled (:meth:`ReplicaBackend.pick`)."""
    drained: str | None = None
    """Why no request goes to it (its error, without the model and URL); None while it is live."""
    drained_at: float = 0.0
    """When it was drained (``time.monotonic``)."""
    probing: bool = False
    """A request is trying it again after :data:`REVIVE_S` (one at a time)."""
    checked: bool = False
    """It answered the check before a run (``GET /models``); one drained there is checked when it is tried again."""
    attempts: set = dataclasses.field(default_factory=set)
    """This set's requests on it (queued for its slot, or sent), each an ``asyncio.Timeout`` with no deadline: draining
    it makes them expire, and each goes to another replica."""


class ReplicaBackend:
    """Chat completions from several servers of one model: least in flight first, drained on failure, retried elsewhere.

    The same interface as :class:`~negotiate.agents.backends.OpenAIBackend` (``complete``, ``preflight``,
    ``describe``, ``options``, ``server``); ``options.base_url`` is the spec's ``URL|URL|...``.
    """

    name = "openai"

    def __init__(self, options: OpenAIOptions, *, pools=None, revive_s: float = REVIVE_S):
        self.options = options
        self.pools = pools
        self.revive_s = revive_s
        """Seconds a drained replica waits before a request tries it again (:data:`REVIVE_S`)."""
        self.replicas = [Replica(url, OpenAIBackend(dataclasses.replace(options, base_url=url), pools=pools))
                         for url in options.base_urls]
        self._turn = 0
        """Where the next tie starts: replicas with as few requests in flight take turns."""

    @property
    def server(self) -> str:
        """The server kind requests are shaped for (the first live replica's; each replica shapes its own)."""
        live = [replica for replica in self.replicas if replica.drained is None] or self.replicas
        return live[0].backend.server

    @property
    def where(self) -> str:
        return f"{self.options.model} at {self.options.base_url}"

    def describe(self) -> dict:
        o = self.options
        return {"backend": "openai", "model": o.model, "base_url": o.base_url, "format": o.format, "server": self.server,
                "replicas": len(self.replicas)}

    def pick(self, tried=()) -> Replica | None:
        """The replica the next request goes to: a drained one whose :attr:`revive_s` has passed and that nobody is
        trying (it is tried again); else, of the live ones not in ``tried``, the one with fewest requests in flight
        (ties taken in turn), one that is stalled (requests in flight, and neither an answer nor a first request for
        the spec's ``timeout``: a hung server, whose requests may be cancelled by the bus's deadline before theirs)
        only where all are; else None."""
        count = len(self.replicas)
        start = self._turn
        now = time.monotonic()
        stall = self.options.timeout
        best, best_key = None, None
        for k in range(count):
            replica = self.replicas[(start + k) % count]
            if replica.drained is None and replica not in tried:
                key = (replica.in_flight > 0 and now - replica.progress_at > stall, replica.in_flight)
                if best is None or key < best_key:
                    best, best_key = replica, key
        for k in range(count):
            replica = self.replicas[(start + k) % count]
            if (replica.drained is not None and not replica.probing and replica not in tried
                    and now - replica.drained_at >= self.revive_s):
                replica.probing = True  # one request tries it; the rest wait for its verdict
                best = replica
                break
        if best is not None:
            self._turn = (self.replicas.index(best) + 1) % count
        return best

    def drain(self, replica: Replica, error: str) -> None:
        """Take ``replica`` out of the set for :attr:`revive_s` seconds, for ``error`` (its error's text), and send this
        set's requests still on it (queued for its slot, or unanswered) to the others."""
        reason = error.removeprefix(f"{self.options.model} at {replica.url}: ")
        moved = len(replica.attempts)
        if replica.drained is None:
            log.warning("replica drained", model=self.options.model, base_url=replica.url, reason=reason,
                        live=sum(r.drained is None for r in self.replicas) - 1, replicas=len(self.replicas), moved=moved)
            requests = (self.pools.requests.logger if self.pools is not None else None)
            if requests is not None:
                requests.warning("replica drained", backend="openai", model=self.options.model, base_url=replica.url, reason=reason,
                                 moved=moved)
        replica.drained = reason
        replica.drained_at = time.monotonic()
        now = asyncio.get_running_loop().time() if replica.attempts else 0.0
        for attempt in replica.attempts:
            if not attempt.expired():  # drained twice before the first drain's requests moved on
                attempt.reschedule(now)

    def _revive(self, replica: Replica) -> None:
        """``replica`` answered: it is live (again), its backend's count of timeouts in a row cleared."""
        if replica.drained is not None:
            log.info("replica revived", model=self.options.model, base_url=replica.url)
            replica.drained = None
            replica.backend.revive()

    def all_down(self) -> LLMError:
        """The one error of a set whose every replica is drained."""
        reasons = "; ".join(f"{replica.url}: {replica.drained}" for replica in self.replicas)
        return LLMError(f"{self.where}: all {len(self.replicas)} replicas are down ({reasons})", unreachable=True)

    async def complete(self, messages: list[dict], *, role: str, seed: int | None = None,
                       constraint: str | None = None) -> Completion:
        """One chat completion from the replica :meth:`pick` names; on its failure, from another (see the module).
        Raises :class:`~negotiate.agents.backends.LLMError` or :class:`~negotiate.agents.backends.LLMTimeout`."""
        tried: list[Replica] = []
        failure: BaseException | None = None
        while True:
            replica = self.pick(tried)
            if replica is None:
                if failure is None or all(r.drained is not None for r in self.replicas):
                    raise self.all_down()
                raise failure
            tried.append(replica)
            if replica.in_flight == 0:
                replica.progress_at = time.monotonic()
            replica.in_flight += 1
            probing = replica.probing
            try:
                if probing:  # its backend's verdict (down after timeouts) is what this request puts to the test
                    replica.backend.revive()
                if probing and not replica.checked:  # never asked before: its models and kind of server first
                    await replica.backend.preflight()
                    replica.checked = True
                completion = await self._attempt(replica, messages, role=role, seed=seed, constraint=constraint)
                if completion is None:  # its replica was drained while it waited there: another one answers it
                    continue
            except LLMTimeout as error:  # slow or hung: another replica may answer; DOWN_AFTER in a row drains it
                if replica.backend.down is not None or probing:
                    self.drain(replica, replica.backend.down or str(error))
                failure = error
                continue
            except LLMError as error:
                if error.unreachable:  # refused, reset, closed mid-answer (after its retries), or down
                    self.drain(replica, str(error))
                    failure = error
                    continue
                if error.status is not None and error.status >= 500:  # this replica's trouble, after its retries
                    if probing:
                        self.drain(replica, str(error))
                    failure = error
                    continue
                if error.status is not None:  # it answered: it is there, and the request was at fault
                    replica.progress_at = time.monotonic()
                    self._revive(replica)
                elif probing:
                    self.drain(replica, str(error))
                raise
            finally:
                replica.in_flight -= 1
                if probing:
                    replica.probing = False
            replica.answered += 1
            replica.progress_at = time.monotonic()
            self._revive(replica)
            return completion

    async def _attempt(self, replica: Replica, messages: list[dict], **request) -> Completion | None:
        """``replica``'s answer to one request, or None if the replica is drained before it answers (the request is
        cancelled there, queued for its slot or sent: :meth:`drain`)."""
        attempt = asyncio.timeout(None)
        try:
            async with attempt:
                replica.attempts.add(attempt)
                return await replica.backend.complete(messages, **request)
        except TimeoutError:  # LLMTimeout is one: the replica's own answer unless the drain came first
            if attempt.expired():
                return None
            raise
        finally:
            replica.attempts.discard(attempt)

    async def preflight(self) -> None:
        """Ask every replica (``GET /models``) at once: one that cannot be reached is drained (it rejoins when it
        comes up, :attr:`revive_s` later); any other refusal (a wrong model, a bad key) raises, and so does every
        replica being unreachable."""
        outcomes = await asyncio.gather(*(replica.backend.preflight() for replica in self.replicas), return_exceptions=True)
        for replica, outcome in zip(self.replicas, outcomes):
            if isinstance(outcome, LLMError) and outcome.unreachable:
                self.drain(replica, str(outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                replica.checked = True
        if all(replica.drained is not None for replica in self.replicas):
            raise self.all_down()


def openai_backend(pools, options: OpenAIOptions):
    """The one backend of ``options`` in ``pools``' run: a :class:`ReplicaBackend` where the spec names several
    servers (``URL|URL``), else the one server's :class:`~negotiate.agents.backends.OpenAIBackend`."""
    if "|" not in options.base_url:
        return single_backend(pools, options)
    return pools.memo(("openai-replicas", options), lambda: ReplicaBackend(options, pools=pools))
