"""negotiate.runner and negotiate.report: batches, resume after an interruption, shards, merged reports."""

from __future__ import annotations

from collections import Counter

import anyio
import orjson
import pytest

from negotiate.errors import UserError
from negotiate.report import overlapping_runs, rows_from_traces, summarize, summary_csv, summary_markdown
from negotiate.runner import RunConfig, load_config, market_seed, prepare, run_batch, save_config, slug
from negotiate.trace import read_episodes


def run(config: RunConfig, out, *, resume: bool = False, concurrency: int = 4, on_episode=None):
    prepared = prepare(config, out, resume=resume)
    save_config(config, out)
    rows = anyio.run(lambda: run_batch(prepared, out, concurrency=concurrency, on_episode=on_episode))
    return prepared, rows


def episodes_in(path) -> list[list[dict]]:
    return list(read_episodes(path))


def indices_in(path) -> list[int]:
    return [events[0]["index"] for events in episodes_in(path)]


def metrics_by_index(path) -> dict[int, dict]:
    return {events[0]["index"]: events[-1]["metrics"] for events in episodes_in(path)}


# -- small pieces -------------------------------------------------------------------------------


def test_market_seeds_are_deterministic_distinct_and_63_bit():
    seeds = {(s, i): market_seed(s, i) for s in range(3) for i in range(200)}
    assert len(set(seeds.values())) == len(seeds)
    assert all(0 <= v < 2**63 for v in seeds.values())
    assert market_seed(7, 42) == market_seed(7, 42)


def test_slug():
    assert slug("concession?beta=2") == "concession-beta-2"
    assert slug("scripted:Greedy") == "scripted-greedy"
    assert slug("???") == "agent"


def test_indices_and_trace_names():
    assert list(RunConfig(sellers=("greedy",), episodes=7).indices()) == list(range(7))
    assert list(RunConfig(sellers=("greedy",), episodes=7, shard=(1, 3)).indices()) == [0, 3, 6]
    assert list(RunConfig(sellers=("greedy",), episodes=7, shard=(3, 3)).indices()) == [2, 5]
    assert RunConfig(sellers=("x",)).trace_name("greedy") == "greedy.jsonl"
    assert RunConfig(sellers=("x",), shard=(2, 4)).trace_name("concession?beta=2") == "concession-beta-2.shard-2-of-4.jsonl"


def test_config_round_trips_through_run_json(tmp_path):
    config = RunConfig(sellers=("greedy", "random"), buyers="stubborn", split="shapes", episodes=9, seed=3, shard=(2, 3),
                       seller_timeout=5.0, reply_timeout=6.0)
    save_config(config, tmp_path)
    assert load_config(tmp_path) == config


def test_load_config_errors(tmp_path):
    with pytest.raises(UserError, match="no run.json"):
        load_config(tmp_path)
    (tmp_path / "run.json").write_text("{nope")
    with pytest.raises(UserError, match="not valid JSON"):
        load_config(tmp_path)
    (tmp_path / "run.json").write_text('{"buyers": "threshold"}')
    with pytest.raises(UserError, match="not a run config") as caught:
        load_config(tmp_path)
    assert "run.json" in str(caught.value)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (RunConfig(sellers=("nobody",)), "unknown seller agent 'nobody'"),
        (RunConfig(sellers=("greedy",), buyers="nobody"), "unknown buyer agent"),
        (RunConfig(sellers=("greedy", "greedy")), "share a trace file"),
        (RunConfig(sellers=("concession?beta=2", "concession?beta=2&")), "share a trace file"),
        (RunConfig(sellers=("greedy",), split="no-such-split"), "unknown split"),
        (RunConfig(sellers=("concession?gamma=2",)), "unknown parameter 'gamma'"),
    ],
)
def test_prepare_checks_everything_before_running(tmp_path, config, match):
    with pytest.raises(UserError, match=match):
        prepare(config, tmp_path / "out", resume=False)
    assert not (tmp_path / "out").exists()


# -- a run, and a paired comparison --------------------------------------------------------------------


def test_a_run_writes_one_trace_per_seller_with_paired_markets(tmp_path):
    out = tmp_path / "run"
    config = RunConfig(sellers=("greedy", "random"), episodes=6, seed=5)
    prepared, rows = run(config, out)
    assert prepared.done == 0 and len(prepared.jobs) == 12
    assert sorted(p.name for p in out.iterdir()) == ["greedy.jsonl", "random.jsonl", "run.json"]
    assert sorted(indices_in(out / "greedy.jsonl")) == sorted(indices_in(out / "random.jsonl")) == list(range(6))
    assert Counter(row["seller"] for row in rows) == {"greedy": 6, "random": 6}
    # Episode i of every seller plays the same market.
    greedy = {e[0]["index"]: e[0]["market"] for e in episodes_in(out / "greedy.jsonl")}
    random_ = {e[0]["index"]: e[0]["market"] for e in episodes_in(out / "random.jsonl")}
    assert greedy == random_
    assert len({orjson.dumps(m) for m in greedy.values()}) == 6
    starts = [e[0] for e in episodes_in(out / "greedy.jsonl")]
    assert all(s["seed"] == market_seed(5, s["index"]) and s["run_seed"] == 5 for s in starts)


def test_the_same_config_gives_the_same_metrics(tmp_path):
    config = RunConfig(sellers=("greedy",), buyers="concession", episodes=5, seed=2)
    run(config, tmp_path / "a")
    run(config, tmp_path / "b", concurrency=1)
    assert metrics_by_index(tmp_path / "a" / "greedy.jsonl") == metrics_by_index(tmp_path / "b" / "greedy.jsonl")


# -- resume ------------------------------------------------------------------------------------------


def test_resume_after_a_half_written_episode_runs_only_what_is_missing(tmp_path):
    out = tmp_path / "run"
    run(RunConfig(sellers=("greedy", "random"), episodes=3, seed=1), out)
    path = out / "greedy.jsonl"
    complete = path.read_bytes()
    # A killed writer: the start of episode 3 and half of its next line.
    donor = episodes_in(out / "random.jsonl")[0]
    half = orjson.dumps(donor[0] | {"index": 3, "episode": "greedy-000003"}) + b"\n" + orjson.dumps(donor[1])[:25]
    path.write_bytes(complete + half)

    config = RunConfig(sellers=("greedy", "random"), episodes=5, seed=1)
    prepared = prepare(config, out, resume=True)
    assert prepared.done == 6
    assert [(job.seller.text, job.index) for job in prepared.jobs] == [
        ("greedy", 3), ("random", 3), ("greedy", 4), ("random", 4)
    ]
    assert path.read_bytes() == complete  # the half-written tail is dropped
    anyio.run(lambda: run_batch(prepared, out))
    for name in ("greedy.jsonl", "random.jsonl"):
        assert sorted(indices_in(out / name)) == list(range(5))  # exactly the episodes asked for, no duplicates

    again = prepare(config, out, resume=True)
    assert (again.jobs, again.done) == ([], 10)


def test_a_cancelled_batch_resumes_to_exactly_the_episodes_asked_for(tmp_path):
    config = RunConfig(sellers=("greedy",), buyers="concession", episodes=8, seed=4)
    out = tmp_path / "run"
    prepared = prepare(config, out, resume=False)
    save_config(config, out)
    seen = []

    async def interrupted():
        with anyio.CancelScope() as scope:
            def on_episode(episode, seller):
                seen.append(episode.id)
                if len(seen) == 3:
                    scope.cancel()

            await run_batch(prepared, out, concurrency=2, on_episode=on_episode)

    anyio.run(interrupted)
    kept = indices_in(out / "greedy.jsonl")  # only whole episodes were written
    assert 3 <= len(kept) < 8

    resumed = prepare(load_config(out), out, resume=True)
    assert resumed.done == len(kept)
    assert sorted(job.index for job in resumed.jobs) == sorted(set(range(8)) - set(kept))
    anyio.run(lambda: run_batch(resumed, out))
    assert sorted(indices_in(out / "greedy.jsonl")) == list(range(8))

    # And the interrupted-then-resumed run matches an uninterrupted one, episode for episode.
    run(config, tmp_path / "straight")
    assert metrics_by_index(out / "greedy.jsonl") == metrics_by_index(tmp_path / "straight" / "greedy.jsonl")


def test_resume_after_a_write_that_lost_only_its_final_newline(tmp_path):
    out = tmp_path / "run"
    run(RunConfig(sellers=("greedy",), episodes=2), out)
    path = out / "greedy.jsonl"
    path.write_bytes(path.read_bytes()[:-1])
    config = RunConfig(sellers=("greedy",), episodes=3)
    prepared = prepare(config, out, resume=True)
    anyio.run(lambda: run_batch(prepared, out))
    assert sorted(indices_in(path)) == [0, 1, 2]


# -- shards ----------------------------------------------------------------------------------------


def test_shards_are_disjoint_and_together_equal_the_unsharded_run(tmp_path):
    base = RunConfig(sellers=("greedy",), episodes=7, seed=9)
    run(base, tmp_path / "whole")
    shards = tmp_path / "shards"
    for k in (1, 2):
        prepared, _ = run(RunConfig(sellers=("greedy",), episodes=7, seed=9, shard=(k, 2)), shards)
    one = indices_in(shards / "greedy.shard-1-of-2.jsonl")
    two = indices_in(shards / "greedy.shard-2-of-2.jsonl")
    assert sorted(one) == [0, 2, 4, 6] and sorted(two) == [1, 3, 5]
    assert not set(one) & set(two)
    assert sorted(one + two) == sorted(indices_in(tmp_path / "whole" / "greedy.jsonl"))
    merged = metrics_by_index(shards / "greedy.shard-1-of-2.jsonl") | metrics_by_index(shards / "greedy.shard-2-of-2.jsonl")
    assert merged == metrics_by_index(tmp_path / "whole" / "greedy.jsonl")

    # The report over both shards merges them into one group of 7 episodes.
    rows = rows_from_traces([shards])
    assert sorted(row["index"] for row in rows) == list(range(7))
    [summary] = summarize(rows, ["seller", "split"])
    assert summary.key == ("greedy", "train") and summary.episodes == 7 and summary.failed == 0
    whole_rows = rows_from_traces([tmp_path / "whole"])
    whole_stats, shard_stats = summarize(whole_rows, ["seller"])[0].stats, summarize(rows, ["seller"])[0].stats
    assert whole_stats.keys() == shard_stats.keys()
    for name, value in whole_stats.items():
        assert shard_stats[name] == pytest.approx(value, nan_ok=True), name

    # The same episodes in two runs (these shards, and the whole run) are not shards of one run: the
    # report keeps the runs apart (for traces without a run id, each folder is a run) ...
    both = rows_from_traces([shards, tmp_path / "whole"])
    assert overlapping_runs(both) == [str(shards), str(tmp_path / "whole")]
    # ... and one run's episodes passed twice are an error, not a silent double count.
    with pytest.raises(UserError, match="appears twice"):
        rows_from_traces([shards, shards / "greedy.shard-1-of-2.jsonl"])


# -- report rows and tables ----------------------------------------------------------------------------


def test_report_rows_recompute_metrics_and_keep_failures(tmp_path):
    out = tmp_path / "run"
    run(RunConfig(sellers=("greedy",), episodes=3), out)
    events = episodes_in(out / "greedy.jsonl")[0]
    failed = [events[0] | {"index": 99, "episode": "x"}, {"type": "episode_end", "outcome": "failed", "reason": "boom", "metrics": None}]
    with open(out / "greedy.jsonl", "ab") as handle:
        handle.write(b"".join(orjson.dumps(e) + b"\n" for e in failed))
    rows = rows_from_traces([out])
    assert len(rows) == 4
    by_index = {row["index"]: row for row in rows}
    assert by_index[99]["metrics"] is None and by_index[99]["reason"] == "boom"
    assert by_index[0]["metrics"] == events[-1]["metrics"]
    [summary] = summarize(rows, ["seller"])
    assert (summary.episodes, summary.failed) == (4, 1)
    assert summary.stats["profit_ratio"][2] <= 3
    assert "greedy" in summary_markdown([summary], ["seller"])
    assert summary_csv([summary], ["seller"]).splitlines()[1].startswith("greedy,4,1,")


def test_report_by_an_unknown_key_is_a_user_error():
    with pytest.raises(UserError, match="cannot group by"):
        summarize([], ["colour"])
