"""``negotiate export`` (training/export.py): the trainer's decisions as Parquet that ``datasets`` loads, values worked
out by hand, the same rendering as ``negotiate train``, and bad input in one line with nothing written."""

from __future__ import annotations

import importlib.util
import json
import sys

import orjson
import pytest

from negotiate.cli import main
from negotiate.training.dataset import load_episodes
from negotiate.training.export import COLUMNS, ExportConfig, decision_rows, export, scored_episodes
from negotiate.training.rewards import _doctest_episode

HAVE_DATASETS = importlib.util.find_spec("datasets") is not None and importlib.util.find_spec("pyarrow") is not None
needs_datasets = pytest.mark.skipif(not HAVE_DATASETS, reason="needs the train extra: pip install 'negotiate[train]'")


def _episode(episode: str, index: int, *, price: int | None, invalid: int, seed: int) -> list[dict]:
    """One buyer (value 700) and one product (cost 100): OPT 600. The seller sends ``invalid`` malformed messages, then
    an offer at ``price`` that the buyer accepts (none when None). Markets of one ``seed`` are one group."""
    events = _doctest_episode(price=price, invalid=invalid)
    events[0] |= {"episode": episode, "index": index, "seller": "scripted", "split": "doc", "run_seed": 0, "seed": seed}
    events[0]["market"] = events[0]["market"] | {"seed": seed}
    return events


@pytest.fixture
def traces(tmp_path):
    """Three episodes by hand (profit-penalized reward: profit / OPT less 0.1 a violation):

    - ``a``, market 7: an offer at 400 accepted: 300 / 600 = 0.5; one decision;
    - ``b``, market 7: two malformed messages, then the offer at 400: 0.5 - 2 x 0.1 = 0.3; three decisions;
    - ``c``, market 8: one malformed message, no deal: 0 - 0.1 = -0.1; one decision.

    Market 7's group: mean 0.4, standard deviation 0.1, so a's advantage is +1 and b's -1 (unscaled: +0.1 and -0.1);
    market 8 is a group of one: 0."""
    path = tmp_path / "doc.jsonl"
    events = (_episode("a", 0, price=400, invalid=0, seed=7) + _episode("b", 1, price=400, invalid=2, seed=7)
              + _episode("c", 2, price=None, invalid=1, seed=8))
    path.write_bytes(b"".join(orjson.dumps(event) + b"\n" for event in events))
    return path


def _rows(traces, **settings) -> list[dict]:
    config = ExportConfig(traces=(str(traces),), **settings)
    return list(decision_rows(scored_episodes(config), scale_advantages=config.scale_advantages))


def test_each_decision_carries_its_reward_return_and_advantage_worked_by_hand(traces):
    rows = _rows(traces)
    assert [(row["episode"], row["turn"]) for row in rows] == [("a", 1), ("b", 1), ("b", 2), ("b", 3), ("c", 1)]
    # the reward arrives on an episode's last decision; the return from every decision is the episode's reward
    assert [row["reward"] for row in rows] == pytest.approx([0.5, 0.0, 0.0, 0.3, -0.1])
    assert [row["return"] for row in rows] == pytest.approx([0.5, 0.3, 0.3, 0.3, -0.1])
    assert [row["advantage"] for row in rows] == pytest.approx([1.0, -1.0, -1.0, -1.0, 0.0])
    assert [row["advantage"] for row in _rows(traces, scale_advantages=False)] == pytest.approx([0.1, -0.1, -0.1, -0.1, 0.0])
    assert len({rows[0]["market"], rows[1]["market"]}) == 1 and rows[4]["market"] != rows[0]["market"]
    assert [(row["valid"], row["action"]) for row in rows] == [(True, "offer"), (False, None), (False, None), (True, "offer"),
                                                               (False, None)]
    assert rows[0]["completion"] == [{"role": "assistant", "content": "To: b1\nTalk: \nAction: [OFFER] p1 $400"}]
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user"]
    assert all(row["prompt_ids"] is row["completion_ids"] is row["logprobs"] is None for row in rows)  # none logged
    assert all(list(row) == list(COLUMNS) for row in rows)


def test_the_prompts_and_completions_are_the_trainers(traces):
    """The rows hold what ``negotiate train`` builds (load_episodes, the same prompt view): for every view."""
    for prompt in ("full", "compact", "advice"):
        episodes = load_episodes([traces], prompt=prompt)
        rows = _rows(traces, prompt=prompt)
        decisions = [d for ep in episodes for d in ep.decisions]
        assert [row["prompt"] for row in rows] == [d.prompt for d in decisions]
        assert [row["completion"][0]["content"] for row in rows] == [d.completion for d in decisions]


def test_dagger_labels_are_the_trainers_too(traces):
    episodes = load_episodes([traces], teacher="greedy")
    rows = _rows(traces, teacher="greedy")
    assert [row["completion"][0]["content"] for row in rows] == [d.completion for ep in episodes for d in ep.decisions]
    assert rows and all(row["valid"] for row in rows)  # a scripted teacher keeps the rules


def test_a_model_sellers_logged_prompt_tokens_and_logprobs_are_written_as_logged(tmp_path):
    """A model seller's message keeps the prompt it saw, its raw text, token ids and log-probs (``extra``): the row holds
    them as they are, not a rendering."""
    events = _episode("m", 0, price=400, invalid=0, seed=7)
    offer = next(event for event in events if event["type"] == "message" and event["sender"] == "seller")
    offer |= {"raw": "Action: [OFFER] p1 $400", "extra": {
        "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "prompt_token_ids": [1, 2],
        "token_ids": [3, 4, 5], "logprobs": [-0.5, -0.25, -0.125]}}
    path = tmp_path / "model.jsonl"
    path.write_bytes(b"".join(orjson.dumps(event) + b"\n" for event in events))
    (row,) = _rows(path)
    assert row["prompt"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert row["completion"] == [{"role": "assistant", "content": "Action: [OFFER] p1 $400"}]
    assert (row["prompt_ids"], row["completion_ids"], row["logprobs"]) == ([1, 2], [3, 4, 5], [-0.5, -0.25, -0.125])
    assert (row["reward"], row["return"], row["advantage"]) == (0.5, 0.5, 0.0)


def test_the_same_episode_ids_in_two_runs_keep_their_own_advantages(traces, tmp_path):
    """Two runs number their episodes alike (an evaluation's splits too): an advantage keyed by the id would be the
    other run's. Here a second run plays market 7 with rewards 0.3 and 0.5: each row keeps its own episode's sign."""
    lines = traces.read_bytes().splitlines()
    other = tmp_path / "other" / "doc.jsonl"
    other.parent.mkdir()
    events = [orjson.loads(line) for line in lines]
    starts = [k for k, event in enumerate(events) if event["type"] == "episode_start"]
    for k in starts:
        events[k] |= {"run": "second"}
    events[starts[0]]["episode"], events[starts[1]]["episode"] = "b", "a"  # ids swapped: a is now the 0.3 episode
    other.write_bytes(b"".join(orjson.dumps(event) + b"\n" for event in events))
    rows = [row for row in _rows(tmp_path) if row["market"] == _rows(traces)[0]["market"]]
    assert {(row["run"], row["episode"], row["return"], row["advantage"]) for row in rows} == {
        (None, "a", 0.5, 1.0), (None, "b", 0.3, -1.0), ("second", "b", 0.5, 1.0), ("second", "a", 0.3, -1.0)}


@needs_datasets
def test_the_file_loads_with_datasets_as_written(traces, tmp_path, capsys):
    import datasets

    out = tmp_path / "out" / "decisions.parquet"
    assert main(["export", "--traces", str(traces), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote 5 decisions of 3 episodes (2 markets) to {out}\n")
    loaded = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert loaded.column_names == list(COLUMNS) and loaded.num_rows == 5
    expected = _rows(traces)
    assert loaded.to_list() == expected
    assert loaded.features["prompt"] == datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})
    assert loaded.features["reward"] == datasets.Value("float64") and loaded.features["prompt_ids"] == datasets.List(
        datasets.Value("int64"))
    import pyarrow.parquet as pq

    made = json.loads(pq.read_schema(out).metadata[b"negotiate.export"])
    assert made["reward"] == "profit-penalized" and made["prompt"] == "full" and made["traces"] == [str(traces)]
    assert sorted(p.name for p in out.parent.iterdir()) == ["decisions.parquet"]  # no partial file left beside it


def test_without_pyarrow_it_says_which_extra_in_one_line(traces, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as on a core install
    out = tmp_path / "d.parquet"
    assert main(["export", "--traces", str(traces), "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("negotiate export: error: export: writes Parquet with pyarrow, which is not installed; "
                                       "it comes with the train extra: pip install 'negotiate[train]'\n")
    assert not out.exists()


@pytest.mark.parametrize(("argv", "line"), [
    ([], "--traces: give the traces to export: --traces DIR"),
    (["--traces", "nowhere"], "nowhere: no such trace file or folder"),
    (["--traces", "TRACES", "--set", "split=train"], "TRACES: no episode to export (each needs an episode_end and a reward; check "
                                                     "split, seller and min_group against the traces)"),
    (["--traces", "TRACES", "--set", "teacher=random"], "--set: teacher: 'random': this seller cannot follow another seller's episode"),
    (["--traces", "TRACES", "--set", "min_group=0"], "--set: min_group: 0: must be at least 1"),
    (["--traces", "TRACES", "--reward", "luck"], "--reward: 'luck': must be one of profit-penalized, profit, welfare, adherence"),
])
def test_bad_input_is_one_line_and_writes_nothing(traces, tmp_path, capsys, argv, line):
    out = tmp_path / "d.parquet"
    argv = [str(traces) if word == "TRACES" else word for word in argv]
    assert main(["export", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("negotiate export: error: " + line.replace("TRACES", str(traces))) and err.count("\n") == 1, err
    assert not out.exists()


def test_an_existing_file_is_not_overwritten(traces, tmp_path, capsys):
    out = tmp_path / "d.parquet"
    out.write_bytes(b"mine")
    assert main(["export", "--traces", str(traces), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"negotiate export: error: --out: '{out}': already exists; choose another --out (nothing is overwritten)\n"
    assert out.read_bytes() == b"mine"
    assert main(["export", "--traces", str(traces), "--out", str(tmp_path)]) == 2
    assert "is a folder; give the Parquet file to write" in capsys.readouterr().err


@needs_datasets
def test_export_is_the_function_the_command_runs(traces, tmp_path):
    wrote = export(ExportConfig(traces=(str(traces),), out=tmp_path / "x.parquet", min_group=2))  # c's market has one episode
    assert wrote == {"rows": 4, "episodes": 2, "markets": 1}
