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
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import structlog

from negotiate.errors import UserError
from negotiate.workers import play_share, shard_task, trace_writers, worker_count, worker_task

__all__ = ["run_ray", "RERUNS", "Written"]

log = structlog.get_logger("negotiate.ray")

RERUNS = 2
"""How many times a shard whose process died plays its unwritten jobs again before the run stops."""
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


def _connect(ray, address: str) -> bool:
    """Join the Ray cluster at ``address`` (empty: Ray's default, ``RAY_ADDRESS`` or a cluster started on this
    machine, else a new one; ``local``: a new one); True when this call started Ray, and so shuts it down.
    A process that has already called ``ray.init`` keeps its cluster."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address or None, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise UserError(f"cannot join a Ray cluster ({error})", field="--address", value=address or "(Ray's default)") from None
    return True


def run_ray(runs: list, workers: int, *, address: str = "", concurrency: int, max_inflight: int | None,
            fsync: bool = False, on_episode: Callable[[dict], None] | None = None) -> int:
    """Play every pending job of ``runs`` (``[(Prepared, out)]``) as ``workers`` Ray tasks on the cluster at
    ``address``, writing the traces here.

    Returns the episodes written. Raises :class:`UserError` if a task fails, or dies more than :data:`RERUNS`
    times (the episodes finished are kept); KeyboardInterrupt cancels the tasks and is re-raised once every
    episode they had sent is written.
    """
    import ray
    from ray.exceptions import RayError, RayTaskError

    started = _connect(ray, address)
    shards = worker_count(runs, workers, concurrency=concurrency, max_inflight=max_inflight)
    base = shard_task(runs, shards, log_file=None)  # a task has no disk of the driver's to log to
    play = ray.remote(num_cpus=1, max_retries=0)(_play_shard)
    writers = trace_writers(runs, fsync=fsync)
    written = [Written() for _ in range(shards)]
    attempts = [0] * shards
    live: dict = {}  # generator -> shard
    state = {"episodes": 0, "failure": None, "stopping": False}

    def submit(shard: int) -> None:
        attempts[shard] += 1
        task = worker_task(base, shard + 1, concurrency=concurrency, max_inflight=max_inflight)
        mark = written[shard]
        live[play.options(name=f"negotiate-shard-{shard + 1}").remote(task, mark.low, frozenset(mark.ahead))] = shard

    def fail(message: str) -> None:
        if state["failure"] is None:
            state["failure"] = message

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
                fail(f"shard {shard + 1} died {attempts[shard]} times ({type(error).__name__})")
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
        for shard in range(shards):
            submit(shard)
        while live and state["failure"] is None:
            ready, _ = ray.wait(list(live), num_returns=1, timeout=1.0)  # a timeout, so a Ctrl-C is heard
            for generator in ready:
                receive(generator)
        if state["failure"] is not None:
            raise UserError(f"a Ray task failed: {state['failure']}; the episodes finished so far are kept (--resume runs the rest)")
    finally:
        state["stopping"] = True
        try:
            for generator in list(live):  # what the tasks finished and sent is written before they stop
                while generator in live and ray.wait([generator], timeout=0)[0]:
                    receive(generator)
            for generator in list(live):
                ray.cancel(generator, force=True)
        finally:
            for writer in writers.values():
                writer.close()
            if started:
                ray.shutdown()
    return state["episodes"]
