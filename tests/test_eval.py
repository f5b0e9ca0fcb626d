"""`negotiate eval`: paired markets, intervals worked by hand, result files, plots, bad input."""

from __future__ import annotations

import math
import re

import pytest

from negotiate.cli import main
from negotiate.metrics import mean_ci
from negotiate.report import paired_differences
from negotiate.trace import read_episodes


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    code = main(["eval", "--sellers", "greedy,posted,random", "--splits", "train,prices-x10", "--episodes", "6",
                 "--baseline", "posted", "--out", str(out), "--quiet"])
    assert code == 0
    return out


def test_every_seller_plays_the_same_markets(evaluation):
    for split in ("train", "prices-x10"):
        markets = {}
        for seller in ("greedy", "posted", "random"):
            episodes = list(read_episodes(evaluation / split / f"{seller}.jsonl"))
            assert len(episodes) == 6
            markets[seller] = {e[0]["index"]: (e[0]["seed"], e[0]["market"]) for e in episodes}
        assert markets["greedy"] == markets["posted"] == markets["random"]
    # prices-x10 scales the same draws: its markets differ from train's only by scale
    train = {e[0]["index"]: e[0]["market"] for e in read_episodes(evaluation / "train" / "greedy.jsonl")}
    x10 = {e[0]["index"]: e[0]["market"] for e in read_episodes(evaluation / "prices-x10" / "greedy.jsonl")}
    assert x10[0]["price_low"] == 10 * train[0]["price_low"] == 1000


def test_the_confidence_interval_matches_the_hand_computation():
    # 0.1..0.4: mean 0.25, sample sd sqrt(0.05 / 3) = 0.12910, t(0.975, 3) = 3.18245: half width 0.20543
    mean, half = mean_ci([0.1, 0.2, 0.3, 0.4])
    assert mean == pytest.approx(0.25)
    assert half == pytest.approx(3.18245 * math.sqrt(0.05 / 3) / 2, rel=1e-4)
    only = mean_ci([0.7])  # one value: no interval (it was 0, which tables showed as certainty)
    assert only[0] == 0.7 and math.isnan(only[1])


def test_paired_differences_match_the_hand_computation():
    # b - a on three markets: 0.1, 0.0, 0.2 -> mean 0.1, sd 0.1, t(0.975, 2) = 4.30265: half 0.24841
    rows = [{"seller": s, "split": "train", "seed": k, "metrics": {"profit_ratio": v, "welfare_ratio": v, "capture": None,
                                                                   "deal_rate": 1.0, "opt_pairs_share": 1.0, "regret": 0, "valid_rate": 1.0}}
            for s, values in (("a", (0.5, 0.6, 0.7)), ("b", (0.6, 0.6, 0.9))) for k, v in enumerate(values)]
    rows.append({"seller": "b", "split": "train", "seed": 99, "metrics": rows[0]["metrics"]})  # no partner: left out
    (paired,) = paired_differences(rows, "a")
    assert (paired.seller, paired.split, paired.pairs) == ("b", "train", 3)
    mean, half, n = paired.diffs["profit_ratio"]
    assert (round(mean, 9), n) == (0.1, 3)
    assert half == pytest.approx(4.30265 * 0.1 / math.sqrt(3), rel=1e-4)
    assert paired.diffs["capture"][2] == 0  # undefined for both: no pairs, no number
    assert math.isnan(paired.diffs["capture"][0])


def test_a_markets_repeats_count_once_in_the_paired_interval():
    # a plays markets 0 and 1 once; b twice each (a --group run). b - a: 0.1, 0.3 on market 0; 0.0, 0.2 on market 1.
    # Mean 0.15; deviations summed per market: +0.1 and -0.1, so se = sqrt(2 / 1 * 0.02) / 4 = 0.05 and the half
    # width is t(0.975, 1) * 0.05 = 12.7062 * 0.05 (as four independent pairs it would be 3.18245 * 0.1291 / 2).
    rows = [{"seller": "a", "split": "train", "seed": k, "metrics": {"profit_ratio": 0.5}} for k in (0, 1)]
    rows += [{"seller": "b", "split": "train", "seed": k, "repeat": r, "metrics": {"profit_ratio": 0.5 + d}}
             for k, r, d in [(0, 0, 0.1), (0, 1, 0.3), (1, 0, 0.0), (1, 1, 0.2)]]
    (paired,) = paired_differences(rows, "a")
    mean, half, n = paired.diffs["profit_ratio"]
    assert (paired.pairs, n, round(mean, 9)) == (4, 4, 0.15)
    assert half == pytest.approx(12.7062 * 0.05, rel=1e-4)


def test_one_markets_repeats_give_a_mean_and_no_interval():
    # b - a on one market, three repeats: 0.1, 0.2, 0.3. Mean 0.2; one market says nothing of another: no interval.
    from negotiate.report import paired_markdown

    rows = [{"seller": "a", "split": "train", "seed": 7, "metrics": {"profit_ratio": 0.5}}]
    rows += [{"seller": "b", "split": "train", "seed": 7, "repeat": r, "metrics": {"profit_ratio": 0.5 + d}}
             for r, d in enumerate((0.1, 0.2, 0.3))]
    (paired,) = paired_differences(rows, "a")
    mean, half, n = paired.diffs["profit_ratio"]
    assert (round(mean, 9), n) == (0.2, 3) and math.isnan(half)
    assert "| b | train | 3 | +0.200 |" in paired_markdown([paired])


def test_an_empty_paired_csv_keeps_its_run_column():
    from negotiate.report import paired_csv

    assert paired_csv([], "planner", by_run=True).startswith("run,seller,baseline,split,pairs,")
    assert paired_csv([], "planner").startswith("seller,baseline,split,pairs,")


def test_a_seller_paired_on_several_splits_gets_a_row_pooling_them():
    # b - a: 0.1 and 0.3 on train, 0.2 on shapes -> all: mean 0.2, sd 0.1, t(0.975, 2) = 4.30265
    rows = [{"seller": s, "split": split, "seed": k, "metrics": {"profit_ratio": v}}
            for s, split, k, v in [("a", "train", 0, 0.5), ("a", "train", 1, 0.5), ("a", "shapes", 0, 0.4),
                                   ("b", "train", 0, 0.6), ("b", "train", 1, 0.8), ("b", "shapes", 0, 0.6)]]
    got = {p.split: (p.pairs, round(p.diffs["profit_ratio"][0], 9), p.diffs["profit_ratio"][1])
           for p in paired_differences(rows, "a")}
    assert list(got) == ["train", "shapes", "all"]
    assert got["all"][:2] == (3, 0.2) and got["all"][2] == pytest.approx(4.30265 * 0.1 / math.sqrt(3), rel=1e-4)
    assert got["train"][:2] == (2, 0.2) and got["shapes"][:2] == (1, 0.2)
    # one split only: no pooled row
    assert [p.split for p in paired_differences([r for r in rows if r["split"] == "train"], "a")] == ["train"]


def _table(markdown: str, heading: str) -> list[list[str]]:
    block = markdown.split(heading, 1)[1]
    lines = [line for line in block.splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    stop = next((k for k in range(2, len(rows)) if rows[k][0] == "seller"), len(rows))
    return rows[:stop]


def test_results_markdown_parses_and_report_gives_the_same_numbers(evaluation, capsys):
    text = (evaluation / "results.md").read_text()
    metrics = _table(text, "## Metrics")
    header, rule, body = metrics[0], metrics[1], metrics[2:]
    assert header[:3] == ["seller", "split", "episodes"] and set("".join(rule)) == {"-"}
    assert len(body) == 6  # 3 sellers x 2 splits
    for row in body:
        assert len(row) == len(header)
        for cell in row[3:-1]:
            assert re.fullmatch(r"-?\d+\.\d+ ± \d+\.\d+", cell), cell
    paired = _table(text, "## Paired differences")
    assert [row[:2] for row in paired[2:]] == [[seller, split] for seller in ("greedy", "random") for split in ("train", "prices-x10", "all")]
    assert all(int(row[2]) == sum(int(r[2]) for r in paired[2:] if r[0] == row[0] and r[1] != "all")
               for row in paired[2:] if row[1] == "all")  # the pooled row has every split's pairs
    assert all(re.fullmatch(r"[+-]\d+\.\d+ ± \d+\.\d+", row[3]) for row in paired[2:])
    capsys.readouterr()
    assert main(["report", str(evaluation), "--by", "seller,split", "--format", "markdown", "--baseline", "posted"]) == 0
    again = capsys.readouterr().out
    table_rows = lambda s: sorted(line for line in s.splitlines() if line.startswith("| ") and not line.startswith("| seller"))
    assert table_rows(again) == table_rows(text)


def test_csv_files_and_plots_are_written(evaluation):
    summary = (evaluation / "results.csv").read_text().splitlines()
    assert summary[0].startswith("seller,split,episodes,failed,valid_rate_mean") and len(summary) == 7
    paired = (evaluation / "paired.csv").read_text().splitlines()
    assert paired[0].startswith("seller,baseline,split,pairs") and len(paired) == 7  # 2 sellers x (2 splits and all)
    for name in ("profit_welfare_by_split.png", "violations_by_type.png", "paired_profit_by_split.png"):
        data = (evaluation / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, name
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width >= 400 and height >= 300


def test_the_last_lines_name_each_file_written_with_its_folder_and_fit_80_columns(tmp_path, capsys, monkeypatch):
    """Issue 51, item 11: eval's last line was 165 columns and named the plots without their folder. Each file is now a
    path on a line of its own, one that opens."""
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "e"
    assert main(["eval", "--seller", "greedy,posted", "--split", "train", "--episodes", "2", "--out", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(k for k, line in enumerate(lines) if line.endswith("; written:"))
    assert re.fullmatch(r"4 episodes in \d+\.\ds; written:", lines[start])
    named = [line[11:] for line in lines[start + 1:start + 7]]
    assert [line[:11] for line in lines[start + 1:start + 7]] == ["  results: ", *["           "] * 2, "  plots:   ", *["           "] * 2]
    assert named == [str(out / name) for name in ("results.md", "results.csv", "paired.csv", "plots/profit_welfare_by_split.png",
                                                   "plots/violations_by_type.png", "plots/paired_profit_by_split.png")]
    assert all((out / path).is_file() for path in named) and lines[start + 7] == "report again:"
    assert all(len(line) <= 80 for line in lines if str(out) not in line)  # a path is never cut


def test_resume_of_a_finished_evaluation_runs_nothing(evaluation):
    sizes = {p: p.stat().st_size for p in evaluation.rglob("*.jsonl") if "log" not in p.name}
    assert main(["eval", "--resume", str(evaluation), "--quiet"]) == 0
    assert {p: p.stat().st_size for p in sizes} == sizes


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--sellers", "greedy,posted", "--baseline", "oracle"], "--baseline: 'oracle': is not one of --seller"),
        (["--splits", "train,nope"], "unknown split"),
        (["--splits", "train,train"], "a split is named twice"),
        (["--sellers", "greedy,nobody"], "unknown seller agent 'nobody'"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, capsys, args, needle):
    assert main(["eval", "--episodes", "2", "--out", str(tmp_path / "e"), "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
    assert not (tmp_path / "e" / "eval.json").exists()


def test_an_existing_evaluation_is_not_overwritten(evaluation, capsys):
    before = (evaluation / "results.md").read_text()
    assert main(["serve", "--episodes", "2", "--out", str(evaluation), "--quiet"]) == 2  # serve into an evaluation: eval resumes it
    assert f"already holds an evaluation; finish it with negotiate eval --resume {evaluation} or" in capsys.readouterr().err
    assert (evaluation / "results.md").read_text() == before


def test_two_splits_that_would_share_a_folder_or_a_name_are_refused_before_anything_runs(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "m.toml").write_text('split = "train"\n')
    (tmp_path / "b" / "m.toml").write_text('split = "shapes"\n')
    (tmp_path / "b" / "n.toml").write_text('split = "shapes"\nname = "train"\n')
    a, b, n = (str(tmp_path / f) for f in ("a/m.toml", "b/m.toml", "b/n.toml"))
    out = tmp_path / "out"
    assert main(["eval", "--seller", "greedy", "--split", f"{a},{b}", "--episodes", "2", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{a} and {b} would share the folder m" in err
    assert main(["eval", "--seller", "greedy", "--split", f"train,{n}", "--episodes", "2", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"train and {n} are both named 'train'" in err
    assert not out.exists()


@pytest.fixture
def drawn(monkeypatch):
    """Every figure the plots save, kept open for inspection."""
    from matplotlib.figure import Figure

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    return figures


def test_plots_say_what_they_average_and_keep_legends_off_the_bars(evaluation, tmp_path, drawn):
    from negotiate.plots import write_plots
    from negotiate.report import rows_from_traces

    rows = rows_from_traces([evaluation])
    write_plots(rows, tmp_path, ["greedy", "posted", "random"], ["train", "prices-x10"], baseline="posted")
    by_split, violations, paired = drawn
    for figure in drawn:  # legends belong to the figure, beside the axes, never inside them over the bars
        assert all(ax.get_legend() is None for ax in figure.axes)
        assert len(figure.legends) == 1
    # violations: one panel per split (not a mean over splits), random's rule breaking on each
    assert [ax.get_title() for ax in violations.axes] == ["train", "prices-x10"]
    assert "per split" in violations._suptitle.get_text()
    # paired: each seller minus the baseline on the same markets, per split, as the paired table says
    from matplotlib.container import BarContainer

    table = {(p.seller, p.split): p.diffs["profit_ratio"][0] for p in paired_differences(rows, "posted")}
    bars = [c for c in paired.axes[0].containers if isinstance(c, BarContainer)]
    assert [c.get_label() for c in bars] == ["greedy", "random"]
    for container, seller in zip(bars, ["greedy", "random"]):
        assert [bar.get_height() for bar in container] == pytest.approx([table[(seller, s)] for s in ("train", "prices-x10")])
    assert "posted" in paired.axes[0].get_ylabel()
