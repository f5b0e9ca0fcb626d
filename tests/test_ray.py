"""--executor ray: shards as Ray tasks play the episodes worker processes play, a task that dies has its shard
played again with no episode lost or written twice, and what Ray cannot play is refused before anything runs.
A Ray run stops on SIGTERM as a local one does, a shard that keeps dying is not exit 2, and a cluster that does not
answer stops the run within its deadline.

One local Ray instance (two CPUs, no dashboard) serves the module: starting one takes seconds on a busy machine.
It listens on 127.0.0.1 only and has a token of its own in the environment, so the tests write no
``~/.ray/auth_token`` (which a later ``ray.init(address="auto")`` would send to a cluster without one); the runs
in subprocesses join it at its address.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
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
    """The module's Ray instance; its address (``HOST:PORT``), for runs in other processes to join."""
    if "ray" not in sys.modules:  # Ray reads it once, at import
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    chosen = {} if any(name in os.environ for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")) else {
        "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    os.environ.update(chosen)
    ray = pytest.importorskip("ray")
    # "local": a new instance, never the cluster named in /tmp/ray/ray_current_cluster (which `ray start` leaves
    # behind, and which ray.init() with no address joins, or fails to, long after that cluster has stopped)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    for name in chosen:
        os.environ.pop(name, None)


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


def _serve_killing_shard_1(out):
    """(exit code, what the watcher killed) of a 12-episode Ray serve of two shards whose shard 1 is killed once it
    has sent an episode; a model seller the fake server answers in 50 ms keeps each shard playing for seconds."""
    killed, stop = {}, threading.Event()
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
    return code, killed


def test_a_shard_whose_task_dies_plays_the_rest_again_and_writes_each_episode_once(cluster, tmp_path):
    # A model seller the fake server answers in 50 ms: each shard plays its 6 markets one at a time for seconds, so
    # shard 1 dies with episodes written and episodes left.
    out = tmp_path / "run"
    code, killed = _serve_killing_shard_1(out)
    assert code == 0 and killed, "the watcher killed shard 1"
    (trace,) = out.glob("openai*.jsonl")
    indices = [orjson.loads(line)["index"] for line in trace.read_bytes().splitlines() if line.startswith(b'{"type":"episode_start"')]
    ends = [line for line in trace.read_bytes().splitlines() if line.startswith(b'{"type":"episode_end"')]
    assert sorted(indices) == list(range(12)) and len(ends) == 12  # none lost, none twice
    log = [orjson.loads(line) for line in (out / "serve.log.jsonl").read_bytes().splitlines()]
    (died,) = [line for line in log if line["event"].startswith("a Ray task died")]
    assert died["shard"] == 1 and died["attempt"] == 1 and 1 <= died["kept"] < 6  # it had written some, not all
    assert [line["attempt"] for line in log if line["event"] == "shard started" and line["shard"] == 1] == [1, 2]


def test_a_shard_that_dies_more_than_its_reruns_stops_the_run_with_exit_4(cluster, tmp_path, capsys, monkeypatch):
    import negotiate.ray_executor as executor

    monkeypatch.setattr(executor, "RERUNS", 0)  # the first death is one too many
    out = tmp_path / "run"
    code, killed = _serve_killing_shard_1(out)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert killed and code == 4, error  # not 2: nothing was wrong with the command
    assert error.startswith("negotiate serve: error: a Ray task failed: shard 1 died 1 times (") and "--resume runs the rest" in error
    (trace,) = out.glob("openai*.jsonl")
    ends = trace.read_bytes().count(b'"type":"episode_end"')
    assert killed["written"] <= ends < 12 and main(["report", str(out)]) == 0  # whole episodes only


def _wait_for_episodes(trace_glob, count: int, process: subprocess.Popen, seconds: float = 90) -> Path:
    """The trace file once it holds ``count`` finished episodes (the process must still be running)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        traces = list(trace_glob())
        if traces and traces[0].read_bytes().count(b'"type":"episode_end"') >= count:
            return traces[0]
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"no {count} episodes within {seconds} s: {process.communicate()[1]}")


def test_sigterm_stops_a_ray_run_as_a_local_one_exit_143_and_resume_plays_the_rest(cluster, tmp_path):
    # Ray's own handler (sys.exit(15), after a crash dump of its C++ one) replaced the command's: exit 15, no line.
    out = tmp_path / "run"
    with serve_in_thread(latency=0.05) as server:
        command = [sys.executable, "-m", "negotiate", "serve", "--episodes", "24", "--seller",
                   f"openai:fake-model@{server.url}?max_tokens=64", "--buyers", "concession", "--executor", "ray",
                   "--address", cluster, "--workers", "2", "--concurrency", "2", "--out", str(out), "--quiet"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "COLUMNS": "200"})
        trace = _wait_for_episodes(lambda: out.glob("openai*.jsonl"), 2, process)
        process.send_signal(signal.SIGTERM)
        printed, err = process.communicate(timeout=60)
        assert process.returncode == 143, err
        assert "SIGTERM received" not in err  # Ray's crash dump
        kept = trace.read_bytes().count(b'"type":"episode_end"')
        assert f"interrupted: {kept} episodes kept in {out}" in printed and 2 <= kept < 24
        assert main(["serve", "--resume", str(out), "--executor", "ray", "--quiet"]) == 0
    starts = [line for line in trace.read_bytes().splitlines() if line.startswith(b'{"type":"episode_start"')]
    assert sorted(orjson.loads(line)["index"] for line in starts) == list(range(24))  # each once


needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray (the ray extra)")


@needs_ray
def test_a_cluster_that_does_not_answer_stops_the_run_within_its_deadline(tmp_path):
    # An address that takes the connection and never answers: ray.init waits for minutes there.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "negotiate", "serve", "--episodes", "2", "--executor", "ray", "--address",
                              address, "--out", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "NEGOTIATE_RAY_CONNECT_S": "3"})
        seconds = time.monotonic() - began
    lines = [line for line in run.stderr.splitlines() if line.startswith("negotiate serve:")]
    assert run.returncode == 4 and lines == [f"negotiate serve: error: --address: '{address}': no answer from the Ray cluster "
                                             "within 3s (NEGOTIATE_RAY_CONNECT_S sets it); the run's episodes so far are kept"]
    assert seconds < 60, seconds


@needs_ray
def test_the_default_address_joining_a_cluster_that_has_gone_stops_within_its_deadline_and_says_why(tmp_path):
    # Ray's default joins the cluster `ray start` last started here, named in ray_current_cluster, which stays behind
    # when that cluster is killed: ray.init retried its address for over 5 minutes with no line of ours.
    temp = tmp_path / "t"
    (temp / "ray").mkdir(parents=True)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        (temp / "ray" / "ray_current_cluster").write_text(address)
        environment = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
        began = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "negotiate", "serve", "--episodes", "2", "--executor", "ray",
                              "--out", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True, timeout=120,
                             env={**environment, "RAY_TMPDIR": str(temp), "NEGOTIATE_RAY_CONNECT_S": "3", "COLUMNS": "400"})
        seconds = time.monotonic() - began
    lines = [line for line in run.stderr.splitlines() if line.startswith("negotiate serve:")]
    assert run.returncode == 4 and lines == [
        "negotiate serve: error: --address: \"(Ray's default)\": no answer from the Ray cluster within 3s (NEGOTIATE_RAY_CONNECT_S "
        f"sets it); Ray joins {address}, the cluster `ray start` last started on this machine (its ray_current_cluster "
        "file): if that cluster has stopped, `ray stop` forgets it, or run with --address local; the run's episodes so "
        "far are kept"], run.stderr
    assert seconds < 60, seconds


@needs_ray
def test_a_local_instance_listens_on_loopback_and_writes_no_token_file(tmp_path):
    # Ray writes ~/.ray/auth_token for every instance ray.init starts; a later run at --address auto sent it to a
    # cluster started without one, and hung. --address local keeps its token in its own environment.
    home = tmp_path / "home"
    home.mkdir()
    environment = {name: value for name, value in os.environ.items() if not name.startswith("RAY_")}
    run = subprocess.run([sys.executable, "-m", "negotiate", "serve", "--episodes", "2", "--seller", "greedy", "--buyers",
                          "concession", "--executor", "ray", "--address", "local", "--out", str(tmp_path / "run"), "--quiet",
                          "--log-level", "error"], capture_output=True, text=True, timeout=180,
                         env={**environment, "HOME": str(home), "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr
    assert not (home / ".ray").exists()
    log = [orjson.loads(line) for line in (tmp_path / "run" / "serve.log.jsonl").read_bytes().splitlines()]
    (joined,) = [line for line in log if line["event"] == "joined a Ray cluster"]
    assert joined["address"].startswith("127.0.0.1:") and joined["started"] is True


def test_a_first_task_that_never_answers_names_the_token_the_driver_sent(monkeypatch):
    # What a driver at --address auto met after a local run had written ~/.ray/auth_token: the cluster (started without
    # a token) took the task, and refused every line it streamed back. Here a stand-in for Ray that never answers.
    pytest.importorskip("ray")
    import negotiate.ray_executor as executor
    from negotiate.workers import WorkerLost

    class Task:
        def options(self, **options):
            return self

        def remote(self):
            return "hello"

    class Silent:
        cancelled: list = []

        def remote(self, **options):
            return lambda function: Task()

        def wait(self, refs, timeout):
            return [], refs

        def cancel(self, ref, force):
            self.cancelled.append(ref)

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(WorkerLost, match=r"--address: 'auto': the Ray cluster took no task within .*s: this driver sends the "
                                         r"token of ~/.ray/auth_token .* run with RAY_AUTH_MODE=disabled"):
        executor._check_tasks_answer(Silent(), "auto", time.monotonic())
    assert Silent.cancelled == ["hello"]


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
