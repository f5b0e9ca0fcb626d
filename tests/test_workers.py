"""--workers N: one run in N processes plays the same episodes, keeps the run's bounds, keeps
finished episodes when stopped, and refuses what it cannot do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from negotiate.cli import main
from negotiate.errors import UserError
from negotiate.runner import RunConfig, prepare
from negotiate.trace import read_episodes, scan
from negotiate.workers import run_workers

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import serve_in_thread  # noqa: E402


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")


def fake_server(latency: float = 0.0):
    return serve_in_thread(latency=latency)


def outcomes(path: Path) -> dict[int, tuple]:
    """index -> (outcome, deals, message count) of every episode in a trace file."""
    out = {}
    for events in read_episodes(path):
        deals = tuple((e["buyer"], e["product"], e["price"]) for e in events if e["type"] == "deal")
        out[events[0]["index"]] = (events[-1]["outcome"], deals, sum(e["type"] == "message" for e in events))
    return out


def test_two_workers_play_the_same_episodes_as_one_process(tmp_path):
    args = ["serve", "--episodes", "12", "--seller", "greedy,random", "--buyers", "concession", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    assert main([*args, "--out", str(tmp_path / "two"), "--workers", "2"]) == 0
    for name in ("greedy.jsonl", "random.jsonl"):
        one, two = outcomes(tmp_path / "one" / name), outcomes(tmp_path / "two" / name)
        assert sorted(two) == list(range(12))
        assert two == one


def test_workers_keep_the_runs_bound_on_requests_in_flight(tmp_path):
    # The server answers nothing till 3 are in flight: each worker's 4 episodes open with a seller's request, and
    # the workers' parts of the bound (2 and 1) let 3 go, not 4.
    with serve_in_thread(latency=0.02, hold=3) as server:
        spec = f"openai:fake-model@{server.url}?max_tokens=64"
        code = main(["serve", "--episodes", "8", "--seller", spec, "--buyers", spec, "--split", "train", "--workers", "2",
                     "--max-inflight", "3", "--concurrency", "8", "--out", str(tmp_path / "run"), "--quiet"])
        assert code == 0
        assert server.max_in_flight == 3  # 2 and 1: the parts add up to the run's bound
        requests = len(server.requests)
    (path,) = (tmp_path / "run").glob("openai*.jsonl")
    episodes = list(read_episodes(path))
    assert sorted(events[0]["index"] for events in episodes) == list(range(8))
    logged = [e for events in episodes for e in events if e["type"] == "message" and "latency_s" in (e.get("extra") or {})]
    # Every model reply is in the parent's trace, but for those the market closed on while they were asked for
    # (how many depends on the timing); each episode has at least the seller's first.
    assert len(episodes) <= len(logged) <= requests and all(any("latency_s" in (e.get("extra") or {}) for e in events)
                                                            for events in episodes)
    # Each worker logs its own requests, one line each.
    lines = [orjson.loads(line) for p in sorted((tmp_path / "run").glob("requests.worker-*.log.jsonl")) for line in p.read_bytes().splitlines()]
    assert len(list((tmp_path / "run").glob("requests.worker-*.log.jsonl"))) == 2
    answered = [line for line in lines if line["event"] == "llm request"]
    cancelled = [line for line in lines if line["event"] == "llm request cancelled"]  # when a market closed
    assert len(logged) <= len(answered) <= requests <= len(answered) + len(cancelled)
    assert all(line["latency_s"] >= 0.02 for line in answered)


def test_workers_log_to_the_console_at_the_runs_level(tmp_path):
    """A worker's info lines (here each worker's check of the server's kind) go to the run's log file; they went
    to the console too, which shows warnings only unless --log-level says otherwise."""
    out = tmp_path / "run"
    with fake_server() as server:
        command = [sys.executable, "-m", "negotiate", "serve", "--episodes", "4", "--seller", f"openai:fake-model@{server.url}",
                   "--workers", "2", "--out", str(out), "--quiet"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    logged = [orjson.loads(line)["event"] for line in (out / "serve.log.jsonl").read_bytes().splitlines()]
    assert logged.count("server kind") == 2  # each worker checks the server (the parent did before its log opened)
    assert "server kind" not in done.stderr and "info" not in done.stderr.lower(), done.stderr


def test_a_specs_max_inflight_is_shared_out_among_workers(tmp_path):
    with serve_in_thread(latency=0.02, hold=2) as server:  # nothing answered till 2 are in flight: one per worker
        spec = f"openai:fake-model@{server.url}?max_tokens=64&max_inflight=2"
        assert main(["serve", "--episodes", "6", "--seller", spec, "--buyers", spec, "--workers", "2",
                     "--out", str(tmp_path / "run"), "--quiet"]) == 0
        assert server.max_in_flight == 2  # one per worker, not two each


def test_local_models_are_refused_with_workers(tmp_path, capsys):
    assert main(["serve", "--seller", "hf:smollm2", "--episodes", "2", "--workers", "2", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--workers" in err and "hf:smollm2" in err and "--workers 1" in err
    assert not (tmp_path / "r" / "run.json").exists()


def test_a_worker_that_fails_stops_the_run_with_its_error(tmp_path):
    spec = tmp_path / "market.toml"
    spec.write_text('name = "tiny"\nbuyers = 2\nproducts = 2\n')
    prepared = prepare(RunConfig(sellers=("greedy",), split=str(spec), episodes=4), tmp_path / "run", resume=False)
    spec.write_text("this is not TOML ==")  # the workers read the spec again, and fail
    with pytest.raises(UserError, match="a worker failed") as raised:
        run_workers([(prepared, tmp_path / "run")], 2, concurrency=4, max_inflight=None, log_file=None)
    assert "market.toml" in str(raised.value)


def test_a_worker_killed_mid_run_stops_it_with_exit_4_keeping_the_episodes_written(tmp_path, capsys):
    # Exit 2 is bad input; a worker that dies (SIGKILL, as the out-of-memory killer sends) is no fault of the command.
    import multiprocessing
    import threading

    out, killed = tmp_path / "run", {}

    def kill_worker_1_once_an_episode_is_written() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            files = list(out.glob("openai*.jsonl"))
            workers = [p for p in multiprocessing.active_children() if p.name == "negotiate-worker-1"]
            if files and workers and b'"type":"episode_end"' in files[0].read_bytes():
                os.kill(workers[0].pid, signal.SIGKILL)
                killed["pid"] = workers[0].pid
            time.sleep(0.02)

    with fake_server(latency=0.05) as server:
        spec = f"openai:fake-model@{server.url}?max_tokens=64"
        watcher = threading.Thread(target=kill_worker_1_once_an_episode_is_written, daemon=True)
        watcher.start()
        code = main(["serve", "--episodes", "24", "--seller", spec, "--buyers", "concession", "--workers", "2",
                     "--concurrency", "2", "--out", str(out), "--quiet"])
        watcher.join(5)
        error = capsys.readouterr().err.strip()
        assert killed and code == 4, error
        assert error.endswith("a worker failed: worker 1 died (killed by SIGKILL) before finishing its episodes; the episodes "
                              "finished so far are kept (--resume runs the rest)") and "\n" not in error
        (path,) = out.glob("openai*.jsonl")
        kept = scan(path)
        assert kept.good_bytes == path.stat().st_size and 1 <= len(kept.complete) < 24  # whole episodes only
        assert main(["serve", "--resume", str(out), "--quiet"]) == 0
    assert sorted(events[0]["index"] for events in read_episodes(path)) == list(range(24))


def test_stopped_workers_keep_every_finished_episode_and_resume_finishes(tmp_path):
    out = tmp_path / "run"
    with fake_server(latency=0.05) as server:
        spec = f"openai:fake-model@{server.url}?max_tokens=64"
        command = [sys.executable, "-m", "negotiate", "serve", "--episodes", "40", "--seller", spec, "--buyers", spec,
                   "--workers", "2", "--concurrency", "2", "--out", str(out), "--quiet"]
        # SIGINT's default action back: a shell starts background jobs (a CI script's, say) with SIGINT ignored.
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"},
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 120  # a hang guard
        while time.monotonic() < deadline:
            files = list(out.glob("openai*.jsonl"))
            if files and files[0].read_bytes().count(b'"type":"episode_end"') >= 3:
                break
            time.sleep(0.1)
        server.latency = 3600  # no more answers: the run cannot finish before the signal, however late it comes
        process.send_signal(signal.SIGINT)  # the parent alone, as `kill -INT` would
        _, err = process.communicate(timeout=60)
        assert process.returncode == 130, err
        (path,) = out.glob("openai*.jsonl")
        kept = scan(path)
        assert kept.good_bytes == path.stat().st_size  # whole episodes only
        assert 3 <= len(kept.complete) < 40
        server.latency = 0.05
        assert main(["serve", "--resume", str(out), "--quiet", "--workers", "2", "--max-inflight", "8"]) == 0
    indices = sorted(events[0]["index"] for events in read_episodes(path))
    assert indices == list(range(40))
    assert all(orjson.loads(line)["type"] for line in path.read_bytes().splitlines())


def test_a_server_that_is_down_is_named_before_any_worker_starts(tmp_path, capsys):
    from fake_openai import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    assert main(["serve", "--seller", f"openai:m@{url}", "--episodes", "4", "--workers", "2", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("negotiate serve: error: --seller: ") and "cannot reach the server" in last and "worker" not in last, last


def test_every_worker_plays_every_seller(tmp_path):
    """Jobs are shared out by market: with a model seller beside a scripted one, both workers ask the model."""
    with fake_server() as server:
        spec = f"openai:fake-model@{server.url}?max_tokens=32"
        assert main(["serve", "--seller", f"{spec},greedy", "--episodes", "4", "--workers", "2", "--out", str(tmp_path / "run"),
                     "--quiet"]) == 0
    logs = sorted((tmp_path / "run").glob("requests.worker-*.log.jsonl"))
    assert len(logs) == 2 and all(log.read_bytes().count(b'"llm request"') for log in logs)
    assert sorted(e[0]["index"] for e in read_episodes(tmp_path / "run" / "greedy.jsonl")) == [0, 1, 2, 3]


def test_workers_are_checked_before_a_local_models_packages(tmp_path, capsys, monkeypatch):
    """On a core install (no torch) `--workers 2` with hf: must say what --workers cannot do, not that torch is
    missing: the flag is checked on the specs as written, before parsing them checks the packages."""
    from negotiate.agents import hf

    monkeypatch.setattr(hf, "installed", lambda name: False)  # as on `pip install negotiate`
    assert main(["serve", "--seller", "hf:smollm2", "--episodes", "2", "--workers", "2", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--workers" in err and "'hf:smollm2'" in err and "--workers 1" in err and "torch" not in err
    assert main(["eval", "--seller", "greedy", "--buyers", " vllm:Qwen/Qwen3-8B", "--workers", "3", "--out", str(tmp_path / "e"),
                 "--quiet"]) == 2
    assert "'vllm:Qwen/Qwen3-8B' loads its model in every worker process" in capsys.readouterr().err
    # with one worker, the missing package is what is named
    assert main(["serve", "--seller", "hf:smollm2", "--episodes", "2", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "not installed" in capsys.readouterr().err
    assert not (tmp_path / "r").exists() and not (tmp_path / "e").exists()
