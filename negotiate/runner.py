"""Batches: many episodes concurrently, traced, resumable, shardable.

A run is a set of jobs (seller, episode index). Episode ``index`` of a run with
seed ``s`` is played on the market drawn with seed ``market_seed(s, index)`` by
every seller of the run, with identically seeded buyers: a paired comparison.
``--shard K/N`` keeps the indices ``i`` with ``i % N == K - 1``. A pool of workers
(the concurrency limit) pulls jobs; each finished episode is written at once, so
an interrupted run keeps every completed episode and ``resume`` runs only the rest.
"""

from __future__ import annotations

import gc
import math
import os
import re
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
import orjson
import structlog

from negotiate.agents.registry import AgentSpec, parse_agent
from negotiate.episode import Episode, run_episode
from negotiate.errors import UserError
from negotiate.market import MarketSpec, generate, resolve_spec
from negotiate.metrics import opt
from negotiate.trace import TraceWriter, scan

__all__ = ["RunConfig", "new_run_id", "check_timeout", "market_seed", "prepare", "run_batch", "run_async", "slug", "play", "build_episode", "build_buyers",
           "save_config", "load_config"]

log = structlog.get_logger("negotiate.runner")


_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def market_seed(run_seed: int, index: int) -> int:
    """The market seed of episode ``index`` in a run seeded ``run_seed`` (SplitMix64 of both; 63 bits).

    >>> market_seed(0, 0) != market_seed(0, 1) != market_seed(1, 0)
    True
    """
    return _splitmix64(_splitmix64(run_seed & _MASK) ^ (index & _MASK)) >> 1


def slug(text: str) -> str:
    """A file-name-safe form of an agent spec: ``concession?beta=2`` -> ``concession-beta-2``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "agent"


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run; saved as ``run.json`` so ``--resume`` can finish it."""

    sellers: tuple[str, ...]
    buyers: str = "threshold"
    split: str = "train"
    """A split name or a TOML spec path."""
    episodes: int = 200
    """Episodes per seller (before sharding)."""
    seed: int = 0
    shard: tuple[int, int] = (1, 1)
    """(K, N): this run plays the K-th of N disjoint slices."""
    seller_timeout: float = 120.0
    reply_timeout: float = 120.0
    group: int = 1
    """Episodes per market instance: episodes ``i`` with the same ``i // group`` play one market,
    the seller sampling with a different seed each time (``negotiate collect``; training groups)."""
    run_id: str = ""
    """Names the run in every episode it writes (``run`` in ``episode_start``), so a report tells
    separate runs of the same seeds apart (``serve``, then ``eval``) while a run's shards merge.
    Runs written before run ids have none."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict, source: str) -> RunConfig:
        try:
            data = dict(data)
            data["sellers"] = tuple(data["sellers"])
            data["shard"] = tuple(data["shard"])
            return cls(**data)
        except (KeyError, TypeError, ValueError) as error:
            raise UserError(f"not a run config ({error})", source=source) from None

    def trace_name(self, seller: str) -> str:
        k, n = self.shard
        return f"{slug(seller)}.jsonl" if n == 1 else f"{slug(seller)}.shard-{k}-of-{n}.jsonl"

    def indices(self) -> range:
        k, n = self.shard
        return range(k - 1, self.episodes, n)


@dataclass
class Job:
    seller: AgentSpec
    index: int


@dataclass
class Prepared:
    """A run's parsed agents and spec, checked before anything runs."""

    config: RunConfig
    spec: MarketSpec
    sellers: list[AgentSpec]
    buyers: AgentSpec
    jobs: list[Job] = field(default_factory=list)
    done: int = 0
    """Episodes already complete in the traces (resume)."""


def new_run_id(command: str) -> str:
    """A run id: the command, the time and 4 random hex digits, like ``serve-20261129-221500-3fa2``."""
    return f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def check_timeout(value: float, flag: str) -> float:
    """An agent deadline: a positive, finite number of seconds."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UserError("must be a positive number of seconds", field=flag, value=value)
    return float(value)


def prepare(config: RunConfig, out: Path, *, resume: bool) -> Prepared:
    """Parse specs and agents, and list the jobs still to run (dropping a half-written tail on resume)."""
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
    for seller in sellers:
        path = out / config.trace_name(seller.text)
        finished: set[int] = set()
        if resume and path.exists():
            result = scan(path)
            if result.good_bytes < path.stat().st_size:
                with open(path, "r+b") as handle:
                    handle.truncate(result.good_bytes)
                log.info("dropped a half-written episode", file=str(path), episode=result.partial)
            finished = {start["index"] for start in result.complete}
        prepared.done += len(finished & set(config.indices()))
        prepared.jobs.extend(Job(seller, i) for i in config.indices() if i not in finished)
    # Interleave sellers so a partial run has comparable coverage of every seller.
    prepared.jobs.sort(key=lambda job: (job.index, sellers.index(job.seller)))
    return prepared


def build_episode(spec: MarketSpec, seller: AgentSpec, buyers: AgentSpec, run_seed: int, index: int, group: int = 1):
    """Episode ``index`` of a run: its market, seller and buyers. With ``group`` > 1, ``group``
    consecutive indices share the market and the buyers' seeds; only the seller's seed differs."""
    seed = market_seed(run_seed, index // group)
    market = generate(spec, seed)
    seller_agent = seller.build(market, [seed, 2] if group == 1 else [seed, 2, index % group])
    return market, seller_agent, build_buyers(market, buyers)


def build_buyers(market, buyers: AgentSpec) -> dict:
    """The buyers of a market, seeded from the market seed alone (every seller and repeat meets the same ones)."""
    return {b.id: buyers.build(market, [market.seed, 1, k]) for k, b in enumerate(market.buyers)}


async def play(prepared: Prepared, job: Job, *, opt_cache: dict | None = None) -> Episode:
    """Play one job of a run."""
    config = prepared.config
    market, seller, buyers = build_episode(prepared.spec, job.seller, prepared.buyers, config.seed, job.index, config.group)
    cells = len(market.buyers) * len(market.products)
    opt_value = opt_cache.get(market.seed) if opt_cache is not None else None
    if opt_value is None:
        # Large assignment problems are solved off the event loop.
        opt_value = await anyio.to_thread.run_sync(opt, market) if cells >= 10_000 else opt(market)
        if opt_cache is not None:
            opt_cache[market.seed] = opt_value
    labels = {"run": config.run_id} if config.run_id else {}
    labels |= {"run_seed": config.seed, "index": job.index, "seed": market.seed, "seller": job.seller.text, "buyers": prepared.buyers.text}
    if config.group > 1:
        labels["group"], labels["repeat"] = config.group, job.index % config.group
    return await run_episode(
        market, seller, buyers,
        episode_id=f"{slug(job.seller.text)}-{job.index:06d}",
        labels=labels,
        seller_timeout=config.seller_timeout,
        reply_timeout=config.reply_timeout,
        opt_value=opt_value,
    )


async def run_batch(
    prepared: Prepared,
    out: Path,
    *,
    concurrency: int = 256,
    on_episode: Callable[[Episode, str], None] | None = None,
    fsync: bool = False,
    sink: Callable[[str, list[dict], dict], None] | None = None,
) -> list[dict]:
    """Run every job of ``prepared``, ``concurrency`` at a time, writing traces under ``out``.

    Returns one row per episode (labels plus metrics) for the report table. With ``sink``, no
    trace is written here: ``sink(seller, events, row)`` gets each finished episode instead
    (a worker process sends it to the parent, which writes it).
    """
    writers = {}
    if sink is None:
        out.mkdir(parents=True, exist_ok=True)
        writers = {s.text: TraceWriter(out / prepared.config.trace_name(s.text), fsync=fsync) for s in prepared.sellers}
    rows: list[dict] = []
    jobs = iter(prepared.jobs)
    opt_cache: dict = {}
    old_threshold = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)  # thousands of short-lived records per second: gen-0 GC was a third of the time

    async def worker() -> None:
        for job in jobs:
            episode = await play(prepared, job, opt_cache=opt_cache)
            start = episode.events[0]
            row = {k: start[k] for k in ("seller", "split", "shape", "tier", "index")} | {"outcome": episode.outcome, "metrics": episode.metrics}
            if sink is None:
                writers[job.seller.text].write(episode.events)
            else:
                sink(job.seller.text, episode.events, row)
            rows.append(row)
            if episode.outcome == "failed":
                log.info("episode failed", episode=episode.id, reason=episode.reason)  # the run counts them: one line at the end
            if len(opt_cache) > 4 * concurrency:
                opt_cache.pop(next(iter(opt_cache)))
            if on_episode is not None:
                on_episode(episode, job.seller.text)

    try:
        if prepared.jobs:
            await preload_models([*prepared.sellers, prepared.buyers])
        async with anyio.create_task_group() as tg:
            for _ in range(max(1, min(concurrency, len(prepared.jobs)))):
                tg.start_soon(worker)
    finally:
        gc.set_threshold(*old_threshold)
        for writer in writers.values():
            writer.close()
        await close_model_clients()
    return rows


async def preload_models(specs: list[AgentSpec]) -> None:
    """Before the first episode starts: load every local model (``hf:``, ``vllm:``) the specs name,
    so no agent deadline counts the load, and ask every server (``openai:``) for its models, so a
    server that is down, a bad key or a wrong model name stops the run here, naming its spec,
    instead of failing every episode (and ``server=auto`` learns the kind of server)."""
    for spec in specs:
        if spec.backend in ("hf", "vllm"):
            from negotiate.agents.local import preload as check
        elif spec.backend == "openai":
            from negotiate.agents.llm import preflight as check
        else:
            continue
        from negotiate.agents.backends import LLMError

        try:
            await check(spec)
        except LLMError as error:
            field = "--seller" if spec.role == "seller" else "--buyers"
            raise UserError(str(error), field=field, value=spec.text) from None


async def close_model_clients() -> None:
    """Close the shared HTTP clients of this event loop's model agents, if any played."""
    if "negotiate.agents.backends" in sys.modules:
        await sys.modules["negotiate.agents.backends"].aclose_clients()


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
    return anyio.run(main, backend_options={"use_uvloop": use_uvloop})


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


