"""A loop run's state: ``loop.json`` in the run folder (:class:`State`: the config, the finished stages, each round's
held-out summary, the serving choice, the port), what a rerun may change of a run it resumes, and starting a run
from an earlier run's finished round 0 (``--sft-from``, :func:`take_round0`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import structlog

from negotiate.errors import UserError
from negotiate.training.loop.config import LoopConfig, _flag, _list

__all__ = ["BEFORE_FLAGS", "EVAL_FIELDS", "RESUMABLE_CHANGES", "ROUND0_STAGES", "SFT_FIELDS", "SFT_STAGES", "State", "take_round0"]

log = structlog.get_logger("negotiate.loop")

BEFORE_FLAGS = {"teacher_traces": None, "round_method": "offline-grpo", "round_epochs": 1.0, "sft_from": None, "legal": False, "grounded": False, "prompt": "full",
                "aggregate": False, "fresh": False, "action_weights": "", "round_action_weights": None, "eval_buyers": "threshold",
                "rule_tables": ""}
"""What a run made before a flag existed did: rounds were offline GRPO, one pass, unconstrained, the full prompt, each round
on its own rollouts only, every imitated decision weighing 1, the rounds weighing as the SFT, evaluated against threshold buyers,
no lookup table beside the fixed rules."""
RESUMABLE_CHANGES = ("rounds", "concurrency", "threads")
"""Flags a rerun may change; any other change to a run's config is refused, but for ``--eval-buyers``, to which a rerun
may add buyer specs (columns: the baselines and every finished round are then evaluated against them too), and ``--out``
(a run folder moved or copied elsewhere resumes there)."""

SFT_FIELDS = ("model", "teacher", "teacher_traces", "split", "buyers", "seed", "teacher_episodes", "sft_steps", "sft_batch", "sft_lr", "lora_r", "bf16",
              "micro_batch", "max_tokens", "serve", "server_url", "prompt", "action_weights", "fresh")
"""Flags that round 0's model depends on: ``--sft-from`` takes an earlier run's SFT only where they all match."""
EVAL_FIELDS = ("eval_splits", "eval_buyers", "eval_episodes", "eval_seed", "eval_temperature", "ladder", "untrained", "legal", "grounded", "fresh")
"""Flags that round 0's evaluations depend on: where one differs, ``--sft-from`` takes the SFT and evaluates it again."""
SFT_STAGES = ("export", "round 0 teacher", "round 0 train", "serving")
ROUND0_STAGES = (*SFT_STAGES, "baselines", "round 0 eval")


def _keep_bf16(config: LoopConfig, theirs: dict, saved: dict) -> None:
    """Where ``--bf16`` was left to the machine, take the earlier run's decision (``theirs``, its loop.json config):
    a run started where bf16 is fast and resumed where it is not trains on as it began, rather than being refused."""
    if getattr(config, "bf16_decided", False) and isinstance(theirs.get("bf16"), bool):
        config.bf16 = saved["bf16"] = theirs["bf16"]


def _is_eval_stage(stage: str) -> bool:
    """The stages that evaluate against each ``--eval-buyers`` column: ``baselines``, ``round K eval``."""
    return stage == "baselines" or (stage.startswith("round ") and stage.endswith(" eval"))


class State:
    """``loop.json``: written whole and renamed into place after every finished stage. ``columns``: for each
    finished evaluation stage, the ``--eval-buyers`` it evaluated against (a rerun may add some)."""

    def __init__(self, path: Path, config: LoopConfig):
        self.path = path
        self.buyers = _list(config.eval_buyers)
        self.data = {"config": config.to_json(), "done": [], "rounds": {}, "serving": None, "port": None, "columns": {}}
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except ValueError as error:
                raise UserError(f"not a valid loop.json ({error})", source=str(path)) from None
            theirs = {**BEFORE_FLAGS, **old.get("config", {})}
            _keep_bf16(config, theirs, self.data["config"])
            key = _first_difference(theirs, self.data["config"], [k for k in theirs if k not in (*RESUMABLE_CHANGES, "eval_buyers", "out")])
            before = _list(theirs["eval_buyers"])
            if key is None and not set(before) <= set(self.buyers):
                key = "eval_buyers"  # a column may be added, not taken away: the run's results would lose it
            if key is not None:
                same = "every one of them (columns may be added)" if key == "eval_buyers" else "the same value"
                raise UserError(f"the run in {path.parent} has {_flag(key)} {theirs[key]!r}; rerun with {same} to resume it, "
                                f"or choose another --out", field=_flag(key), value=self.data["config"].get(key))
            # A run from before columns were kept evaluated each finished stage against its own --eval-buyers.
            old.setdefault("columns", {stage: before for stage in old["done"] if _is_eval_stage(stage)})
            old["config"] = self.data["config"]
            self.data = old

    def missing(self, stage: str) -> list[str]:
        """The ``--eval-buyers`` columns evaluation ``stage`` has not evaluated against yet."""
        have = self.data["columns"].get(stage, []) if stage in self.data["done"] else []
        return [buyers for buyers in self.buyers if buyers not in have]

    def done(self, stage: str) -> bool:
        return stage in self.data["done"] and not (_is_eval_stage(stage) and self.missing(stage))

    def finish(self, stage: str) -> None:
        if stage not in self.data["done"]:
            self.data["done"].append(stage)
        if _is_eval_stage(stage):
            self.data["columns"][stage] = list(self.buyers)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        os.replace(tmp, self.path)

def take_round0(source: Path, out: Path, config: LoopConfig, state: State) -> None:
    """Start ``out`` from ``source``'s finished round 0 (``--sft-from``): its folders are hard-linked (copied
    across file systems), its stages, serving choice and round-0 summary recorded as done here; the port is this run's.
    Where an evaluation flag differs, only the SFT is taken; the baselines and round 0's evaluation run again."""
    try:
        other = json.loads((source / "loop.json").read_text())
    except ValueError as error:
        raise UserError(f"not a valid loop.json ({error})", source=str(source / "loop.json")) from None
    theirs = {**BEFORE_FLAGS, **other.get("config", {})}
    _keep_bf16(config, theirs, state.data["config"])
    name = _first_difference(theirs, config.to_json(), [name for name in SFT_FIELDS if name in theirs])
    if name is not None:
        raise UserError(f"the run in {source} has {_flag(name)} {theirs[name]!r}; round 0 depends on it, so give the same value",
                        field=_flag(name), value=getattr(config, name))
    missing = [stage for stage in ROUND0_STAGES if stage not in other.get("done", [])]
    if missing:
        raise UserError(f"round 0 of that run is not finished ({', '.join(missing)} missing): finish it first", field="--sft-from",
                        value=str(source))
    # Other buyer columns do not change an evaluation: those both runs have are taken, the others run here.
    same_eval = _first_difference(theirs, config.to_json(), [name for name in EVAL_FIELDS if name in theirs and name != "eval_buyers"]) is None
    stages = ROUND0_STAGES if same_eval else SFT_STAGES
    skip = None if same_eval else source / "round-00" / "eval"  # evaluated again here, under this run's flags
    for name in ("base", "round-00", "baselines"):
        target = out / name
        if target.exists():
            shutil.rmtree(target)  # a cut earlier attempt's copy: never resumed as if it were this run's
        if same_eval or name != "baselines":
            shutil.copytree(source / name, target, copy_function=_link_or_copy,
                            ignore=lambda folder, names: [n for n in names if Path(folder) / n == skip])
    data = state.data
    data["done"] = list(stages)
    if same_eval:
        shared = [buyers for buyers in state.buyers if buyers in _list(theirs["eval_buyers"])]
        data["columns"] = {stage: shared for stage in stages if _is_eval_stage(stage)}
        data["rounds"]["0"] = {buyers: summary for buyers, summary in other["rounds"]["0"].items() if buyers in shared}
    # Not the source's port: this run's server is its own (two runs from one SFT may run at once), and its policies
    # are told apart from the source's in cross-run reports by their URL.
    data["serving"] = other.get("serving")
    data["seconds"] = {stage: seconds for stage, seconds in (other.get("seconds") or {}).items() if stage in stages}
    data["sft_from"] = str(source.resolve())
    state.save()
    log.info("round 0 taken", source=str(source), evaluations="taken" if same_eval else "to run again")


def _first_difference(theirs: dict, ours: dict, names) -> str | None:
    """The first of ``names`` whose value in an earlier run's config (``theirs``) is not this run's."""
    return next((name for name in names if ours.get(name) != theirs[name]), None)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
