"""``negotiate teach``: imitation of the planner on the menu, replay rounds, held-out evaluation beside baselines, end to
end on a small model (seconds), from the command line."""

from __future__ import annotations

import asyncio
import importlib.util
import json

import pytest

from negotiate.cli import main
from negotiate.errors import UserError
from negotiate.training.teach import TeachConfig

HAVE_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch and transformers (the hf extra)")

SMALL = """
hidden = 32
layers = 1
heads = 2
vocab = 320
buyers = ["concession", "threshold"]
splits = ["specs/compact.toml"]
sft_markets = 8
sft_epochs = 1.0
rounds = 1
round_markets = 4
round_epochs = 1.0
eval_markets = 4
baselines = ["planner", "menu"]
batch_size = 16
threads = 1
"""


@pytest.mark.timeout(600)
def test_teach_runs_the_recipe_end_to_end_and_its_policy_plays(tmp_path):
    config = tmp_path / "teach.toml"
    config.write_text(SMALL)
    out = tmp_path / "run"
    assert main(["teach", "--config", str(config), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["stages"]) == ["sft", "round-1"]
    for stage in results["stages"].values():
        assert stage["valid"] == 1.0  # every move is on the menu
        assert {b: [len(v) for v in by.values()] for b, by in stage["ratios"].items()} == {"concession": [4], "threshold": [4]}
    assert set(results["baselines"]) == {"planner", "menu"}
    table = (out / "results.md").read_text()
    assert "## concession buyers" in table and "| policy after round-1 |" in table and "| planner |" in table
    assert (out / "curve.png").stat().st_size > 1000
    # The evaluation traces are the policy's: a menu seller, greedy, on the held-out markets.
    from negotiate.trace import read_records

    (episode, *_) = read_records(out / "stage-01-round" / "eval-concession.jsonl")
    assert episode.start.run_seed == 1_000_003 and episode.seller_messages()[0].extra["format"] == "menu"
    # The last stage's policy is a folder hf: plays with prompt=menu.
    from negotiate.agents.registry import parse_agent
    from negotiate.run import Run, RunConfig

    spec = f"hf:{out / 'policy'}?prompt=menu&temperature=0"
    run = Run(RunConfig(sellers=(spec,), buyers="concession", split="specs/compact.toml", seed=3, fresh=True))

    async def play():
        async with run:
            return await run.episode(parse_agent(spec, "seller"), 0).play()

    assert asyncio.run(play()).metrics["seller_invalid"] == 0


def test_the_studies_teach_configs_check():
    from pathlib import Path

    from negotiate.settings import read_file

    paths = [path for path in sorted(Path("docs/experiments").glob("*.toml")) if path.read_text().startswith("# negotiate teach")]
    assert {path.stem for path in paths} >= {"learned", "learned-quick", "learned-rollout"}
    for path in paths:
        config = TeachConfig(**read_file(path, TeachConfig, command="teach"))
        json.dumps(config.to_json())  # its record (config.json), a start folder's path included
        if config.start is not None and not Path(config.start).exists():
            assert path.stem == "learned-pg" and str(config.start) == "runs/learned/stage-00-sft/policy"  # learned.toml makes it
            config.start = None
        config.check()
        assert config.eval_seed != config.seed and config.splits


def test_a_bad_setting_is_one_line():
    with pytest.raises(UserError, match="eval_seed: 7: is the training markets' run seed"):
        TeachConfig(eval_seed=7).check()
    with pytest.raises(UserError, match="baselines"):
        TeachConfig(baselines=("nobody",)).check()
