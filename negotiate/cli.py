"""The ``negotiate`` command: ``serve`` runs batches, ``report`` reads traces back.

Bad input (an unknown agent, a malformed spec, a truncated or too-new trace) is one
line on stderr naming the file, field and value, and exit code 2; nothing is
overwritten.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anyio
import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from negotiate.agents.scripted import BUYERS, SELLERS
from negotiate.errors import UserError
from negotiate.logs import configure
from negotiate.market import SPLITS
from negotiate.report import GROUP_KEYS, rows_from_traces, summarize, summary_csv, summary_markdown, summary_table
from negotiate.runner import RunConfig, load_config, prepare, run_batch, save_config

__all__ = ["main"]

log = structlog.get_logger("negotiate.cli")


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard: {text!r}: expected K/N, like 2/8") from None
    if not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"--shard: {text!r}: need 1 <= K <= N")
    return k, n


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="negotiate", description="Multi-item bargaining: run episodes, read metrics from traces.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run many episodes concurrently, write traces, print metrics",
                           description="Run a batch of episodes. With no arguments: every scripted seller on the train split, paired.")
    serve.add_argument("--seller", default=",".join(SELLERS),
                       help=f"comma-separated seller specs, [scripted:]NAME[?k=v] (default: all of {', '.join(SELLERS)})")
    serve.add_argument("--buyers", default="threshold", help=f"buyer spec for every buyer: {', '.join(BUYERS)} (default: threshold)")
    serve.add_argument("--split", default="train", help=f"split ({', '.join(SPLITS)}) or a TOML market spec file (default: train)")
    serve.add_argument("--episodes", type=_positive, default=200, help="episodes per seller (default: 200)")
    serve.add_argument("--seed", type=int, default=0, help="run seed: episode i plays the market seeded from (seed, i)")
    serve.add_argument("--concurrency", type=_positive, default=256, help="episodes in flight at once (default: 256)")
    serve.add_argument("--shard", type=_shard, default=(1, 1), metavar="K/N", help="run the K-th of N disjoint slices of the episodes")
    serve.add_argument("--out", type=Path, help="trace folder (default: traces/serve-DATE-TIME)")
    serve.add_argument("--resume", type=Path, metavar="DIR", help="finish an interrupted run in DIR (its run.json gives the settings)")
    serve.add_argument("--seller-timeout", type=float, default=120.0, help="seconds a seller may think before losing the turn")
    serve.add_argument("--reply-timeout", type=float, default=120.0, help="seconds a buyer may think before its silence counts as a reject")
    serve.add_argument("--fsync", action="store_true", help="fsync after every episode (survives power loss, slower)")
    serve.add_argument("--by", default="seller,split", help=f"table breakdown, from {', '.join(GROUP_KEYS)} (default: seller,split)")
    serve.add_argument("--quiet", action="store_true", help="no progress bar")

    report = sub.add_parser("report", help="metrics table from trace files or folders alone",
                            description="Recompute every episode's metrics from its trace; merge shards; print a table.")
    report.add_argument("traces", nargs="+", help="trace files (*.jsonl) or folders searched recursively")
    report.add_argument("--by", default="seller,split", help=f"breakdown, from {', '.join(GROUP_KEYS)} (default: seller,split)")
    report.add_argument("--format", choices=("table", "markdown", "csv"), default="table")
    report.add_argument("--allow-partial", action="store_true", help="skip a half-written trailing episode instead of failing")
    play = sub.add_parser("play", help="bargain yourself in the terminal UI, as a buyer or as the seller",
                          description="Play one episode in the terminal UI against scripted (or any) agents; the episode is traced like any other.")
    play.add_argument("--role", choices=("buyer", "seller"), default="buyer", help="the part you take (default: buyer)")
    play.add_argument("--split", default="train", help=f"split ({', '.join(SPLITS)}) or a TOML market spec file (default: train)")
    play.add_argument("--seed", type=int, default=None, help="market seed (default: a fresh one, printed)")
    play.add_argument("--seller", default="greedy", help="the seller agent when you play a buyer (default: greedy)")
    play.add_argument("--buyers", default="concession", help="the other buyers' agent (default: concession)")
    play.add_argument("--out", type=Path, default=Path("traces") / "play", help="folder for your episodes' traces (default: traces/play)")

    replay = sub.add_parser("replay", help="step through recorded episodes (terminal UI, or --text)",
                            description="Replay episodes from a trace file: every message (thoughts included), deals, violations, metrics.")
    replay.add_argument("trace", type=Path, help="a trace file (*.jsonl)")
    replay.add_argument("--episode", help="episode id (default: the first; the UI lets you pick)")
    replay.add_argument("--text", action="store_true", help="print a plain transcript instead of opening the UI")
    return parser


def _by(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _serve(args: argparse.Namespace, console: Console) -> int:
    if args.resume is not None:
        out = args.resume
        config = load_config(out)
    else:
        config = RunConfig(
            sellers=tuple(s.strip() for s in args.seller.split(",") if s.strip()),
            buyers=args.buyers, split=args.split, episodes=args.episodes, seed=args.seed, shard=args.shard,
            seller_timeout=args.seller_timeout, reply_timeout=args.reply_timeout,
        )
        out = args.out or Path("traces") / time.strftime("serve-%Y%m%d-%H%M%S")
        if (out / "run.json").exists():
            raise UserError("already holds a run; pass --resume to finish it or choose another --out", source=str(out))
    by = _by(args.by)
    summarize([], by)  # check --by before running anything
    prepared = prepare(config, out, resume=args.resume is not None)
    save_config(config, out)
    configure(out / "serve.log.jsonl")
    log.info("run", out=str(out), sellers=list(config.sellers), buyers=config.buyers, split=config.split,
             episodes=len(prepared.jobs), already_done=prepared.done, concurrency=args.concurrency, shard=f"{config.shard[0]}/{config.shard[1]}")
    progress = Progress(TextColumn("[bold]serve"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=args.quiet, transient=False)
    began = time.perf_counter()
    counter = {"n": 0}
    with progress:
        task = progress.add_task("episodes", total=len(prepared.jobs), rate="")

        def tick(_episode, _seller) -> None:
            counter["n"] += 1
            if counter["n"] % 16 == 0 or counter["n"] == len(prepared.jobs):
                rate = counter["n"] / max(1e-9, time.perf_counter() - began)
                progress.update(task, completed=counter["n"], rate=f"{rate:,.0f} ep/s")

        try:
            anyio.run(lambda: run_batch(prepared, out, concurrency=args.concurrency, on_episode=tick, fsync=args.fsync))
        except KeyboardInterrupt:
            progress.stop()
            console.print(f"[yellow]interrupted:[/] {counter['n'] + prepared.done} episodes kept in {out}; "
                          f"finish with: negotiate serve --resume {out}")
            return 130
    elapsed = time.perf_counter() - began
    log.info("done", episodes=counter["n"], seconds=round(elapsed, 2), out=str(out))
    rows = rows_from_traces([out])
    console.print(summary_table(summarize(rows, by), by))
    console.print(f"traces: {out}  ·  {counter['n']} episodes in {elapsed:.1f}s  ·  report again: negotiate report {out}")
    return 0


def _report(args: argparse.Namespace, console: Console) -> int:
    by = _by(args.by)
    summarize([], by)
    rows = rows_from_traces(args.traces, allow_partial=args.allow_partial)
    summaries = summarize(rows, by)
    if args.format == "markdown":
        sys.stdout.write(summary_markdown(summaries, by))
    elif args.format == "csv":
        sys.stdout.write(summary_csv(summaries, by))
    else:
        console.print(summary_table(summaries, by))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    configure(None)
    try:
        if args.command == "serve":
            return _serve(args, console)
        if args.command in ("play", "replay"):
            from negotiate.tui import commands  # Textual loads only for the UI commands

            return commands.play(args) if args.command == "play" else commands.replay(args)
        return _report(args, console)
    except UserError as error:
        print(f"negotiate {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
