"""The evaluation plots: long seller names (model specs) leave the axes room, and never merge two sellers."""

from __future__ import annotations

import doctest
import warnings

import pytest

from negotiate import plots
from negotiate.cli import main
from negotiate.report import rows_from_traces

SELLERS = ["greedy", "posted", "random", "dutch", "concession", "oracle", "planner"]
SPLITS = ["train", "shapes", "correlated", "prices-x10"]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("plots") / "run"
    assert main(["eval", "--sellers", ",".join(SELLERS), "--splits", ",".join(SPLITS), "--episodes", "2", "--out", str(out), "--quiet"]) == 0
    return rows_from_traces([out])


def _renamed(rows, name):
    return [row | {"seller": name(row["seller"])} for row in rows]


@pytest.mark.parametrize("splits", [["train"], SPLITS])
def test_model_spec_names_do_not_collapse_the_axes(rows, tmp_path, splits):
    # Seven sellers named like checkpoints, 87 characters each: before, constrained layout gave up on the
    # violations plot ("axes sizes collapsed to zero"), a warning and an unreadable figure.
    long = _renamed(rows, lambda seller: "hf:/runs/" + "x" * 70 + "/" + seller)
    long = [row for row in long if row["split"] in splits]
    names = sorted({row["seller"] for row in long})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = plots.write_plots(long, tmp_path, names, splits)
    assert [p.name for p in paths] == ["profit_welfare_by_split.png", "violations_by_type.png", "paired_profit_by_split.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_a_split_given_as_a_spec_file_is_drawn_under_its_name(rows, tmp_path, monkeypatch):
    # `negotiate eval --split specs/tiny.toml`: the rows say "tiny". The plots once drew an empty
    # panel labelled with the path (and constrained layout collapsed under that long label).
    from matplotlib.figure import Figure

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: drawn.append(self))
    train = [row for row in rows if row["split"] == "train"]
    plots.write_plots(train, tmp_path, SELLERS, ["/runs/specs/train.toml"])
    by_split, violations, paired = drawn
    assert [label.get_text() for label in by_split.axes[0].get_xticklabels()] == ["train"]
    assert [ax.get_title() for ax in violations.axes] == ["train"]
    heights = [bar.get_height() for bar in by_split.axes[0].patches]
    assert len(heights) == len(SELLERS) and all(0 <= h <= 1 for h in heights)  # drawn, not NaN


def test_tick_names_shorten_specs_and_keep_sellers_apart():
    assert plots._tick_names(["openai:smol@http://127.0.0.1:8000/v1?temperature=0.7", "greedy"]) == ["openai:smol", "greedy"]
    # A local model by its folder: "hf:" + 40 = 43 characters, cut to 20: 10 from the front, the ellipsis, 9 from the back.
    assert plots._tick_names(["hf:/runs/x/" + "a" * 40 + "?format=json"], limit=20) == ["hf:aaaaaaa…aaaaaaaaa"]
    # Two checkpoints of one run share the folder's name: each keeps its parent ("hf:step-1/" + 20 b's, elided).
    steps = ["hf:/runs/" + "a" * 20 + f"/step-{k}/" + "b" * 20 for k in (1, 2)]
    assert plots._tick_names(steps, limit=20) == ["hf:step-1/…bbbbbbbbb", "hf:step-2/…bbbbbbbbb"]
    # Differing only in the middle even with their parents: elided they would share a bar, so both stay whole.
    same = ["hf:/runs/" + "a" * 20 + f"-{k}-" + "c" * 20 + "/" + "b" * 20 for k in (1, 2)]
    assert plots._tick_names(same, limit=20) == same


def test_plots_doctests_pass():
    result = doctest.testmod(plots, report=False)
    assert result.attempted >= 3 and result.failed == 0
