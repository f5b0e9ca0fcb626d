"""The report tables read compact rows (negotiate.report.ReportRow): the same numbers as rows with every metric,
in a fifth of the memory. ``serve``, ``eval`` and ``report`` print their tables from them."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import textwrap

import anyio
import orjson
import pytest
from hypothesis import given, strategies as st
from rich.console import Console

from negotiate.cli import main
from negotiate.report import (
    SCORED, ReportRow, Scores, overlapping_runs, paired_differences, paired_markdown, rows_from_traces, summarize, summary_csv,
    summary_table,
)
from negotiate.runner import RunConfig, prepare, run_batch, save_config
from negotiate.trace import read_episodes

GROUPED = "serve-20261204-101010-aaaa"
ONCE = "eval-20261204-101010-bbbb"


def play(config: RunConfig, out) -> None:
    prepared = prepare(config, out, resume=False)
    save_config(config, out)
    anyio.run(lambda: run_batch(prepared, out, concurrency=8))


def fail_some(path, every: int) -> int:
    """Rewrite a trace with every ``every``-th episode failed (two reasons, so the commonest is told apart)."""
    episodes = list(read_episodes(path))
    for k in range(1, len(episodes), every):
        episodes[k][-1] = episodes[k][-1] | {"outcome": "failed", "reason": "boom" if k % 2 else "other", "metrics": None}
    path.write_bytes(b"".join(orjson.dumps(event) + b"\n" for events in episodes for event in events))
    return len(range(1, len(episodes), every))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of the same markets: one with --group 3 repeats (random's differ), one playing each market once,
    a third on another split; failed episodes in two of them."""
    root = tmp_path_factory.mktemp("report")
    play(RunConfig(sellers=("greedy", "random", "posted"), episodes=120, group=3, seed=4, run_id=GROUPED), root / "grouped")
    play(RunConfig(sellers=("greedy", "posted"), episodes=60, seed=4, run_id=ONCE), root / "once")
    play(RunConfig(sellers=("greedy", "posted"), split="shapes", episodes=40, seed=4), root / "shapes")
    assert fail_some(root / "grouped" / "posted.jsonl", 13) and fail_some(root / "once" / "greedy.jsonl", 11)
    return root


def _report(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["report", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("argv", [
    ["grouped"],
    ["grouped", "--format", "csv"],
    ["grouped", "--baseline", "greedy", "--format", "markdown"],
    ["grouped", "--baseline", "posted", "--format", "csv", "--by", "seller,split,shape,tier"],
    ["grouped", "once", "--baseline", "greedy"],
    ["grouped", "once", "--baseline", "greedy", "--baseline-run", ONCE, "--format", "markdown"],
    ["grouped", "once", "shapes", "--baseline", "greedy", "--baseline-run", "serve-aaaa", "--format", "csv"],
    ["grouped", "once", "shapes", "--by", "run,seller,buyers,split", "--format", "csv"],
    ["once", "shapes", "--baseline", "posted", "--format", "markdown"],
])
def test_report_prints_the_same_from_compact_rows_as_from_rows_with_every_metric(runs, argv, capsys, monkeypatch):
    from negotiate import cli_commands

    argv = [str(runs / a) if a in ("grouped", "once", "shapes") else a for a in argv]
    monkeypatch.setenv("COLUMNS", "200")
    compact = _report(argv, capsys)
    monkeypatch.setattr(cli_commands, "rows_from_traces", lambda *args, **kwargs: rows_from_traces(*args, **kwargs | {"compact": False}))
    assert compact == _report(argv, capsys)
    assert compact[0] == 0 and compact[1]


def test_compact_and_full_rows_give_equal_summaries_pairs_and_failures(runs):
    from negotiate.cli_runs import _failures

    paths = [runs / "grouped", runs / "once", runs / "shapes"]
    full, compact = rows_from_traces(paths), rows_from_traces(paths, compact=True)
    assert all(isinstance(row, ReportRow) for row in compact) and len(compact) == len(full) == 120 * 3 + 60 * 2 + 40 * 2

    def everything(rows) -> list:
        by = ["run", "seller", "split"]
        summaries = summarize(rows, by)
        unpaired: list[str] = []
        paired = paired_differences(rows, "greedy", baseline_run=ONCE, on_unpaired=unpaired.append)
        console = Console(file=io.StringIO(), width=200, record=True)
        console.print(summary_table(summaries, by))
        code = _failures(console, rows, runs / "serve.log.jsonl", "serve")
        # repr: every float to its last bit (nan included, which == would not match)
        return [repr(summaries), summary_csv(summaries, by), repr(paired), paired_markdown(paired), unpaired,
                overlapping_runs(rows), code, console.export_text()]

    got, expected = everything(compact), everything(full)
    assert got == expected
    assert "of 560 episodes failed (commonest reason" in got[-1]
    assert [row["index"] for row in compact] == [row["index"] for row in full]


def test_a_groups_repeats_count_once_in_the_interval_worked_by_hand():
    # profit/OPT on market A twice (0.2, 0.4), on B twice (0.6, 1.0), on C once (0.8): mean 3.0 / 5 = 0.6.
    # Deviations summed per market: A -0.4 - 0.2 = -0.6, B 0.0 + 0.4 = 0.4, C 0.2; squares 0.56.
    # se = sqrt(3 / 2 * 0.56) / 5 = 0.183303; t(0.975, 2) = 4.302653: half width 0.788689.
    # (As five independent values: sd 0.316228, t(0.975, 4) = 2.776445, half width 0.392646.)
    metrics = {name: 1.0 for name in SCORED} | {"capture": None, "violations": {}, "budget_overrun": 0}

    def row(market: str, repeat: int, ratio: float) -> ReportRow:
        return ReportRow(seller="a", buyers="threshold", split="train", shape="2x4", tier="100-1000", run="r", index=None,
                         seed=1, run_seed=0, repeat=repeat, market=market, outcome="terminated", reason="sold_out",
                         metrics=Scores.of(metrics | {"profit_ratio": ratio}))

    rows = [row("A", 0, 0.2), row("A", 1, 0.4), row("B", 0, 0.6), row("B", 1, 1.0), row("C", 0, 0.8)]
    [summary] = summarize(rows, ["seller"])
    mean, half, n = summary.stats["profit_ratio"]
    assert (round(mean, 12), n) == (0.6, 5)
    assert half == pytest.approx(4.302653 * math.sqrt(1.5 * 0.56) / 5, rel=1e-6)
    assert round(half, 6) == 0.788689
    assert summary.stats["capture"][2] == 0 and math.isnan(summary.stats["capture"][0])  # None for all: no value
    # The same rows as dicts give the same numbers, to the last bit.
    as_dicts = [{"seller": r.seller, "split": r.split, "market": r.market, "repeat": r.repeat, "seed": r.seed,
                 "metrics": metrics | {"profit_ratio": r.metrics["profit_ratio"]}} for r in rows]
    assert repr(summarize(as_dicts, ["seller"])) == repr([summary])


def test_scores_read_like_the_metrics_dict_they_keep():
    metrics = {"valid_rate": 0.75, "profit_ratio": 0.1 + 0.2, "capture": None, "deal_rate": 0.5, "welfare_ratio": 1.0,
               "opt_pairs_share": None, "regret": 2**40 + 1, "turns_per_deal": 3.0, "violations": {"below_cost": 2},
               "budget_overrun": 1, "opt": 17}
    scores = Scores.of(metrics)
    assert {name: scores[name] for name in SCORED} == {name: metrics[name] for name in SCORED}  # exact: no rounding
    assert scores.get("capture") is None and scores.get("opt") is None and scores.get("opt", 0) == 0
    assert dict(scores["violations"]) == {"below_cost": 2} and scores["budget_overrun"] == 1
    with pytest.raises(KeyError):
        scores["opt"]
    none = Scores.of(metrics | {"violations": {}})
    assert dict(none["violations"]) == {} and bool(none)


@given(st.lists(st.tuples(st.sampled_from("xyz"), st.sampled_from("ab"), st.integers(0, 3)), max_size=30))
def test_overlapping_runs_are_the_runs_that_share_an_episode(played):
    rows = [{"run": run, "seller": seller, "split": "train", "run_seed": 0, "index": index} for run, seller, index in played]
    runs_of: dict[tuple, set] = {}
    for row in rows:  # the definition: every run of an episode that more than one run played
        runs_of.setdefault((row["seller"], row["index"]), set()).add(row["run"])
    shared = {run for runs in runs_of.values() if len(runs) > 1 for run in runs}
    assert overlapping_runs(rows) == list(dict.fromkeys(row["run"] for row in rows if row["run"] in shared))


# -- memory -------------------------------------------------------------------------------------------------


EPISODES = 20_000
PER_EPISODE = 1200
"""Bytes of address space a report may take per episode: the compact rows take about 600 (rows with every metric,
2,400: a report of 20,000 episodes then runs out of room, a MemoryError)."""


def test_a_report_of_20000_episodes_takes_under_a_kilobyte_and_a_bit_an_episode(tmp_path):
    """``negotiate report`` in a child whose address space is capped, once the imports are done, at what it maps
    plus :data:`PER_EPISODE` per episode. The episodes are copies of one of a tiny market, each its own market."""
    spec = tmp_path / "tiny.toml"
    spec.write_text('name = "tiny"\nbuyers = 2\nproducts = 1\n')
    play(RunConfig(sellers=("greedy",), split=str(spec), episodes=2), tmp_path / "warm")
    start, *rest = next(iter(read_episodes(tmp_path / "warm" / "greedy.jsonl")))
    (tmp_path / "big").mkdir()
    with open(tmp_path / "big" / "greedy.jsonl", "wb") as handle:
        for index in range(EPISODES):
            name = f"greedy-{index:06d}"
            first = start | {"episode": name, "index": index, "seed": index, "market": start["market"] | {"seed": index}}
            handle.write(b"".join(orjson.dumps(event | {"episode": name}) + b"\n" for event in [first, *rest]))
    script = textwrap.dedent("""
        import contextlib, io, json, resource, sys
        from negotiate.cli import main

        def mapped() -> int:
            with open("/proc/self/status") as status:
                return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

        with contextlib.redirect_stdout(io.StringIO()):  # every import and first use: a report of two episodes
            assert main(["report", sys.argv[1], "--format", "csv"]) == 0
        limit = mapped() + int(sys.argv[3]) * int(sys.argv[4])
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["report", sys.argv[2], "--format", "csv"])
        print(json.dumps({"code": code, "csv": out.getvalue()}))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "warm"), str(tmp_path / "big"), str(EPISODES),
                           str(PER_EPISODE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]  # out of room: a MemoryError, or -11 where C code met it
    result = json.loads(done.stdout)
    assert result["code"] == 0 and result["csv"].splitlines()[1].startswith(f"greedy,tiny,{EPISODES},0,"), done.stderr[-2000:]
