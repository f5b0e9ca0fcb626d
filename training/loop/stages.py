"""The loop's stages and how each runs: as a ``negotiate`` command in a child process (:func:`run_stage`), so that
everything a stage writes is a trace or a checkpoint the other commands read, and a stage's memory (a model in
training) is given back when it ends. The teacher's episodes (``serve``), SFT and each round's training (``train``),
a round's rollouts (``collect``) and the held-out evaluations (``eval``) are the methods of :class:`Stages`.

Each stage is a typed config: a :class:`TrainConfig` for training, a :class:`Play` (a ``RunConfig`` and its
``RunOptions``) for a stage that plays. It is written as the TOML file its command reads (``round-01/train.toml``,
``round-01/eval/threshold.toml``: a record of what ran) and run as ``negotiate COMMAND --config FILE``; the command
lines are built here and nowhere else."""

from __future__ import annotations

import ctypes
import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from negotiate.run import RunConfig, RunOptions
from negotiate.runner import slug as _slug
from negotiate.settings import to_keys, to_toml
from negotiate.trace import trace_files
from negotiate.training.loop.config import LoopConfig, _list
from negotiate.training.loop.report import rule_baselines, write_report
from negotiate.training.loop.rounds import ROUNDS, learning_signal
from negotiate.training.loop.serving import Serving
from negotiate.training.loop.state import State
from negotiate.training.loop.summary import summarize_folder
from negotiate.training.trainer import TrainConfig

__all__ = ["FAILED_EPISODES", "STOP_GRACE", "FailedEpisodes", "LoopError", "Stages", "run_stage"]

log = structlog.get_logger("negotiate.loop")


class LoopError(RuntimeError):
    """A stage that failed; the message is one line naming the stage and why."""


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


class FailedEpisodes(LoopError):
    """A serve, collect or eval stage that ran to its end with failed episodes (a server that died, say): not finished.
    Its finished episodes are kept; :meth:`Stages.play` plays the failed ones again once, and stops the loop if they
    fail again. A table is never made from what is left."""


PROGRESS_EVERY = 15.0
"""Seconds between two looks at a running stage's progress (a line is shown only when it says something new)."""


def train_progress(out: Path, total: int | None):
    """What a training stage has done, read off its ``metrics.jsonl``: ``step 12/120, 150.2 s a step``."""

    def look() -> str | None:
        try:
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            return None
        steps = [row for row in rows if "loss" in row]
        if not steps:
            return "loading the model and the data"
        mean = sum(row.get("seconds", 0.0) for row in steps) / len(steps)
        return f"step {steps[-1]['step']}{f'/{total}' if total else ''}, {mean:.1f} s a step"

    return look


def episodes_progress(folder: Path, total: int):
    """What a stage that plays episodes has done, read off its traces: ``37 of 192 episodes``."""

    def look() -> str:
        done = 0
        for path in folder.rglob("*.jsonl"):
            if not path.name.endswith(".log.jsonl"):
                try:
                    done += path.read_bytes().count(b'"type":"episode_end"')
                except OSError:
                    pass
        return f"{done} of {total} episodes"

    return look


def run_stage(name: str, args: list[str], out_file: Path, *, tolerate_failed_episodes: bool = True, progress=None,
              echo=lambda line: None) -> float:
    """Run ``negotiate ARGS`` as a child; its output goes to ``out_file``. Returns seconds; raises LoopError, and
    :class:`FailedEpisodes` where a stage that plays episodes (``tolerate_failed_episodes``) ended with failed ones.
    ``progress``: a callable saying what the stage has done so far, shown through ``echo`` when it changes (looked at
    every :data:`PROGRESS_EVERY` seconds, with the time the stage has taken)."""
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
            shown = None
            while True:
                try:
                    code = child.wait(timeout=PROGRESS_EVERY if progress is not None else None)
                    break
                except subprocess.TimeoutExpired:
                    said = progress()
                    if said and said != shown:
                        echo(f"loop: {name}: {said} ({time.perf_counter() - began:.0f}s)")
                        shown = said
        except BaseException:
            _stop(child)
            raise
    seconds = time.perf_counter() - began
    with open(out_file, "rb") as out:
        out.seek(start)
        printed = out.read().decode(errors="replace")
    if code == 1 and tolerate_failed_episodes and FAILED_EPISODES in printed:
        # Exit 1 with that line: the run went to its end, and some episodes failed (each is in the trace with its
        # reason). Not finished: the stage plays them again or stops the loop (a table from the rest would mislead).
        # Exit 1 without it is a crash (a Python traceback exits 1 too).
        said = next(line.strip() for line in printed.splitlines() if FAILED_EPISODES in line)
        log.warning("stage had failed episodes", stage=name, output=str(out_file))
        raise FailedEpisodes(f"{name}: {said[:300]} (output: {out_file})")
    if code != 0:
        lines = [line.strip() for line in printed.splitlines() if line.strip()]
        reason = lines[-1] if lines else "(no output)"
        raise LoopError(f"{name} failed (exit {code}): {reason[:400]} (output: {out_file})")
    log.info("stage done", stage=name, seconds=round(seconds, 1))
    return seconds

# -- the command lines ----------------------------------------------------------------------------------


def _policy_spec(url: str, name: str, config: LoopConfig, temperature: float) -> str:
    """The agent spec of the policy the server serves as ``name``: the config's policy at ``temperature``, as the policy
    writes itself (:meth:`~negotiate.agents.policy.Policy.query`), with the loop's client settings (the keys in the
    order the loop has always written them: the spec names the trace files)."""
    policy = replace(config.policy, temperature=temperature)
    return f"openai:{name}@{url}?" + policy.query("vllm", logprobs=1, timeout=1800, retries=2, max_inflight=config.concurrency)


@dataclass(frozen=True)
class Play:
    """A stage that plays episodes, typed: the command (``serve``, ``collect`` or ``eval``), what the run is
    (:class:`RunConfig`: for ``eval``, ``split`` lists the splits) and how it is played (:class:`RunOptions`). It runs as
    ``negotiate COMMAND --config FILE``, the file holding exactly these settings (:func:`play_settings`)."""

    command: str
    config: RunConfig
    options: RunOptions

    def episodes(self) -> int:
        """The episodes it plays in all: per seller (markets x group for collect), x sellers, x splits for eval."""
        splits = len(_list(self.config.split)) if self.command == "eval" else 1
        return self.config.episodes * len(self.config.sellers) * splits


def play_settings(play: Play) -> dict:
    """The settings of ``play`` as its command's keys (``--keys``; :func:`~negotiate.settings.to_keys`): ``markets`` for
    collect's episodes, the sellers joined as ``--seller`` takes them, a shard as K/N; a setting left unset (None) is
    left out."""
    return to_keys(play.command, play.config, play.options)


def _settings_file(folder: Path) -> Path:
    """Where a play stage's settings are written: beside its folder (``round-01/eval/threshold.toml``), so that a stage
    started over (its folder removed) keeps the record."""
    return folder.with_name(folder.name + ".toml")


def play_args(play: Play, folder: Path) -> list[str]:
    """The command of a play stage: its typed settings written as the TOML file beside ``folder``, and the command that
    reads them; resumed where ``folder`` already holds a run (which keeps its own settings: the file's are the same),
    new otherwise."""
    marker = "eval.json" if play.command == "eval" else "run.json"
    file = _settings_file(folder)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(to_toml(play_settings(play)))
    if (folder / marker).exists():
        return [play.command, "--resume", str(folder), "--config", str(file), "--quiet"]
    if folder.exists():
        shutil.rmtree(folder)
    return [play.command, "--config", str(file), "--out", str(folder), "--quiet"]


def retry_args(args: list[str], folder: Path) -> list[str]:
    """The command that runs a stage again: the run in ``folder`` resumed, its failed episodes played again
    (``--resume --retry-failed``); ``args`` again where the first try left no run there."""
    marker = "eval.json" if args[0] == "eval" else "run.json"
    if not (folder / marker).exists():
        return args
    return [args[0], "--resume", str(folder), "--retry-failed", "--config", str(_settings_file(folder)), "--quiet"]


def _play(command: str, config: LoopConfig, *, sellers: str, split: str, buyers: str, episodes: int, seed: int, group: int = 1,
          max_inflight: int | None = None) -> Play:
    """A play stage of the loop: deadlines no CPU model misses, the loop's concurrency, ``fresh`` as the loop has it."""
    run = RunConfig(sellers=tuple(_list(sellers)), buyers=buyers, split=split, episodes=episodes * group, group=group, seed=seed,
                    seller_timeout=3600.0, reply_timeout=3600.0, fresh=config.fresh)
    return Play(command, run, RunOptions(concurrency=config.concurrency, max_inflight=max_inflight))


def _train_common(config: LoopConfig) -> dict:
    """The trainer settings every ``train`` of the run takes (SFT and rounds alike)."""
    return {"threads": config.threads, "micro_batch": config.micro_batch, "bf16": config.bf16, "prompt": config.prompt,
            "lora_r": config.lora_r}


def teacher_play(config: LoopConfig) -> Play:
    """The teacher's episodes on the training split (``serve``), for SFT."""
    return _play("serve", config, sellers=config.teacher, split=config.split, buyers=config.buyers,
                 episodes=config.teacher_episodes, seed=config.seed)


def sft_config(config: LoopConfig, traces: Path, base: Path, out: Path) -> TrainConfig:
    """Round 0's training: SFT of the base model on the teacher's episodes in ``traces``."""
    return TrainConfig(method="sft", traces=(str(traces),), model=str(base), out=str(out), max_steps=config.sft_steps,
                       batch_size=config.sft_batch, lr=config.sft_lr, seed=config.seed, action_weights=config.action_weights,
                       **_train_common(config))


def round_config(config: LoopConfig, k: int, traces: list[Path], base: Path, adapter: Path, out: Path) -> TrainConfig:
    """Round ``k``'s training by its method on ``traces``, continuing the previous round's ``adapter``."""
    steps = {"max_steps": config.grpo_steps} if config.grpo_steps else {"epochs": config.round_epochs}
    return TrainConfig(method=config.round_method, traces=tuple(map(str, traces)), model=str(base), adapter=str(adapter), out=str(out),
                       batch_size=config.grpo_batch, lr=config.grpo_lr, seed=config.seed + k, **steps,
                       **ROUNDS[config.round_method].train_options(config), **_train_common(config))


def train_args(train: TrainConfig) -> list[str]:
    """The ``train`` command of a typed config: the config written as the TOML file ``train.toml`` beside its checkpoint
    folder (a record of what trained it), run in a child process (a model in training wants its own memory)."""
    file = Path(train.out).parent / "train.toml"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(to_toml(train))
    return ["train", "--config", str(file), "--quiet"]


def collect_play(config: LoopConfig, k: int, seller: str) -> Play:
    """Round ``k``'s rollouts: groups of episodes of the previous round's policy (``seller``) on the training split."""
    return _play("collect", config, sellers=seller, split=config.split, buyers=config.buyers, episodes=config.markets,
                 group=config.group, seed=config.seed + k, max_inflight=config.concurrency)


def eval_play(config: LoopConfig, sellers: str, buyers: str) -> Play:
    """``sellers`` (comma-separated) on the held-out markets against ``buyers``."""
    return _play("eval", config, sellers=sellers, split=config.eval_splits, buyers=buyers, episodes=config.eval_episodes,
                 seed=config.eval_seed, max_inflight=config.concurrency)


# -- the stages -------------------------------------------------------------------------------------------


def _fresh(folder: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)  # a training cut short starts over: its partial checkpoint is not a policy


class Stages:
    """The stages of one run in ``out``: each does its work and returns; recording it as finished is the caller's."""

    def __init__(self, config: LoopConfig, out: Path, state: State, serving: Serving, echo=lambda line: None):
        self.config, self.out, self.state, self.serving, self.echo = config, out, state, serving, echo
        self.base = out / "base"
        self.log_file = out / "loop.out"
        """Where every stage's output goes."""

    def round_folder(self, k: int) -> Path:
        return self.out / f"round-{k:02d}"

    def play(self, name: str, play: Play, folder: Path, serves: int | None | bool = False) -> None:
        """Run a stage that plays episodes into ``folder``, with the policy of round ``serves`` in service (None: the
        untrained model's; False: the stage needs no server). Where some episodes failed, or the stage failed with the
        loop's server dead (it died mid-stage, say), the server is restarted and the stage run again once, playing only
        what is missing or failed; if that fails too, the stage is not finished and the loop stops with one line saying
        why (exit 1). Nothing is summarized from what is left."""
        shown = {"progress": episodes_progress(folder, play.episodes()), "echo": self.echo}
        args = play_args(play, folder)
        try:
            run_stage(name, args, self.log_file, **shown)
            return
        except FailedEpisodes as first:
            log.warning("failed episodes: playing them again", stage=name, why=str(first))
        except LoopError as first:
            if serves is False or not self.serving.down():
                raise
            log.warning("the server is down: restarting it and running the stage again", stage=name, why=str(first))
        if serves is not False:
            self.serving.restart(serves)
        try:
            run_stage(f"{name}, again", retry_args(args, folder), self.log_file, **shown)
        except LoopError as second:
            raise LoopError(f"{second}; it failed again after the server was restarted: the stage is not finished") from None
    def train(self, name: str, train: TrainConfig) -> None:
        """Run a training stage (a child process on the typed config), its progress shown from its metrics."""
        run_stage(name, train_args(train), self.log_file, tolerate_failed_episodes=False, echo=self.echo,
                  progress=train_progress(Path(train.out), train.max_steps))

    def export(self) -> None:
        from negotiate.training.trainer import export_model

        export_model(self.config.model, self.base)

    def teacher(self) -> None:
        """Round 0's teacher episodes: played by ``--teacher``, or with ``--teacher-traces`` copied into the run."""
        config, folder = self.config, self.round_folder(0) / "teacher"
        if config.teacher_traces is None:
            self.play("teacher episodes", teacher_play(config), folder)
            return
        _fresh(folder)
        folder.mkdir(parents=True)
        for k, path in enumerate(trace_files(_list(config.teacher_traces))):  # the run keeps what it learned from
            shutil.copyfile(path, folder / f"{k:02d}-{path.name}")

    def sft(self) -> None:
        r0 = self.round_folder(0)
        self.serving.before_training()
        _fresh(r0 / "checkpoint")
        self.train("round 0 sft", sft_config(self.config, r0 / "teacher", self.base, r0 / "checkpoint"))

    def baselines(self) -> None:
        """The scripted ladder, the fixed rules over the prompt's tools (:func:`rule_baselines`), and the untrained
        model, on the held-out markets: each buyer column not yet evaluated."""
        config = self.config
        for buyers in self.state.missing("baselines"):
            target = self.out / "baselines" / _slug(buyers)
            sellers = _list(config.ladder)
            sellers += [rule for rule in rule_baselines(config) if rule not in sellers]
            if config.untrained:
                url, name = self.serving.policy(None)
                sellers.append(_policy_spec(url, name, config, config.eval_temperature))
            self.play(f"baselines ({buyers})", eval_play(config, ",".join(sellers), buyers), target,
                      None if config.untrained else False)

    def evaluate(self, k: int) -> None:
        """Round ``k``'s policy on the held-out markets (each buyer column not yet evaluated), its summary, the report."""
        config, folder = self.config, self.round_folder(k) / "eval"
        for buyers in self.state.missing(f"round {k} eval"):
            url, name = self.serving.policy(k)
            spec = _policy_spec(url, name, config, config.eval_temperature)
            self.play(f"round {k} eval ({buyers})", eval_play(config, spec, buyers), folder / _slug(buyers), k)
        self.state.data["rounds"][str(k)] = {buyers: summarize_folder(folder / _slug(buyers)) for buyers in _list(config.eval_buyers)}
        write_report(self.out, config, self.state)

    def collect(self, k: int) -> None:
        """Round ``k``'s rollouts, by round ``k - 1``'s policy."""
        config, folder = self.config, self.round_folder(k)
        url, name = self.serving.policy(k - 1)
        self.play(f"round {k} collect", collect_play(config, k, _policy_spec(url, name, config, config.temperature)),
                  folder / "rollouts", k - 1)
        self.state.data.setdefault("rollouts", {})[str(k)] = summarize_folder(folder / "rollouts")

    def learn(self, k: int) -> None:
        """Round ``k``'s training by ``--round-method``, continuing round ``k - 1``'s adapter."""
        config, folder, previous = self.config, self.round_folder(k), self.round_folder(k - 1) / "checkpoint"
        method = ROUNDS[config.round_method]
        self.serving.before_training()
        _fresh(folder / "checkpoint")
        traces = method.traces(config, self.out, k)
        if not learning_signal(traces, config.round_method):
            # rft, offline-grpo: every group's episodes scored alike (or none sold at a profit), nothing to prefer;
            # dagger: no finished episode with a seller message to label. The round keeps the previous policy
            # (a copy, so that every round has its checkpoint).
            shutil.copytree(previous, folder / "checkpoint")
            self.state.data.setdefault("notes", {})[str(k)] = f"no learning signal: {method.no_signal}, so the policy is unchanged"
            log.warning("no learning signal", round=k)
            return
        self.train(f"round {k} {config.round_method}", round_config(config, k, traces, self.base, previous / "adapter", folder / "checkpoint"))
