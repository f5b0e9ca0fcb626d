"""Seconds per seller decision on a GPU: training (the trainer's batched LoRA pass) and generation (the ``hf:`` backend).

    python benchmarks/bench_gpu.py --model runs/loop/base                     # SmolLM2-135M, its own weights
    python benchmarks/bench_gpu.py --model FOLDER --random-weights --shape qwen3-1.7b --json gpu.json

What ``negotiate loop`` spends its time on, per decision, on whatever device torch finds (CUDA when
present; this runs on a CPU too, slowly):

1. Decisions: the greedy seller plays ``--episodes`` compact markets (specs/compact.toml); its
   messages become the prompts and tagged completions SFT trains on (``build_examples``, as
   ``negotiate train`` builds them), tokenized by ``--model``'s tokenizer.
2. Training: one forward and backward pass per decision, LoRA r16 on every linear layer, bf16
   autocast, the shared prompt prefix run once (``batch_logprobs``), in micro-batches of each of
   ``--micro``; the median of ``--repeat`` timings after one warm-up.
3. Generation: the ``hf:`` backend's batched decoding (``_LocalModel.generate``: the shared prefix's
   keys and values computed once, then one token a step for every row) on the same prompts, in
   batches of each of ``--batch``, exactly ``--max-tokens`` tokens per reply (random weights rarely
   stop early; a real model's replies stop sooner, so this is an upper bound per reply).

Models: ``--model`` names a transformers folder (config and tokenizer; its weights too, unless
``--random-weights`` or it has none). ``--shape`` runs more models of a known shape with random
weights and the same tokenizer (the token ids fit any larger vocabulary): ``qwen3-1.7b`` is
Qwen3-1.7B's configuration. Random weights time the same arithmetic as trained ones; what they
cannot say is anything about what the model learns. ``--save-random DIR`` writes ``--model``'s
random-weight model as a folder ``negotiate train --model DIR`` takes (benchmarks/gpu_check.sh
trains it for a few steps with the real command).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decisions import teacher_decisions, time_variant  # noqa: E402

SHAPES = {
    # Qwen3-1.7B's config.json (hidden 2048, 28 layers, 16 query and 8 key-value heads of 128, tied embeddings).
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu"),
}


def load_model(folder: Path, shape: str | None, random_weights: bool, device: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if shape is None and not random_weights and any(folder.glob("*.safetensors")):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    else:
        config = AutoConfig.for_model(**SHAPES[shape]) if shape else AutoConfig.from_pretrained(folder)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config.use_cache = False
    return model.to(device)


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_training(model, examples, micro: int, repeat: int, device: str) -> float:
    """Median seconds per decision of the forward and backward pass, LoRA, bf16 autocast, shared prefix."""
    samples = []
    for k in range(repeat + 1):
        sync(device)
        seconds = time_variant(model, examples, micro=micro, share=True, bf16=True)
        sync(device)
        if k:  # the first is a warm-up (kernels, allocator)
            samples.append(seconds)
    return statistics.median(samples)


def time_generation(model, tokenizer, examples, batch: int, max_tokens: int, device: str) -> tuple[float, int]:
    """(seconds per batch, tokens generated) of the hf backend decoding ``batch`` prompts at once (``model``
    in eval mode, with its KV cache on)."""
    from negotiate.agents.hf import _Job, _LocalModel

    local = _LocalModel.in_memory(model, tokenizer, name="bench")
    local.encode = lambda ids: list(ids)  # the jobs carry the decisions' prompt ids, already rendered by the chat template
    rows = (examples * (batch // len(examples) + 1))[:batch]
    samples = []
    for k in range(3):  # the first is a warm-up
        jobs = [_Job(messages=ex.prompt_ids, temperature=1.0, top_p=1.0, max_tokens=max_tokens, seed=i, future=None)
                for i, ex in enumerate(rows)]
        sync(device)
        began = time.perf_counter()
        out = local.generate(jobs)
        sync(device)
        if k:
            samples.append(time.perf_counter() - began)
    errors = [o for o in out if isinstance(o, Exception)]
    if errors:
        raise RuntimeError(f"generation failed: {errors[0]}")
    return statistics.median(samples), sum(len(o.token_ids) for o in out)


def sizes(text: str) -> list[int]:
    """``8,32`` -> [8, 32], for --micro and --batch."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give sizes of 1 or more, separated by commas (8,32)")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a transformers folder: config.json and the tokenizer (weights optional)")
    parser.add_argument("--random-weights", action="store_true", help="initialize --model's architecture at random, ignoring its weights")
    parser.add_argument("--shape", action="append", default=[], choices=sorted(SHAPES), help="also time a model of this shape (random weights)")
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--decisions", type=int, default=64)
    parser.add_argument("--micro", type=sizes, default="8,32", help="training micro-batch sizes")
    parser.add_argument("--batch", type=sizes, default="32,128", help="generation batch sizes")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--save-random", help="save --model with random weights (and its tokenizer) to this folder")
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model: {args.model!r}: not a transformers folder (no config.json there)")

    import torch
    from peft import get_peft_model
    from transformers import AutoTokenizer

    from negotiate.training.dataset import DataFilter, load_episodes
    from negotiate.training.trainer import TrainConfig, build_examples, lora_config

    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    folder = Path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    traces = teacher_decisions(args.episodes, work)
    config = TrainConfig(model=str(folder), traces=(str(traces),), method="sft", prompt="full")
    episodes = load_episodes(config.traces, where=DataFilter(), prompt="full")
    results = {"device": name, "torch": torch.__version__, "models": []}
    print(f"device: {name}, torch {torch.__version__}")
    plans = [(None, args.random_weights)] + [(shape, True) for shape in args.shape]
    for shape, random_weights in plans:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        model = load_model(folder, shape, random_weights, device)
        label = shape or folder.name
        parameters = sum(p.numel() for p in model.parameters())
        if shape is None and args.save_random and random_weights:
            model.save_pretrained(args.save_random)
            tokenizer.save_pretrained(args.save_random)
        examples, counts = build_examples(config, episodes, model, tokenizer)  # stop tokens: the model's
        examples = examples[: args.decisions]
        prompt = statistics.mean(len(ex.prompt_ids) for ex in examples)
        completion = statistics.mean(len(ex.completion_ids) for ex in examples)
        row = {"model": label, "parameters": parameters, "random_weights": random_weights, "decisions": len(examples),
               "prompt_tokens": round(prompt), "completion_tokens": round(completion, 1), "train": {}, "generate": {}}
        print(f"\n{label}: {parameters / 1e6:.0f}M parameters{' (random weights)' if random_weights else ''}; {len(examples)} decisions "
              f"of {counts['examples']}, prompt tokens mean {prompt:.0f}, completion tokens mean {completion:.1f}")
        peft = get_peft_model(model, lora_config(config))
        peft.train()
        for micro in args.micro:
            seconds = time_training(peft, examples, micro, args.repeat, device)
            row["train"][micro] = seconds
            print(f"  train  (LoRA r16, bf16 autocast, micro-batch {micro:3d}): {seconds * 1000:8.1f} ms per decision, "
                  f"{3600 / seconds:9.0f} decisions per hour")
        model = peft.merge_and_unload().to(torch.bfloat16).eval()  # the LoRA layers' zero update: the base weights
        model.config.use_cache = True
        for batch in args.batch:
            seconds, tokens = time_generation(model, tokenizer, examples, batch, args.max_tokens, device)
            row["generate"][batch] = {"seconds": seconds, "tokens": tokens}
            print(f"  generate (hf backend, bf16, batch {batch:3d}, {args.max_tokens} tokens each): {seconds:6.2f} s per batch, "
                  f"{seconds / batch * 1000:7.1f} ms per decision, {tokens / seconds:8.0f} tokens/s")
        if device == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            print(f"  peak GPU memory: {row['peak_gib']} GiB")
        results["models"].append(row)
        del model, peft
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
