"""``negotiate train``: the command around :func:`negotiate.training.methods.train`. Its settings are :class:`TrainConfig`'s,
read by :func:`negotiate.settings.read_command` (flags, ``--config``, ``--set``, ``--keys``) before it runs."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import shutil
import time
from pathlib import Path

from rich.console import Console

from negotiate.errors import UserError
from negotiate.training.trainer import TrainConfig

__all__ = ["run_train", "TRAIN_INSTALL"]

TRAIN_INSTALL = "pip install 'negotiate[train]'"
_NEEDS = ("torch", "transformers", "peft")
LINE_EVERY_S = 30.0
"""Where the output is not a terminal: the longest wait between two progress lines (one at most per step)."""


def run_train(args: argparse.Namespace, config: TrainConfig, console: Console) -> int:
    """Train by ``config`` (read and checked); ``args``: what the command prints (``--quiet``, the console's level)."""
    missing = [name for name in _NEEDS if importlib.util.find_spec(name) is None]
    if config.method == "online-grpo" and importlib.util.find_spec("trl") is None:
        missing.append("trl")
    if missing:
        raise UserError(f"{', '.join(missing)} not installed; training needs them: {TRAIN_INSTALL}", field="--method", value=config.method)
    config.check_inputs()  # before the folder and its log are made: a wrong path leaves nothing behind
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from negotiate.logs import configure
    from negotiate.training.methods import train
    from negotiate.training.ranks import from_env

    ranks = from_env()  # under torchrun or accelerate launch, rank 0 alone makes the folder, logs to it and shows progress
    out = Path(config.out).absolute()
    made = next((p for p in reversed((out, *out.parents)) if not p.exists()), None) if ranks.main else None
    log_file = out / "train.log.jsonl"
    had_log = log_file.exists() or not ranks.main
    console_level = getattr(args, "console_level", logging.WARNING)
    if ranks.main:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"cannot be made ({error.strerror})", field="--out", value=config.out) from None
    else:
        console_level = max(console_level, logging.ERROR)  # rank 0 says what every rank would
    configure(log_file if ranks.main else None, console_level=console_level)
    columns = (TextColumn(f"train {config.method}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    shown = not args.quiet and ranks.main
    # Into a file or a pipe rich draws the bar only at the end: there, a line at the first and last step and at least every
    # LINE_EVERY_S seconds between, so a run of minutes per step is seen to move.
    lines = shown and not console.is_terminal
    if lines:
        console.print(f"train {config.method}: loading the model and the traces", highlight=False, soft_wrap=True)
    try:
        with Progress(*columns, console=console, disable=not shown or lines, transient=False) as progress:
            task = progress.add_task("train", total=None, info="loading")
            spent = [0.0, time.monotonic()]  # seconds in steps so far; when the last line was printed

            def tick(step: int, total: int, row: dict) -> None:
                info = f"loss {row['loss']:.4f}" if "loss" in row else ""
                if row.get("reward") is not None:
                    info += f"  reward {row['reward']:.3f}"
                spent[0] += row.get("seconds", 0.0)
                info += f"  {spent[0] / step:.1f} s/step  eta {_clock(spent[0] / step * (total - step))}"  # from step 1 on
                progress.update(task, completed=step, total=total, info=info)
                if lines and (step in (1, total) or time.monotonic() - spent[1] >= LINE_EVERY_S):
                    spent[1] = time.monotonic()
                    console.print(f"train {config.method}: step {step}/{total}  {info}", highlight=False, soft_wrap=True)

            summary = train(config, progress=tick)
    except UserError:  # refused once the traces were read (no usable episodes, say): take back what this run made
        configure(None, console_level=console_level)  # closes the log file
        _take_back(made, log_file, had_log)
        raise
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: say whether what was learned is kept (the trainer saved it)
        if ranks.main:
            steps, where = getattr(stop, "steps", 0), getattr(stop, "checkpoint", None)
            if where:
                console.print(f"[yellow]interrupted:[/] after step {steps} of {stop.total_steps}; its checkpoint is saved in {where} "
                              f"(play it: --seller hf:{where})", highlight=False, soft_wrap=True)
            else:
                before = " (no step had finished)" if not steps else ""  # else a second stop cut the saving short
                console.print(f"[yellow]interrupted:[/] no checkpoint was saved in {config.out}{before}", highlight=False, soft_wrap=True)
        raise
    if not ranks.main:
        return 0
    for row in summary["evals"]:
        e = row["eval"]
        console.print(f"step {row['step']:>5}: reward {_fmt(e['reward'])}  adherence {_fmt(e['valid_rate'])}  "
                      f"profit/OPT {_fmt(e['profit_ratio'])}  ({e['episodes']} episodes)")
    console.print(f"checkpoint: {summary['checkpoint']}  ·  play it: --seller hf:{summary['checkpoint']}  ·  "
                  f"curve: {summary['curve']}  ·  {summary['steps']} steps in {summary['seconds']:.0f}s")
    return 0


def _take_back(made: Path | None, log_file: Path, had_log: bool) -> None:
    """Remove what a refused run made: the folders it created (``made``, the topmost), where they hold nothing but
    its log, or else its new log alone. A folder that was there before, or anything else written, is kept."""
    if made is None:
        if not had_log and log_file.is_file():
            log_file.unlink()
    elif all(p == log_file or p.is_dir() for p in made.rglob("*")):
        shutil.rmtree(made)


def _clock(seconds: float) -> str:
    """``H:MM:SS``, as rich's time columns show it."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"
