"""negotiate.cli: exit codes, one-line errors naming the problem, a small serve run and its report."""

from __future__ import annotations

import csv
import importlib.util
import io
import os
import re
import subprocess
import sys
import time

import orjson
import pytest

from negotiate.cli import main
from negotiate.episode import SCHEMA_VERSION
from negotiate.errors import UserError
from negotiate.market import load_spec
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


@pytest.mark.parametrize("seed", [str(2**64), "-1"])
def test_a_seed_beyond_64_bits_is_refused_before_a_folder_is_made(tmp_path, capsys, seed):
    # 2**64 used to reach the run's JSON and end in a TypeError traceback, leaving an empty folder
    assert main(["serve", "--seller", "greedy", "--seed", seed, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert f"--seed: '{seed}': must be from 0 to 18446744073709551615" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv, line", [
    (["serve", "--bogus"], "negotiate serve: error: unrecognized arguments: --bogus (see negotiate serve --help)"),
    (["replay", "a.jsonl", "b.jsonl"], "negotiate replay: error: unrecognized arguments: b.jsonl (see negotiate replay --help)"),
])
def test_an_unknown_argument_is_named_with_its_command(capsys, argv, line):
    # argparse said "negotiate: error: ... (see negotiate --help)": the top-level help, which has no command's flags
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and capsys.readouterr().err == line + "\n"


def test_resume_refuses_an_out_elsewhere_and_collect_counts_markets(finished_run, tmp_path, capsys):
    assert main(["serve", "--resume", str(finished_run), "--out", str(tmp_path / "other"), "--quiet"]) == 2
    assert f"--out: '{tmp_path / 'other'}': --resume writes into the run's own folder ({finished_run}); drop --out" in error_line(capsys)
    assert not (tmp_path / "other").exists()
    out = tmp_path / "c"
    assert main(["collect", "--seller", "greedy", "--markets", "3", "--group", "2", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["collect", "--resume", str(out), "--markets", "2", "--quiet"]) == 2
    assert "--markets: 2: the run already has 3 markets (6 episodes per seller); --resume can add markets, not drop them" in error_line(capsys)


def test_a_scripted_agent_parameter_given_twice_and_a_trace_with_no_episode(tmp_path, capsys):
    assert main(["serve", "--seller", "concession?beta=1&beta=2", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "parameter 'beta' is given twice" in error_line(capsys)  # it used to play beta=2 without a word
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert main(["report", str(tmp_path / "empty.jsonl")]) == 2  # it printed an empty table and exited 0
    assert f"{tmp_path / 'empty.jsonl'}: no finished episode in it yet" in error_line(capsys)


@pytest.mark.parametrize("command, flag, value", [("serve", "--seller", "greedy,"), ("eval", "--seller", ",greedy"),
                                                   ("eval", "--split", "train,,shapes")])
def test_an_empty_item_in_a_list_is_refused_not_dropped(tmp_path, capsys, command, flag, value):
    out = tmp_path / "r"
    assert main([command, flag, value, "--episodes", "2", "--out", str(out), "--quiet"]) == 2  # it played one seller or split fewer
    line = error_line(capsys)
    assert f"{flag}: {value!r}: has an empty item between commas" in line and not out.exists()


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


def _without_market(start):
    return {k: v for k, v in start.items() if k != "market"}


def _short_values(start):
    market = start["market"]
    buyers = [{**market["buyers"][0], "values": market["buyers"][0]["values"][:1]}, *market["buyers"][1:]]
    return start | {"market": market | {"buyers": buyers}}


@pytest.mark.parametrize(("change", "problem"), [
    (_without_market, "the episode_start has no market"),
    (lambda start: start | {"spec": None}, "the episode_start has no spec"),
    (lambda start: start | {"spec": start["spec"] | {"price_scale": -1}}, "its spec: price_scale: -1: must be above 0"),
    (_short_values, "buyer b1 has 1 values for "),
])
def test_report_of_an_episode_whose_market_is_broken(finished_run, tmp_path, capsys, change, problem):
    events = next(iter(read_episodes(finished_run / "greedy.jsonl")))
    path = tmp_path / "broken.jsonl"
    _trace(path, [change(events[0]), *events[1:]])
    assert main(["report", str(path)]) == 2
    line = error_line(capsys)
    assert line.startswith(f"negotiate report: error: {path}: episode {events[0]['episode']}: {problem}")


def test_report_of_a_deal_for_a_product_the_market_lacks(finished_run, tmp_path, capsys):
    episodes = list(read_episodes(finished_run / "greedy.jsonl"))
    events = next(e for e in episodes if any(x["type"] == "deal" for x in e))
    deal = next(x for x in events if x["type"] == "deal")
    path = tmp_path / "p99.jsonl"
    _trace(path, [x | {"product": "p99"} if x is deal else x for x in events])
    assert main(["report", str(path)]) == 2  # it used to count the deal, and report fewer OPT pairs
    assert f"a deal of {deal['buyer']!r} for 'p99' names a buyer or product its market lacks" in error_line(capsys)


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


def test_report_against_a_teacher_replays_it_through_every_sellers_states(finished_run, tmp_path, capsys):
    import csv

    from negotiate.trace import read_records

    capsys.readouterr()
    assert main(["report", str(finished_run), "--teacher", "greedy", "--format", "csv"]) == 0
    rows = {(r["seller"], r["teacher_would"]): r for r in csv.DictReader(capsys.readouterr().out.splitlines())}
    sent = {name: sum(1 for ep in read_records(finished_run / f"{name}.jsonl") for e in ep.messages() if e.sender == "seller")
            for name in ("greedy", "random")}
    assert {seller: int(rows[(seller, "all")]["states"]) for seller in sent} == sent
    greedy = rows[("greedy", "all")]  # greedy against itself: the same reply in every state
    assert greedy["same_kind"] == greedy["states"] == greedy["same_offer"] and greedy["price_gap_sum"] == "0"
    assert int(rows[("random", "all")]["same_kind"]) < sent["random"]
    assert main(["report", str(finished_run), "--teacher", "greedy"]) == 0
    out = capsys.readouterr().out
    assert "greedy against what greedy would have sent" in out and "random against what greedy would have sent" in out
    assert main(["report", str(finished_run), "--teacher", "oracle"]) == 2
    assert "--teacher: 'oracle': this seller cannot follow another seller's episode" in error_line(capsys)
    assert main(["report", str(finished_run), "--teacher", "greedy", "--baseline", "greedy", "--format", "csv"]) == 2
    assert "one CSV table at a time" in error_line(capsys)
    assert serve(tmp_path / "again") == 0  # another run of the same markets: its states are not pooled with the first's
    assert main(["report", str(finished_run), str(tmp_path / "again"), "--teacher", "greedy"]) == 2
    assert "--teacher: 'greedy': the traces hold 2 separate runs of the same markets" in error_line(capsys)


def test_the_teacher_tables_list_the_sellers_in_the_metrics_tables_order(tmp_path, capsys):
    import csv

    assert main(["serve", "--seller", "posted,greedy", "--episodes", "2", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "run"), "--teacher", "greedy", "--format", "csv"]) == 0
    sellers = [row["seller"] for row in csv.DictReader(capsys.readouterr().out.splitlines())]
    assert list(dict.fromkeys(sellers)) == ["posted", "greedy"]  # as the run lists them, not as its files sort


def test_the_teacher_tables_same_kind_is_of_the_states_where_the_teacher_would_speak():
    from collections import Counter

    from negotiate.report import agreement_rows
    from negotiate.training.dataset import Agreement

    a = Agreement(Counter({("offer", "offer"): 2, ("accept", "offer"): 2, ("wait", "offer"): 3}), both_offered=2, same_offer=1, price_gap=30)
    header, rows = agreement_rows({"s": a}, "planner")
    assert header == ["seller", "planner would", "states", "offer", "accept", "same kind", "same buyer & product", "mean price gap"]
    assert rows == [["s", "offer", "2", "2", "0", "100%", "50%", "$30"], ["s", "accept", "2", "2", "0", "0%", "", ""],
                    ["s", "wait", "3", "3", "0", "-", "", ""], ["s", "all", "7", "7", "0", "50%", "", ""]]  # 2 of the 4 spoken


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
    capsys.readouterr()
    assert main(["serve", "--resume", str(out)]) == 0
    assert "dropped a half-written episode (a killed run's); it plays again" in capsys.readouterr().err  # not silently
    assert sorted(e[0]["index"] for e in read_episodes(path)) == [0, 1, 2, 3]
    assert sorted(e[0]["index"] for e in read_episodes(out / "random.jsonl")) == [0, 1, 2, 3]


@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_sigterm_stops_a_run_as_ctrl_c_does_and_resume_finishes_it(tmp_path, loop):
    """Slurm and Kubernetes stop a job with SIGTERM: the run says what it kept and how to finish (it ended
    silently with 143), the traces hold exactly that many episodes, and --resume plays the rest. On asyncio's
    own loop (no uvloop: a core install) the stop also printed "Task exception was never retrieved"."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    command = [sys.executable, "-m", "negotiate", "serve", "--seller", "greedy", "--episodes", "3000", "--out", str(out), "--quiet"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "NEGOTIATE_LOOP": loop})
    deadline = time.monotonic() + 60
    while not ((out / "greedy.jsonl").exists() and (out / "greedy.jsonl").stat().st_size > 0):
        assert time.monotonic() < deadline and run.poll() is None, "the run wrote no episode"
        time.sleep(0.05)
    os.kill(run.pid, signal.SIGTERM)
    printed, _ = run.communicate(timeout=60)
    assert run.returncode == 143, printed
    kept = len(list(read_episodes(out / "greedy.jsonl")))
    assert 0 < kept < 3000  # stopped after its first episodes: 3000 take about 6 s here
    assert f"interrupted: {kept} episodes kept in {out}" in printed and f"negotiate serve --resume {out}" in printed
    assert "Traceback" not in printed and "xception" not in printed, printed  # raised inside a task, it came out as a group
    last = orjson.loads((out / "serve.log.jsonl").read_bytes().splitlines()[-1])  # the log says how the run ended, too
    assert (last["event"], last["by"], last["kept"]) == ("interrupted", "SIGTERM", kept) and last["played"] <= kept
    assert main(["serve", "--resume", str(out), "--quiet"]) == 0
    assert sorted(e[0]["index"] for e in read_episodes(out / "greedy.jsonl")) == list(range(3000))


def test_a_second_ctrl_c_while_a_stopped_run_counts_its_traces_still_says_how_to_finish(tmp_path, capsys, monkeypatch):
    """Counting a long run's traces takes seconds; a second Ctrl-C then ended the command with one bare line, no
    resume hint and no 'interrupted' line in the run's log."""
    from rich.console import Console

    import negotiate.cli_runs as runs
    from negotiate.logs import configure
    from negotiate.runner import load_config, prepare

    out = tmp_path / "run"
    assert serve(out) == 0

    def pressed_again(runs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "_kept", pressed_again)
    configure(out / "serve.log.jsonl")
    try:
        prepared = prepare(load_config(out), out, resume=True)
        assert runs._stopped(Console(width=200), [(prepared, out)], out, "serve", runs.EXIT_INTERRUPTED, 3, 1.5) == 130
    finally:
        configure(None)  # the log file closed
    printed = capsys.readouterr().out
    assert f"interrupted: every finished episode kept (3 played this time) in {out}" in printed
    assert f"negotiate serve --resume {out}" in printed
    last = orjson.loads((out / "serve.log.jsonl").read_bytes().splitlines()[-1])
    assert (last["event"], last["by"], last["played"], last["kept"]) == ("interrupted", "SIGINT", 3, None)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_trace_that_takes_no_more_stops_the_run_with_one_line_and_resume_finishes(tmp_path, workers):
    """A full disk (here a 64 KiB file size limit): one line naming the file and the cause, exit code 3, the
    episodes written before it kept; it was some 260 lines of tracebacks, one per worker task."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "run"
    command = [sys.executable, "-m", "negotiate", "serve", "--seller", "greedy,posted", "--episodes", "60", "--out", str(out),
               "--quiet", "--workers", workers]
    limit = 64 * 1024
    run = subprocess.run(command, capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert run.returncode == 3, run.stderr
    (line,) = run.stderr.splitlines()
    full = re.fullmatch(f"negotiate serve: error: {re.escape(str(out))}/(greedy|posted).jsonl: cannot write the trace \\(File too "
                        "large\\); the episodes before this one are kept, and --resume plays the rest once there is room", line)
    assert full is not None, line
    kept = len(list(read_episodes(out / f"{full[1]}.jsonl", allow_partial=True)))
    assert 0 < kept < 60
    assert main(["serve", "--resume", str(out), "--quiet"]) == 0  # room again: the rest is played
    for seller in ("greedy", "posted"):
        assert sorted(e[0]["index"] for e in read_episodes(out / f"{seller}.jsonl")) == list(range(60))


def test_ctrl_c_or_sigterm_in_any_command_is_one_line_not_a_traceback(finished_run, capsys, monkeypatch):
    from negotiate import cli, cli_commands

    def stop(kind):
        def raise_it(*args, **kwargs):
            raise kind
        return raise_it

    monkeypatch.setattr(cli_commands, "rows_from_traces", stop(KeyboardInterrupt))
    assert main(["report", str(finished_run)]) == 130
    assert capsys.readouterr().err == "negotiate report: interrupted\n"
    monkeypatch.setattr(cli_commands, "rows_from_traces", stop(cli.Terminated))
    assert main(["report", str(finished_run)]) == 143
    assert capsys.readouterr().err == "negotiate report: stopped by SIGTERM\n"


def test_agent_deadlines_default_longer_when_a_local_model_plays(tmp_path):
    import json

    from negotiate.cli import _parser, command_settings
    from negotiate.cli_runs import _new_config
    from negotiate.run import LOCAL_TIMEOUT
    from negotiate.settings import read_command

    def deadlines(*argv):
        command = argv[0]
        config = _new_config(command, read_command(_parser().parse_args(argv), command, command_settings()[command]))
        return {"seller_timeout": config.seller_timeout, "reply_timeout": config.reply_timeout}

    assert deadlines("serve", "--seller", "greedy") == {"seller_timeout": 120.0, "reply_timeout": 120.0}
    assert deadlines("serve", "--seller", "hf:smollm2?max_tokens=40")["seller_timeout"] == LOCAL_TIMEOUT == 3600.0
    assert deadlines("serve", "--seller", "greedy", "--buyers", " vllm:Qwen/Qwen3-8B")["reply_timeout"] == LOCAL_TIMEOUT
    assert deadlines("serve", "--seller", "hf:x", "--seller-timeout", "5") == {"seller_timeout": 5.0, "reply_timeout": LOCAL_TIMEOUT}
    assert deadlines("collect", "--seller", "greedy") == {"seller_timeout": 600.0, "reply_timeout": 600.0}
    assert deadlines("serve", "--seller", "hf:x", "--set", "reply_timeout=7") == {"seller_timeout": LOCAL_TIMEOUT, "reply_timeout": 7.0}
    assert main(["serve", "--seller", "greedy", "--episodes", "1", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    saved = json.loads((tmp_path / "s" / "run.json").read_text())
    assert saved["seller_timeout"] == saved["reply_timeout"] == 120.0
    assert main(["collect", "--seller", "greedy", "--markets", "1", "--group", "2", "--reply-timeout", "7",
                 "--out", str(tmp_path / "c"), "--quiet"]) == 0
    saved = json.loads((tmp_path / "c" / "run.json").read_text())
    assert saved["seller_timeout"] == 600.0 and saved["reply_timeout"] == 7.0 and saved["group"] == 2


# -- a newcomer's first hour (issue 12): every command right the first time ---------------------------


def test_help_shows_every_default_and_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "market i is seeded from (seed, i) (default: 0)" in text
    assert "exit codes: 0 every episode finished; 1 one or more episodes failed" in text and "130 interrupted" in text
    assert "3 a trace took no more (full disk; episodes kept)" in text and "143 the same, stopped by SIGTERM" in text
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--format {table,markdown,csv} table: for the terminal" in text
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: torch's choice)" in text and "(default: torch's choice) (default: None)" not in text


def _options(command: str, capsys) -> dict[str, str]:
    """Each flag of ``negotiate COMMAND --help`` (aliases joined by a comma) and its help, one line each."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out.split("options:")[1].split("exit codes:")[0]
    flags, current = {}, None
    for line in text.splitlines():
        found = re.match(r"  (-\S.*?)(?:\s{2,}(.*))?$", line)
        if found:  # the flag's spellings, then (after two spaces or on the next lines) its help
            current = ",".join(word.rstrip(",") for word in found[1].split() if word.startswith("-"))
            flags[current] = found[2] or ""
        elif current is not None:
            flags[current] = (flags[current] + " " + " ".join(line.split())).strip()
    return flags


def test_the_run_commands_flags_keep_their_names_defaults_and_help(capsys):
    """serve, collect and eval take their run flags from RunConfig and RunOptions: the same names,
    defaults and help as when they were written by hand."""
    serve, collect, evaluate = (_options(command, capsys) for command in ("serve", "collect", "eval"))
    shared = ["--seller,--sellers", "--buyers", "--seed", "--seller-timeout", "--reply-timeout", "--concurrency",
              "--workers", "--max-inflight", "--out", "--resume", "--retry-failed", "--log-level", "--quiet", "-h,--help", "--fresh",
              "--executor", "--address", "--config", "--set", "--keys"]
    assert sorted(serve) == sorted([*shared, "--split", "--episodes", "--group", "--shard", "--fsync", "--by"])
    assert sorted(collect) == sorted([*shared, "--split", "--markets", "--group", "--shard", "--fsync", "--by"])
    assert sorted(evaluate) == sorted([*shared, "--split,--splits", "--episodes", "--baseline"])
    assert serve["--episodes"] == "episodes per seller (default: 200)" and evaluate["--episodes"] == "markets per split (default: 200)"
    assert collect["--markets"] == "market instances (default: 32)" and collect["--group"] == "episodes per market (default: 8)"
    assert serve["--group"].endswith("sampling afresh (default: 1)")
    assert serve["--seller,--sellers"].endswith("(default: all of oracle,planner,greedy,concession,posted,dutch,random)")
    assert collect["--seller,--sellers"].endswith("(negotiate agents lists them)")  # collect names its sellers
    assert evaluate["--split,--splits"] == "comma-separated splits or TOML spec files (default: train,shapes,correlated,prices-x10)"
    assert serve["--split"].endswith("(default: train; negotiate splits lists them)")
    assert serve["--shard"] == collect["--shard"] == "run the K-th of N disjoint slices of the episodes (default: 1/1, all of them)"
    for command, seconds in ((serve, 120), (collect, 600), (evaluate, 120)):
        assert command["--seller-timeout"] == (f"seconds a seller may think before losing the turn (default: {seconds}, "
                                               "or 3600 when an hf: or vllm: model plays)")
    assert serve["--workers"].startswith("worker processes (default: 1): each plays a share of the episodes")
    assert serve["--concurrency"] == evaluate["--concurrency"] == "episodes in flight at once (default: 256)"
    assert serve["--max-inflight"] == evaluate["--max-inflight"]
    assert serve["--max-inflight"].startswith("model requests in flight per server") and "(default:" not in serve["--max-inflight"]
    assert serve["--fsync"] == "fsync after every episode (survives power loss, slower)"


def test_version(capsys):
    import negotiate

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"negotiate {negotiate.__version__}"


def test_agents_and_splits_are_listed_with_their_parameters(capsys):
    from negotiate.agents.scripted import BUYERS, SELLERS
    from negotiate.market import SPLITS

    assert main(["agents"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in (*SELLERS, *BUYERS))
    assert "beta in (0, 100]" in out and "patience in [1, 1000]" in out and "share in (0, 1]" in out
    # the spec grammar, as registry.GRAMMAR writes it once (tests/test_llm_spec.py checks it names every key)
    from negotiate.agents.registry import GRAMMAR

    words = " ".join(out.split())
    assert " ".join(GRAMMAR.split()) in words
    assert "openai:MODEL@BASE_URL" in words and "pip install 'negotiate[llm]'" in words and "kv_cache_gib" in words
    assert main(["splits"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SPLITS)
    assert "1000-10000" in out  # prices-x10's values
    assert "budget_per_pair" in out and "personas" in out  # every spec field


def test_the_splits_table_fits_80_columns_whole(monkeypatch, capsys):
    from negotiate.market import SPLITS

    monkeypatch.setenv("COLUMNS", "80")  # a pipe's width: names and ranges were cut there ("correlat…", "1000-100…")
    assert main(["splits"]) == 0
    table = capsys.readouterr().out.split("fields of a TOML spec file")[0].splitlines()
    assert max(len(line) for line in table) <= 80 and not any("…" in line for line in table)
    row = {line.split()[0]: line.split() for line in table[3:] if line.strip()}
    assert set(row) == set(SPLITS)
    assert row["correlated"][3:5] == ["correlated", "0.7"] and row["prices-x10"][4:] == ["1000-10000", "1000-5500", "held", "out"]


def test_a_bad_flag_value_is_one_line_naming_the_flag_once(tmp_path, capsys):
    assert main(["serve", "--shard", "3/2", "--out", str(tmp_path / "r")]) == 2
    line = error_line(capsys)
    assert line.count("--shard") == 1 and "'3/2': need 1 <= K <= N" in line


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_agent_deadlines_must_be_positive_and_finite(tmp_path, capsys, value):
    assert main(["serve", "--seller-timeout", value, "--out", str(tmp_path / "r")]) == 2
    assert "--seller-timeout" in error_line(capsys)
    assert not (tmp_path / "r").exists()


def test_a_run_config_with_a_bad_deadline_is_refused_too(tmp_path):
    from negotiate.errors import UserError
    from negotiate.runner import RunConfig, prepare

    with pytest.raises(UserError, match="--reply-timeout: nan: must be a positive number"):
        prepare(RunConfig(sellers=("greedy",), reply_timeout=float("nan")), tmp_path, resume=False)


@pytest.mark.parametrize("command", [["serve"], ["eval"], ["collect"]])
def test_an_empty_seller_list_is_refused_and_leaves_no_folder(tmp_path, capsys, command):
    assert main([*command, "--seller", " , ", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "--seller" in error_line(capsys)
    assert not (tmp_path / "r").exists()


def test_a_parameter_the_agent_does_not_take_is_named_whatever_its_value(tmp_path, capsys):
    for spec in ("greedy?beta=", "greedy?beta=x", "greedy?beta=2"):
        assert main(["serve", "--seller", spec, "--out", str(tmp_path / "r"), "--quiet"]) == 2
        line = error_line(capsys)
        assert "unknown parameter 'beta' for greedy; it takes none" in line and "not a number" not in line


def test_eval_errors_name_its_flags(tmp_path, capsys):
    assert main(["eval", "--split", "train,nowhere", "--out", str(tmp_path / "e"), "--quiet"]) == 2
    assert error_line(capsys).startswith("negotiate eval: error: --split: 'nowhere': unknown split")
    # the old spellings still work
    assert main(["eval", "--sellers", "greedy,posted", "--splits", "train", "--baseline", "oracle", "--out", str(tmp_path / "e")]) == 2
    assert "--baseline: 'oracle': is not one of --seller (greedy, posted)" in error_line(capsys)


def test_out_must_be_a_folder_that_can_be_made(tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert main(["serve", "--out", str(a_file), "--quiet"]) == 2
    assert "is a file, not a folder" in error_line(capsys)
    assert main(["eval", "--out", str(a_file / "sub"), "--quiet"]) == 2
    assert f"cannot be made: {a_file} is a file" in error_line(capsys)
    assert a_file.read_text() == "x"


def test_a_new_run_never_writes_into_another_run(finished_run, tmp_path, capsys):
    before = sorted(p.relative_to(finished_run) for p in finished_run.rglob("*"))
    assert main(["eval", "--seller", "greedy", "--split", "train", "--episodes", "2", "--out", str(finished_run), "--quiet"]) == 2
    assert f"already holds a run; finish it with negotiate serve --resume {finished_run} or choose another --out" in error_line(capsys)
    assert sorted(p.relative_to(finished_run) for p in finished_run.rglob("*")) == before
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "old.jsonl").write_text("")
    assert serve(loose) == 2
    assert "already holds trace files" in error_line(capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert serve(empty) == 0  # an empty folder is fine


def test_report_keeps_a_serve_and_an_eval_of_one_seed_apart(tmp_path, capsys):
    assert main(["serve", "--seller", "greedy,posted", "--episodes", "3", "--out", str(tmp_path / "serve"), "--quiet"]) == 0
    assert main(["eval", "--seller", "greedy,posted", "--split", "train", "--episodes", "3", "--out", str(tmp_path / "eval"),
                 "--quiet"]) == 0
    runs = {orjson.loads((tmp_path / f / "run.json").read_bytes())["run_id"] for f in ("serve", "eval/train")}
    assert len(runs) == 2 and all(run.startswith(("serve-", "eval-")) for run in runs)
    capsys.readouterr()
    # logs and the runs' other files picked up by a shell glob (traces/*/*) are skipped, not read as traces
    files = sorted(str(p) for p in tmp_path.rglob("*") if p.is_file())
    assert any(f.endswith(".log.jsonl") for f in files) and any(f.endswith("run.json") for f in files)
    assert any(f.endswith("results.md") for f in files) and any(f.endswith(".png") for f in files)
    assert main(["report", *files, "--format", "csv"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("run,seller,split,episodes")
    assert sorted(line.split(",")[0] for line in lines[1:]) == sorted([*runs, *runs])
    assert all(line.split(",")[3] == "3" for line in lines[1:])
    assert "2 separate runs played the same episodes" in captured.err
    # one run alone: no run column
    assert main(["report", str(tmp_path / "eval"), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("seller,split,episodes")
    # --baseline across them: greedy is in both runs, so --baseline-run says which
    assert main(["report", str(tmp_path), "--baseline", "greedy"]) == 2
    assert "--baseline: 'greedy': played the same markets against buyers threshold in 2 separate runs" in error_line(capsys)
    eval_run = orjson.loads((tmp_path / "eval" / "train" / "run.json").read_bytes())["run_id"]
    serve_run = (runs - {eval_run}).pop()
    assert main(["report", str(tmp_path), "--baseline", "greedy", "--baseline-run", eval_run, "--format", "csv"]) == 0
    paired = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    got = {(row["run"], row["seller"]): row for row in paired}
    assert set(got) == {(serve_run, "greedy"), (serve_run, "posted"), (eval_run, "posted")}
    # the baseline column is the seller, as without runs; its run has a column of its own
    assert {(row["baseline"], row["baseline_run"]) for row in paired} == {("greedy", eval_run)}
    assert all(row["pairs"] == "3" for row in paired)
    # greedy is deterministic: the serve run's greedy is the eval run's on the same markets, to the cent
    assert float(got[serve_run, "greedy"]["profit_ratio_diff"]) == 0.0
    assert got[serve_run, "posted"]["profit_ratio_diff"] == got[eval_run, "posted"]["profit_ratio_diff"]
    assert main(["report", str(tmp_path), "--baseline", "greedy", "--baseline-run", "nosuch"]) == 2
    assert "--baseline-run: 'nosuch': no run of that id in the traces; runs there: " in error_line(capsys)
    # the terminal's run column shows a run as its command and random digits (the whole id wrapped at 80 columns),
    # and --baseline-run takes what it shows
    short = {run: f"{run.split('-')[0]}-{run.split('-')[-1]}" for run in runs}
    assert main(["report", str(tmp_path), "--baseline", "greedy", "--baseline-run", short[eval_run]]) == 0
    shown = capsys.readouterr().out
    assert eval_run not in shown.replace(f"greedy of run {eval_run}", "") and serve_run not in shown
    assert {line.split()[0] for line in shown.splitlines() if line.split()[1:2] == ["posted"]} == set(short.values())
    assert main(["report", str(tmp_path), "--baseline-run", eval_run]) == 2
    assert "give --baseline too" in error_line(capsys)


def _fail_every_episode(path) -> None:
    """Rewrite a trace as if each of its episodes had failed (an LLM seller whose server was down)."""
    episodes = list(read_episodes(path))
    for events in episodes:
        events[-1] = events[-1] | {"outcome": "failed", "reason": "LLMError: down", "metrics": None}
    path.write_bytes(b"".join(orjson.dumps(event) + b"\n" for events in episodes for event in events))


def test_a_seller_or_baseline_whose_every_episode_failed_is_named_as_such_not_as_other_markets(tmp_path, capsys):
    assert main(["eval", "--seller", "greedy,posted,oracle", "--split", "train", "--episodes", "4", "--out", str(tmp_path / "e"),
                 "--quiet"]) == 0
    _fail_every_episode(tmp_path / "e" / "train" / "posted.jsonl")
    capsys.readouterr()
    # posted is left out of the pairs: because it failed, which is said, not because of other markets
    assert main(["report", str(tmp_path / "e"), "--baseline", "greedy", "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert [row["seller"] for row in csv.DictReader(io.StringIO(captured.out))] == ["oracle"]
    assert "every episode failed, so nothing to pair: posted on train" in captured.err
    assert "no market in common" not in captured.err
    # the baseline itself failed: nothing pairs, and that is why
    assert main(["report", str(tmp_path / "e"), "--baseline", "posted", "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert list(csv.DictReader(io.StringIO(captured.out))) == []
    assert "every episode failed, so nothing to pair: posted on train" in captured.err
    assert "no market in common" not in captured.err
    # eval's results.md says it under the paired table (a resumed, finished eval writes its results again)
    assert main(["eval", "--resume", str(tmp_path / "e"), "--quiet"]) == 1  # failed episodes: exit 1
    results = (tmp_path / "e" / "results.md").read_text()
    # ... and says at its top that it is incomplete: how many failed, what the numbers are over, and how to finish it
    assert results.startswith("# negotiate eval (incomplete)\n")
    assert "**Incomplete: 4 of 12 episodes failed.**" in results and "--resume" in results and "--retry-failed" in results
    paired = results.split("## Paired differences against greedy")[1]
    assert "every episode failed, so nothing to pair: posted on train" in paired and "| oracle | train |" in paired


@pytest.mark.parametrize("by, problem", [
    ("", "--by: '': name at least one label to group by: seller, buyers, split, shape, tier, run"),
    (" , ", "--by: ' , ': has an empty item between commas"),  # the one list rule (settings.items_of)
    ("seller,seller", "--by: 'seller,seller': seller given twice"),
    ("run,split,run,split", "--by: 'run,split,run,split': run, split given twice"),
])
def test_report_refuses_an_empty_or_repeated_by(tmp_path, capsys, by, problem):
    assert main(["serve", "--seller", "greedy", "--episodes", "2", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "s"), "--by", by]) == 2
    assert problem in error_line(capsys)
    assert main(["serve", "--seller", "greedy", "--episodes", "2", "--out", str(tmp_path / "t"), "--quiet", "--by", by]) == 2
    assert problem in error_line(capsys)
    assert not (tmp_path / "t").exists()  # refused before anything ran


def test_report_pairs_sellers_of_separate_runs_on_the_markets_they_share(tmp_path, capsys):
    def evaluate(name, seller, *more):
        assert main(["eval", "--seller", seller, "--split", "train", "--episodes", "4", "--out", str(tmp_path / name), "--quiet",
                     *more]) == 0

    evaluate("both", "greedy,posted")
    evaluate("greedy", "greedy")
    evaluate("posted", "posted")
    evaluate("posted-later", "posted", "--seed", "7")  # other markets: nothing to pair with
    evaluate("posted-stubborn", "posted", "--buyers", "stubborn")  # the same markets, other buyers: not paired either
    capsys.readouterr()

    def diffs(*folders):
        assert main(["report", *(str(tmp_path / f) for f in folders), "--baseline", "greedy", "--format", "csv"]) == 0
        captured = capsys.readouterr()
        rows = list(csv.DictReader(io.StringIO(captured.out)))
        return [(row["seller"], row["split"], row["pairs"], row["profit_ratio_diff"], row["profit_ratio_ci95"]) for row in rows], captured.err

    one_run, _ = diffs("both")
    assert len(one_run) == 1 and one_run[0][:3] == ("posted", "train", "4")
    across, err = diffs("greedy", "posted", "posted-later", "posted-stubborn")
    assert across == one_run  # the same pairs, across runs; the other markets and the other buyers pair with nothing
    assert "no market in common with greedy" in err and err.count("posted on train") == 2  # each run left out is named


def test_traces_without_a_run_id_still_report(finished_run, tmp_path, capsys):
    old = tmp_path / "old.jsonl"
    old.write_bytes(b"".join(orjson.dumps({k: v for k, v in e.items() if k != "run"}) + b"\n"
                             for events in read_episodes(finished_run / "greedy.jsonl") for e in events))
    assert main(["report", str(old), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("greedy,train,4,0,")


def test_report_orders_sellers_as_the_run_did(tmp_path, capsys):
    assert main(["serve", "--seller", "random,greedy,dutch", "--episodes", "2", "--out", str(tmp_path / "r"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "r"), "--format", "csv"]) == 0
    assert [line.split(",")[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["random", "greedy", "dutch"]


def test_a_binary_file_is_named_not_echoed(tmp_path, capsys):
    path = tmp_path / "image.jsonl"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x1b[31m")
    assert main(["report", str(path)]) == 2
    line = error_line(capsys)
    assert "binary data" in line and "\x1b" not in line and "PNG" not in line and "truncated" not in line


def test_only_a_cut_off_last_line_gets_the_truncation_hint(finished_run, tmp_path, capsys):
    data = (finished_run / "greedy.jsonl").read_bytes().splitlines(keepends=True)
    middle = tmp_path / "middle.jsonl"
    middle.write_bytes(b"".join(data[:3]) + b"{oops\n" + b"".join(data[3:]))
    assert main(["report", str(middle)]) == 2
    line = error_line(capsys)
    assert f"{middle}:4" in line and "not a JSON line" in line and "cut off" not in line and "resume" not in line
    tail = tmp_path / "tail.jsonl"
    tail.write_bytes(b"".join(data) + data[0][:30])
    assert main(["report", str(tail)]) == 2
    assert "cut off" in error_line(capsys)


def test_allow_partial_says_how_many_episodes_it_skipped(finished_run, tmp_path, capsys):
    path = tmp_path / "cut.jsonl"
    episodes = list(read_episodes(finished_run / "greedy.jsonl"))
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in [*episodes[0], *episodes[1][:2]]))
    assert main(["report", str(path), "--allow-partial", "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1].startswith("greedy,train,1,")
    assert "--allow-partial skipped 1 incomplete episode:" in captured.err and f"{path}:" in captured.err


# -- --resume: more episodes extend a run; any other change is refused -------------------------------


def test_resume_with_more_episodes_extends_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert serve(out) == 0
    first = (out / "greedy.jsonl").read_bytes()
    assert main(["serve", "--resume", str(out), "--episodes", "6", "--quiet"]) == 0
    assert (out / "greedy.jsonl").read_bytes().startswith(first)  # the old episodes are untouched
    for name in ("greedy.jsonl", "random.jsonl"):
        assert sorted(e[0]["index"] for e in read_episodes(out / name)) == [0, 1, 2, 3, 4, 5]
    assert orjson.loads((out / "run.json").read_bytes())["episodes"] == 6
    # the same episodes as a run of 6 from the start
    assert main(["serve", "--episodes", "6", "--seller", "greedy,random", "--out", str(tmp_path / "six"), "--quiet"]) == 0
    strip = lambda path: [[{k: v for k, v in e.items() if k not in ("time", "run", "ts", "wall_s")} for e in events]
                          for events in read_episodes(path)]
    assert strip(out / "greedy.jsonl") == strip(tmp_path / "six" / "greedy.jsonl")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--seller", "greedy"], "--seller: 'greedy': the run in"),
        (["--split", "shapes"], "--split: 'shapes': the run in"),
        (["--seed", "7"], "--seed: '7': the run in"),
        (["--buyers", "concession"], "has --buyers threshold"),
        (["--episodes", "2"], "the run already has 4 episodes per seller; --resume can add episodes, not drop them"),
        (["--fresh"], "--fresh: the run in "),
    ],
)
def test_resume_refuses_settings_that_differ_from_the_runs(finished_run, capsys, flags, needle):
    before = (finished_run / "run.json").read_bytes()
    assert main(["serve", "--resume", str(finished_run), *flags, "--quiet"]) == 2
    line = error_line(capsys)
    assert needle in line and "True" not in line and "False" not in line
    assert (finished_run / "run.json").read_bytes() == before


def test_resume_accepts_the_runs_own_settings(finished_run, capsys):
    assert main(["serve", "--resume", str(finished_run), "--seller", "greedy, random", "--seed", "0", "--episodes", "4",
                 "--quiet"]) == 0


def test_eval_fresh_is_recorded_and_kept_on_resume(tmp_path, capsys):
    out = tmp_path / "e"
    assert main(["eval", "--seller", "greedy", "--split", "train", "--episodes", "2", "--fresh", "--out", str(out), "--quiet"]) == 0
    assert orjson.loads((out / "train" / "run.json").read_bytes())["fresh"] is True
    assert main(["eval", "--resume", str(out), "--episodes", "3", "--quiet"]) == 0  # the run's own --fresh, unsaid
    episodes = list(read_episodes(out / "train" / "greedy.jsonl"))
    assert [e[0]["index"] for e in episodes] == [0, 1, 2] and all(e[0]["fresh"] is True for e in episodes)
    # A scripted seller under --fresh hears each reply before its next message: no seller message follows
    # another while a reply to the first is owed.
    for events in episodes:
        owed = set()
        for e in events:
            if e["type"] == "message" and e["sender"] == "seller":
                assert not owed
                owed.add(e["to"])
            elif e["type"] == "message":
                owed.discard(e["sender"])


def test_eval_resume_extends_every_split(tmp_path, capsys):
    out = tmp_path / "e"
    args = ["--seller", "greedy,posted", "--split", "train,shapes", "--quiet"]
    assert main(["eval", *args, "--episodes", "2", "--out", str(out)]) == 0
    assert main(["eval", "--resume", str(out), "--split", "train", "--quiet"]) == 2
    assert "--split: 'train': the run in" in error_line(capsys)
    assert main(["eval", "--resume", str(out), "--episodes", "3", "--quiet"]) == 0
    for split in ("train", "shapes"):
        assert sorted(e[0]["index"] for e in read_episodes(out / split / "posted.jsonl")) == [0, 1, 2]


# -- exit codes and what a run prints --------------------------------------------------------------------


def test_a_run_whose_episodes_fail_exits_1_with_one_line(tmp_path, capsys, monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_openai import Fault, serve_in_thread

    monkeypatch.setenv("COLUMNS", "80")
    with serve_in_thread() as server:
        server.faults.extend(Fault(status=400, message="This model's maximum context length is 8 tokens.") for _ in range(200))
        code = main(["serve", "--seller", f"openai:{server.model}@{server.url}?retries=0", "--episodes", "3",
                     "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 1
    captured = capsys.readouterr()
    assert captured.err == ""  # --quiet: no log line, not one per failed episode
    assert "3 of 3 episodes failed" in captured.out and "maximum context length" in captured.out
    assert "report again:\n  negotiate report " in captured.out
    logged = [orjson.loads(line) for line in (tmp_path / "r" / "serve.log.jsonl").read_bytes().splitlines()]
    assert sum(line["event"] == "episode failed" for line in logged) == 3


def test_retry_failed_plays_the_failed_episodes_again_and_keeps_every_other(tmp_path, capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_openai import Fault, serve_in_thread

    out = tmp_path / "r"
    with serve_in_thread() as server:
        seller = f"openai:{server.model}@{server.url}?retries=0"
        server.faults.extend(Fault(status=503) for _ in range(200))  # the server is down for the whole run
        assert main(["serve", "--seller", f"greedy,{seller}", "--episodes", "3", "--out", str(out), "--quiet"]) == 1
        assert f"once fixed, play them again with:\n  negotiate serve --resume {out} --retry-failed" in capsys.readouterr().out
        (model_trace,) = [p for p in out.glob("*.jsonl") if p.name != "greedy.jsonl" and not p.name.endswith(".log.jsonl")]
        greedy = (out / "greedy.jsonl").read_bytes()
        assert [e[-1]["outcome"] for e in read_episodes(model_trace)] == ["failed"] * 3
        server.faults.clear()  # back up
        assert main(["serve", "--resume", str(out), "--quiet"]) == 1  # a plain resume: failed episodes count as played
        assert "0 episodes in" in capsys.readouterr().out
        assert main(["serve", "--retry-failed", "--seller", "greedy", "--out", str(tmp_path / "x"), "--quiet"]) == 2
        assert "--retry-failed: True: plays a run's failed episodes again: give the run with --resume DIR" in error_line(capsys)
        assert not (tmp_path / "x").exists()
        assert main(["serve", "--resume", str(out), "--retry-failed", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "playing 3 failed episodes again" in printed and "3 episodes in" in printed
    episodes = list(read_episodes(model_trace))
    assert sorted(e[0]["index"] for e in episodes) == [0, 1, 2] and all(e[-1]["outcome"] != "failed" for e in episodes)
    assert (out / "greedy.jsonl").read_bytes() == greedy  # the other seller's trace is untouched, byte for byte
    assert not list(out.glob("*.retry"))


def test_the_log_counts_episodes_per_seller_like_the_flag(tmp_path, capsys):
    assert main(["serve", "--seller", "greedy,posted,dutch", "--episodes", "5", "--out", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().err == ""  # the default console level is warning: no info lines
    (run,) = [orjson.loads(line) for line in (tmp_path / "r" / "serve.log.jsonl").read_bytes().splitlines()
              if orjson.loads(line)["event"] == "run"]
    assert (run["episodes"], run["to_play"], run["already_done"]) == (5, 15, 0)
    assert main(["serve", "--resume", str(tmp_path / "r"), "--log-level", "info"]) == 0
    assert "run" in capsys.readouterr().err


def test_at_80_columns_headers_stay_whole_and_commands_are_not_wrapped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "a-rather-long-folder-name-for-the-traces-of-this-run" / "serve-with-a-long-name"
    assert main(["serve", "--seller", "concession?beta=2,greedy", "--episodes", "3", "--by", "seller,split,shape",
                 "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines if str(out) not in line)  # a path is never cut either
    rule = next(k for k, line in enumerate(lines) if line.strip().startswith("─"))
    words = {word for line in lines[rule - 2:rule] for word in line.split()}
    assert words == {"viol", "profit", "deal", "welf", "OPT", "turns", "seller", "split", "shape", "n", "valid", "/ep", "/OPT",
                     "capt", "rate", "pairs", "regret", "/deal"}
    assert f"  negotiate report {out}" in lines  # the whole command on one line


def test_a_core_install_without_aiohttp_names_the_llm_extra(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "aiohttp", None)  # as on `pip install negotiate`: no HTTP client
    spec = "openai:m@http://127.0.0.1:9/v1"
    for command in (["serve", "--seller", spec], ["eval", "--seller", spec], ["collect", "--seller", spec],
                    ["serve", "--buyers", spec]):
        assert main([*command, "--out", str(tmp_path / "r"), "--quiet"]) == 2
        line = error_line(capsys)
        assert "aiohttp is not installed" in line and "pip install 'negotiate[llm]'" in line
        assert not (tmp_path / "r").exists()


def test_a_server_with_no_models_list_must_answer_a_chat_request(tmp_path, capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_openai import serve_in_thread

    with serve_in_thread(owned_by=None) as server:  # GET /models answers 404
        assert main(["serve", "--seller", f"openai:not-served@{server.url}", "--episodes", "2", "--out", str(tmp_path / "r"),
                     "--quiet"]) == 2
    line = error_line(capsys)
    assert "GET" in line and "/models is not found (404)" in line and "answers 404" in line and "not-served" in line
    assert not (tmp_path / "r").exists()


def test_report_pairs_each_repeat_of_a_group_and_each_buyer_column_with_its_own_baseline(tmp_path, capsys):
    def run(*argv):
        assert main([*argv, "--quiet"]) == 0

    # greedy in groups of 2 on 4 markets; posted once on each of the same 4 markets, in another run
    run("serve", "--seller", "greedy", "--split", "train", "--episodes", "8", "--group", "2", "--out", str(tmp_path / "groups"))
    run("eval", "--seller", "posted,greedy", "--split", "train", "--episodes", "4", "--out", str(tmp_path / "once"))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "groups"), str(tmp_path / "once"), "--baseline", "posted", "--format", "csv"]) == 0
    rows = {row["run"].split("-")[0]: row for row in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert rows["serve"]["pairs"] == "8" and rows["eval"]["pairs"] == "4"  # each repeat against the market's one posted episode
    # greedy is deterministic: its two repeats of a market are alike, so the mean difference is the one-run mean
    assert float(rows["serve"]["profit_ratio_diff"]) == pytest.approx(float(rows["eval"]["profit_ratio_diff"]))
    # ...and a market's repeats count once in the interval: 8 pairs of 4 markets, as wide as 4 pairs
    assert float(rows["serve"]["profit_ratio_ci95"]) == pytest.approx(float(rows["eval"]["profit_ratio_ci95"]))
    assert float(rows["eval"]["profit_ratio_ci95"]) > 0
    # the same in the summary table: greedy's 8 episodes of 4 markets, as sure as its 4 episodes of them
    assert main(["report", str(tmp_path / "groups"), str(tmp_path / "once"), "--by", "run,seller", "--format", "csv"]) == 0
    summary = {(row["run"].split("-")[0], row["seller"]): row for row in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert summary["serve", "greedy"]["episodes"] == "8" and summary["eval", "greedy"]["episodes"] == "4"
    assert float(summary["serve", "greedy"]["profit_ratio_ci95"]) == pytest.approx(float(summary["eval", "greedy"]["profit_ratio_ci95"]))

    # two buyer columns of the same markets (as the loop's baselines): each pairs with its own column's baseline
    for buyers in ("threshold", "concession"):
        run("eval", "--seller", "planner,greedy", "--buyers", buyers, "--split", "train", "--episodes", "4",
            "--out", str(tmp_path / buyers))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "threshold"), str(tmp_path / "concession"), "--baseline", "planner", "--format", "csv"]) == 0
    captured = capsys.readouterr()
    paired = list(csv.DictReader(io.StringIO(captured.out)))
    assert [(row["seller"], row["pairs"]) for row in paired] == [("greedy", "4"), ("greedy", "4")]
    assert len({row["run"] for row in paired}) == 2 and "no market in common" not in captured.err
    assert paired[0]["baseline"] == "planner"  # of its run in each buyer column: both runs
    assert sorted(paired[0]["baseline_run"].split()) == sorted({row["run"] for row in paired})
    # the baseline's runs on other markets (another seed) are the baseline too: only the same markets twice are ambiguous
    run("eval", "--seller", "planner,greedy", "--buyers", "threshold", "--split", "train", "--episodes", "4", "--seed", "5",
        "--out", str(tmp_path / "later"))
    capsys.readouterr()
    folders = [str(tmp_path / f) for f in ("threshold", "concession", "later")]
    assert main(["report", *folders, "--baseline", "planner", "--format", "csv"]) == 0
    assert sorted(row["pairs"] for row in csv.DictReader(io.StringIO(capsys.readouterr().out))) == ["4", "4", "4"]
    run("eval", "--seller", "planner", "--buyers", "threshold", "--split", "train", "--episodes", "4", "--out", str(tmp_path / "again"))
    capsys.readouterr()
    assert main(["report", *folders, str(tmp_path / "again"), "--baseline", "planner"]) == 2
    assert "--baseline: 'planner': played the same markets against buyers threshold in 2 separate runs" in error_line(capsys)


_INTERRUPT_AT = """
import importlib.abc, os, signal, sys

point = sys.argv[1]
if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    sys.exit(f"SIGINT is not Python's default handler here but {signal.getsignal(signal.SIGINT)!r}")

def interrupt():
    os.kill(os.getpid(), signal.SIGINT)  # handled by the time kill() returns; if it came later, the loop waits
    while True:  # for it, so that it lands at this point, however busy the machine
        pass

class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == point:
            sys.meta_path.remove(self)
            interrupt()
        return None

if point == "configure":  # after every module has loaded: the command line sets up its logging
    import negotiate.logs
    negotiate.logs.configure = lambda *args, **kwargs: interrupt()
else:  # while a module loads
    sys.meta_path.insert(0, Interrupt())
sys.argv = ["negotiate", "splits"]
from importlib.metadata import entry_points
(script,) = [e for e in entry_points(group="console_scripts") if e.name == "negotiate"]
sys.exit(script.load()())
"""


@pytest.mark.parametrize("point", ["scipy", "negotiate.workers", "configure"])
def test_ctrl_c_while_the_command_line_loads_is_one_line(point):
    """A real SIGINT while the installed ``negotiate`` script loads the command line (as it imports scipy, the
    heaviest of its modules, or negotiate.workers, the last) or while ``main`` sets up, before the command's own
    handling: one line and exit 130, no traceback.

    The child gets SIGINT's default action back, so that Python installs its handler as it does under a
    terminal: a shell starts a background job (a CI script's, say) with SIGINT ignored, and a child inherits
    that, so the signal did nothing and ``splits`` ran to the end."""
    import signal
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _INTERRUPT_AT, point], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (done.returncode, done.stderr, done.stdout) == (130, "negotiate: interrupted\n", "")


def _pty_stream(columns: int):
    """A stream on a pseudo-terminal ``columns`` wide (what a person's terminal is to the command)."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return leader, os.fdopen(follower, "w")


@pytest.mark.parametrize("columns", [80, 132])
def test_an_error_fits_the_terminal_and_a_pipe_gets_it_on_one_line(tmp_path, columns):
    """Issue 44: error lines ran to 250 characters. On a terminal they wrap to its width (at most 100 columns);
    piped, they stay one line, so a script reads one error per line."""
    from negotiate.cli import ERROR_WIDTH, for_screen

    spec = tmp_path / "bad.toml"
    spec.write_text("bogus = 17\n")
    with pytest.raises(UserError) as caught:
        load_spec(spec)
    line = f"negotiate serve: error: {caught.value}"
    assert len(line) > 200  # the unknown field's message lists every field
    leader, stream = _pty_stream(columns)
    try:
        shown = for_screen(line, stream)
    finally:
        stream.close()
        os.close(leader)
    lines = shown.splitlines()
    assert len(lines) >= 3 and max(map(len, lines)) <= min(columns, ERROR_WIDTH)
    assert all(later.startswith("    ") for later in lines[1:])
    assert " ".join(part.strip() for part in lines) == line  # nothing lost or changed but the breaks
    piped = tmp_path / "piped.txt"
    with open(piped, "w") as stream:
        assert for_screen(line, stream) == line


def test_other_libraries_warnings_go_to_the_run_log_and_only_their_errors_to_the_screen(tmp_path, capsys):
    """Issue 44: peft's warnings and transformers' lines flooded the screen. Another library's warnings (Python's
    warnings module and its loggers) go to the run's log file; its errors also reach the console; ours are unchanged."""
    import logging
    import warnings

    from negotiate.logs import configure

    log = tmp_path / "run.log.jsonl"
    configure(log, console_level=logging.INFO)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("peft: the adapter has no config", UserWarning)
        # a library logger of no installed package: transformers, once imported, has a handler of its own (its
        # verbosity is set to errors by the CLI: TRANSFORMERS_VERBOSITY, below)
        logging.getLogger("somelib.modeling").warning("some weights were not used")
        logging.getLogger("somelib.modeling").error("the model could not be loaded")
        logging.getLogger("negotiate.cli").info("our own line")
    finally:
        configure(None, console_level=logging.WARNING)
        logging.captureWarnings(False)
    err = capsys.readouterr().err
    assert "peft: the adapter has no config" not in err and "some weights were not used" not in err
    assert "somelib.modeling: ERROR: the model could not be loaded" in err and "our own line" in err
    lines = [orjson.loads(line) for line in log.read_text().splitlines()]
    said = [line["event"] for line in lines]
    assert any("peft: the adapter has no config" in event for event in said)
    assert "some weights were not used" in said and "the model could not be loaded" in said and "our own line" in said


def test_the_command_line_turns_hugging_face_bars_and_warnings_down_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # a person's own choice stays
    assert main(["splits"]) == 0
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TRANSFORMERS_VERBOSITY"] == "info"
    # The bar transformers draws while it converts a GGUF file: off. tqdm reads TQDM_* when it is imported, which the
    # command line does later; a fresh process shows it (this one may have imported tqdm before). The core install has
    # no tqdm: there the variable is what is checked.
    assert os.environ["TQDM_DISABLE"] == "1"
    if importlib.util.find_spec("tqdm") is not None:
        code = "from negotiate.cli import main; main(['splits']); from tqdm.auto import tqdm; print(tqdm(range(3)).disable)"
        env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
        shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert shown.stdout.splitlines()[-1] == "True", shown
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY")
    assert main(["splits"]) == 0
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"


def test_the_progress_line_counts_model_requests_that_keep_the_run_waiting(monkeypatch):
    """Issue 44: a run against a server that accepts and never answers was silent for 30 s and more. Each request
    is counted from when it goes out to when it ends (answered, failed or cancelled); the progress line shows those
    that have waited more than 5 s, and the longest wait, at every redraw."""
    from negotiate import logs
    from negotiate.cli_runs import SlowRequests

    clock = [100.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    requests = logs.RequestLog()
    column = SlowRequests(requests)
    first = requests.begin()
    clock[0] = 103.0
    second = requests.begin()
    assert column.render(None).plain == ""  # 3 s and 0 s: none slow yet
    clock[0] = 110.0
    assert column.render(None).plain == "2 requests waiting, the longest 10 s"
    requests.end(first)
    assert column.render(None).plain == "1 request waiting, the longest 7 s"
    requests.end(second)
    requests.end(second)  # ended twice (a cancel after a failure): no harm
    assert column.render(None).plain == "" and requests.slow() == (0, 0.0)


# -- issue 51, item 6: each bad input one line, exit 2, nothing written ----------------------------------------------------

BIG = str(2**63)
"""A count past a machine integer: an OverflowError traceback and exit 1 before."""
IPV6 = ("base URL 'http://[::1/v1' is not a valid URL (Invalid IPv6 URL); write it like http://127.0.0.1:8000/v1, an IPv6 address "
        "in brackets: http://[::1]:8000/v1")


@pytest.mark.parametrize(("argv", "file", "line"), [
    (["serve", "--episodes", BIG], None, f"negotiate serve: error: --episodes: '{BIG}': must be at most 1,000,000,000"),
    (["serve", "--set", f"episodes={BIG}"], None, f"negotiate serve: error: --set: episodes: {BIG}: must be at most 1,000,000,000"),
    (["serve", "--config", "FILE"], f"episodes = {BIG}\n", f"negotiate serve: error: FILE: episodes: {BIG}: must be at most 1,000,000,000"),
    (["eval", "--episodes", BIG], None, f"negotiate eval: error: --episodes: '{BIG}': must be at most 1,000,000,000"),
    (["collect", "--seller", "greedy", "--markets", BIG], None,
     f"negotiate collect: error: --markets: '{BIG}': must be at most 1,000,000,000"),
    (["collect", "--seller", "greedy", "--markets", "200000000"], None,  # under the bound, but not times its group of 8
     "negotiate collect: error: --markets: 200000000: times group (8) is 1,600,000,000 episodes; at most 1,000,000,000"),
    (["collect", "--seller", "greedy", "--group", "100000000"], None,  # the default markets (32) said so
     "negotiate collect: error: --markets: 32: times group (100,000,000) is 3,200,000,000 episodes; at most 1,000,000,000"),
    (["collect", "--seller", "greedy", "--config", "FILE"], "markets = 200000000\n",
     "negotiate collect: error: FILE: markets: 200000000: times group (8) is 1,600,000,000 episodes; at most 1,000,000,000"),
    (["serve", "--concurrency", BIG], None, f"negotiate serve: error: --concurrency: '{BIG}': must be at most 1,000,000,000"),
    (["serve", "--shard", "1/99999999999999999999"], None,  # a TypeError traceback, and an empty folder left
     "negotiate serve: error: --shard: '1/99999999999999999999': need N <= 1,000,000,000"),
    (["serve", "--seller", "openai:m@http://[::1/v1"], None, f"negotiate serve: error: --seller: 'openai:m@http://[::1/v1': {IPV6}"),
    (["serve", "--seller", "openai:m@http://127.0.0.1:9/v1|http://[::1/v1"], None,
     f"negotiate serve: error: --seller: 'openai:m@http://127.0.0.1:9/v1|http://[::1/v1': {IPV6}"),
    (["serve", "--buyers", "openai:m@http://[::1/v1"], None, f"negotiate serve: error: --buyers: 'openai:m@http://[::1/v1': {IPV6}"),
    (["serve", "--split", "FILE"], "budget = true\n", "negotiate serve: error: FILE: budget: True: must be a whole number"),
])
def test_a_bad_count_url_or_spec_is_one_line_exit_2_and_no_folder(tmp_path, capsys, argv, file, line):
    """Issue 51, item 6: 12 of 159 bad inputs were a traceback (a count of 2**63, a shard of 10**20 slices, a malformed
    IPv6 URL) or played (a spec's budget = true: a budget of 1 turn). Each is one line naming where the value came from,
    with the bound, exit 2, and no run folder."""
    if file is not None:
        path = tmp_path / "given.toml"
        path.write_text(file)
        argv, line = [str(path) if word == "FILE" else word for word in argv], line.replace("FILE", str(path))
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out), "--quiet"]) == 2
    assert error_line(capsys) == line
    assert not out.exists()


def test_a_run_json_past_the_bounds_is_one_line_on_resume(tmp_path, capsys):
    """A run.json edited by hand (or written by another tool) is read with the bounds of the flags; collect's --resume
    may extend a run only within them (markets times the run's group)."""
    out = tmp_path / "c"
    assert main(["collect", "--seller", "greedy", "--markets", "1", "--group", "2", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    saved, files = (out / "run.json").read_bytes(), {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.json"}
    assert main(["collect", "--resume", str(out), "--markets", "600000000", "--quiet"]) == 2
    assert error_line(capsys) == ("negotiate collect: error: --markets: 600000000: times the run's group (2) is 1,200,000,000 "
                                  "episodes; at most 1,000,000,000")
    for key, value, problem in (("episodes", 2**63 - 1, "must be at most 1,000,000,000"),
                                ("shard", [1, 10**12], "need N <= 1,000,000,000"), ("group", 0, "must be at least 1")):
        (out / "run.json").write_bytes(orjson.dumps(orjson.loads(saved) | {key: value}))
        assert main(["collect", "--resume", str(out), "--quiet"]) == 2
        assert error_line(capsys) == f"negotiate collect: error: {out / 'run.json'}: {key}: {value!r}: {problem}"
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.json"} == files  # nothing written


@pytest.mark.parametrize(("change", "problem"), [
    ({"market": 5}, "1: market: 5: must be a JSON object"),
    ({"episode": None}, "1: episode: missing or null; every episode has an id, a non-empty string"),
    ({"market": {}}, " episode greedy-000000: the market lacks 'seed'"),
])
def test_report_and_replay_text_refuse_the_same_episode_start_in_the_same_line(tmp_path, capsys, change, problem):
    """Issue 51: replay --text printed an episode_start whose market was 5 (``budget ? turns``), which report refused;
    report took an episode id of null. Both commands now read an episode_start the same way, and refuse with one line."""
    assert main(["serve", "--seller", "greedy", "--episodes", "1", "--out", str(tmp_path / "r"), "--quiet"]) == 0
    capsys.readouterr()
    events = next(read_episodes(tmp_path / "r" / "greedy.jsonl"))
    events[0] |= change
    trace = tmp_path / "odd.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(event) + b"\n" for event in events))
    for command in ("report", "replay"):
        assert main([command, str(trace), *(["--text"] if command == "replay" else [])]) == 2
        assert error_line(capsys) == f"negotiate {command}: error: {trace}:{problem}".replace(":" + " episode", ": episode")
    assert capsys.readouterr().out == ""


# -- issue 51, item 11: output a person reads -------------------------------------------------------------------------------


def test_the_run_table_names_its_buyers_and_split_and_says_what_each_short_title_means(tmp_path, capsys, monkeypatch):
    """The table's title named neither the buyers every row played nor the split; capt, welf /OPT and regret had no
    legend and no unit. At 80 columns the legend's lines fit, none of its entries split across two."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["serve", "--seller", "greedy", "--buyers", "concession?patience=5", "--split", "shapes", "--episodes", "2",
                 "--out", str(tmp_path / "r"), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].strip() == "negotiate serve: concession?patience=5 buyers on shapes"
    assert all(len(line) <= 80 for line in lines if str(tmp_path) not in line)  # a path is never cut
    legend = [line.strip() for line in lines[lines.index(next(line for line in lines if line.startswith("±"))):]][:6]
    assert legend == ["±: 95% CI of the mean · viol/ep: seller violations an episode",
                      "capt: capture, a deal's (price - cost) / (value - cost)",
                      "welf/OPT: welfare (value - cost over the deals) / OPT",
                      "OPT: the best matching's welfare",
                      "OPT pairs: share of OPT's buyer-product pairs made",
                      "regret: OPT - welfare, in the market's $ · budget overruns: 0"]
