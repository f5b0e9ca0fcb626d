"""Worker processes: one run spread over N processes on one machine (``--workers N``).

One Python process keeps hundreds of model requests in flight, but its one core caps it at
about 1,500 requests/s (benchmarks/bench_llm.py); a GPU server batches more than that. With
``--workers N`` the parent splits the pending jobs over N child processes (spawned, not forked)
by market, round-robin (:func:`share`), each playing its share with ``run_batch`` on its own
event loop, at ``ceil(concurrency / N)`` episodes and ``ceil(max_inflight / N)`` requests in
flight, so the bounds stay the run's bounds. A child is sent what defines the jobs (the runs'
configs and the indices their traces already hold), not a list of them, and takes its share as
it plays: a run of 10**8 episodes costs no more memory than one of 1,000 (benchmarks/scale.py).
Children do not write traces: each finished episode comes back to the parent as its encoded
JSON lines, and the parent appends them to the run's usual trace files. The traces,
``--resume`` and ``report`` are therefore the same as with one process. A long episode, whose older events a child
keeps in a spill file, comes back a megabyte at a time (``("part", ...)`` messages, which the parent keeps in a spill
file of its own until the episode's last lines arrive), so neither process holds it whole.

A child that fails stops the run with its error; completed episodes are kept. A child that dies (killed, out
of memory) stops it with :class:`WorkerLost` (exit code 4: nothing was wrong with the command, and ``--resume``
plays the rest). On Ctrl-C the parent stops the children, keeps every episode they had finished and sent, and
returns.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import signal
import socket
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path

import structlog

from negotiate.errors import UserError
from negotiate.logs import configure, console_level
from negotiate.trace import Spill, TraceWriteError, TraceWriter

__all__ = ["run_workers", "check_workers", "models_play", "play_share", "EXECUTORS", "WorkerLost"]

log = structlog.get_logger("negotiate.workers")


class WorkerLost(UserError):
    """A worker that died (a process killed or out of memory, a Ray task's node gone), or a Ray cluster that did not
    answer: the run stops with one line (exit code 4, not 2: the command was not at fault), its finished episodes kept."""


def _specs(runs: list):
    return [spec for prepared, _ in runs for spec in (*prepared.sellers, prepared.buyers)]


EXECUTORS = ("local", "ray")
"""Where a run's workers play: ``local`` processes (:func:`run_workers`), or Ray tasks (:mod:`negotiate.ray_executor`)."""


def check_workers(workers: int, specs: Iterable[str], *, executor: str = "local", address: str = "") -> None:
    """Refuse what the workers cannot play, before anything is written: an unknown ``--executor``, an ``--address``
    without Ray, Ray not installed, and local models (``hf:``, ``vllm:``) with ``--workers`` above 1 (each process
    would load its own copy) or in Ray tasks (a task is lent a CPU, not the GPU).

    It reads the specs as written, before they are parsed: parsing an ``hf:`` spec checks that torch is
    installed, and a user who cannot use ``--workers`` here should hear that first, whatever is installed.
    """
    if executor not in EXECUTORS:
        raise UserError(f"unknown executor; use {' or '.join(EXECUTORS)}", field="--executor", value=executor)
    if address and executor != "ray":
        raise UserError("names a Ray cluster: add --executor ray", field="--address", value=address)
    local = _local_models(specs)
    if executor == "ray":
        if local:
            raise UserError(f"{local[0]!r} would load its model in a Ray task, which is lent a CPU; serve the model "
                            "(vllm serve) and name it with an openai: spec", field="--executor", value=executor)
        _check_reachable(address)
        if importlib.util.find_spec("ray") is None:  # found without importing it (Ray takes a second to import)
            raise UserError("needs Ray: pip install 'negotiate[ray]'", field="--executor", value=executor)
    if workers > 1 and local:
        raise UserError(f"{local[0]!r} loads its model in every worker process; local models batch inside one "
                        "process, so play them with --workers 1", field="--workers", value=str(workers))


def _local_models(specs: Iterable[str]) -> list[str]:
    """The specs, as written, whose backend loads its model in this process (``hf:``, ``vllm:``: ``Kind.local`` in the
    backends' table), split by the spec grammar's one rule (:func:`~negotiate.agents.registry.split_backend`)."""
    from negotiate.agents.registry import split_backend

    backends = {text.strip(): split_backend(text.strip())[0] for text in specs}
    if all(backend == "scripted" for backend in backends.values()):
        return []  # the backends' table (and the model half it imports) loads only where a spec names a model
    from negotiate.agents.backends import BACKENDS

    return [text for text, backend in backends.items() if backend in BACKENDS and BACKENDS[backend].local]


def _check_reachable(address: str) -> None:
    """Refuse a Ray address (``HOST:PORT`` or ``ray://HOST:PORT``) where nothing answers: ``ray.init`` would retry
    it for minutes (13 measured here) before saying so. ``auto``, ``local`` and Ray's default are Ray's to find."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as error:
        raise UserError(f"nothing answers there ({error.strerror or error})", field="--address", value=address) from None


def share_of(total: int, worker: int, workers: int) -> int:
    """Worker ``worker``'s (0-based) part of a bound ``total`` split over ``workers``: the parts add up to
    ``total`` (at least 1 each).

    >>> [share_of(5, w, 2) for w in range(2)], [share_of(3, w, 2) for w in range(2)]
    ([3, 2], [2, 1])
    """
    return max(1, total // workers + (1 if worker < total % workers else 0))


def share(jobs: Iterable, worker: int, workers: int, start: int = 0) -> Iterator:
    """Worker ``worker``'s (0-based) jobs of ``jobs`` (in play order, by market index): the markets with a job
    left, dealt round-robin over ``workers`` counting from ``start`` (the markets of the runs before this
    one), each with every one of its jobs, so every worker plays every seller and a stopped run keeps
    paired coverage.

    >>> from negotiate.runner import Jobs
    >>> jobs = Jobs(("a", "b"), range(4), (frozenset({1}), frozenset({1})))  # market 1 is finished
    >>> [[(job.seller, job.index) for job in share(jobs, w, 2)] for w in range(2)]
    [[('a', 0), ('b', 0), ('a', 3), ('b', 3)], [('a', 2), ('b', 2)]]
    """
    market, last = start - 1, None
    for job in jobs:
        if job.index != last:
            market, last = market + 1, job.index
        if market % workers == worker:
            yield job


def models_play(runs: list) -> bool:
    """Whether a model (``openai:``, ``hf:``, ``vllm:``) plays in any of ``runs`` (``[(Prepared, out)]``)."""
    return any(spec.backend != "scripted" for spec in _specs(runs))


def play_share(task: dict, send: Callable[[tuple], None],
               numbered: Callable[[int, Iterable], Iterable] = lambda _k, jobs: jobs) -> None:
    """What a worker does, in a process of ``--workers`` or a Ray task: play its share of the jobs of ``task`` (see
    :func:`shard_task`) and ``send`` each finished episode as ``("episode", run, seller, encoded lines, row)`` (with
    ``task["parts"]``, a long episode's stored lines go first, a megabyte a ``("part", run, seller, lines)``), then
    ``("done",)``, or ``("error", message, traceback)`` once anything fails. ``numbered(run, jobs)`` sees each run's
    jobs as they are taken (the Ray executor numbers them, and leaves out those a dead task already sent)."""
    pools = None
    try:
        from negotiate.agents.pools import Pools
        from negotiate.agents.registry import parse_agent
        from negotiate.market import resolve_spec
        from negotiate.runner import Jobs, Prepared, RunConfig, run_async, run_batch
        from negotiate.trace import StoredEvents, encode

        # The parent's console level: at the default a worker's info lines (a server's kind, each failed episode) go
        # to the log file only, as one process's do.
        configure(Path(task["log_file"]) if task["log_file"] else None, console_level=task["console_level"])
        # This process's part of the run's bounds: the --max-inflight share, or each spec's max_inflight split over the workers.
        pools = Pools(max_inflight=task["max_inflight"], share=(task["worker"] - 1, task["workers"]))
        if task["log_file"] and task["models"]:  # a request log per worker: buffered lines from two processes would interleave
            pools.requests.open(Path(task["log_file"]).parent / f"requests.worker-{task['worker']}.log.jsonl")
        runs = []
        for k, (config_json, out, finished, start) in enumerate(task["runs"]):
            config = RunConfig.from_json(config_json, out)
            sellers = [parse_agent(text, "seller") for text in config.sellers]
            jobs = numbered(k, share(Jobs(tuple(sellers), config.indices(), finished), task["worker"] - 1, task["workers"], start))
            runs.append((Prepared(config, resolve_spec(config.split), sellers, parse_agent(config.buyers, "buyer"), jobs), Path(out)))

        def sink(k: int, seller: str, events, row: dict) -> None:
            if task.get("parts") and type(events) is StoredEvents:  # no await in here: the parts and their episode go together
                for chunk in events.stored.chunks():
                    send(("part", k, seller, chunk))
                events = events.tail
            send(("episode", k, seller, encode(events), row))

        async def main() -> None:
            for k, (prepared, out) in enumerate(runs):
                await run_batch(prepared, out, concurrency=task["concurrency"], pools=pools,
                                sink=lambda seller, events, row, k=k: sink(k, seller, events, row))

        run_async(main)
        send(("done",))
    except BaseException as error:  # noqa: BLE001 -- reported to the parent, which stops the run
        message = str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
        try:
            send(("error", message, traceback.format_exc()))
        except OSError:
            pass
    finally:
        if pools is not None:
            pools.requests.close()


def _child(task: dict, conn: Connection) -> None:
    """A worker process: play the jobs of ``task`` and send each episode back through ``conn`` (runs spawned)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    try:
        play_share(task, conn.send)
    finally:
        conn.close()


def shard_task(runs: list, workers: int, *, log_file: Path | None) -> dict:
    """What every worker of ``runs`` (``[(Prepared, out)]``) is sent, less its own number and bounds: each run's
    config, folder, finished indices and how many markets the runs before it have (see :func:`share`), not its jobs."""
    markets = [prepared.jobs.markets() for prepared, _ in runs]
    return {"runs": [(prepared.config.to_json(), str(out), prepared.jobs.finished, sum(markets[:k]))
                     for k, (prepared, out) in enumerate(runs)],
            "workers": workers, "models": models_play(runs), "log_file": str(log_file) if log_file else None,
            "console_level": console_level()}


def worker_task(base: dict, worker: int, *, concurrency: int, max_inflight: int | None) -> dict:
    """Worker ``worker``'s (1-based) task: ``base`` (:func:`shard_task`) and its part of the run's bounds."""
    workers = base["workers"]
    return {**base, "worker": worker, "concurrency": share_of(concurrency, worker - 1, workers),
            "max_inflight": share_of(max_inflight, worker - 1, workers) if max_inflight else None}


def worker_count(runs: list, workers: int, *, concurrency: int, max_inflight: int | None) -> int:
    """How many workers ``runs`` get: ``workers``, but no more than markets to deal, episodes or requests in flight."""
    return max(1, min(workers, sum(prepared.jobs.markets() for prepared, _ in runs), concurrency, max_inflight or workers))


def trace_writers(runs: list, *, fsync: bool) -> dict[tuple[int, str], TraceWriter]:
    """(run, seller text) -> the trace writer of that seller's file in that run's folder: where the parent writes what workers send."""
    return {(k, seller.text): TraceWriter(Path(out) / prepared.config.trace_name(seller.text), fsync=fsync)
            for k, (prepared, out) in enumerate(runs) for seller in prepared.sellers}


def run_workers(runs: list, workers: int, *, concurrency: int, max_inflight: int | None, log_file: Path | None,
                fsync: bool = False, on_episode: Callable[[dict], None] | None = None) -> int:
    """Play every pending job of ``runs`` (``[(Prepared, out)]``) in ``workers`` processes.

    Returns the episodes written. Raises :class:`UserError` if a worker fails, :class:`WorkerLost` if one dies (the
    episodes it and the others finished are kept); KeyboardInterrupt stops the workers and is re-raised once every
    finished episode is written.
    """
    workers = worker_count(runs, workers, concurrency=concurrency, max_inflight=max_inflight)
    writers = trace_writers(runs, fsync=fsync)
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold threads or an event loop
    processes, conns = [], {}
    written, failure, lost, stopping = 0, None, False, False
    base = shard_task(runs, workers, log_file=log_file)

    finished: set[Connection] = set()
    held: dict[Connection, Spill] = {}  # a long episode's lines, from its worker's "part" messages, until its "episode"

    def receive(conn: Connection) -> bool:
        """Handle one message; False once the worker is finished (done, failed, or gone)."""
        nonlocal written, failure, lost
        try:
            message = conn.recv()
        except Exception:  # noqa: BLE001 -- EOF, or a message cut off by a worker stopped mid-send
            if conn not in finished and failure is None and not stopping:
                process = processes[conns[conn] - 1]
                process.join(5)
                code = process.exitcode
                how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
                failure, lost = f"worker {conns[conn]} died ({how}) before finishing its episodes", True
            return False
        if message[0] == "part":
            if conn not in held:
                held[conn] = Spill()
            held[conn].append(message[3])
            return True
        if message[0] == "episode":
            _, k, seller, data, row = message
            stored = held.pop(conn, None)
            writers[(k, seller)].write_encoded(data, stored)
            if stored is not None:
                stored.close()
            written += 1
            if on_episode is not None:
                on_episode(row)
            return True
        finished.add(conn)
        if message[0] == "error" and failure is None:
            failure = message[1]
            log.error("worker failed", worker=conns[conn], error=message[1], traceback=message[2])
        return False

    try:
        for w in range(workers):
            parent_end, child_end = context.Pipe(duplex=False)
            task = {**worker_task(base, w + 1, concurrency=concurrency, max_inflight=max_inflight), "parts": True}
            process = context.Process(target=_child, args=(task, child_end), name=f"negotiate-worker-{w + 1}",
                                      daemon=True)
            process.start()
            child_end.close()
            processes.append(process)
            conns[parent_end] = w + 1
        live = set(conns)
        while live and failure is None:
            for conn in wait(list(live)):
                if not receive(conn):
                    live.discard(conn)
        if failure is not None:
            raise (WorkerLost if lost else UserError)(f"a worker failed: {failure}; the episodes finished so far are kept "
                                                      "(--resume runs the rest)")
        for process in processes:
            process.join(10)
    finally:
        stopping = True
        for process in processes:
            if process.is_alive():
                process.terminate()
        for conn in conns:  # episodes a worker finished and sent before it stopped are kept
            while True:
                try:
                    if not conn.poll(0) or not receive(conn):
                        break
                except (EOFError, OSError, TraceWriteError):  # a trace that takes no more: the error on its way out says so
                    break
            conn.close()
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
        for writer in writers.values():
            writer.close()
    return written
