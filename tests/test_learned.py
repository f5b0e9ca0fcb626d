"""``learned``: the seller taught by replaying the market, shipped in the package (docs/experiments/learned.md). It is
listed by ``negotiate agents``, parsed as the shipped folder played as a menu policy, greedily, and plays with every
message valid from the command line, on a core install plus the hf extra."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from negotiate.agents.registry import LEARNED, learned_path, parse_agent
from negotiate.cli import main
from negotiate.errors import UserError

HAVE_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch and transformers (the hf extra)")


def test_the_policy_ships_in_the_package_under_10_mb():
    folder = learned_path()
    files = {path.name: path.stat().st_size for path in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files), files
    assert sum(files.values()) < 10 * 2**20, files
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama"


def test_agents_lists_it(capsys):
    assert main(["agents"]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"│ {LEARNED} +│ The seller taught by replaying +│", out)
    assert "needs pip install 'negotiate[hf]'" in " ".join(re.sub(r"[│ ]+", " ", out).split())  # printed, not read as markup


@needs_torch
def test_it_parses_as_the_shipped_folder_played_greedily_on_the_menu():
    spec = parse_agent("learned", "seller")
    assert (spec.text, spec.backend, spec.name) == ("learned", "hf", "learned")
    assert spec.params["path"].rstrip("/") == str(learned_path()) and spec.params["prompt"] == "menu"
    assert spec.params["temperature"] == 0.0
    assert parse_agent("learned?temperature=1", "seller").params["temperature"] == 1.0
    with pytest.raises(UserError, match="its prompt is menu"):
        parse_agent("learned?prompt=full", "seller")
    with pytest.raises(UserError, match="learned is a seller"):
        parse_agent("learned", "buyer")


@needs_torch
@pytest.mark.timeout(600)
def test_serve_compares_it_with_the_planner_every_message_valid(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["serve", "--seller", "learned,planner", "--buyers", "concession", "--split", "specs/compact.toml",
                 "--episodes", "8", "--fresh", "--out", str(out), "--quiet"]) == 0
    from negotiate.trace import read_records

    episodes = list(read_records(out / "learned.jsonl"))
    assert len(episodes) == 8
    assert all(e.metrics["seller_invalid"] == 0 and e.metrics["seller_messages"] >= 1 for e in episodes)
    assert all(m.extra["format"] == "menu" for e in episodes for m in e.seller_messages())
