"""negotiate.cli: exit codes, one-line errors naming the problem, a small serve run and its report."""

from __future__ import annotations

import orjson
import pytest

from negotiate.cli import main
from negotiate.episode import SCHEMA_VERSION
from negotiate.trace import read_episodes


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")


def error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def serve(out, *extra) -> int:
    return main(["serve", "--episodes", "4", "--seller", "greedy,random", "--out", str(out), "--quiet", *extra])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert serve(out) == 0
    return out


# -- errors: exit code 2 and one line on stderr -------------------------------------------------------


def test_unknown_seller(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["serve", "--seller", "greedy,nobody", "--out", str(out), "--quiet"]) == 2
    line = error_line(capsys)
    assert "--seller" in line and "nobody" in line and "unknown seller" in line
    assert not out.exists()  # nothing was started


def test_unknown_buyer(tmp_path, capsys):
    assert main(["serve", "--buyers", "ghost", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "ghost" in error_line(capsys)


def test_bad_seller_parameter(tmp_path, capsys):
    assert main(["serve", "--seller", "concession?beta=x", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    line = error_line(capsys)
    assert "beta" in line and "not a number" in line


@pytest.mark.parametrize(
    ("text", "field"),
    [("bogus = 1\n", "bogus"), ("buyers = 0\n", "buyers"), ("price_low = 9.0\nprice_high = 1.0\n", "price_low"), ("buyers = [\n", "TOML")],
)
def test_malformed_spec_file(tmp_path, capsys, text, field):
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    assert main(["serve", "--split", str(spec), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    line = error_line(capsys)
    assert str(spec) in line and field in line
    assert not (tmp_path / "r").exists()


def test_unknown_split(tmp_path, capsys):
    assert main(["serve", "--split", "nowhere", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "nowhere" in error_line(capsys)


def _trace(path, events, tail: bytes = b"") -> None:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events) + tail)


def test_report_of_a_truncated_trace(finished_run, tmp_path, capsys):
    path = tmp_path / "cut.jsonl"
    data = (finished_run / "greedy.jsonl").read_bytes()
    path.write_bytes(data[: len(data) - 40])  # cut inside the last line
    lines = data[: len(data) - 40].count(b"\n") + 1
    assert main(["report", str(path)]) == 2
    line = error_line(capsys)
    assert f"{path}:{lines}" in line and "truncated" in line
    # --allow-partial reports the complete episodes instead
    assert main(["report", str(path), "--allow-partial", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("greedy,train,3,")


def test_report_of_a_newer_schema_trace(finished_run, tmp_path, capsys):
    events = next(iter(read_episodes(finished_run / "greedy.jsonl")))
    path = tmp_path / "new.jsonl"
    _trace(path, [events[0] | {"schema": SCHEMA_VERSION + 1}, *events[1:]])
    assert main(["report", str(path)]) == 2
    line = error_line(capsys)
    assert str(path) in line and "schema" in line and str(SCHEMA_VERSION + 1) in line


def test_report_of_a_missing_file(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none.jsonl")]) == 2
    assert "none.jsonl" in error_line(capsys)


def test_report_by_an_unknown_key(finished_run, capsys):
    assert main(["report", str(finished_run), "--by", "colour"]) == 2
    assert "colour" in error_line(capsys)


def test_out_folder_that_already_holds_a_run(finished_run, capsys):
    before = {p.name: p.read_bytes() for p in finished_run.iterdir() if p.suffix in (".json", ".jsonl") and "log" not in p.name}
    assert serve(finished_run) == 2
    line = error_line(capsys)
    assert str(finished_run) in line and "already holds a run" in line
    after = {p.name: p.read_bytes() for p in finished_run.iterdir() if p.suffix in (".json", ".jsonl") and "log" not in p.name}
    assert after == before  # nothing overwritten


def test_resume_of_a_folder_without_a_run(tmp_path, capsys):
    assert main(["serve", "--resume", str(tmp_path), "--quiet"]) == 2
    assert "run.json" in error_line(capsys)


# -- a small run ----------------------------------------------------------------------------------------


def test_serve_writes_the_config_and_one_trace_per_seller(finished_run):
    names = sorted(p.name for p in finished_run.iterdir())
    assert "run.json" in names
    assert [n for n in names if n.endswith(".jsonl") and not n.endswith(".log.jsonl")] == ["greedy.jsonl", "random.jsonl"]
    config = orjson.loads((finished_run / "run.json").read_bytes())
    assert config["sellers"] == ["greedy", "random"] and config["episodes"] == 4
    for name in ("greedy.jsonl", "random.jsonl"):
        assert sorted(e[0]["index"] for e in read_episodes(finished_run / name)) == [0, 1, 2, 3]


def test_report_prints_a_table(finished_run, capsys):
    capsys.readouterr()
    assert main(["report", str(finished_run)]) == 0
    out = capsys.readouterr().out
    assert "greedy" in out and "random" in out and "train" in out


def test_report_as_markdown_and_csv(finished_run, capsys):
    capsys.readouterr()
    assert main(["report", str(finished_run), "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| seller | split | episodes")
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["greedy", "random"]
    assert main(["report", str(finished_run / "greedy.jsonl"), "--format", "csv", "--by", "seller"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("seller,episodes,failed,") and rows[1].startswith("greedy,4,0,")


def test_resume_of_a_completed_run_runs_nothing_more(finished_run, capsys):
    before = {name: (finished_run / name).read_bytes() for name in ("greedy.jsonl", "random.jsonl")}
    assert main(["serve", "--resume", str(finished_run), "--quiet"]) == 0
    assert {name: (finished_run / name).read_bytes() for name in before} == before


def test_serve_then_resume_after_an_interruption(tmp_path, capsys):
    out = tmp_path / "run"
    assert serve(out) == 0
    path = out / "greedy.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # the last episode was being written when the run died
    assert main(["serve", "--resume", str(out), "--quiet"]) == 0
    assert sorted(e[0]["index"] for e in read_episodes(path)) == [0, 1, 2, 3]
    assert sorted(e[0]["index"] for e in read_episodes(out / "random.jsonl")) == [0, 1, 2, 3]


def test_agent_deadlines_default_longer_when_a_local_model_plays(tmp_path):
    import argparse
    import json

    from negotiate.cli import LOCAL_TIMEOUT, _timeouts

    args = argparse.Namespace(seller_timeout=None, reply_timeout=None, base_timeout=120.0)
    assert _timeouts(args, ("greedy", "threshold")) == {"seller_timeout": 120.0, "reply_timeout": 120.0}
    assert _timeouts(args, ("hf:smollm2?max_tokens=40", "threshold"))["seller_timeout"] == LOCAL_TIMEOUT == 3600.0
    assert _timeouts(args, ("greedy", " vllm:Qwen/Qwen3-8B"))["reply_timeout"] == LOCAL_TIMEOUT
    given = argparse.Namespace(seller_timeout=5.0, reply_timeout=None, base_timeout=120.0)
    assert _timeouts(given, ("hf:x",)) == {"seller_timeout": 5.0, "reply_timeout": LOCAL_TIMEOUT}
    assert main(["serve", "--seller", "greedy", "--episodes", "1", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    saved = json.loads((tmp_path / "s" / "run.json").read_text())
    assert saved["seller_timeout"] == saved["reply_timeout"] == 120.0
    assert main(["collect", "--seller", "greedy", "--markets", "1", "--group", "2", "--reply-timeout", "7",
                 "--out", str(tmp_path / "c"), "--quiet"]) == 0
    saved = json.loads((tmp_path / "c" / "run.json").read_text())
    assert saved["seller_timeout"] == 600.0 and saved["reply_timeout"] == 7.0 and saved["group"] == 2
