"""--executor ray: shards as Ray tasks play the episodes worker processes play, a task that dies has its shard
played again with no episode lost or written twice, and what Ray cannot play is refused before anything runs.

One local Ray instance (two CPUs, no dashboard) serves the module: starting one takes seconds on a busy machine.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import orjson
import pytest

from negotiate.cli import main
from negotiate.ray_executor import Written

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import free_port, serve_in_thread  # noqa: E402

VOLATILE = ("run", "time", "ts", "wall_s")
"""What differs between two runs of the same episodes: the run's id and the clock."""


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")


def records(folder: Path) -> dict[tuple[str, str], list[dict]]:
    """(trace file, episode id) -> the episode's events, less what the clock or the run id sets."""
    out: dict = {}
    for path in sorted(folder.rglob("*.jsonl")):
        if path.name.endswith(".log.jsonl"):
            continue
        for line in path.read_bytes().splitlines():
            event = {k: v for k, v in orjson.loads(line).items() if k not in VOLATILE}
            out.setdefault((str(path.relative_to(folder)), event["episode"]), []).append(event)
    return out


def test_ray_tasks_write_the_episodes_worker_processes_write(cluster, tmp_path):
    # eval: two runs (splits) dealt over two shards, so the tasks number jobs across runs as the processes deal them.
    args = ["eval", "--splits", "train,shapes", "--episodes", "6", "--seller", "greedy,random", "--buyers", "concession",
            "--workers", "2", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "processes")]) == 0
    assert main([*args, "--out", str(tmp_path / "ray"), "--executor", "ray"]) == 0
    processes, ray = records(tmp_path / "processes"), records(tmp_path / "ray")
    assert len(processes) == 2 * 2 * 6  # splits x sellers x markets
    assert ray == processes


def test_collect_on_ray_plays_every_repeat_of_every_market_once(cluster, tmp_path):
    assert main(["collect", "--seller", "random", "--buyers", "concession", "--markets", "3", "--group", "2",
                 "--executor", "ray", "--workers", "2", "--out", str(tmp_path / "c"), "--quiet"]) == 0
    starts = [orjson.loads(line) for line in (tmp_path / "c" / "random.jsonl").read_bytes().splitlines()
              if line.startswith(b'{"type":"episode_start"')]
    assert sorted((e["index"], e["repeat"]) for e in starts) == [(i, i % 2) for i in range(6)]
    log = [orjson.loads(line) for line in (tmp_path / "c" / "serve.log.jsonl").read_bytes().splitlines()]
    assert sorted(line["shard"] for line in log if line["event"] == "shard started") == [1, 2]  # played by two tasks


def _kill_first_shard_once_it_sent_an_episode(out: Path, killed: dict, stop: threading.Event) -> None:
    """Watch the run: once the trace holds an episode of shard 1 (the even markets), SIGKILL that shard's task
    process, whose pid the run's log names."""
    while not stop.wait(0.02):
        traces = list(out.glob("openai*.jsonl"))
        log = out / "serve.log.jsonl"
        if not traces or not log.exists():
            continue
        indices = [orjson.loads(line)["index"] for line in traces[0].read_bytes().splitlines()
                   if line.startswith(b'{"type":"episode_start"') and line.endswith(b"}")]
        written = log.read_bytes()
        lines = written[:written.rfind(b"\n") + 1].splitlines()  # whole lines only: the log may be mid-write
        pids = [line["pid"] for line in map(orjson.loads, lines) if line["event"] == "shard started" and line["shard"] == 1]
        if pids and any(i % 2 == 0 for i in indices):
            killed["pid"], killed["written"] = pids[0], len(indices)
            os.kill(pids[0], signal.SIGKILL)
            return


def test_a_shard_whose_task_dies_plays_the_rest_again_and_writes_each_episode_once(cluster, tmp_path):
    # A model seller the fake server answers in 50 ms: each shard plays its 6 markets one at a time for seconds, so
    # shard 1 dies with episodes written and episodes left.
    out, killed, stop = tmp_path / "run", {}, threading.Event()
    with serve_in_thread(latency=0.05) as server:
        watcher = threading.Thread(target=_kill_first_shard_once_it_sent_an_episode, args=(out, killed, stop), daemon=True)
        watcher.start()
        try:
            code = main(["serve", "--episodes", "12", "--seller", f"openai:fake-model@{server.url}?max_tokens=64",
                         "--buyers", "concession", "--executor", "ray", "--workers", "2", "--concurrency", "2",
                         "--out", str(out), "--quiet"])
        finally:
            stop.set()
            watcher.join(5)
    assert code == 0 and killed, "the watcher killed shard 1"
    (trace,) = out.glob("openai*.jsonl")
    indices = [orjson.loads(line)["index"] for line in trace.read_bytes().splitlines() if line.startswith(b'{"type":"episode_start"')]
    ends = [line for line in trace.read_bytes().splitlines() if line.startswith(b'{"type":"episode_end"')]
    assert sorted(indices) == list(range(12)) and len(ends) == 12  # none lost, none twice
    log = [orjson.loads(line) for line in (out / "serve.log.jsonl").read_bytes().splitlines()]
    (died,) = [line for line in log if line["event"].startswith("a Ray task died")]
    assert died["shard"] == 1 and died["attempt"] == 1 and 1 <= died["kept"] < 6  # it had written some, not all
    assert [line["attempt"] for line in log if line["event"] == "shard started" and line["shard"] == 1] == [1, 2]


def test_written_numbers_stay_as_few_as_those_finished_out_of_order():
    mark = Written()
    assert [mark.add(n) for n in (2, 0, 1, 1, 5)] == [True, True, True, False, True]
    assert (mark.low, mark.ahead, mark.count) == (3, {5}, 4)


@pytest.mark.parametrize(("extra", "expected"), [
    (["--address", "auto"], "--address: 'auto': names a Ray cluster: add --executor ray"),
    (["--executor", "dask"], "--executor: 'dask': unknown executor; use local or ray"),
    (["--executor", "ray", "--seller", "hf:some/model"], "would load its model in a Ray task"),
    (["--executor", "ray", "--address", f"ray://127.0.0.1:{free_port()}"], "nothing answers there (Connection refused)"),
])
def test_what_ray_cannot_play_is_one_line_before_anything_runs(tmp_path, capsys, extra, expected):
    code = main(["serve", "--episodes", "2", "--buyers", "concession", "--quiet", "--out", str(tmp_path / "run"), *extra])
    error = capsys.readouterr().err.strip()
    assert code == 2 and expected in error and "\n" not in error
    assert not (tmp_path / "run").exists()


def test_without_ray_installed_the_executor_names_the_extra(tmp_path, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    code = main(["serve", "--episodes", "2", "--executor", "ray", "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 2 and "needs Ray: pip install 'negotiate[ray]'" in capsys.readouterr().err
