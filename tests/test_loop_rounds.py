"""``negotiate loop``'s round methods (training/loop/rounds/) and the command lines the stages build from them
(training/loop/stages.py): what each method adds to a round's ``train``, and which traces a round trains on."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from negotiate.training.loop import LoopConfig
from negotiate.training.loop.config import ROUND_METHODS
from negotiate.training.loop.rounds import ROUNDS
from negotiate.settings import read_file
from negotiate.training.loop.stages import round_config, sft_config, train_args
from negotiate.training.trainer import TrainConfig

OUT = Path("run")


def _config(**kw) -> LoopConfig:
    return LoopConfig(**({"out": str(OUT), "bf16": False, "teacher": "planner", "grpo_batch": 16, "grpo_lr": 2e-4, "lora_r": 16,
                          "seed": 7, "micro_batch": 8} | kw))


def _round_2(config: LoopConfig) -> TrainConfig:
    return round_config(config, 2, [OUT / "round-02" / "rollouts"], OUT / "base", OUT / "round-01" / "checkpoint" / "adapter",
                        OUT / "round-02" / "checkpoint")


COMMON = {"traces": ("run/round-02/rollouts",), "model": "run/base", "adapter": "run/round-01/checkpoint/adapter",
          "out": "run/round-02/checkpoint", "batch_size": 16, "lr": 2e-4, "seed": 9}
"""Round 2's training settings that every method shares and that are not the trainer's defaults, worked out from
``_config``: its seed is the run's 7 + 2; one epoch, rank 16, micro-batch 8, no bf16 and the full prompt are the
trainer's defaults too, so they do not show."""


def _changed(train: TrainConfig) -> dict:
    """The settings of ``train`` that are not the trainer's defaults."""
    default = TrainConfig()
    return {f.name: getattr(train, f.name) for f in fields(TrainConfig) if getattr(train, f.name) != getattr(default, f.name)}


def test_the_round_methods_are_the_loops_choices_in_the_order_its_help_lists_them():
    assert ROUND_METHODS == tuple(ROUNDS) == ("rft", "dagger", "offline-grpo")
    assert all(method.name == name for name, method in ROUNDS.items())


@pytest.mark.parametrize("method, added", [
    ("rft", {"method": "rft", "action_weights": "accept=4"}),
    ("dagger", {"method": "dagger", "teacher": "planner", "min_group": 1, "action_weights": "accept=4"}),
    ("offline-grpo", {"method": "offline-grpo", "kl_beta": 0.05}),  # weighs by advantage: the action weights are not its
])
def test_each_round_method_adds_its_own_settings_to_the_rounds_train(method, added):
    config = _config(round_method=method, action_weights="accept=4", kl_beta=0.05)
    assert _changed(_round_2(config)) == COMMON | added


def test_the_rounds_weigh_by_round_action_weights_where_given_and_by_none_when_told_none():
    assert _round_2(_config(action_weights="accept=4", round_action_weights="")).action_weights == ""
    assert _round_2(_config(action_weights="accept=4", round_action_weights="offer=2")).action_weights == "offer=2"


def test_every_setting_a_round_method_adds_is_a_trainer_field():
    # The flags a round adds are TrainConfig fields by name, so a typed TrainConfig can take them as they are.
    names = {f.name for f in fields(TrainConfig)}
    config = _config(action_weights="accept=4", kl_beta=0.05)
    for method in ROUNDS.values():
        assert set(method.train_options(config)) <= names, method.name


def test_a_dagger_round_trains_on_its_rollouts_or_aggregated_on_the_teachers_episodes_and_every_rollout_so_far():
    dagger = ROUNDS["dagger"]
    assert dagger.traces(_config(round_method="dagger"), OUT, 3) == [OUT / "round-03" / "rollouts"]
    assert dagger.traces(_config(round_method="dagger", aggregate=True), OUT, 3) == [
        OUT / "round-00" / "teacher", OUT / "round-01" / "rollouts", OUT / "round-02" / "rollouts", OUT / "round-03" / "rollouts"]
    assert ROUNDS["rft"].traces(_config(), OUT, 3) == ROUNDS["offline-grpo"].traces(_config(), OUT, 3) == [OUT / "round-03" / "rollouts"]


def test_only_dagger_learns_from_one_episode_per_market():
    assert {name: method.min_group for name, method in ROUNDS.items()} == {"rft": 2, "dagger": 1, "offline-grpo": 2}


def test_sft_trains_the_base_model_on_the_teachers_episodes_with_the_runs_settings(tmp_path):
    config = _config(sft_steps=100, sft_batch=8, sft_lr=4e-4, action_weights="accept=4", threads=2, bf16=True, prompt="facts")
    train = sft_config(config, OUT / "round-00" / "teacher", OUT / "base", OUT / "round-00" / "checkpoint")
    assert _changed(train) == {"traces": ("run/round-00/teacher",), "model": "run/base", "out": "run/round-00/checkpoint",
                               "max_steps": 100, "lr": 4e-4, "seed": 7, "action_weights": "accept=4", "threads": 2, "bf16": True,
                               "prompt": "facts"}  # batch 8, micro-batch 8, rank 16 and method sft are the trainer's defaults
    # The stage runs `train --config FILE` in a child process: the file beside the checkpoint gives back the same config.
    where = replace_out(train, tmp_path / "round-00" / "checkpoint")
    argv = train_args(where)
    assert argv == ["train", "--config", str(tmp_path / "round-00" / "train.toml"), "--quiet"]
    assert TrainConfig(**read_file(argv[2], TrainConfig, command="train")) == where


def replace_out(train: TrainConfig, out: Path) -> TrainConfig:
    from dataclasses import replace

    return replace(train, out=str(out))
