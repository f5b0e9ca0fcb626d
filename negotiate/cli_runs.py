"""The commands that play episodes, ``serve``, ``collect`` and ``eval``: where a run writes (a new folder, or the
one ``--resume`` finishes, held by its writer lock), its settings (new, or the saved run's with only a larger
``--episodes`` allowed), one progress bar over every job, and what it prints and exits with. The exit codes of
every command are here too, since they name a run's outcomes (:mod:`negotiate.cli` lists them in ``--help``),
as are the small pieces of output the other commands share: a command to copy, and the ``--by`` breakdown.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shlex
import time
from collections import Counter
from pathlib import Path

import structlog
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.text import Text

from negotiate.errors import UserError
from negotiate.logs import REQUEST_LOG, configure
from negotiate.plots import write_plots
from negotiate.report import (
    GROUP_KEYS, paired_csv, paired_differences, paired_markdown, paired_table, rows_from_traces, short_label, summarize, summary_csv, summary_markdown, summary_table,
)
from negotiate.agents.pools import Pools
from negotiate.run import RunConfig, RunOptions, default_timeout
from negotiate.settings import COUNT_MOST, Settings, command_flags, items_of, spelling
from negotiate.runner import (
    Prepared, load_config, new_run_id, prepare, preload_models, run_async, run_batch, save_config, slug, take_failed, writing,
)
from negotiate.trace import count_complete
from negotiate.workers import check_workers, models_play, run_workers

log = structlog.get_logger("negotiate.cli")  # the name every log line of a command has carried

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED, EXIT_LOST, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 4, 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, as Ctrl-C is: a run stops the same way, keeps its finished
    episodes and says how to resume (Slurm and Kubernetes stop a job with SIGTERM)."""


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
