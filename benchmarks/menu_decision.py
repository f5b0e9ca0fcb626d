"""The CPU cost of one decision of a menu policy (issue 49's target for the shipped one: at most 0.5 s of CPU).

A decision of a menu policy is one forward pass over its prompt (about 150 tokens on the compact splits) and a read of
the letters' logits. This script takes the menu prompts of real states (the planner's menu rule on the compact splits,
conceding buyers), and times the policy deciding them one at a time, as ``negotiate play`` asks it (no batching), in
process CPU seconds (user + system, all threads), and in wall seconds::

    python benchmarks/menu_decision.py                          # the shipped policy, learned, on one thread as it plays
    python benchmarks/menu_decision.py --model PATH --threads 2 # any menu policy folder, SmolLM2 for scale

It prints the mean and the 95th percentile per decision over ``--states`` decisions (after ``--warmup`` untimed ones),
the prompts' mean length in tokens, and the conditions (threads, torch's, and the 1-minute load average).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np


def states(n: int) -> list[tuple[list[dict], str]]:
    """Menu prompts and their letters, of the first ``n`` decisions of the planner's menu rule on compact markets."""
    from negotiate.agents.registry import parse_agent
    from negotiate.run import Run, RunConfig
    from negotiate.training.teacher import label_episode

    out = []
    index = 0
    while len(out) < n:
        for split in ("specs/compact.toml", "specs/compact-correlated.toml", "specs/compact-shapes.toml"):
            run = Run(RunConfig(sellers=("menu",), buyers="concession", split=split, seed=424243, fresh=True))
            episode = asyncio.run(run.episode(parse_agent("menu", "seller"), index).play())
            out += [(label.prompt, "".join(line[0] for line in label.options)) for label in label_episode(episode, value=False)]
        index += 1
    return out[:n]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a menu policy folder (default: the shipped learned policy)")
    parser.add_argument("--states", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as learned plays; 0: torch's choice)")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    import torch

    from negotiate.agents.hf import _Job, _LocalModel
    from negotiate.agents.registry import learned_path

    if args.threads:
        torch.set_num_threads(args.threads)
    path = args.model or str(learned_path())
    model = _LocalModel(path, None, args.dtype)
    tokenizer = model.load()[2]
    letters = {c: tokenizer.encode(c, add_special_tokens=False)[0] for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}
    todo = states(args.states + args.warmup)
    cpu, wall, tokens = [], [], []
    loop = asyncio.new_event_loop()
    for k, (messages, options) in enumerate(todo):
        job = _Job(messages, 0.0, 1.0, 1, 0, loop.create_future(), allowed=tuple(letters[c] for c in options))
        c0, w0 = time.process_time(), time.perf_counter()
        (chosen,) = model.choose([job])
        c1, w1 = time.process_time(), time.perf_counter()
        if k >= args.warmup:
            cpu.append(c1 - c0), wall.append(w1 - w0), tokens.append(len(chosen.prompt_ids))
    loop.close()
    cpu, wall = np.array(cpu), np.array(wall)
    load = os.getloadavg()[0]
    print(f"{path}: {args.states} decisions, prompts {np.mean(tokens):.0f} tokens on average; torch threads {torch.get_num_threads()}, "
          f"{args.dtype}, 1-minute load {load:.2f} on {os.cpu_count()} cores")
    print(f"  CPU per decision: mean {cpu.mean() * 1000:.1f} ms, p95 {np.percentile(cpu, 95) * 1000:.1f} ms")
    print(f"  wall per decision: mean {wall.mean() * 1000:.1f} ms, p95 {np.percentile(wall, 95) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
