"""A run's memory does not grow with --episodes: its jobs are made as they are taken, in the order a list of
them had (by market index, then seller), on resume and in shards; a worker is sent what defines its share, not
the share; and a batch keeps no row per episode."""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import anyio
import orjson
import pytest

from negotiate.errors import UserError
from negotiate.runner import RunConfig, prepare, run_batch, save_config
from negotiate.trace import read_episodes, scan
from negotiate.workers import run_workers

SELLERS = ("greedy", "random", "posted")
ADDRESS_SPACE = 4 << 30
"""What a child given 10**9 episodes may map: listing the jobs runs it out of address space (a MemoryError, a
failed test) long before it could take the machine's memory."""


def bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def in_bounded_child(script: str, *args: str) -> dict:
    """Run ``script`` in a Python child with :data:`ADDRESS_SPACE`; the JSON it prints."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=bounded)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def listed_jobs(sellers, indices, finished: dict[str, set[int]]) -> list[tuple[str, int]]:
    """The jobs as prepare() listed them before they were made lazily: every (seller, index) not finished, sorted
    by index and then seller order."""
    jobs = [(seller, i) for seller in sellers for i in indices if i not in finished.get(seller, set())]
    return sorted(jobs, key=lambda job: (job[1], sellers.index(job[0])))


def pairs(jobs) -> list[tuple[str, int]]:
    return [(job.seller.text, job.index) for job in jobs]


def keep_only(path: Path, indices: set[int]) -> None:
    """Rewrite a trace with only the episodes of ``indices`` (an interrupted run finishes them in any order)."""
    kept = [events for events in read_episodes(path) if events[0]["index"] in indices]
    path.write_bytes(b"".join(orjson.dumps(event) + b"\n" for events in kept for event in events))


def indices_in(path: Path) -> list[int]:
    return [events[0]["index"] for events in read_episodes(path)]


def run_small(config: RunConfig, out: Path) -> None:
    prepared = prepare(config, out, resume=False)
    save_config(config, out)
    anyio.run(lambda: run_batch(prepared, out, concurrency=4))


# -- the jobs: the old list's, in its order ----------------------------------------------------------


@pytest.mark.parametrize("shard", [(1, 1), (2, 3)])
def test_resumed_jobs_are_the_listed_jobs_in_the_same_order(tmp_path, shard):
    out = tmp_path / "run"
    run_small(RunConfig(sellers=SELLERS, episodes=12, seed=3, shard=shard), out)
    config = RunConfig(sellers=SELLERS, episodes=20, seed=3, shard=shard)
    indices = list(config.indices())
    # Each seller stopped somewhere else; one market is finished by every seller.
    keep = {"greedy": set(indices[:3]), "random": {indices[0], indices[2]}, "posted": {indices[0], indices[3]}}
    for seller, kept in keep.items():
        keep_only(out / config.trace_name(seller), kept)
    prepared = prepare(config, out, resume=True)
    expected = listed_jobs(SELLERS, indices, keep)
    assert pairs(prepared.jobs) == expected
    assert len(prepared.jobs) == len(expected) == 3 * len(indices) - 7
    assert prepared.done == 7
    assert prepared.jobs.markets() == len(indices) - 1 == len({index for _, index in expected})
    assert pairs(prepared.jobs) == expected  # taken again, the same jobs: nothing is used up


def test_retry_failed_puts_the_failed_episodes_back_among_the_jobs(tmp_path):
    out = tmp_path / "run"
    config = RunConfig(sellers=("greedy", "random"), episodes=4, seed=1)
    run_small(config, out)
    path = out / "random.jsonl"
    episodes = list(read_episodes(path))
    episodes[1][-1] = episodes[1][-1] | {"outcome": "failed", "reason": "boom", "metrics": None}  # index 1 failed
    path.write_bytes(b"".join(orjson.dumps(event) + b"\n" for events in episodes for event in events))
    kept = prepare(config, out, resume=True)
    assert (len(kept.jobs), kept.done) == (0, 8)
    retried = prepare(config, out, resume=True, retry_failed=True)
    assert (pairs(retried.jobs), retried.done, retried.retry) == ([("random", 1)], 7, [path])


def test_an_old_trace_without_indices_does_not_scan_the_whole_range(tmp_path):
    """``None in range(n)`` compares with every element: an index-less episode must not meet a 10**9 range."""
    out = tmp_path / "run"
    run_small(RunConfig(sellers=("greedy",), episodes=2), out)
    path = out / "greedy.jsonl"
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for event in lines:
        event.pop("index", None)
    path.write_bytes(b"".join(orjson.dumps(event) + b"\n" for event in lines))
    result = in_bounded_child("""
        import json, sys, time
        from pathlib import Path
        from negotiate.runner import RunConfig, prepare
        began = time.perf_counter()
        prepared = prepare(RunConfig(sellers=("greedy",), episodes=10**9), Path(sys.argv[1]), resume=True)
        print(json.dumps({"len": len(prepared.jobs), "done": prepared.done, "seconds": time.perf_counter() - began}))
    """, str(out))
    assert (result["len"], result["done"]) == (10**9, 0) and result["seconds"] < 5, result


def test_preparing_a_billion_episodes_is_prompt_and_holds_no_list(tmp_path):
    """The old prepare() listed every job: 8.9 GB for 10**8. In a child with bounded address space, so that a
    regression fails instead of taking the machine's memory."""
    result = in_bounded_child("""
        import json, sys, time, tracemalloc
        from itertools import islice
        from pathlib import Path
        from negotiate.runner import RunConfig, prepare
        tracemalloc.start()
        began = time.perf_counter()
        prepared = prepare(RunConfig(sellers=("greedy", "random"), episodes=10**9), Path(sys.argv[1]), resume=False)
        seconds = time.perf_counter() - began
        first = [(job.seller.text, job.index) for job in islice(prepared.jobs, 4)]
        print(json.dumps({"len": len(prepared.jobs), "markets": prepared.jobs.markets(), "first": first,
                          "peak": tracemalloc.get_traced_memory()[1], "seconds": seconds}))
    """, str(tmp_path / "run"))
    assert result["len"] == 2 * 10**9 and result["markets"] == 10**9
    assert result["first"] == [["greedy", 0], ["random", 0], ["greedy", 1], ["random", 1]]
    assert result["peak"] < 4 << 20, result  # a few MB: the specs, not the jobs


# -- workers: each takes its markets, round-robin ------------------------------------------------------


def test_worker_shares_deal_whole_markets_round_robin_across_runs():
    from negotiate.runner import Jobs
    from negotiate.workers import share

    first = Jobs(("a", "b"), range(0, 9, 2), (frozenset({4}), frozenset({2, 4})))  # markets 0, 2, 6, 8 left
    second = Jobs(("a", "b"), range(5), (frozenset(), frozenset({1})))
    starts = (0, first.markets())
    shares = [[(k, job.seller, job.index) for k, jobs in enumerate((first, second)) for job in share(jobs, w, 3, starts[k])]
              for w in range(3)]
    # The old deal: list every (run, market) with a job, in order; market n goes to worker n % 3.
    jobs = [(k, job.seller, job.index) for k, jobs in enumerate((first, second)) for job in jobs]
    markets = list(dict.fromkeys((k, index) for k, _, index in jobs))
    assert shares == [[job for job in jobs if markets.index((job[0], job[2])) % 3 == w] for w in range(3)]
    assert sorted(job for part in shares for job in part) == sorted(jobs)  # every job once
    assert [len(part) for part in shares] == [6, 5, 5]


def test_workers_resume_a_run_and_play_each_market_once_per_seller(tmp_path):
    out = tmp_path / "run"
    run_small(RunConfig(sellers=("greedy", "random"), episodes=6, seed=2), out)
    keep_only(out / "greedy.jsonl", {0, 1, 4})
    keep_only(out / "random.jsonl", {1, 5})
    config = RunConfig(sellers=("greedy", "random"), episodes=10, seed=2)
    prepared = prepare(config, out, resume=True)
    assert run_workers([(prepared, out)], 3, concurrency=6, max_inflight=None, log_file=None) == 20 - 5
    for name in ("greedy.jsonl", "random.jsonl"):
        assert sorted(indices_in(out / name)) == list(range(10))  # each market once per seller, none twice
        assert scan(out / name).good_bytes == (out / name).stat().st_size
    # The episodes are the ones a single process plays.
    run_small(config, tmp_path / "one")
    for name in ("greedy.jsonl", "random.jsonl"):
        by_index = {events[0]["index"]: events[-1]["metrics"] for events in read_episodes(out / name)}
        assert by_index == {events[0]["index"]: events[-1]["metrics"] for events in read_episodes(tmp_path / "one" / name)}


def test_workers_are_sent_what_defines_their_share_not_the_share(tmp_path):
    """The parent of a run of 10**6 episodes holds no list of them: its workers fail at once here (the spec they
    read again is broken), and what the parent allocated meanwhile is a few MB (the old list and its copies: hundreds)."""
    spec = tmp_path / "market.toml"
    spec.write_text('name = "tiny"\nbuyers = 2\nproducts = 2\n')
    tracemalloc.start()
    try:
        prepared = prepare(RunConfig(sellers=("greedy", "random"), split=str(spec), episodes=10**6), tmp_path / "run", resume=False)
        spec.write_text("this is not TOML ==")
        with pytest.raises(UserError, match="a worker failed"):
            run_workers([(prepared, tmp_path / "run")], 2, concurrency=4, max_inflight=None, log_file=None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20


# -- a batch keeps nothing per episode ----------------------------------------------------------------


def test_a_batch_keeps_no_row_per_episode(tmp_path):
    out = tmp_path / "run"
    prepared = prepare(RunConfig(sellers=("greedy",), buyers="concession", episodes=2), out, resume=False)
    prepared.jobs = replace(prepared.jobs, indices=range(10**9))  # played until stopped
    sizes = {}

    async def stopped() -> int:
        with anyio.CancelScope() as scope:
            def on_episode(episode, seller):
                nonlocal seen
                seen += 1
                if seen in (100, 500):
                    gc.collect()
                    sizes[seen] = tracemalloc.get_traced_memory()[0]
                if seen == 500:
                    scope.cancel()

            seen = 0
            await run_batch(prepared, out, concurrency=4, on_episode=on_episode)
        return seen

    tracemalloc.start()
    try:
        assert anyio.run(stopped) == 500
    finally:
        tracemalloc.stop()
    assert len(list(read_episodes(out / "greedy.jsonl"))) >= 500
    assert sizes[500] - sizes[100] < 200_000, sizes  # a row per episode was about 1.5 kB


# -- the command line ----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_with_a_billion_episodes_plays_at_once_and_keeps_what_it_played(tmp_path, workers):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "negotiate", "serve", "--episodes", str(10**9), "--seller", "greedy,random",
               "--workers", str(workers), "--concurrency", "4", "--out", str(out), "--quiet"]

    def child() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a shell starts background jobs with SIGINT ignored
        bounded()

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"},
                               preexec_fn=child)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            if (out / "random.jsonl").exists() and (out / "random.jsonl").read_bytes().count(b'"type":"episode_end"') >= 5:
                break
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err[-2000:]
    for name in ("greedy.jsonl", "random.jsonl"):
        kept = scan(out / name)
        assert kept.good_bytes == (out / name).stat().st_size and len(kept.complete) >= 4  # whole episodes only
    # Paired coverage from the first markets on: by market, then seller, so no seller is ahead of the other by
    # more than the episodes that were in flight.
    greedy, random_ = set(indices_in(out / "greedy.jsonl")), set(indices_in(out / "random.jsonl"))
    assert len(greedy ^ random_) <= 4 and min(greedy & random_) <= 1


def test_scanning_a_trace_keeps_little_per_episode(tmp_path):
    """Resume and the count of what a stopped run kept scan its traces: each episode's parsed start (its market)
    and end were kept, about 9 kB an episode, so a run of 10**7 could not be resumed in memory."""
    run_small(RunConfig(sellers=("greedy",), episodes=600, seed=5), tmp_path / "run")
    path = tmp_path / "run" / "greedy.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    ends = [k for k, line in enumerate(lines) if b'"episode_end"' in line]
    (tmp_path / "fewer.jsonl").write_bytes(b"".join(lines[: ends[199] + 1]))  # the first 200 episodes

    def peak(trace: Path) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            assert len(scan(trace).complete) in (200, 600)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    per_episode = (peak(path) - peak(tmp_path / "fewer.jsonl")) / 400
    assert per_episode < 1000, per_episode  # an id, an index and an outcome: about 170 bytes
