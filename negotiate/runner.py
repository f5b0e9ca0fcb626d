"""Batches: many episodes concurrently, traced, resumable, shardable.

A run is a set of jobs (seller, episode index). Episode ``index`` of a run with
seed ``s`` is played on the market drawn with seed ``market_seed(s, index)`` by
every seller of the run, with identically seeded buyers: a paired comparison
(the conventions, and the :class:`~negotiate.run.Run` a batch plays in, are in
:mod:`negotiate.run`).
``--shard K/N`` keeps the indices ``i`` with ``i % N == K - 1``. A pool of workers
(the concurrency limit) pulls jobs; each finished episode is written at once, so
an interrupted run keeps every completed episode and ``resume`` runs only the rest.

Nothing a run holds grows with ``--episodes``: its jobs are made one at a time as
they are taken (:class:`Jobs`), and a finished episode goes to its trace and is
forgotten (the end-of-run table reads the traces back). Only resume holds the
indices the traces already have. Nor does it grow with an episode's turns: a long
episode spills its events to an unnamed file in the run's folder as it goes, and
its trace is copied from there when it ends (:mod:`negotiate.trace`).

A run folder has one writer at a time (:func:`writing`). Two processes playing the
same missing episodes into one folder (``serve --out D`` and ``serve --resume D``
4 s later; a scheduler starting a replacement before the old task has exited)
wrote 1,459 of 1,500 episodes twice, and from then on ``report`` and ``--resume``
refused the folder. The writer holds an OS lock (``flock``) on ``D/.writer.lock``,
which the kernel releases when the process ends, even by SIGKILL, so a killed run
leaves nothing to clear by hand; a second writer is refused with one line naming
the first (its pid and host).
"""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sized
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import anyio
import orjson
import structlog

from negotiate.agents.pools import Pools, current_pools
from negotiate.agents.registry import AgentSpec, parse_agent
from negotiate.episode import Episode
from negotiate.errors import UserError
from negotiate.market import MarketSpec, resolve_spec
from negotiate.metrics import opt
from negotiate.regulator import EpisodeState
from negotiate.run import Run, RunConfig, build_buyers, check_timeout, market_seed, slug
from negotiate.trace import Outcome, drop_failed, scan

__all__ = ["RunConfig", "new_run_id", "check_timeout", "market_seed", "prepare", "run_batch", "run_async", "slug", "play", "build_episode", "build_buyers",
           "save_config", "load_config", "take_failed", "writing", "LOCK_FILE"]

log = structlog.get_logger("negotiate.runner")


@dataclass
class Job:
    seller: AgentSpec
    index: int


@dataclass(frozen=True)
class Jobs:
    """The jobs a run still has to play, made one at a time as they are taken, in play order: by market index,
    then seller order, so a partial run has comparable coverage of every seller.

    Not a list: listing every job took 2.1 GB and 9 s for ``serve --episodes 10000000`` before its first
    episode, 5.3 GB and 45 s with ``--workers 2`` (benchmarks/scale.py). What defines them is small: the
    sellers, the run's indices (a ``range``) and, on resume, each seller's finished indices, which is what
    its trace already holds.

    >>> jobs = Jobs(("a", "b"), range(3), (frozenset({0}), frozenset()))
    >>> len(jobs), [(job.seller, job.index) for job in jobs], jobs.markets()
    (5, [('b', 0), ('a', 1), ('b', 1), ('a', 2), ('b', 2)], 3)
    """

    sellers: tuple[AgentSpec, ...] = ()
    indices: range = range(0)
    finished: tuple[frozenset[int], ...] = ()
    """Per seller, the indices of ``indices`` already in its trace (resume): they are not played again."""

    def __len__(self) -> int:
        return len(self.sellers) * len(self.indices) - sum(map(len, self.finished))

    def __iter__(self) -> Iterator[Job]:
        for index in self.indices:
            for seller, finished in zip(self.sellers, self.finished):
                if index not in finished:
                    yield Job(seller, index)

    def markets(self) -> int:
        """How many markets (indices) have a job left: those some seller has not finished."""
        everyone = frozenset.intersection(*self.finished) if self.finished else frozenset()
        return len(self.indices) - len(everyone)


@dataclass
class Prepared:
    """A run's parsed agents and spec, checked before anything runs."""

    config: RunConfig
    spec: MarketSpec
    sellers: list[AgentSpec]
    buyers: AgentSpec
    jobs: Iterable[Job] = field(default_factory=Jobs)
    """The jobs to play, in order: :func:`prepare` gives a :class:`Jobs`; a worker process, its share of them."""
    done: int = 0
    """Episodes already complete in the traces (resume)."""
    retry: list[Path] = field(default_factory=list)
    """Trace files whose failed episodes play again (``--retry-failed``): :func:`take_failed` takes them out first."""


def new_run_id(command: str) -> str:
    """A run id: the command, the time and 4 random hex digits, like ``serve-20261129-221500-3fa2``."""
    return f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def prepare(config: RunConfig, out: Path, *, resume: bool, retry_failed: bool = False) -> Prepared:
    """Parse specs and agents, and list the jobs still to run (dropping a half-written tail on resume, and with
    ``retry_failed`` the failed episodes, which then run again)."""
    if not config.sellers:
        raise UserError("names no seller; give one or more seller specs, comma-separated, like greedy,posted",
                        field="--seller", value=",".join(config.sellers))
    check_timeout(config.seller_timeout, "--seller-timeout")
    check_timeout(config.reply_timeout, "--reply-timeout")
    spec = resolve_spec(config.split)
    sellers = [parse_agent(text, "seller") for text in config.sellers]
    if len({slug(s.text) for s in sellers}) != len(sellers):
        raise UserError("two sellers share a trace file name", field="--seller", value=",".join(config.sellers))
    buyers = parse_agent(config.buyers, "buyer")
    prepared = Prepared(config, spec, sellers, buyers)
    indices = config.indices()
    finished_by_seller = []
    for seller in sellers:
        path = out / config.trace_name(seller.text)
        finished: set[int] = set()
        if resume and path.exists():
            result = scan(path)
            if result.good_bytes < path.stat().st_size:
                with open(path, "r+b") as handle:
                    handle.truncate(result.good_bytes)
                # On the console (a warning): the run's log opens only after this, and the README promises it.
                log.warning("dropped a half-written episode (a killed run's); it plays again", file=str(path), episode=result.partial)
            failed = {episode.index for episode in result.complete if episode.outcome == Outcome.FAILED}
            finished = {episode.index for episode in result.complete} - (failed if retry_failed else set())
            if retry_failed and failed:
                prepared.retry.append(path)
        # `in` a range is arithmetic for an int, but a scan of the whole range for anything else (an old trace's None).
        finished = frozenset(i for i in finished if isinstance(i, int) and i in indices)
        prepared.done += len(finished)
        finished_by_seller.append(finished)
    prepared.jobs = Jobs(tuple(sellers), indices, tuple(finished_by_seller))
    return prepared


def take_failed(prepared: Prepared) -> int:
    """Take the failed episodes out of the traces of a run prepared with ``retry_failed``, once every check has
    passed and just before it plays them again; returns how many."""
    taken = 0
    for path in prepared.retry:
        dropped = drop_failed(path, fsync=True)
        log.info("failed episodes to play again", file=str(path), episodes=dropped)
        taken += dropped
    prepared.retry = []
    return taken


def build_episode(spec: MarketSpec, seller: AgentSpec, buyers: AgentSpec, run_seed: int, index: int, group: int = 1):
    """Episode ``index`` of a run seeded ``run_seed``: its market, seller and buyers (:meth:`Run.episode`'s
    conventions; model agents take the current context's pools)."""
    plan = _run_of(spec, seller, buyers, run_seed, group).episode(seller, index)
    return plan.market, plan.seller, plan.buyers


def _run_of(spec: MarketSpec, seller: AgentSpec, buyers: AgentSpec, run_seed: int, group: int = 1) -> Run:
    return Run(RunConfig(sellers=(seller.text,), buyers=buyers.text, seed=run_seed, group=group), spec=spec, buyers=buyers,
               pools=current_pools())


async def play(run: Run, job: Job, *, opt_cache: dict | None = None) -> Episode:
    """Play one job of a run."""
    plan = run.episode(job.seller, job.index)
    market = plan.market
    cells = len(market.buyers) * len(market.products)
    opt_value = opt_cache.get(market.seed) if opt_cache is not None else None
    if opt_value is None:
        # Large assignment problems are solved off the event loop.
        opt_value = await anyio.to_thread.run_sync(opt, market) if cells >= 10_000 else opt(market)
        if opt_cache is not None:
            opt_cache[market.seed] = opt_value
    # A long episode spills its events beside the trace they go to (same disk; the file has no name, and goes with it).
    state = EpisodeState(market, episode=plan.episode_id, spill_dir=run.out)
    return await plan.play(opt_value=opt_value, state=state)


async def run_batch(
    prepared: Prepared,
    out: Path,
    *,
    concurrency: int = 256,
    on_episode: Callable[[Episode, str], None] | None = None,
    fsync: bool = False,
    sink: Callable[[str, list[dict], dict], None] | None = None,
    pools: Pools | None = None,
) -> int:
    """Run every job of ``prepared``, ``concurrency`` at a time, writing traces under ``out``.

    Returns how many episodes it played. It keeps none of them, so its memory does not grow with
    the run: the traces hold them and a report reads them back; ``on_episode`` sees each as it
    ends. With ``sink``, no trace is written here: ``sink(seller, events, row)`` gets each
    finished episode instead, ``row`` its labels and metrics (a worker process sends it to the
    parent, which writes it). The batch is one :class:`Run`: its model clients and loaded models
    are ``pools`` (the command's, shared by its batches), or its own; it closes its trace files
    and this loop's HTTP clients when it ends.
    """
    run = Run(prepared.config, spec=prepared.spec, buyers=prepared.buyers, pools=pools or Pools(),
              out=out if sink is None else None, fsync=fsync)
    with writing(out) if sink is None else nullcontext():  # a command that plays several batches holds it already
        async with run:
            if sink is None:
                for seller in prepared.sellers:
                    run.trace(seller.text)  # every seller's file exists once the run starts, as resume expects
            return await _play_all(run, prepared, concurrency, on_episode, sink)


async def _play_all(run: Run, prepared: Prepared, concurrency: int, on_episode, sink) -> int:
    jobs = iter(prepared.jobs)
    first = next(jobs, None)  # a worker's share has no length: whether it holds a job shows by taking one
    if first is None:
        return 0
    jobs = chain([first], jobs)
    played = 0
    opt_cache: dict = {}
    old_threshold = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)  # thousands of short-lived records per second: gen-0 GC was a third of the time

    async def worker() -> None:
        nonlocal played
        for job in jobs:
            episode = await play(run, job, opt_cache=opt_cache)
            start = episode.events[0]
            row = {"seller": start.seller, "split": start.split, "shape": start.shape, "tier": start.tier, "index": start.index,
                   "outcome": episode.outcome, "metrics": episode.metrics}
            if sink is None:
                run.write(job.seller.text, episode.events)
            else:
                sink(job.seller.text, episode.events, row)
            played += 1
            if episode.outcome == "failed":
                log.info("episode failed", episode=episode.id, reason=episode.reason)  # the run counts them: one line at the end
            if len(opt_cache) > 4 * concurrency:
                opt_cache.pop(next(iter(opt_cache)))
            if on_episode is not None:
                on_episode(episode, job.seller.text)

    try:
        await preload_models([*prepared.sellers, prepared.buyers], run.pools)
        async with anyio.create_task_group() as tg:
            # A worker's share has no length: the tasks beyond its jobs end at once.
            for _ in range(min(concurrency, len(prepared.jobs)) if isinstance(prepared.jobs, Sized) else concurrency):
                tg.start_soon(worker)
    except BaseExceptionGroup as group:
        raise _one_user_error(group) from None
    finally:
        gc.set_threshold(*old_threshold)
    return played


def _one_user_error(group: BaseExceptionGroup) -> BaseException:
    """What the workers of a batch raised, as the CLI can say it: a stop (SIGTERM raises in whichever task runs, as
    :class:`KeyboardInterrupt`); where every one of them is a :class:`UserError` (a trace that takes no more, say,
    met by every worker in turn), the first; else the group itself."""
    leaves, todo = [], [group]
    while todo:
        for error in todo.pop().exceptions:
            (todo if isinstance(error, BaseExceptionGroup) else leaves).append(error)
    stop = next((error for error in leaves if isinstance(error, KeyboardInterrupt)), None)
    if stop is not None:
        return stop
    return leaves[0] if leaves and all(isinstance(error, UserError) for error in leaves) else group


async def preload_models(specs: list[AgentSpec], pools: Pools | None = None) -> None:
    """Before the first episode starts: load every local model (``hf:``, ``vllm:``) the specs name,
    so no agent deadline counts the load, and ask every server (``openai:``) for its models, so a
    server that is down, a bad key or a wrong model name stops the run here, naming its spec,
    instead of failing every episode (and ``server=auto`` learns the kind of server)."""
    for spec in specs:
        if spec.backend == "scripted":  # no model: nothing to load or ask
            continue
        from negotiate.agents.backends import LLMError, preload  # the model half loads only where a spec names a model

        try:
            await preload(spec, pools or current_pools())
        except LLMError as error:
            field = "--seller" if spec.role == "seller" else "--buyers"
            raise UserError(str(error), field=field, value=spec.text) from None


def run_async(main: Callable[[], Awaitable]):
    """``anyio.run(main)`` on uvloop where it is installed (the ``llm`` extra): about a tenth less CPU
    per model request than asyncio's own loop (benchmarks/bench_llm.py). ``NEGOTIATE_LOOP=asyncio`` opts out."""
    use_uvloop = False
    if os.environ.get("NEGOTIATE_LOOP", "auto") != "asyncio":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            pass
        else:
            use_uvloop = True
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous) or threading.current_thread() is not threading.main_thread():
        return anyio.run(main, backend_options={"use_uvloop": use_uvloop})
    # A Python SIGTERM handler (the command line's raises Terminated) would raise inside whichever task runs when the
    # signal lands; asyncio then logs that task's exception as never retrieved. As asyncio.Runner does for Ctrl-C, the
    # loop takes the signal instead and cancels the main task; the handler runs once the loop has stopped.
    stopped = False

    async def guarded():
        nonlocal stopped
        loop, task = asyncio.get_running_loop(), asyncio.current_task()

        def on_sigterm() -> None:
            nonlocal stopped
            stopped = True
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await main()
        except asyncio.CancelledError:
            if not stopped:
                raise
        finally:
            loop.remove_signal_handler(signal.SIGTERM)  # which leaves SIG_DFL
            signal.signal(signal.SIGTERM, previous)

    try:
        result = anyio.run(guarded, backend_options={"use_uvloop": use_uvloop})
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopped:
        previous(signal.SIGTERM, None)
    return result


LOCK_FILE = ".writer.lock"
"""The file in a run folder its writer holds a ``flock`` on (:func:`writing`); it names the writer (pid and host)."""

_held: dict[str, list] = {}
"""This process's writer locks: folder (resolved) -> [the lock file, how many blocks hold it]."""


@contextmanager
def writing(out: Path) -> Iterator[None]:
    """Hold ``out``'s writer lock for the block, making the folder if need be: one process writes a run folder at a time.

    Another process that holds it is refused with :class:`UserError` (one line naming it); this process may nest
    blocks on one folder (a command holds it, and each batch it plays takes it again). The lock is ``flock`` on
    :data:`LOCK_FILE`, released by the kernel when the process ends however it ends; at the end of the block the file is
    removed (while still held: a process that opened it just before locks a file no longer there, sees so, and tries
    again), so a finished run leaves nothing beside its traces. Where the file system has no locks, a warning says so
    and the block runs unlocked.
    """
    key = str(Path(out).resolve())
    held = _held.get(key)
    if held is None:
        held = _held[key] = [_lock(Path(out)), 0]
    held[1] += 1
    try:
        yield
    finally:
        held[1] -= 1
        if held[1] == 0:
            del _held[key]
            handle = held[0]
            if handle is not None:
                try:
                    os.unlink(Path(out) / LOCK_FILE)
                except OSError:
                    pass
                handle.close()


def _lock(out: Path):
    """Open and ``flock`` ``out``'s :data:`LOCK_FILE` (the file now at that path, not one its holder removed meanwhile),
    and write this process into it; None where the file system cannot lock."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return None
    path = out / LOCK_FILE
    while True:
        try:
            out.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a+")  # not "w": the holder's line stays readable until the lock is ours
        except OSError as error:
            raise UserError(f"cannot be locked for writing ({error.strerror})", source=str(out)) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read(200).strip() or "it has not said which yet"
            handle.close()
            raise UserError(f"another process is writing this run ({holder}); a run folder has one writer at a time: wait for "
                            "it to end, or stop it (its finished episodes are kept) and try again", source=str(out)) from None
        except OSError as error:  # ENOLCK, ENOSYS: a network file system mounted without locks
            handle.close()
            log.warning("cannot lock the run's folder; nothing stops a second process writing into it", folder=str(out),
                        error=error.strerror)
            return None
        try:
            current = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        handle.close()  # its holder removed it while this process opened it: lock the one there now
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle


def save_config(config: RunConfig, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_bytes(orjson.dumps(config.to_json(), option=orjson.OPT_INDENT_2))


def load_config(out: Path) -> RunConfig:
    path = out / "run.json"
    if not path.exists():
        raise UserError("not a run folder (no run.json)", source=str(out))
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as error:
        raise UserError(f"not valid JSON ({error})", source=str(path)) from None
    return RunConfig.from_json(data, str(path))


