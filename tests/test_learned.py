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


@needs_torch
@pytest.mark.timeout(600)
async def test_a_person_bargains_against_it_in_the_terminal_ui(tmp_path):
    # negotiate play --role buyer --seller learned: the person's buyer rejects every offer (bids $1 where none stands) till
    # the episode ends; each of learned's messages is a menu option, valid, addressed to the person (the only buyer).
    from test_tui import SIZE, SOLO, my_turn, session, until

    from negotiate.tui.app import NegotiateApp
    from negotiate.tui.results import ResultScreen

    play = session(tmp_path, "buyer", seller="learned")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(SOLO.budget):
            await my_turn(pilot, play)
            if play.result is not None:
                break
            left = play.state.budget_left
            if play.view().offer:
                await pilot.press("ctrl+r", "enter")  # reject the standing offer
            else:
                await pilot.press("1", "enter")  # nothing to reject: bid $1 (the turn opens on a bid's price)
            await until(pilot, lambda: play.state.budget_left < left or play.result is not None)  # the message went
        await until(pilot, lambda: isinstance(app.screen, ResultScreen))
    sent = [e for e in play.result.episode.events if e["type"] == "message" and e["sender"] == "seller"]
    assert sent and all(e["valid"] and e["extra"]["format"] == "menu" and e["to"] == "b1" for e in sent)
