"""The Ray executor: a run's shards as Ray tasks, on one machine or a cluster (``--executor ray``).

Labs that outgrow one machine already run Ray (SkyRL, OpenRLHF and vLLM's multi-node mode sit on it), so
a run past one machine's cores goes onto their cluster instead of an engine of our own. ``--executor ray
--address ADDR --workers N`` deals the run's markets to N shards exactly as to N worker processes
(:func:`negotiate.workers.share`, every seller of a market in one shard), each with its part of
``--concurrency`` and ``--max-inflight``. Each shard is one Ray task (one CPU) that plays its share with
``run_batch`` on its own event loop (:func:`negotiate.workers.play_share`) and yields what it finishes
(a Ray streaming generator) in batches of whatever is ready, so a busy shard sends few objects. The
driver, the ``negotiate`` command, writes every episode to the run's usual trace files: the markets,
seeds, episode ids and records are those of ``--workers N``, and ``--resume`` and ``report`` read the
traces as ever. Tasks write no files, so the cluster needs no shared disk.

A shard whose process dies (killed, out of memory, its node gone) plays again, up to :data:`RERUNS`
times, without what the driver already wrote: a shard numbers its jobs in play order, the same on every
attempt; the driver keeps the numbers it wrote (all below a low-water mark, and the few finished above
it: :class:`Written`, the size of the episodes in flight, not of the run) and the next attempt skips
them. No episode is written twice and none goes missing. Ray's own task retries would play the whole
shard again, so tasks are submitted with ``max_retries=0`` and the driver reruns them. An error of the
run itself (a trace that takes no more, a model server that cannot be reached) stops the run as it does
with ``--workers``; finished episodes are kept and ``--resume`` plays the rest.

A shard that dies once more than that stops the run with :class:`~negotiate.workers.WorkerLost` (exit code 4,
not 2: nothing was wrong with the command; the episodes written are kept).

Joining the cluster has a deadline, :data:`CONNECT_S`: ``ray.init`` waits for minutes on an address that accepts
and never answers, and a driver whose token the cluster refuses joins at once but never hears from its tasks (Ray
writes ``~/.ray/auth_token`` for every instance ``ray.init`` starts; a driver at ``auto`` then sends it to a cluster
that ``ray start --head`` started without one). So ``ray.init`` joining a cluster runs in a thread of its own, and
before any shard a first task (no CPU asked) must stream a line back, both within :data:`CONNECT_S` seconds in all;
else the run stops with :class:`~negotiate.workers.WorkerLost` naming the likely cause. An instance this run starts (``--address
local``, or Ray's default where it starts one) listens on 127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
where the environment does not say otherwise), and ``local`` is given a token of its own in its environment, so
it writes no ``~/.ray/auth_token`` for later runs to send elsewhere.

Ctrl-C and SIGTERM end a Ray run as they end a local one: ``ray.init`` puts Ray's own SIGTERM handler in place
(``sys.exit(15)``, after a crash dump from its C++ handler), so the command's handler is put back after it; the
tasks are cancelled, what they sent is written, and the command exits 130 or 143.

Every node needs negotiate installed at the driver's version (a shared image, or the cluster's Python
environment). A task's log lines go to Ray's worker logs, and Ray shows their warnings on the driver's
console; requests are not logged per worker as they are with ``--workers`` (there is no disk to share).
"""

from __future__ import annotations

import itertools
import logging
import os
import platform
import queue
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import structlog

from negotiate.errors import UserError
from negotiate.trace import TraceWriteError
from negotiate.workers import WorkerLost, play_share, shard_task, trace_writers, worker_count, worker_task

__all__ = ["run_ray", "RERUNS", "Written", "CONNECT_S"]

log = structlog.get_logger("negotiate.ray")

RERUNS = 2
"""How many times a shard whose process died plays its unwritten jobs again before the run stops."""
CONNECT_S = float(os.environ.get("NEGOTIATE_RAY_CONNECT_S", "60"))
"""Seconds to join the Ray cluster and hear from a first task on it (``NEGOTIATE_RAY_CONNECT_S`` sets it): a local
instance started in 5-8 s on this busy 2-core machine, a first task answered in about 1 s more."""
_BATCH = 256
"""The most episodes a task yields at once (what is ready when the driver asks, up to this)."""
_END = ("done", "error")


@dataclass
class Written:
    """The job numbers of one shard the driver has written: every one below ``low``, and those in ``ahead``.
    A shard takes its jobs in order and finishes them nearly in order, so ``ahead`` stays about as large as
    the shard's episodes in flight.

    >>> mark = Written()
    >>> [mark.add(n) for n in (1, 0, 0, 3)], mark.low, sorted(mark.ahead)
    ([True, True, False, True], 2, [3])
    """

    low: int = 0
    ahead: set[int] = field(default_factory=set)

    @property
    def count(self) -> int:
        """How many numbers are written."""
        return self.low + len(self.ahead)

    def add(self, number: int) -> bool:
        """Note ``number`` written; False if it was already (a second copy, which is not written)."""
        if number < self.low or number in self.ahead:
            return False
        self.ahead.add(number)
        while self.low in self.ahead:
            self.ahead.remove(self.low)
            self.low += 1
        return True


def _play_shard(task: dict, low: int, ahead: frozenset[int]) -> Iterator[list[tuple]]:
    """One shard, as a Ray task: play ``task``'s jobs but those numbered below ``low`` or in ``ahead``, and yield
    lists of messages: ``("started", node, pid)`` first, then ``("episode", number, run, seller, lines, row)`` for
    each episode, and at the end ``("done",)`` or ``("error", message, traceback)``. The episodes play on an event
    loop in a thread; this generator hands on what it finishes."""
    messages: queue.SimpleQueue = queue.SimpleQueue()
    counter = itertools.count()
    numbers: dict[tuple[int, str, int], int] = {}  # a job in play -> its number (only the event loop's thread uses it)

    def numbered(k: int, jobs: Iterable) -> Iterator:
        for job in jobs:
            number = next(counter)
            if number >= low and number not in ahead:
                numbers[(k, job.seller.text, job.index)] = number
                yield job

    def send(message: tuple) -> None:
        if message[0] == "episode":
            _, k, seller, data, row = message
            message = ("episode", numbers.pop((k, seller, row["index"])), k, seller, data, row)
        messages.put(message)

    yield [("started", platform.node(), os.getpid())]
    player = threading.Thread(target=play_share, args=(task, send, numbered), name="negotiate-shard", daemon=True)
    player.start()
    while True:
        batch = [messages.get()]
        while len(batch) < _BATCH and batch[-1][0] not in _END:
            try:
                batch.append(messages.get_nowait())
            except queue.Empty:
                break
        yield batch
        if batch[-1][0] in _END:
            break
    player.join()


def _hello() -> Iterator[str]:
    """The first task of a run: one line streamed back, as a shard streams its episodes (what a driver whose token the
    cluster refuses never receives, though a plain task's answer reaches it)."""
    yield platform.node()


_LOOPBACK = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch: "0" makes an instance started here take 127.0.0.1 as its address, and listen there only."""
_AUTH = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _environment(address: str) -> dict[str, str]:
    """Before Ray is imported: an instance this run may start listens on 127.0.0.1 only, and ``local`` gets a token of its
    own (what Ray would write to ``~/.ray/auth_token``, where a later run at ``auto`` would find it and send it to
    another cluster). Returns what was set, to take out again at the end."""
    if address not in ("", "local"):
        return {}
    chosen = {}
    if _LOOPBACK not in os.environ and "ray" not in sys.modules:  # Ray reads it once, at import
        chosen[_LOOPBACK] = "0"
    if address == "local" and not any(name in os.environ for name in _AUTH):
        chosen["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ.update(chosen)
    return chosen


class _NotMainThread(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "not the main thread" not in record.getMessage()


def _connect(ray, address: str, deadline: float) -> bool:
    """Join the Ray cluster at ``address`` (empty: Ray's default, ``RAY_ADDRESS`` or a cluster started on this
    machine, else a new one; ``local``: a new one) by ``deadline`` (``time.monotonic``); True when this call started
    Ray, and so shuts it down. A process that has already called ``ray.init`` keeps its cluster.

    Joining a cluster (``auto``, ``HOST:PORT``, ``ray://``, ``RAY_ADDRESS``, or the default where
    :func:`_last_started` names one), ``ray.init`` runs in a thread of its own, which the deadline stops waiting for:
    it may wait for minutes (the default joining a cluster that has stopped retried its address for over 5 minutes
    here, with no line of ours). An instance is started in the calling
    thread (Ray's processes are told to die with the thread that started them). Either way the SIGTERM handler in
    place before is put back once it returns, over Ray's (``sys.exit(15)`` and a crash dump from its C++ handler)."""
    if ray.is_initialized():
        return False
    shown = address or "(Ray's default)"
    last = _last_started(ray) if address in ("", "auto") and not os.environ.get("RAY_ADDRESS") else None
    outcome: dict = {}

    def init() -> None:
        try:
            ray.init(address=address or None, logging_level=logging.WARNING)
        except BaseException as error:  # noqa: BLE001 -- handed to the caller's thread
            outcome["error"] = error

    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if address == "local" or (not address and not os.environ.get("RAY_ADDRESS") and last is None):
            init()  # starts an instance
        else:
            quiet = _NotMainThread()  # Ray's warning that a thread gets no SIGTERM handler of Ray's: that is wanted here
            logging.getLogger("ray._private.worker").addFilter(quiet)
            try:
                thread = threading.Thread(target=init, name="negotiate-ray-init", daemon=True)
                thread.start()
                thread.join(max(0.0, deadline - time.monotonic()))
            finally:
                logging.getLogger("ray._private.worker").removeFilter(quiet)
            if thread.is_alive():  # left behind: a daemon thread, gone with the process
                stale = (f"; Ray joins {last}, the cluster `ray start` last started on this machine (its "
                         "ray_current_cluster file): if that cluster has stopped, `ray stop` forgets it, or run with "
                         "--address local" if last else "")
                raise WorkerLost(f"no answer from the Ray cluster within {CONNECT_S:g}s (NEGOTIATE_RAY_CONNECT_S sets it){stale}; "
                                 "the run's episodes so far are kept", field="--address", value=shown)
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)
    error = outcome.get("error")
    if isinstance(error, (ConnectionError, ValueError, RuntimeError)):
        raise UserError(f"cannot join a Ray cluster ({error})", field="--address", value=shown) from None
    if error is not None:
        raise error
    if address == "local":
        host = (_gcs_address(ray) or "").rpartition(":")[0].strip("[]")
        if host and host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("the Ray instance started for this run listens on the machine's network address, reachable from "
                        f"other machines (Ray was imported before {_LOOPBACK}=0 could be set)", address=host)
    return True


def _last_started(ray) -> str | None:
    """The cluster Ray's default address and ``auto`` join before any other: the one ``ray start`` last started on
    this machine, named in ``ray_current_cluster`` in Ray's temporary folder (``RAY_TMPDIR``, else ``/tmp``), which
    stays behind when that cluster ends other than by ``ray stop``. None where there is none (the default then starts
    an instance), or where this Ray keeps it elsewhere."""
    try:
        from ray._private.utils import read_ray_address  # Ray's own reader (2.60): where it looks, it finds
    except ImportError:
        return None
    try:
        return read_ray_address() or None
    except OSError:
        return None


def _gcs_address(ray) -> str | None:
    """The cluster's address as Ray gives it (None through Ray Client)."""
    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 -- only a log line's field
        return None


def _check_tasks_answer(ray, address: str, deadline: float) -> None:
    """A first task on the cluster streams a line back by ``deadline``, or the run stops naming the likely cause (one
    that fails there, negotiate missing on the node say, is one line too)."""
    from ray.exceptions import RayError

    shown = address or "(Ray's default)"
    generator = ray.remote(num_cpus=0, max_retries=0)(_hello).options(name="negotiate-hello").remote()
    ready, _ = ray.wait([generator], timeout=max(0.0, deadline - time.monotonic()))
    if ready:
        try:
            ray.get(next(generator))
        except RayError as error:
            raise UserError(f"a first task failed on the Ray cluster ({str(error).strip().splitlines()[-1]})",
                            field="--address", value=shown) from None
        return
    ray.cancel(generator, force=True)
    token = os.environ.get("RAY_AUTH_MODE", "").lower() == "token" and address in ("", "auto")
    hint = (": this driver sends the token of ~/.ray/auth_token (Ray writes one for every instance ray.init starts), which "
            "a cluster started without token authentication refuses; run with RAY_AUTH_MODE=disabled, or start the "
            "cluster with that token (docs/scaling.md)" if token else ": can it start a worker process? (the head's Ray "
            "logs say: /tmp/ray/session_latest/logs)")
    raise WorkerLost(f"the Ray cluster took no task within {CONNECT_S:g}s{hint}", field="--address", value=shown)


def run_ray(runs: list, workers: int, *, address: str = "", concurrency: int, max_inflight: int | None,
            fsync: bool = False, on_episode: Callable[[dict], None] | None = None) -> int:
    """Play every pending job of ``runs`` (``[(Prepared, out)]``) as ``workers`` Ray tasks on the cluster at
    ``address``, writing the traces here.

    Returns the episodes written. Raises :class:`UserError` if a task fails, and
    :class:`~negotiate.workers.WorkerLost` if one dies more than :data:`RERUNS` times or the cluster does not answer
    within :data:`CONNECT_S` (the episodes finished are kept); KeyboardInterrupt cancels the tasks and is re-raised
    once every episode they had sent is written.
    """
    chosen = _environment(address)
    import ray
    from ray.exceptions import RayError, RayTaskError

    shards = worker_count(runs, workers, concurrency=concurrency, max_inflight=max_inflight)
    base = shard_task(runs, shards, log_file=None)  # a task has no disk of the driver's to log to
    play = ray.remote(num_cpus=1, max_retries=0)(_play_shard)
    writers: dict = {}
    written = [Written() for _ in range(shards)]
    attempts = [0] * shards
    live: dict = {}  # generator -> shard
    state = {"episodes": 0, "failure": None, "lost": False, "stopping": False, "started": False}

    def submit(shard: int) -> None:
        attempts[shard] += 1
        task = worker_task(base, shard + 1, concurrency=concurrency, max_inflight=max_inflight)
        mark = written[shard]
        live[play.options(name=f"negotiate-shard-{shard + 1}").remote(task, mark.low, frozenset(mark.ahead))] = shard

    def fail(message: str, *, lost: bool = False) -> None:
        if state["failure"] is None:
            state["failure"], state["lost"] = message, lost

    def receive(generator) -> None:
        """Take ``generator``'s next batch and write its episodes; drop it once it ends, rerunning a shard that died."""
        shard = live[generator]
        try:
            batch = ray.get(next(generator))
        except StopIteration:
            del live[generator]
            return
        except RayTaskError as error:  # raised by the task itself outside the run (negotiate missing on a node, say)
            del live[generator]
            fail(f"shard {shard + 1}: {error}")
            return
        except RayError as error:  # the task's process or node died
            del live[generator]
            if state["stopping"]:
                return
            if attempts[shard] > RERUNS:
                fail(f"shard {shard + 1} died {attempts[shard]} times ({type(error).__name__})", lost=True)
                return
            log.warning("a Ray task died; its shard plays again without the episodes already written", shard=shard + 1,
                        attempt=attempts[shard], kept=written[shard].count, error=type(error).__name__)
            submit(shard)
            return
        for message in batch:
            if message[0] == "episode":
                _, number, k, seller, data, row = message
                if written[shard].add(number):
                    writers[(k, seller)].write_encoded(data)
                    state["episodes"] += 1
                    if on_episode is not None:
                        on_episode(row)
            elif message[0] == "started":
                log.info("shard started", shard=shard + 1, attempt=attempts[shard], node=message[1], pid=message[2])
            elif message[0] == "error":
                log.error("shard failed", shard=shard + 1, error=message[1], traceback=message[2])
                fail(message[1])

    try:
        deadline = time.monotonic() + CONNECT_S
        state["started"] = _connect(ray, address, deadline)
        _check_tasks_answer(ray, address, deadline)
        log.info("joined a Ray cluster", address=_gcs_address(ray), started=state["started"], shards=shards)
        writers.update(trace_writers(runs, fsync=fsync))
        for shard in range(shards):
            submit(shard)
        while live and state["failure"] is None:
            ready, _ = ray.wait(list(live), num_returns=1, timeout=1.0)  # a timeout, so a Ctrl-C is heard
            for generator in ready:
                receive(generator)
        if state["failure"] is not None:
            what = WorkerLost if state["lost"] else UserError
            raise what(f"a Ray task failed: {state['failure']}; the episodes finished so far are kept (--resume runs the rest)")
    finally:
        state["stopping"] = True
        try:
            try:
                for generator in list(live):  # what the tasks finished and sent is written before they stop
                    while generator in live and ray.wait([generator], timeout=0)[0]:
                        receive(generator)
            except (TraceWriteError, RayError):  # a trace that takes no more: the error on its way out says so
                pass
            for generator in list(live):
                ray.cancel(generator, force=True)
        finally:
            for writer in writers.values():
                writer.close()
            if state["started"]:
                ray.shutdown()
            for name in chosen:
                os.environ.pop(name, None)
    return state["episodes"]
