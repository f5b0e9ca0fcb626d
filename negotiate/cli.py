"""The ``negotiate`` command: ``serve`` runs batches, ``report`` reads traces back.

Bad input (an unknown agent, a malformed spec, a truncated or too-new trace) is one
line on stderr naming the file, field and value, and exit code 2; nothing is
overwritten.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from negotiate.agents.scripted import BUYERS, SELLERS
from negotiate.errors import UserError
from negotiate.logs import REQUEST_LOG, configure, request_log
from negotiate.market import SPLITS
from negotiate.report import GROUP_KEYS, rows_from_traces, summarize, summary_csv, summary_markdown, summary_table
from negotiate.plots import write_plots
from negotiate.report import paired_csv, paired_differences, paired_markdown, paired_table
from negotiate.runner import (
    Prepared, RunConfig, close_model_clients, load_config, prepare, preload_models, run_async, run_batch, save_config, slug,
)
from negotiate.workers import check_workers, models_play, run_workers

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


LOCAL_TIMEOUT = 3600.0
"""Default agent deadline when a local model (hf:, vllm:) plays: on a CPU a reply can wait minutes for its batch."""


def _timeout_arguments(parser: argparse.ArgumentParser, timeout: float) -> None:
    local = f"(default: {timeout:g}, or {LOCAL_TIMEOUT:g} when an hf: or vllm: model plays)"
    parser.add_argument("--seller-timeout", type=float, default=None, help=f"seconds a seller may think before losing the turn {local}")
    parser.add_argument("--reply-timeout", type=float, default=None,
                        help=f"seconds a buyer may think before its silence counts as a reject {local}")
    parser.set_defaults(base_timeout=timeout)


def _timeouts(args: argparse.Namespace, specs) -> dict:
    """The agents' deadlines: as given, else the command's default, longer when a local model plays."""
    local = any(spec.strip().startswith(("hf:", "vllm:")) for spec in specs)
    default = max(args.base_timeout, LOCAL_TIMEOUT) if local else args.base_timeout
    return {"seller_timeout": args.seller_timeout if args.seller_timeout is not None else default,
            "reply_timeout": args.reply_timeout if args.reply_timeout is not None else default}


def _workers_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=_positive, default=1,
                        help="worker processes (default: 1): each plays a share of the episodes on its own core, with its share of "
                             "--concurrency and --max-inflight; one process tops out near 1,500 model requests/s")


def _batch_arguments(parser: argparse.ArgumentParser, command: str, *, timeout: float) -> None:
    """The flags serve and collect share."""
    parser.add_argument("--buyers", default="threshold", help=f"buyer spec for every buyer: {', '.join(BUYERS)} (default: threshold)")
    parser.add_argument("--split", default="train", help=f"split ({', '.join(SPLITS)}) or a TOML market spec file (default: train)")
    parser.add_argument("--seed", type=int, default=0, help="run seed: market i is seeded from (seed, i)")
    parser.add_argument("--concurrency", type=_positive, default=256, help="episodes in flight at once (default: 256)")
    _workers_argument(parser)
    parser.add_argument("--shard", type=_shard, default=(1, 1), metavar="K/N", help="run the K-th of N disjoint slices of the episodes")
    parser.add_argument("--out", type=Path, help=f"trace folder (default: traces/{command}-DATE-TIME)")
    parser.add_argument("--resume", type=Path, metavar="DIR", help="finish an interrupted run in DIR (its run.json gives the settings)")
    _timeout_arguments(parser, timeout)
    parser.add_argument("--max-inflight", type=_positive, metavar="N",
                        help="model requests in flight per server (openai: specs), overriding their max_inflight; "
                             "the agents' timeouts include the wait for a slot")
    parser.add_argument("--fsync", action="store_true", help="fsync after every episode (survives power loss, slower)")
    parser.add_argument("--by", default="seller,split", help=f"table breakdown, from {', '.join(GROUP_KEYS)} (default: seller,split)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="negotiate", description="Multi-item bargaining: run episodes, read metrics from traces.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run many episodes concurrently, write traces, print metrics",
                           description="Run a batch of episodes. With no arguments: every scripted seller on the train split, paired.")
    serve.add_argument("--seller", default=",".join(SELLERS),
                       help=f"comma-separated seller specs, [scripted:]NAME[?k=v] (default: all of {', '.join(SELLERS)})")
    serve.add_argument("--episodes", type=_positive, default=200, help="episodes per seller (default: 200)")
    serve.add_argument("--group", type=_positive, default=1,
                       help="episodes per market instance: the seller plays each market this many times, sampling afresh (default: 1)")
    _batch_arguments(serve, "serve", timeout=120.0)

    collect = sub.add_parser("collect", help="play each market G times for training groups (serve with --group)",
                             description="Collect training data: every seller plays MARKETS markets, each GROUP times with a fresh "
                                         "sampling seed (buyers identical), so group-relative advantages compare strategies on one market.")
    collect.add_argument("--seller", required=True, help="comma-separated seller specs, e.g. hf:checkpoints/sft?temperature=1")
    collect.add_argument("--markets", type=_positive, default=32, help="market instances (default: 32)")
    collect.add_argument("--group", type=_positive, default=8, help="episodes per market (default: 8)")
    _batch_arguments(collect, "collect", timeout=600.0)

    from negotiate.training.options import add_train_arguments  # no torch: the flags come from the config dataclass

    add_train_arguments(sub.add_parser(
        "train", help="post-train a seller from traces (sft, offline-grpo) or from live episodes (online-grpo)",
        description="Turn collected episodes into a better seller: a checkpoint folder that hf:OUT loads. "
                    "Needs the train extra: pip install 'negotiate[train]'."))

    report = sub.add_parser("report", help="metrics table from trace files or folders alone",
                            description="Recompute every episode's metrics from its trace; merge shards; print a table.")
    report.add_argument("traces", nargs="+", help="trace files (*.jsonl) or folders searched recursively")
    report.add_argument("--by", default="seller,split", help=f"breakdown, from {', '.join(GROUP_KEYS)} (default: seller,split)")
    report.add_argument("--format", choices=("table", "markdown", "csv"), default="table")
    report.add_argument("--allow-partial", action="store_true", help="skip a half-written trailing episode instead of failing")
    report.add_argument("--baseline", help="also print paired differences of every seller against this one (same markets)")
    evaluate = sub.add_parser("eval", help="compare sellers side by side on the generalization splits (tables, CSV, plots)",
                              description="Every seller plays the same markets with the same seeds on each split (a paired comparison); "
                                          "writes traces, results.md, results.csv, paired.csv and PNG plots.")
    evaluate.add_argument("--sellers", default=",".join(SELLERS), help=f"comma-separated seller specs (default: all of {', '.join(SELLERS)})")
    evaluate.add_argument("--buyers", default="threshold", help="buyer spec (default: threshold)")
    evaluate.add_argument("--splits", default=",".join(SPLITS), help=f"comma-separated splits or TOML spec files (default: {','.join(SPLITS)})")
    evaluate.add_argument("--episodes", type=_positive, default=200, help="markets per split (default: 200)")
    evaluate.add_argument("--baseline", help="seller the others are compared with, pair by pair (default: the first of --sellers)")
    evaluate.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    evaluate.add_argument("--concurrency", type=_positive, default=256, help="episodes in flight at once (default: 256)")
    _workers_argument(evaluate)
    evaluate.add_argument("--max-inflight", type=_positive, metavar="N",
                       help="model requests in flight per server (openai: specs), overriding their max_inflight; "
                            "the agents' timeouts include the wait for a slot")
    evaluate.add_argument("--out", type=Path, help="output folder (default: traces/eval-DATE-TIME)")
    evaluate.add_argument("--resume", type=Path, metavar="DIR", help="finish an interrupted evaluation in DIR")
    _timeout_arguments(evaluate, 120.0)
    evaluate.add_argument("--quiet", action="store_true", help="no progress bar")

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


def _list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _by(text: str) -> list[str]:
    return list(_list(text))


def split_dir(split: str) -> str:
    """Folder of one split's run inside an evaluation (a spec file's path becomes its slug)."""
    return slug(Path(split).stem if split.endswith(".toml") else split)


def _run_all(runs: list[tuple[Prepared, Path]], args: argparse.Namespace, console: Console, label: str,
             log_file: Path | None = None) -> tuple[int, float, bool]:
    """Play every pending job of ``runs`` under one progress bar (in ``--workers`` processes).
    Returns (episodes, seconds, interrupted)."""
    total = sum(len(p.jobs) for p, _ in runs)
    progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=args.quiet, transient=False)
    began = time.perf_counter()
    counter = {"n": 0}
    with progress:
        task = progress.add_task("episodes", total=total, rate="")

        def tick(_episode, _seller) -> None:
            counter["n"] += 1
            if counter["n"] % 16 == 0 or counter["n"] == total:
                rate = counter["n"] / max(1e-9, time.perf_counter() - began)
                progress.update(task, completed=counter["n"], rate=f"{rate:,.0f} ep/s")

        async def main() -> None:
            for prepared, out in runs:
                await run_batch(prepared, out, concurrency=args.concurrency, on_episode=tick, fsync=getattr(args, "fsync", False))

        try:
            if args.workers > 1 and total > 0:
                run_workers(runs, args.workers, concurrency=args.concurrency, max_inflight=args.max_inflight, log_file=log_file,
                            fsync=getattr(args, "fsync", False), on_episode=lambda row: tick(None, None))
            else:
                if log_file is not None and models_play(runs):
                    request_log.open(log_file.parent / REQUEST_LOG)
                try:
                    run_async(main)
                finally:
                    request_log.close()
        except KeyboardInterrupt:
            progress.stop()
            return counter["n"], time.perf_counter() - began, True
    return counter["n"], time.perf_counter() - began, False


def _check_models(runs: list[tuple[Prepared, Path]], fields: dict[str, str] | None = None) -> None:
    """Before anything is written: ask every model server of ``runs`` for its models and load every
    local model (a run does it again, cheaply), so a server that is down, a wrong model name or a
    model that cannot load is one error line and leaves no run folder behind."""
    if not any(p.jobs for p, _ in runs) or not models_play(runs):
        return

    async def check() -> None:
        try:
            for prepared, _ in runs:
                await preload_models([*prepared.sellers, prepared.buyers], fields)
        finally:
            await close_model_clients()

    run_async(check)


def _serve(args: argparse.Namespace, console: Console) -> int:
    if args.resume is not None:
        out = args.resume
        config = load_config(out)
    else:
        collect = args.command == "collect"
        config = RunConfig(
            sellers=_list(args.seller), buyers=args.buyers, split=args.split,
            episodes=args.markets * args.group if collect else args.episodes, seed=args.seed,
            shard=args.shard, group=args.group, **_timeouts(args, (*_list(args.seller), args.buyers)),
        )
        out = args.out or Path("traces") / time.strftime(f"{args.command}-%Y%m%d-%H%M%S")
        if (out / "run.json").exists():
            raise UserError("already holds a run; pass --resume to finish it or choose another --out", source=str(out))
    by = _by(args.by)
    summarize([], by)  # check --by before running anything
    prepared = prepare(config, out, resume=args.resume is not None)
    check_workers(args.workers, [(prepared, out)])
    _check_models([(prepared, out)])
    save_config(config, out)
    configure(out / "serve.log.jsonl")
    log.info("run", out=str(out), sellers=list(config.sellers), buyers=config.buyers, split=config.split,
             episodes=len(prepared.jobs), already_done=prepared.done, concurrency=args.concurrency, shard=f"{config.shard[0]}/{config.shard[1]}")
    done, elapsed, interrupted = _run_all([(prepared, out)], args, console, args.command, out / "serve.log.jsonl")
    if interrupted:
        console.print(f"[yellow]interrupted:[/] {done + prepared.done} episodes kept in {out}; finish with: negotiate {args.command} --resume {out}")
        return 130
    log.info("done", episodes=done, seconds=round(elapsed, 2), out=str(out))
    rows = rows_from_traces([out])
    console.print(summary_table(summarize(rows, by, {"seller": config.sellers}), by))
    console.print(f"traces: {out}  ·  {done} episodes in {elapsed:.1f}s  ·  report again: negotiate report {out}")
    return 0


def _eval(args: argparse.Namespace, console: Console) -> int:
    if args.resume is not None:
        out = args.resume
        path = out / "eval.json"
        if not path.exists():
            raise UserError("not an eval folder (no eval.json)", source=str(out))
        try:
            settings = json.loads(path.read_text())
            sellers, splits, baseline = settings["sellers"], settings["splits"], settings["baseline"]
        except (ValueError, KeyError) as error:
            raise UserError(f"not a valid eval.json ({error})", source=str(path)) from None
        configs = [load_config(out / split_dir(split)) for split in splits]
    else:
        sellers, splits = list(_list(args.sellers)), list(_list(args.splits))
        baseline = args.baseline or sellers[0]
        if baseline not in sellers:
            raise UserError(f"is not one of --sellers ({', '.join(sellers)})", field="--baseline", value=baseline)
        if len(set(splits)) != len(splits):
            raise UserError("a split is named twice", field="--splits", value=args.splits)
        out = args.out or Path("traces") / time.strftime("eval-%Y%m%d-%H%M%S")
        if (out / "eval.json").exists():
            raise UserError("already holds an evaluation; pass --resume to finish it or choose another --out", source=str(out))
        configs = [RunConfig(sellers=tuple(sellers), buyers=args.buyers, split=split, episodes=args.episodes, seed=args.seed,
                             **_timeouts(args, (*sellers, args.buyers))) for split in splits]
    runs = [(prepare(config, out / split_dir(config.split), resume=args.resume is not None), out / split_dir(config.split))
            for config in configs]  # every spec and agent is checked before anything runs
    check_workers(args.workers, runs)
    _check_models(runs, {"seller": "--sellers"})
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps({"sellers": sellers, "splits": splits, "baseline": baseline}, indent=2))
    for (_, run_out), config in zip(runs, configs):
        save_config(config, run_out)
    configure(out / "eval.log.jsonl")
    log.info("eval", out=str(out), sellers=sellers, splits=splits, baseline=baseline,
             episodes=sum(len(p.jobs) for p, _ in runs), already_done=sum(p.done for p, _ in runs))
    done, elapsed, interrupted = _run_all(runs, args, console, "eval", out / "eval.log.jsonl")
    if interrupted:
        console.print(f"[yellow]interrupted:[/] completed episodes kept in {out}; finish with: negotiate eval --resume {out}")
        return 130
    rows = rows_from_traces([out])
    by = ["seller", "split"]
    order = {"seller": sellers, "split": splits}
    summaries = summarize(rows, by, order)
    paired = paired_differences(rows, baseline, order)
    console.print(summary_table(summaries, by, title="negotiate eval: metrics by seller and split, mean (± 95% CI)"))
    console.print(paired_table(paired, baseline))
    (out / "results.md").write_text(
        f"# negotiate eval\n\nSellers {', '.join(sellers)} on {', '.join(splits)}; baseline {baseline}. "
        f"Reproduce the numbers from the traces: `negotiate report {out} --by seller,split --format markdown --baseline {baseline}`.\n\n"
        f"## Metrics (mean ± 95% CI)\n\n{summary_markdown(summaries, by)}\n"
        f"## Paired differences against {baseline} (same markets)\n\n{paired_markdown(paired)}"
    )
    (out / "results.csv").write_text(summary_csv(summaries, by))
    (out / "paired.csv").write_text(paired_csv(paired, baseline))
    plots = write_plots(rows, out / "plots", sellers, splits)
    console.print(f"results: {out}/results.md, results.csv, paired.csv; plots: {', '.join(p.name for p in plots)}  ·  "
                  f"{done} episodes in {elapsed:.1f}s")
    return 0


def _report(args: argparse.Namespace, console: Console) -> int:
    by = _by(args.by)
    summarize([], by)
    rows = rows_from_traces(args.traces, allow_partial=args.allow_partial)
    summaries = summarize(rows, by)
    paired = paired_differences(rows, args.baseline) if args.baseline else None
    if args.format == "markdown":
        sys.stdout.write(summary_markdown(summaries, by))
        if paired is not None:
            sys.stdout.write(f"\nPaired differences against {args.baseline} (same markets):\n\n" + paired_markdown(paired))
    elif args.format == "csv":
        sys.stdout.write(summary_csv(summaries, by) if paired is None else paired_csv(paired, args.baseline))
    else:
        console.print(summary_table(summaries, by))
        if paired is not None:
            console.print(paired_table(paired, args.baseline))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    configure(None)
    if getattr(args, "max_inflight", None) is not None:
        from negotiate.agents.backends import set_max_inflight

        set_max_inflight(args.max_inflight)
    try:
        if args.command in ("serve", "collect"):
            return _serve(args, console)
        if args.command == "train":
            from negotiate.training.options import run_train

            return run_train(args, console)
        if args.command == "eval":
            return _eval(args, console)
        if args.command in ("play", "replay"):
            from negotiate.tui import commands  # Textual loads only for the UI commands

            return commands.play(args) if args.command == "play" else commands.replay(args)
        return _report(args, console)
    except UserError as error:
        print(f"negotiate {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:
        if getattr(args, "max_inflight", None) is not None:  # main() called as a function: the flag ends with the command
            from negotiate.agents.backends import set_max_inflight

            set_max_inflight(None)


if __name__ == "__main__":
    sys.exit(main())
