"""negotiate.runner and negotiate.report: batches, resume after an interruption, shards, merged reports, one
writer per run folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import anyio
import orjson
import pytest

from negotiate.agents.registry import parse_agent
from negotiate.errors import UserError
from negotiate.report import overlapping_runs, rows_from_traces, summarize, summary_csv, summary_markdown
from negotiate.run import Run
from negotiate.runner import LOCK_FILE, RunConfig, load_config, market_seed, prepare, run_batch, save_config, slug, writing
from negotiate.trace import encode, read_episodes


def run(config: RunConfig, out, *, resume: bool = False, concurrency: int = 4, on_episode=None):
    prepared = prepare(config, out, resume=resume)
    save_config(config, out)
    played = anyio.run(lambda: run_batch(prepared, out, concurrency=concurrency, on_episode=on_episode))
    return prepared, played


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
    prepared, played = run(config, out)
    assert prepared.done == 0 and len(prepared.jobs) == 12 and played == 12
    assert sorted(p.name for p in out.iterdir()) == ["greedy.jsonl", "random.jsonl", "run.json"]
    assert sorted(indices_in(out / "greedy.jsonl")) == sorted(indices_in(out / "random.jsonl")) == list(range(6))
    assert Counter(row["seller"] for row in rows_from_traces([out])) == {"greedy": 6, "random": 6}
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
    assert (list(again.jobs), len(again.jobs), again.done) == ([], 0, 10)


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
    with pytest.raises(UserError, match=r"appears twice \(the file is given twice; pass each shard once\)"):
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


# -- one way to build episode i ---------------------------------------------------------------------------


def _untimed(events) -> list[dict]:
    """An episode's trace lines as written, without the timing fields."""
    lines = [orjson.loads(line) for line in encode(events).splitlines()]
    return [{k: v for k, v in e.items() if k not in ("ts", "wall_s", "time")} for e in lines]


def _draws(agent, n: int = 4) -> list[float]:
    return [float(x) for x in agent.rng.random(n)]


def test_serve_and_run_episode_play_the_same_episode_i(tmp_path):
    config = RunConfig(sellers=("random",), buyers="random", episodes=3, seed=9)
    prepared, _ = run(config, tmp_path)
    served = {events[0]["index"]: events for events in episodes_in(tmp_path / "random.jsonl")}

    async def direct(index: int) -> list[dict]:
        async with Run(config) as built:
            return (await built.episode(parse_agent("random", "seller"), index).play()).events

    for index in range(3):
        assert _untimed(anyio.run(direct, index)) == _untimed(served[index])
        assert served[index][0]["seed"] == market_seed(9, index)


def test_the_play_session_seats_the_agents_of_episode_i_around_the_person(tmp_path):
    from negotiate.market import SPLITS
    from negotiate.tui.session import HUMAN_BUYER, PlaySession

    plan = Run(RunConfig(sellers=("random",), buyers="random", seed=4)).episode(parse_agent("random", "seller"), 2)
    session = PlaySession("buyer", SPLITS["train"], market_seed(4, 2), seller=parse_agent("random", "seller"),
                          buyers=parse_agent("random", "buyer"), out=tmp_path, pace=0, others_pace=0)
    assert session.market.to_dict() == plan.market.to_dict()
    assert _draws(session.seller.agent) == _draws(plan.seller)  # seeded [market seed, 2] both ways
    others = [b for b in session.buyers if b != HUMAN_BUYER]
    assert others and all(_draws(session.buyers[b].agent) == _draws(plan.buyers[b]) for b in others)  # [market seed, 1, k]
    assert session.buyers[HUMAN_BUYER] is session.human


def test_the_screenshot_episode_is_episode_3_of_a_serve_run_with_seed_0(tmp_path):
    from negotiate.tui.screenshots import SEED, replay_episode

    run(RunConfig(sellers=("greedy",), buyers="concession", episodes=SEED + 1, seed=0), tmp_path)
    served = next(events for events in episodes_in(tmp_path / "greedy.jsonl") if events[0]["index"] == SEED)
    assert _untimed(anyio.run(replay_episode).events) == _untimed(served)


def test_a_group_shares_its_market_and_buyers_and_numbers_the_sellers_repeat():
    spec = parse_agent("random", "seller")
    built = Run(RunConfig(sellers=("random",), buyers="random", seed=5, group=3))
    plans = [built.episode(spec, index) for index in (3, 4, 5)]  # market 1 of the run, repeats 0, 1, 2
    assert {p.market.seed for p in plans} == {market_seed(5, 1)}
    assert [p.labels["repeat"] for p in plans] == [0, 1, 2] and all(p.labels["group"] == 3 for p in plans)
    assert len({tuple(_draws(p.seller)) for p in plans}) == 3  # the seller samples afresh each time ...
    first, *others = [_draws(p.buyers["b1"]) for p in plans]
    assert all(draws == first for draws in others)  # ... against the same buyers
    # Repeat 0 samples as a lone episode does (SeedSequence ignores trailing zeros): the trainer's rollouts, which
    # always seeded [market seed, 2, repeat], play their evaluations (groups of one) as serve does.
    single = Run(RunConfig(sellers=("random",), buyers="random", seed=5))
    assert _draws(built.episode(spec, 3).seller) == _draws(single.episode(spec, 1).seller)


async def test_a_run_owns_its_pools_and_trace_files_for_its_duration(tmp_path):
    from negotiate.agents.pools import current_pools

    config = RunConfig(sellers=("greedy",), buyers="threshold", episodes=2, seed=1)
    async with Run(config, out=tmp_path) as built:
        assert current_pools() is built.pools  # agents built anywhere in the task take the run's pools
        for index in range(2):
            built.write("greedy", (await built.episode(parse_agent("greedy", "seller"), index).play()).events)
        writer = built.trace("greedy")
    assert current_pools() is not built.pools
    with pytest.raises(ValueError, match="closed file"):  # the run closed its trace file on the way out
        writer.write_encoded(b"")
    assert indices_in(tmp_path / "greedy.jsonl") == [0, 1]


# -- one writer per run folder ----------------------------------------------------------------------------------------

_HOLD = """
import sys, time
from pathlib import Path
from negotiate.runner import writing
with writing(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


@contextmanager
def held_elsewhere(folder: Path):
    """Another process holding ``folder``'s writer lock (making the folder), SIGKILLed at the end if still there."""
    process = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "held\n"
        yield process
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()


def refusal(folder: Path, holder: subprocess.Popen, command: str = "serve") -> str:
    return (f"negotiate {command}: error: {folder}: another process is writing this run (pid {holder.pid} on {socket.gethostname()}); "
            "a run folder has one writer at a time: wait for it to end, or stop it (its finished episodes are kept) and try again")


def test_one_process_may_nest_its_hold_on_a_folder_and_leaves_no_lock_file_behind(tmp_path):
    folder = tmp_path / "f"
    with writing(folder):
        with writing(folder):  # a command holds it, and each batch it plays takes it again
            assert (folder / LOCK_FILE).read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
        assert (folder / LOCK_FILE).exists()
    assert list(folder.iterdir()) == []
    with writing(folder):  # and it can be taken again
        pass


def test_a_second_writer_of_a_run_is_refused_with_one_line_and_writes_nothing(tmp_path, capsys):
    from negotiate.cli import main

    out = tmp_path / "run"
    assert main(["serve", "--episodes", "2", "--seller", "greedy", "--out", str(out), "--quiet"]) == 0
    assert LOCK_FILE not in {p.name for p in out.iterdir()}  # a finished run leaves nothing beside its traces
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with held_elsewhere(out) as holder:
        for command in (["--episodes", "4"], ["--retry-failed"], []):
            assert main(["serve", "--resume", str(out), *command, "--quiet"]) == 2
            assert capsys.readouterr().err.strip() == refusal(out, holder)
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != LOCK_FILE} == before
        holder.kill()  # SIGKILL: the kernel releases its lock; the file it leaves names a process that is gone
        holder.wait(10)
        assert main(["serve", "--resume", str(out), "--episodes", "4", "--quiet"]) == 0
    assert sorted(indices_in(out / "greedy.jsonl")) == [0, 1, 2, 3]


def test_a_new_run_into_a_folder_another_process_holds_is_refused(tmp_path, capsys):
    from negotiate.cli import main

    out = tmp_path / "new"
    with held_elsewhere(out) as holder:  # made and locked, still empty: a run starting beside this one
        assert main(["serve", "--episodes", "2", "--out", str(out), "--quiet"]) == 2
        assert capsys.readouterr().err.strip() == refusal(out, holder)
        assert main(["eval", "--episodes", "2", "--split", "train", "--out", str(out), "--quiet"]) == 2
        assert capsys.readouterr().err.strip() == refusal(out, holder, "eval")
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]


def test_an_evaluation_is_refused_while_another_process_writes_it_or_one_of_its_splits(tmp_path, capsys):
    from negotiate.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--seller", "greedy,posted", "--split", "train,shapes", "--episodes", "2", "--out", str(out),
                 "--quiet"]) == 0
    for folder in (out, out / "shapes"):  # serve --resume eval/shapes is a writer of that split too
        with held_elsewhere(folder) as holder:
            assert main(["eval", "--resume", str(out), "--episodes", "3", "--quiet"]) == 2
            assert capsys.readouterr().err.strip() == refusal(folder, holder, "eval")
    assert main(["eval", "--resume", str(out), "--episodes", "3", "--quiet"]) == 0
    assert sorted(indices_in(out / "shapes" / "posted.jsonl")) == [0, 1, 2]


def test_serve_resume_beside_a_running_serve_is_refused_and_every_episode_is_written_once(tmp_path, capsys):
    # The case: serve --out D, and 4 s later serve --resume D, both played the missing markets (1,459 of 1,500
    # episodes written twice), and report and --resume refused the folder from then on.
    from fake_openai import serve_in_thread

    from negotiate.cli import main

    out = tmp_path / "run"
    with serve_in_thread(latency=0.05) as server:
        first = subprocess.Popen([sys.executable, "-m", "negotiate", "serve", "--episodes", "12", "--seller",
                                  f"openai:fake-model@{server.url}?max_tokens=64", "--buyers", "concession", "--concurrency", "2",
                                  "--out", str(out), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 90
        while not any(b'"type":"episode_end"' in path.read_bytes() for path in out.glob("openai*.jsonl")):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1]
            time.sleep(0.05)
        assert main(["serve", "--resume", str(out), "--quiet"]) == 2
        assert capsys.readouterr().err.strip() == refusal(out, first)
        _, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
    (trace,) = out.glob("openai*.jsonl")
    assert sorted(indices_in(trace)) == list(range(12))  # each once
    assert main(["report", str(out)]) == 0 and main(["serve", "--resume", str(out), "--quiet"]) == 0
