"""Throughput of the episode runtime: validated, traced messages per second.

Measures, in one run:

* the real async runtime -- :func:`negotiate.episode.run_episode` with scripted
  agents, a pool of N worker tasks pulling episodes from one list (like
  :func:`negotiate.runner.run_batch`), every finished episode written with
  :class:`negotiate.trace.TraceWriter` to a temporary file -- at each concurrency
  of ``--concurrency`` (default 1, 100 and 1,000 episodes in flight);
* the same episodes as a plain synchronous loop, no asyncio: the same
  :class:`negotiate.regulator.EpisodeState` validation (``seller_send`` /
  ``buyer_reply``), the agents' synchronous ``decide``, the same trace events and
  the same ``TraceWriter``. It reproduces the bus's scheduling (when the seller
  acts, when it waits, in which order buyers answer), so both play the same
  episodes; a sanity check compares them message by message, and every
  configuration's deals are hashed and compared.

"Messages" are the seller and buyer ``message`` events in the trace files (read
back after each run, outside the timed region). Both paths run with
``gc.set_threshold(50_000, 20, 20)``, as ``run_batch`` does. Markets, agents and
OPT are built before the clock starts (their cost is reported separately), so the
figures are the runtime's: scheduling, validation, observations, trace events,
metrics and trace writing. Each row gives messages per second of wall time and per
second of the process's CPU time (``time.process_time``): on a shared machine the
wall figure follows the other jobs' load, and the CPU figure is what the process
would get on an idle one.

Each configuration runs in its own subprocess, so its peak RSS
(``resource.getrusage``) is its own; ``--in-process`` runs them all here.

    python benchmarks/bench_runtime.py                       # dutch seller, threshold buyers, train
    python benchmarks/bench_runtime.py --seller posted --episodes 2000 --json out.json
    python benchmarks/bench_runtime.py --profile 100         # cProfile of the async path at 100
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import hashlib
import io
import json
import os
import platform
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from collections import deque
from importlib.metadata import version
from pathlib import Path

import anyio
import orjson

from negotiate.agents.registry import parse_agent
from negotiate.episode import end_event, live_metrics, run_episode, start_event
from negotiate.market import resolve_spec
from negotiate.metrics import opt
from negotiate.protocol import Generated, Message, ParseFailure
from negotiate.regulator import EpisodeState
from negotiate.runner import build_episode, slug
from negotiate.trace import DealEvent, EpisodeEnd, MessageEvent, TraceWriter, parse_event

GC_THRESHOLD = tuple(int(x) for x in __import__("os").environ.get("BENCH_GC", "50000,20,20").split(","))
"""What negotiate.runner.run_batch sets while a batch runs."""
TARGET_MSGS = 60_000
"""The target (issue #13): validated, traced messages per second at 100 concurrent episodes."""
TARGET_CONCURRENCY = 100
TARGET_SCALE = 1_000
"""... and at this concurrency, within 10% of the figure at TARGET_CONCURRENCY."""
TARGET_SCALE_RATIO = 0.9


# -- the episodes -------------------------------------------------------------------


def _build_one(spec, seller, buyers, run_seed: int, index: int) -> tuple:
    """One job as negotiate.runner.play prepares it: market, agents, OPT, labels."""
    market, seller_agent, buyer_agents = build_episode(spec, seller, buyers, run_seed, index)
    opt_value = opt(market)
    labels = {"run_seed": run_seed, "index": index, "seed": market.seed, "seller": seller.text, "buyers": buyers.text}
    return (f"{slug(seller.text)}-{index:06d}", market, seller_agent, buyer_agents, labels, opt_value)


def build_jobs(args, *, lazy: bool = False) -> tuple[list, dict]:
    """Fresh markets, agents and OPT for episodes 0..E-1 (agents are stateful: one set per run).

    ``lazy``: callables that build each job when a worker takes it (inside the clock, as run_batch does).
    """
    spec = resolve_spec(args.split)
    seller = parse_agent(args.seller, "seller")
    buyers = parse_agent(args.buyers, "buyer")
    if lazy:
        return [functools.partial(_build_one, spec, seller, buyers, args.seed, index) for index in range(args.episodes)], {}
    jobs = []
    t_build = t_opt = 0.0
    for index in range(args.episodes):
        t0 = time.perf_counter()
        market, seller_agent, buyer_agents = build_episode(spec, seller, buyers, args.seed, index)
        t1 = time.perf_counter()
        opt_value = opt(market)
        t2 = time.perf_counter()
        t_build += t1 - t0
        t_opt += t2 - t1
        labels = {"run_seed": args.seed, "index": index, "seed": market.seed, "seller": seller.text, "buyers": buyers.text}
        jobs.append((f"{slug(seller.text)}-{index:06d}", market, seller_agent, buyer_agents, labels, opt_value))
    n = max(1, args.episodes)
    return jobs, {"build_us": t_build / n * 1e6, "opt_us": t_opt / n * 1e6}


# -- the async runtime ---------------------------------------------------------------


async def _pool(jobs: list[tuple], concurrency: int, writer: TraceWriter, sink: list | None) -> None:
    queue = iter(jobs)

    async def worker() -> None:
        for job in queue:
            if callable(job):  # --with-setup: build it now, on the clock
                job = job()
            episode_id, market, seller, buyers, labels, opt_value = job
            episode = await run_episode(market, seller, buyers, episode_id=episode_id, labels=labels, opt_value=opt_value)
            writer.write(episode.events)
            if sink is not None:
                sink.append(episode.events)

    async with anyio.create_task_group() as tg:
        for _ in range(max(1, min(concurrency, len(jobs)))):
            tg.start_soon(worker)


def run_async(jobs: list[tuple], concurrency: int, writer: TraceWriter, sink: list | None = None) -> float:
    """Play every job with ``concurrency`` workers; returns the wall time of the pool."""
    wall = 0.0

    async def main() -> None:
        nonlocal wall
        t0 = time.perf_counter()
        await _pool(jobs, concurrency, writer, sink)
        wall = time.perf_counter() - t0

    anyio.run(main)
    return wall


# -- the same game, synchronously ------------------------------------------------------


def _unpack(decision):
    """As negotiate.bus does: (result, raw, extra) from what an agent returned."""
    if isinstance(decision, Generated):
        return decision.result, decision.raw, decision.extra
    if decision is None or isinstance(decision, (Message, ParseFailure)):
        return decision, None, None
    return ParseFailure(f"agent returned {type(decision).__name__}, not a message", repr(decision)[:500]), None, None


_SELLER = object()
"""The seller's entry in the ready queue."""


def play_sync(episode_id: str, market, seller, buyers: dict, labels: dict, opt_value) -> list[dict]:
    """One episode as a plain loop, in the order the async bus plays it.

    The bus calls scripted (instant) buyers inline: the seller messages every buyer it
    can, and when it would wait, the buyers answer in the order they were written to,
    until the episode ends. Here that is a while loop and a deque, with the same
    validation (EpisodeState), the same trace events and the same writer.
    """
    began = time.perf_counter()
    state = EpisodeState(market, episode=episode_id)
    state.events.append(start_event(episode_id, market, seller, buyers, labels))
    due: deque = deque()
    while not state.done:
        if state.budget_left > 0 and state.any_free():
            result, raw, extra = _unpack(seller.decide(state.seller_observation()))
            if result is not None:
                to = state.seller_send(result, raw, extra)
                if to is not None:
                    due.append((to, result))
                continue
            if not state.pending:
                state.finish("terminated", "seller_idle")
                break
        elif not state.pending:
            state.finish("truncated", "budget") if state.budget_left <= 0 else state.finish("terminated", "no_buyers")
            break
        if not due:
            raise RuntimeError(f"{episode_id}: the seller waits and no buyer holds a message")
        while due and not state.done:
            buyer_id, message = due.popleft()
            result, raw, extra = _unpack(buyers[buyer_id].decide(state.buyer_observation(buyer_id, message)))
            if result is None:
                result = ParseFailure("buyer gave no reply", "")
            state.buyer_reply(buyer_id, result, raw, extra)
    metrics = live_metrics(state, opt_value)
    end = end_event(state, metrics, time.perf_counter() - began)
    end.episode = episode_id
    state.events.append(end)
    return state.events


def run_sync(jobs: list[tuple], writer: TraceWriter, sink: list | None = None) -> float:
    t0 = time.perf_counter()
    for job in jobs:
        events = play_sync(*(job() if callable(job) else job))
        writer.write(events)
        if sink is not None:
            sink.append(events)
    return time.perf_counter() - t0


# -- reading the traces back -------------------------------------------------------------


def _deal_key(event: DealEvent) -> tuple:
    return (event.buyer, event.product, event.price, event.by, event.turn)


def _message_key(event: MessageEvent) -> tuple:
    action = event.action
    return (event.sender, event.to, event.turn, event.valid, None if action is None else tuple(action.values()))


def summarize_trace(path: Path) -> dict:
    """Count episodes and message events of a trace file, and hash its deals (in episode order)."""
    episodes = messages = deals = 0
    by_episode: dict[str, list] = {}
    outcomes: dict[str, int] = {}
    with open(path, "rb") as handle:
        for line in handle:
            event = parse_event(orjson.loads(line))
            if isinstance(event, MessageEvent):
                messages += 1
            elif isinstance(event, DealEvent):
                deals += 1
                by_episode.setdefault(event.episode, []).append(_deal_key(event))
            elif isinstance(event, EpisodeEnd):
                episodes += 1
                outcomes[event.outcome] = outcomes.get(event.outcome, 0) + 1
    digest = hashlib.sha256(orjson.dumps(sorted(by_episode.items()))).hexdigest()[:12]
    return {"episodes": episodes, "messages": messages, "deals": deals, "deal_digest": digest, "outcomes": outcomes}


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- one configuration ---------------------------------------------------------------------


def measure(args, mode: str, concurrency: int) -> dict:
    """Run one configuration ``args.repeat`` times; keep the fastest."""
    best = None
    for _ in range(args.repeat):
        jobs, setup = build_jobs(args, lazy=args.with_setup)
        gc.collect()
        rss_setup = _rss_mib()
        with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
            path = Path(tmp) / "trace.jsonl"
            old = gc.get_threshold()
            gc.set_threshold(*GC_THRESHOLD)
            try:
                with TraceWriter(path) as writer:
                    cpu = time.process_time()
                    wall = run_async(jobs, concurrency, writer) if mode == "async" else run_sync(jobs, writer)
                    cpu = time.process_time() - cpu
            finally:
                gc.set_threshold(*old)
            rss_peak = _rss_mib()
            del jobs
            counted = summarize_trace(path)
            trace_mib = path.stat().st_size / 2**20
        row = {
            "mode": mode, "concurrency": concurrency if mode == "async" else None, "wall_s": wall, "cpu_s": cpu,
            "msgs_per_s": counted["messages"] / wall, "msgs_per_cpu_s": counted["messages"] / cpu, "episodes_per_s": counted["episodes"] / wall,
            "trace_mib": trace_mib, "rss_setup_mib": rss_setup, "rss_peak_mib": rss_peak, **counted, **setup,
        }
        if best is None or row["msgs_per_s"] > best["msgs_per_s"]:
            best = row
    return best


def _worker_main(args) -> None:
    mode, _, n = args.worker.partition(":")
    row = measure(args, mode, int(n or 1))
    sys.stdout.write("BENCH-RESULT " + json.dumps(row) + "\n")


def measure_in_subprocess(args, mode: str, concurrency: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", f"{mode}:{concurrency}", "--seller", args.seller, "--buyers", args.buyers,
           "--split", args.split, "--episodes", str(args.episodes), "--seed", str(args.seed), "--repeat", str(args.repeat)] + (["--with-setup"] if args.with_setup else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH-RESULT "):
            return json.loads(line.removeprefix("BENCH-RESULT "))
    raise RuntimeError(f"{mode}:{concurrency} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


# -- sanity check: both paths play the same episodes -------------------------------------------


def sanity_check(args, count: int) -> dict:
    """Play the first ``count`` episodes both ways (async at ``count`` in flight) and compare them."""
    small = argparse.Namespace(**{**vars(args), "episodes": count})
    async_events: list = []
    sync_events: list = []
    with tempfile.TemporaryDirectory(prefix="bench-runtime-check-") as tmp:
        with TraceWriter(Path(tmp) / "a.jsonl") as writer:
            run_async(build_jobs(small)[0], count, writer, async_events)
        with TraceWriter(Path(tmp) / "s.jsonl") as writer:
            run_sync(build_jobs(small)[0], writer, sync_events)
    by_id = {events[0].episode: events for events in async_events}
    same_deals = same_messages = same_outcome = 0
    first_diff = None
    for events in sync_events:
        other = by_id.get(events[0].episode, [])
        pick = lambda evs, t, key: [key(e) for e in evs if isinstance(e, t)]  # noqa: E731
        d = pick(events, DealEvent, _deal_key) == pick(other, DealEvent, _deal_key)
        m = pick(events, MessageEvent, _message_key) == pick(other, MessageEvent, _message_key)
        o = events[-1].outcome == other[-1].outcome and events[-1].reason == other[-1].reason if other else False
        same_deals += d
        same_messages += m
        same_outcome += o
        if not (d and m and o) and first_diff is None:
            first_diff = events[0].episode
    deals = sum(1 for events in sync_events for e in events if isinstance(e, DealEvent))
    return {"episodes": count, "same_deals": same_deals, "same_messages": same_messages, "same_outcome": same_outcome,
            "deals": deals, "first_difference": first_diff, "ok": same_deals == same_messages == same_outcome == count}


# -- profile -------------------------------------------------------------------------------------


def profile(args, target: str, top: int) -> None:
    """cProfile one configuration: ``target`` is a concurrency (the async path) or ``sync``."""
    jobs, _ = build_jobs(args)
    gc.collect()
    with tempfile.TemporaryDirectory(prefix="bench-runtime-prof-") as tmp:
        old = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLD)
        profiler = cProfile.Profile()
        try:
            with TraceWriter(Path(tmp) / "trace.jsonl") as writer:
                profiler.enable()
                wall = run_sync(jobs, writer) if target == "sync" else run_async(jobs, int(target), writer)
                profiler.disable()
        finally:
            gc.set_threshold(*old)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    what = "the sync loop" if target == "sync" else f"the async runtime at {int(target)} in flight"
    print(f"cProfile of {what}, {args.episodes} episodes: {wall:.2f} s under the profiler")
    print(out.getvalue())
    print("tottime by module:")
    groups: dict[str, float] = {}
    total = 0.0
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        total += tottime
        groups[_module(filename, name)] = groups.get(_module(filename, name), 0.0) + tottime
    for key, value in sorted(groups.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {value:7.3f} s  {value / total:6.1%}  {key}")
    if args.profile_out:
        stats.dump_stats(args.profile_out)
        print(f"raw stats written to {args.profile_out} (python -m pstats {args.profile_out})")


def _module(filename: str, name: str) -> str:
    if "anyio" in filename:
        return "anyio"
    if "asyncio" in filename:
        return "asyncio"
    for marker in ("/negotiate/", "/agents/", "/benchmarks/"):
        if marker in filename:
            return marker.strip("/") + "/" + filename.rsplit(marker, 1)[1]
    if filename == "~":
        return "builtins (" + ("orjson" if "orjson" in name else "write" if "write" in name else "other") + ")"
    return filename.rsplit("/", 1)[-1]


# -- the report ------------------------------------------------------------------------------------


def _concurrency_list(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--concurrency: {text!r} is not a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--concurrency: {text!r}: every value must be at least 1")
    return values


def _profile_target(text: str) -> str:
    if text == "sync" or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"--profile: {text!r}: a concurrency (like 100) or 'sync'")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Throughput of negotiate's episode runtime: async (1/100/1,000 in flight) vs a plain synchronous loop.")
    parser.add_argument("--seller", default="dutch", help="seller spec (default: dutch, a cheap scripted seller)")
    parser.add_argument("--buyers", default="threshold", help="buyer spec (default: threshold)")
    parser.add_argument("--split", default="train", help="split name or TOML spec (default: train)")
    parser.add_argument("--episodes", type=int, default=2500, help="episodes per configuration (default: 2500, about 3-5 s each on 2 cores)")
    parser.add_argument("--concurrency", type=_concurrency_list, default=[1, 100, 1000], help="async episodes in flight, comma-separated (default: 1,100,1000)")
    parser.add_argument("--seed", type=int, default=0, help="run seed: episode i plays market_seed(seed, i) (default: 0)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration, the fastest kept (default: 1)")
    parser.add_argument("--check", type=int, default=50, help="episodes compared message by message, async vs sync (default: 50; 0 skips)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--with-setup", action="store_true",
                        help="build each market, its agents and OPT inside the clock, as run_batch does (default: before it)")
    parser.add_argument("--in-process", action="store_true", help="run every configuration in this process (peak RSS is then cumulative)")
    parser.add_argument("--profile", metavar="N|sync", type=_profile_target,
                        help="instead: cProfile the async path at N in flight (or the sync loop) and print the top functions by tottime")
    parser.add_argument("--profile-top", type=int, default=30, help="functions to print with --profile (default: 30)")
    parser.add_argument("--profile-out", metavar="PATH", help="with --profile, also dump the raw pstats file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        _worker_main(args)
        return 0
    if args.profile:
        profile(args, args.profile, args.profile_top)
        return 0

    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=150)
    console.print(f"[bold]negotiate runtime benchmark[/]: seller [cyan]{args.seller}[/], buyers [cyan]{args.buyers}[/], "
                  f"split [cyan]{args.split}[/], {args.episodes} episodes per configuration, seed {args.seed}, "
                  f"gc.set_threshold{GC_THRESHOLD} (as run_batch), Python {platform.python_version()}, "
                  f"{os.cpu_count()} CPUs, anyio {version('anyio')}")

    check = None
    if args.check:
        check = sanity_check(args, min(args.check, args.episodes))
        verdict = "[green]same[/]" if check["ok"] else "[red]DIFFERENT[/]"
        console.print(f"sanity check, first {check['episodes']} episodes, async vs sync: {verdict} deals in "
                      f"{check['same_deals']}/{check['episodes']} ({check['deals']} deals), same messages in "
                      f"{check['same_messages']}/{check['episodes']}, same outcome in {check['same_outcome']}/{check['episodes']}"
                      + (f"; first difference: {check['first_difference']}" if check["first_difference"] else ""))

    run = measure if args.in_process else measure_in_subprocess
    rows = []
    for mode, n in [("sync", 1)] + [("async", n) for n in args.concurrency]:
        console.print(f"  running {mode}" + (f" at {n} in flight" if mode == "async" else "") + " ...", style="dim")
        rows.append(run(args, mode, n))
    sync = rows[0]

    table = Table(title="validated, traced messages per second (messages = seller + buyer message events in the trace)",
                  caption=(f"setup outside the clock: market+agents {sync['build_us']:.0f} µs/episode, OPT {sync['opt_us']:.0f} µs/episode; "
                           if not args.with_setup else "setup (market, agents, OPT) inside the clock, as run_batch; ")
                          + f"trace {sync['trace_mib'] / max(1, sync['episodes']) * 1024:.1f} KiB/episode")
    for name, justify in [("path", "left"), ("in flight", "right"), ("episodes", "right"), ("messages", "right"), ("wall s", "right"),
                          ("msgs/s", "right"), ("msgs/CPU s", "right"), ("episodes/s", "right"), ("vs sync", "right"), ("RSS setup", "right"),
                          ("peak RSS", "right"), ("deals (digest)", "left")]:
        table.add_column(name, justify=justify)
    for row in rows:
        table.add_row(
            "sync loop" if row["mode"] == "sync" else "async run_episode",
            "-" if row["concurrency"] is None else f"{row['concurrency']:,}",
            f"{row['episodes']:,}", f"{row['messages']:,}", f"{row['wall_s']:.2f}",
            f"{row['msgs_per_s']:,.0f}", f"{row['msgs_per_cpu_s']:,.0f}", f"{row['episodes_per_s']:,.0f}", f"{row['msgs_per_s'] / sync['msgs_per_s']:.2f}x",
            f"{row['rss_setup_mib']:.0f} MiB", f"{row['rss_peak_mib']:.0f} MiB", f"{row['deals']:,} ({row['deal_digest']})",
        )
    console.print(table)

    digests = {row["deal_digest"] for row in rows}
    consistent = len(digests) == 1 and len({row["messages"] for row in rows}) == 1
    console.print(("[green]every configuration played the same episodes[/] (same message count and deal digest)" if consistent else
                   "[red]configurations differ[/] in message count or deals: the paths do not play the same episodes"))

    by_n = {row["concurrency"]: row for row in rows if row["mode"] == "async"}
    targets = []
    if TARGET_CONCURRENCY in by_n:
        value = by_n[TARGET_CONCURRENCY]["msgs_per_s"]
        targets.append({"target": f">= {TARGET_MSGS:,} msgs/s at {TARGET_CONCURRENCY} in flight", "value": f"{value:,.0f} msgs/s", "measured": value, "met": value >= TARGET_MSGS})
        if TARGET_SCALE in by_n:
            ratio = by_n[TARGET_SCALE]["msgs_per_s"] / value
            targets.append({"target": f"{TARGET_SCALE:,} in flight >= {TARGET_SCALE_RATIO} x {TARGET_CONCURRENCY} in flight", "value": f"{ratio:.2f} x",
                            "measured": ratio, "met": ratio >= TARGET_SCALE_RATIO})
    for target in targets:
        mark = "[green]met[/]" if target["met"] else "[red]NOT met[/]"
        console.print(f"target {target['target']}: {target['value']} -> {mark}")

    if args.json:
        payload = {
            "config": {k: getattr(args, k) for k in ("seller", "buyers", "split", "episodes", "concurrency", "seed", "repeat", "with_setup")},
            "gc_threshold": GC_THRESHOLD, "python": platform.python_version(), "cpus": os.cpu_count(),
            "rows": rows, "sanity_check": check, "consistent": consistent, "targets": targets,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
        console.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
