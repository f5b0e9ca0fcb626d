"""The commands that play no batch of episodes: ``report`` (metrics from traces), ``replay`` and ``play`` (the
terminal UI, or ``--web``), ``export`` (Parquet for other RL stacks), ``train``, ``loop`` and ``teach`` (the training
commands), and the listings ``agents`` and ``splits``; with the settings of play, report and replay. Each one's heavy
code (torch, Textual, pyarrow) loads only when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from negotiate.errors import UserError
from negotiate.market import SPLITS, MarketSpec
from negotiate.report import (
    GROUP_KEYS, agreement_csv, baseline_of, agreement_markdown, agreement_tables, overlapping_runs, paired_csv, paired_differences, paired_markdown, paired_table, resolve_run, rows_from_traces, run_order,
    summarize, summary_csv, summary_markdown, summary_table,
)
from negotiate.settings import Settings, setting
from negotiate.cli_runs import EXIT_OK, _by, _print_command, _unfinished


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
        table = Table(title=f"named {role}s ({flag} NAME or NAME?KEY=VALUE&...; models by spec, below)", title_justify="left", show_lines=False)
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
