"""The trainer: traces in, a better seller out. Read top to bottom.

1. :class:`TrainConfig` says everything a run does (``negotiate train`` builds it from flags).
2. :func:`load_policy` loads the model named by ``--model`` (a folder, a ``.gguf`` file or the
   ``smollm2`` alias, as the ``hf:`` backend resolves it), and wraps it with a LoRA adapter
   (peft) unless ``lora`` is off.
3. :func:`build_examples` turns episodes into token sequences: the prompt's ids (logged ones
   when the trace has them, else the chat template's), the completion's ids and, where logged,
   the log-probs of the policy that sampled them; plus a weight (the advantage, or for imitation the
   decision's ``action_weights``: 1 unless its action's kind is named there).
4. The loss, per method:

   - ``sft``: mean negative log-likelihood of the completion tokens of the best episodes'
     valid messages (``top``: the share of episodes kept, by reward);
   - ``rft`` (rejection-sampling fine-tuning, or expert iteration): the same loss as ``sft``, on the
     valid messages of each collected group's best episode (its reward above the group's lowest and
     above 0). Only better-than-its-siblings behaviour is pushed up; nothing is pushed down;
   - ``dagger``: the same loss on every state of the collected episodes, each labelled with what a
     scripted ``teacher`` would have sent there (``dataset.teacher_decisions``): imitation on the
     policy's own states, where its mistakes lead (DAgger, Ross et al. 2011);
   - in these three, each decision's token losses are multiplied by its weight (``--action-weights
     accept=4``: a rare kind of decision counts more, as a class weight does in classification);
   - ``offline-grpo``: the clipped policy-gradient surrogate of GRPO on collected groups. Each
     completion token ``t`` of a decision in episode ``e`` has ratio ``r = exp(logp_new - logp_old)``
     against the logged log-prob (or, where none was logged, the policy's own before its first
     update) and loss ``-min(r A_e, clip(r, 1 - eps, 1 + eps) A_e)``, averaged over tokens, with
     ``A_e`` the group-relative advantage of the episode (``dataset.advantages``); plus
     ``kl_beta`` times the k3 estimate of KL(policy || reference), the reference being the
     model before training (the adapter switched off).
   - ``online-grpo`` lives in :mod:`negotiate.training.online` (TRL's GRPOTrainer, rollouts played
     by this runtime); :func:`negotiate.training.methods.train` picks one or the other.

5. Every step appends one line to ``OUT/metrics.jsonl``; with ``eval_episodes`` the current
   policy plays that many held-out episodes before training, every ``eval_every`` steps and at
   the end (traces under ``OUT/eval/``), and ``OUT/curve.png`` plots reward and adherence.
6. :func:`save_policy` writes the merged weights and tokenizer to ``OUT`` (``hf:OUT`` loads it
   as a seller; a vLLM server serves it as a model), and, with LoRA, the adapter alone to
   ``OUT/adapter`` (for vLLM's ``/v1/load_lora_adapter`` on top of the same base model).
7. Under ``torchrun`` or ``accelerate launch`` (N processes, :mod:`negotiate.training.ranks`), every
   process draws the same global batch and takes its share of it; the gradients are summed across the
   processes once per step, so a step is the step one process would take on the whole batch. The
   evaluation episodes are shared out the same way. Rank 0 alone writes.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from negotiate.errors import UserError
from negotiate.settings import items_of, setting, spelling

from negotiate.training.ranks import (ONE, Ranks, broadcast_parameters, from_env, gather, join, leave, share, sum_floats,
                                     sum_gradients)
from negotiate.training.dataset import (DataFilter, Decision, Episode, advantages, by_group, check_teacher, load_episodes,
                                       parse_action_weights)
from negotiate.training.learning import LearningConfig
from negotiate.training.rewards import DEFAULT_REWARD, REWARDS
from negotiate.training.logprobs import (  # noqa: F401 (the trainer's names, as tests and callers import them)
    MIN_SHARED, MMAP_THRESHOLD, Example, batch_logprobs, checkpoint_layers, completion_logprobs, encode_completion,
    return_freed_memory,
)

__all__ = ["TrainConfig", "METHODS", "train", "load_policy", "build_examples", "Example", "save_policy", "evaluate_policy", "play_episodes"]

log = structlog.get_logger("negotiate.training")

METHODS = ("sft", "rft", "dagger", "offline-grpo", "online-grpo")
IMITATION = ("sft", "rft", "dagger")
"""The methods whose loss is the negative log-likelihood of the kept decisions (each times its weight)."""
FROM_TRACES = tuple(method for method in METHODS if method != "online-grpo")
"""The methods that learn from collected traces (``--traces``); online-grpo plays its own episodes."""


def check_split(name: str, flag: str) -> None:
    """A split name or a TOML spec file (read now: a wrong field names the file), refused under ``flag``, before
    anything loads, where it is neither (the markets are built only when the policy plays)."""
    from negotiate.market import resolve_spec

    if Path(name).is_dir():
        raise UserError("is a folder; give a split or a .toml spec file", field=flag, value=name)
    resolve_spec(name, flag)


def _flag(default, help: str, **options):
    """A setting of ``negotiate train`` that is also its flag (``--epochs`` for ``epochs``)."""
    return setting(help, default=default, **options)


def _key(default, help: str, **options):
    """A setting of ``negotiate train`` that is a key only (of ``--config`` and ``--set``)."""
    return setting(help, default=default, key_only=True, **options)


@dataclass
class TrainConfig(LearningConfig):
    """One training run. Each field is a setting of ``negotiate train`` (``negotiate.settings``): a key of its ``--config``
    file and of ``--set``, and a flag where marked so; those it shares with ``negotiate loop`` are
    :class:`~negotiate.training.learning.LearningConfig`'s."""

    traces: tuple[str, ...] = _flag((), f"trace files or folders to learn from ({', '.join(FROM_TRACES)})", kind="list", many=True,
                                    metavar="PATH")
    out: str = _flag("checkpoints/seller", "checkpoint folder to write")
    method: str = _flag("sft", f"one of {', '.join(METHODS)}")
    reward: str = _key(DEFAULT_REWARD, f"reward function, one of {', '.join(REWARDS)}")
    split: str | None = _key(None, "use only episodes of this split (online-grpo: the split its rollouts play)")
    seller: str | None = _key(None, "use only episodes of this seller spec (as the trace names it)")
    min_group: int = _key(2, "drop groups with fewer episodes (at least 1; rft and offline-grpo need 2 or more)", kind="int")
    top: float = _key(1.0, "sft: the share of episodes kept, best rewards first", kind="number")
    lora: bool = _key(True, "train a LoRA adapter (peft) instead of every weight", kind="switch")
    lora_alpha: int = _key(32, "LoRA alpha", kind="int")
    adapter: str | None = _key(None, "continue training this LoRA adapter (a folder with adapter_config.json, trained on --model) "
                                     "instead of a fresh one")
    epochs: float = _flag(1.0, "passes over the examples", kind="number")
    max_steps: int | None = _flag(None, "optimizer steps to take, in place of --epochs (the decisions are reshuffled at each pass)",
                                  kind="int")
    batch_size: int = _flag(8, "decisions per optimizer step", kind="int")
    lr: float = _flag(1e-4, "AdamW learning rate", kind="number")
    weight_decay: float = _key(0.0, "AdamW weight decay", kind="number")
    max_grad_norm: float = _key(1.0, "clip the gradient's norm to this (above 0; inf: no clipping)", kind="number")
    clip_eps: float = _key(0.2, "offline-grpo: ratio clip epsilon", kind="number")
    scale_advantages: bool = _key(True, "offline-grpo: divide advantages by the group's standard deviation", kind="switch")
    max_length: int = _key(2048, "drop decisions longer than this many tokens", kind="int")
    checkpointing: bool = _key(True, "recompute each layer's activations in the backward pass (gradient checkpointing): the same "
                                     "loss and gradients for about a third more compute; SFT of SmolLM2-135M at batch 8, full "
                                     "prompt, held 11.4 GB without it, 1.9 GB with it", kind="switch")
    eval_episodes: int = _flag(0, "held-out episodes the policy plays before, during and after training (0: none)", kind="int")
    eval_every: int = _key(0, "steps between evaluations (0: only before and after)", kind="int")
    eval_buyers: str = _key("threshold", "buyer spec in evaluation and rollouts")
    gen_batch: int = _key(16, "replies generated together in evaluation and rollouts", kind="int")

    def check(self) -> None:
        """Every value in its range and every name known, before anything loads; one line naming the setting as a person
        gives it (its flag, or its key) otherwise."""
        named = _spelled
        if self.method not in METHODS:
            raise UserError(f"unknown method; choose from {', '.join(METHODS)}", field="--method", value=self.method)
        if self.reward not in REWARDS:
            raise UserError(f"unknown reward; choose from {', '.join(REWARDS)}", field=named("reward"), value=self.reward)
        if self.method != "online-grpo" and not self.traces:
            raise UserError(f"{self.method} learns from traces: give --traces DIR", field="--traces", value=None)
        if self.method == "offline-grpo" and self.kl_beta > 0 and not self.lora:
            raise UserError("a KL to the reference needs LoRA (the reference is the model with its adapter off); "
                            "set lora = true or kl_beta = 0", field=named("kl_beta"), value=self.kl_beta)
        self.policy.check()  # the prompt view and decoding of evaluation and rollouts, checked once
        if self.method == "dagger":
            check_teacher(self.teacher)
        if parse_action_weights(self.action_weights, flag=named("action_weights")) and self.method not in IMITATION:
            raise UserError(f"weighs imitated decisions: use it with --method {', '.join(IMITATION)}", field=named("action_weights"),
                            value=self.action_weights)
        if self.adapter is not None and not self.lora:
            raise UserError("an adapter to continue needs LoRA; set lora = true", field=named("adapter"), value=self.adapter)
        if self.adapter is not None and not (Path(self.adapter) / "adapter_config.json").is_file():
            raise UserError("not a LoRA adapter folder (no adapter_config.json)", field=named("adapter"), value=self.adapter)
        if not 0 < self.top <= 1:
            raise UserError("must be in (0, 1]", field=named("top"), value=self.top)
        # nan passes every comparison, so each bound is written as what a good value satisfies.
        for name, zero in (("epochs", False), ("lr", False), ("clip_eps", False), ("weight_decay", True), ("kl_beta", True)):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise UserError("must be a finite number", field=named(name), value=value)
            if not (value >= 0 if zero else value > 0):
                raise UserError("must be 0 or more" if zero else "must be above 0", field=named(name), value=value)
        if not self.max_grad_norm > 0:  # torch scales the gradient by max_grad_norm / norm: 0 would zero every step
            raise UserError("must be above 0 (inf: no clipping)", field=named("max_grad_norm"), value=self.max_grad_norm)
        if not 0 <= self.temperature <= 2:  # the hf: backend's range
            raise UserError("must be from 0 to 2 (0: greedy)", field=named("temperature"), value=self.temperature)
        if self.method == "online-grpo" and self.temperature == 0:  # TRL divides the logits by it; a greedy group is all alike
            raise UserError("online-grpo samples its rollouts: must be above 0", field=named("temperature"), value=self.temperature)
        for name in ("batch_size", "micro_batch", "max_length", "lora_r", "lora_alpha", "group", "markets", "max_tokens", "gen_batch",
                     "max_steps", "min_group", "threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserError("must be at least 1", field=named(name), value=getattr(self, name))
        for name, zero in (("eval_episodes", "none"), ("eval_every", "only before and after")):
            if getattr(self, name) < 0:
                raise UserError(f"must be 0 or more (0: {zero})", field=named(name), value=getattr(self, name))
        if self.method == "online-grpo" and self.group < 2:  # as train_online says it, before trl is imported
            raise UserError("online-grpo compares episodes of one market: must be 2 or more", field=named("group"), value=self.group)
        if self.method == "online-grpo" and self.batch_size % self.group:
            raise UserError(f"must be a multiple of group ({self.group})", field="--batch-size", value=self.batch_size)
        self.check_ranks(from_env())
        for split in eval_splits_of(self):
            check_split(split, named("eval_splits"))
        if self.method == "online-grpo" and self.split is not None:  # the markets of the rollouts (a filter of traces otherwise)
            check_split(self.split, named("split"))

    def check_ranks(self, ranks: Ranks) -> None:
        """A batch shared by ``ranks.world`` processes (torchrun, accelerate launch) gives each of them a part."""
        if not ranks.many:
            return
        if self.method == "online-grpo" and self.batch_size % ranks.world:  # TRL's per-device batch: an even share
            raise UserError(f"must be a multiple of the number of processes ({ranks.world}): each plays an equal share",
                            field="--batch-size", value=self.batch_size)
        if self.batch_size < ranks.world:
            raise UserError(f"must be at least the number of processes ({ranks.world}): each takes a share of every batch",
                            field="--batch-size", value=self.batch_size)

    def check_inputs(self) -> None:
        """What the run reads and writes, checked on disk without reading a trace or loading a model (so in
        moments): ``--out`` can take a checkpoint, ``--traces`` name trace files, ``--model`` names a model."""
        from negotiate.trace import trace_files

        out = Path(self.out)
        above = next((p for p in (out, *out.absolute().parents) if p.exists()), None)
        if above is not None and not above.is_dir():
            where = "is a file" if above == out else f"is inside {str(above)!r}, a file"
            raise UserError(f"{where}, not a folder; choose a new folder for the checkpoint", field="--out", value=self.out)
        if (out / "train.json").exists():
            raise UserError("already holds a trained checkpoint; choose another --out", source=str(out))
        if self.method != "online-grpo":
            trace_files(self.traces)
        resolve_model(self.model)

    @property
    def policy(self):
        """The seller policy in evaluation and rollouts (``negotiate.agents.policy``): the prompt view, tagged replies,
        the temperature and the token budget of this config."""
        from negotiate.agents.policy import Policy

        return Policy(prompt=self.prompt, format="tagged", temperature=self.temperature, max_tokens=self.max_tokens)

    def to_json(self) -> dict:
        return asdict(self)


def _spelled(name: str) -> str:
    """How a person gives the setting ``name`` of ``negotiate train``: its flag, or its key."""
    return spelling(TrainConfig, name, "train")


# -- the policy -----------------------------------------------------------------------------------


def resolve_model(name: str) -> tuple[str, str | None]:
    """(folder, gguf file or None) for ``--model``, resolved exactly as the ``hf:`` backend resolves it."""
    from negotiate.agents.hf import parse_hf_spec

    options = parse_hf_spec(name, field="--model", text=name)
    return options.path, options.gguf_file


def load_policy(config: TrainConfig, *, wrap: bool = True):
    """(model, tokenizer): the starting model in float32, LoRA-wrapped when ``config.lora`` and ``wrap``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, gguf = resolve_model(config.model)
    kwargs = {"gguf_file": gguf} if gguf else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    if torch.cuda.is_available():
        model.to("cuda")
    if gguf:  # dequantized on load: the weights are plain tensors now, and save_pretrained must not re-quantize
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    model.config.use_cache = False
    if config.lora and wrap and config.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, config.adapter, is_trainable=True)
    elif config.lora and wrap:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(config))
    return model, tokenizer


def export_model(model: str, out: Path) -> Path:
    """Save ``model`` (anything ``--model`` takes: a folder, a .gguf file, ``smollm2``) as a transformers
    folder of safetensors in ``out``, which vLLM serves; a GGUF is dequantized. Returns ``out``.
    An ``out`` that already holds a model is kept as it is (an interrupted export is redone)."""
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    model_obj, tokenizer = load_policy(TrainConfig(model=model, lora=False), wrap=False)
    model_obj.config.use_cache = True
    partial = out.with_name(out.name + ".partial")
    model_obj.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    partial.rename(out)
    return out


def lora_config(config: TrainConfig):
    from peft import LoraConfig

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def save_policy(model, tokenizer, out: Path) -> None:
    """Merged weights and tokenizer in ``out``; the LoRA adapter alone in ``out/adapter``."""
    out.mkdir(parents=True, exist_ok=True)
    merged = model
    if hasattr(model, "merge_and_unload"):
        model.save_pretrained(out / "adapter")
        merged = model.merge_and_unload()  # in place: saving is the run's last use of the adapter
    merged.config.use_cache = True
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)


# -- examples ---------------------------------------------------------------------------------------


def select(config: TrainConfig, episodes: list[Episode]) -> list[tuple[Decision, float]]:
    """(decision, weight) pairs for the method: sft keeps the valid messages of the best ``top`` share of
    episodes; rft the valid messages of each group's best episodes (:func:`group_best`); dagger every decision
    (the teacher's labels); each weighs 1, or its action's ``--action-weights``. offline-grpo keeps every
    decision whose episode has a nonzero advantage, weighted by it."""
    weights = parse_action_weights(config.action_weights)
    if config.method == "sft":
        ranked = sorted(episodes, key=lambda ep: ep.reward, reverse=True)
        kept = ranked[: max(1, math.ceil(len(ranked) * config.top))] if ranked else []
        chosen = [d for ep in kept for d in ep.decisions if d.valid]
    elif config.method == "rft":
        chosen = [d for ep in group_best(episodes) for d in ep.decisions if d.valid]
    elif config.method == "dagger":
        chosen = [d for ep in episodes for d in ep.decisions]  # the teacher's labels (load_episodes(teacher=...))
    if config.method in IMITATION:
        return [(d, weights.get(d.action, 1.0)) for d in chosen]
    adv = advantages(episodes, scale=config.scale_advantages)
    return [(d, adv[ep.id]) for ep in episodes for d in ep.decisions if adv[ep.id] != 0.0]


def group_best(episodes: list[Episode]) -> list[Episode]:
    """Each group's best episodes: those whose reward is the group's highest, when that is above the
    group's lowest (the group tells better from worse) and above 0 (nothing sold at a loss is imitated).
    Ties at the top are all kept."""
    kept = []
    for members in by_group(episodes).values():
        top = max(ep.reward for ep in members)
        if top > 0 and top > min(ep.reward for ep in members):
            kept += [ep for ep in members if ep.reward == top]
    return kept


def build_examples(config: TrainConfig, episodes: list[Episode], model, tokenizer) -> tuple[list[Example], dict]:
    """Tokenized examples and counts of what was kept and why the rest was dropped."""
    from negotiate.agents.hf import encode_chat, stop_tokens

    stops = stop_tokens(model, tokenizer)
    out: list[Example] = []
    counts = {"episodes": len(episodes), "decisions": sum(len(ep.decisions) for ep in episodes), "too_long": 0, "logged_tokens": 0}
    for decision, weight in select(config, episodes):
        logged = decision.prompt_ids is not None and decision.completion_ids is not None
        prompt_ids = list(decision.prompt_ids) if logged else encode_chat(tokenizer, decision.prompt)
        completion_ids = list(decision.completion_ids) if logged else encode_completion(tokenizer, decision.prompt, decision.completion, stops)
        if not completion_ids:
            continue
        if len(prompt_ids) + len(completion_ids) > config.max_length:
            counts["too_long"] += 1
            continue
        old = list(decision.logprobs) if logged and decision.logprobs and len(decision.logprobs) == len(completion_ids) else None
        counts["logged_tokens"] += logged
        out.append(Example(prompt_ids, completion_ids, weight, old, decision.reward, decision.valid))
    counts["examples"] = len(out)
    return out, counts


# -- the loss -------------------------------------------------------------------------------------


def example_loss(config: TrainConfig, model, example: Example, stats: dict, logp=None, ref=None):
    """The summed (not averaged) token loss of one example; ``stats`` gathers what the step logs.
    ``logp`` (and ``ref``, the reference's log-probs for the KL) may come from :func:`batch_logprobs`."""
    import torch

    if logp is None:
        logp = completion_logprobs(model, example)
    if config.method in IMITATION:
        return -example.weight * logp.sum()
    if example.old_logprobs is None:  # nothing logged: the policy before its first update samples the reference point
        example.old_logprobs = logp.detach().tolist()
    old = torch.tensor(example.old_logprobs, device=logp.device)
    ratio = torch.exp(logp - old)
    adv = example.weight
    clipped = torch.clamp(ratio, 1 - config.clip_eps, 1 + config.clip_eps)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    stats["ratio"].append(float(ratio.detach().mean()))
    stats["clipped"].append(float(((ratio.detach() - clipped.detach()).abs() > 1e-6).float().mean()))
    if config.kl_beta > 0:
        if ref is None:
            with torch.no_grad(), _reference(model):
                ref = completion_logprobs(model, example)
        delta = ref - logp
        kl = torch.exp(delta) - delta - 1
        stats["kl"].append(float(kl.detach().mean()))
        loss = loss + config.kl_beta * kl
    return loss.sum()


def batch_loss_backward(config: TrainConfig, model, batch: list[Example], stats: dict, tokens: int) -> float:
    """Backpropagate the step's loss (summed over the batch, over ``tokens``) in micro-batches of
    ``config.micro_batch`` examples that share their prompt prefix; returns the loss."""
    import contextlib

    import torch

    total = 0.0
    size = max(1, config.micro_batch)
    autocast = torch.autocast(model.device.type, dtype=torch.bfloat16) if config.bf16 else contextlib.nullcontext()
    for start in range(0, len(batch), size):
        chunk = batch[start : start + size]
        with autocast:
            logps = batch_logprobs(model, chunk)
            refs = [None] * len(chunk)
            if config.method == "offline-grpo" and config.kl_beta > 0:
                with torch.no_grad(), _reference(model):
                    refs = batch_logprobs(model, chunk)
            loss = sum(example_loss(config, model, ex, stats, logp=lp, ref=rf) for ex, lp, rf in zip(chunk, logps, refs)) / tokens
        loss.backward()
        total += float(loss.detach())
    return total


def _reference(model):
    """The starting model: the same weights with the LoRA adapter switched off (a context manager)."""
    if not hasattr(model, "disable_adapter"):
        raise UserError("a KL to the reference needs LoRA (the reference is the model with its adapter off)",
                        field="--kl-beta", value=None)
    return model.disable_adapter()


# -- evaluation: the policy plays episodes ------------------------------------------------------


def play_episodes(model, tokenizer, config: TrainConfig, jobs: list[tuple[int, int]], *, run_seed: int, split: str,
                  group: int = 1, label: str = "policy") -> list[list[dict]]:
    """Play one episode per ``(market index, repeat)`` job with the current weights as the seller
    (tagged format), generation batched across episodes; return each episode's events. The market
    of index ``m`` is the one ``negotiate serve --seed RUN_SEED`` plays as episode ``m`` (``group`` 1),
    so scripted sellers can be compared on exactly these markets. With ``config.fresh`` the policy is asked
    only once every scripted buyer has answered its last message (as ``serve --fresh``)."""
    import anyio

    from negotiate.agents.hf import HFBackend, HFOptions, _LocalModel
    from negotiate.agents.registry import policy_seller
    from negotiate.run import LOCAL_TIMEOUT, Run, RunConfig

    was_training = model.training
    local = _LocalModel.in_memory(model, tokenizer, label)
    local.batch = config.gen_batch
    policy = config.policy
    options = HFOptions(model=label, path=label, temperature=policy.temperature, max_tokens=policy.max_tokens, batch=config.gen_batch)
    backend = HFBackend(options, model=local)

    class Weights:
        """The weights being trained, as a seller spec the run builds its episodes with: the config's policy."""

        text = label

        def build(self, market, seed, pools=None):
            return policy_seller(policy, backend, market, seed)

    # Market m's episodes are indices m * group + repeat of a run grouped by ``group``, as collect numbers them.
    run = Run(RunConfig(sellers=(label,), buyers=config.eval_buyers, split=split, seed=run_seed, group=group,
                        seller_timeout=LOCAL_TIMEOUT, reply_timeout=LOCAL_TIMEOUT, fresh=config.fresh))
    results: list = [None] * len(jobs)

    async def one(k: int, index: int, repeat: int) -> None:
        plan = run.episode(Weights(), index * group + repeat, episode_id=f"{label}-{index:06d}-{repeat:02d}")
        results[k] = (await plan.play()).events

    async def main() -> None:
        async with run, anyio.create_task_group() as tg:
            for k, (index, repeat) in enumerate(jobs):
                tg.start_soon(one, k, index, repeat)

    try:
        anyio.run(main)
    finally:
        model.train(was_training)
    return results


def eval_splits_of(config: TrainConfig) -> list[str]:
    """The evaluation splits of ``config.eval_splits`` (comma-separated, in order)."""
    return items_of(config.eval_splits, _spelled("eval_splits"))


def evaluate_splits(model, tokenizer, config: TrainConfig, folder: Path, step: int, ranks: Ranks = ONE) -> list:
    """The policy's evaluation at ``step`` on each of ``--eval-splits`` (``--eval-episodes`` markets each): one trace
    file each under ``folder`` (``step-NNNNN.jsonl`` where there is one split), the episodes pooled."""
    from negotiate.runner import slug

    splits = eval_splits_of(config)
    played = []
    for split in splits:
        name = f"step-{step:05d}.jsonl" if len(splits) == 1 else f"step-{step:05d}-{slug(split)}.jsonl"
        played += evaluate_policy(model, tokenizer, config, folder / name, episodes=config.eval_episodes,
                                  run_seed=config.eval_seed, split=split, label=f"step-{step}", ranks=ranks)
    return played


def evaluate_policy(model, tokenizer, config: TrainConfig, out_file: Path, *, episodes: int, run_seed: int,
                    split: str, label: str = "policy", ranks: Ranks = ONE) -> list[list[dict]]:
    """Play ``episodes`` held-out episodes with the current weights; write their trace to ``out_file``. Under several
    processes each plays a share (episodes ``rank, rank + world, ...``) and rank 0 writes them all, in order."""
    from negotiate.trace import TraceWriter

    jobs = share([(i, 0) for i in range(episodes)], ranks)
    mine = play_episodes(model, tokenizer, config, jobs, run_seed=run_seed, split=split, label=label)
    shares = gather(mine, ranks)
    played = [shares[i % ranks.world][i // ranks.world] for i in range(episodes)]
    if ranks.main:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        with TraceWriter(out_file) as writer:
            for events in played:
                writer.write(events)
    return played


def summarize_episodes(played: list[list], reward: str) -> dict:
    """Mean reward, adherence (valid seller messages) and profit/OPT of played episodes."""
    from negotiate.training.rewards import reward_fn

    score = reward_fn(reward)
    rewards = [r for r in (score(events) for events in played) if r is not None]
    ends = [events[-1].metrics or {} for events in played]
    sent = sum(m.get("seller_messages", 0) for m in ends)
    invalid = sum(m.get("seller_invalid", 0) for m in ends)
    ratios = [m["profit_ratio"] for m in ends if m.get("profit_ratio") is not None]
    return {
        "reward": sum(rewards) / len(rewards) if rewards else None,
        "valid_rate": (sent - invalid) / sent if sent else None,
        "profit_ratio": sum(ratios) / len(ratios) if ratios else None,
        "episodes": len(played),
    }


# -- the loop -------------------------------------------------------------------------------------


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line, flushed at once (a killed run keeps its curve). With no
    path (a rank other than 0) the rows are kept and nothing is written."""

    def __init__(self, path: Path | None):
        self.path = path
        self.rows: list[dict] = []
        self._handle = open(path, "w", encoding="utf-8") if path is not None else None  # a rerun starts a fresh log

    def write(self, row: dict) -> None:
        self.rows.append(row)
        if self._handle is not None:
            self._handle.write(json.dumps(row) + "\n")
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def train(config: TrainConfig, *, progress=None) -> dict:
    """Run ``config``, a method that learns from collected traces (every one but ``online-grpo``, which
    :func:`negotiate.training.methods.train` hands to :mod:`negotiate.training.online`); returns the summary
    also written to ``OUT/train.json``."""
    config.check()
    config.check_inputs()
    if config.method not in FROM_TRACES:
        raise ValueError(f"{config.method} does not learn from traces: negotiate.training.methods.train runs it")
    grouped = config.method in ("rft", "offline-grpo")
    where = DataFilter(split=config.split, seller=config.seller, min_group=config.min_group if grouped else 1)
    episodes = load_episodes(config.traces, reward=config.reward, where=where, prompt=config.prompt,
                             teacher=config.teacher if config.method == "dagger" else None)
    if not episodes:
        raise UserError("no usable episodes (check --split, --seller and --min-group against the traces)", source=", ".join(config.traces))
    import torch  # seconds to import: after the traces, so that traces that give nothing are refused at once

    if config.threads:
        torch.set_num_threads(config.threads)
    ranks = from_env()
    made = join(ranks)  # every rank read the same traces; none raised, so all of them join
    try:
        summary = _train_steps(config, episodes, ranks, progress=progress)
    except BaseException:
        leave(made, wait=False)  # no barrier: the other ranks may be inside a collective; torchrun ends them
        raise
    leave(made)
    return summary


def _train_steps(config: TrainConfig, episodes: list[Episode], ranks: Ranks, *, progress=None) -> dict:
    import torch

    out = Path(config.out)
    torch.manual_seed(config.seed)
    began = time.perf_counter()
    model, tokenizer = load_policy(config)
    if config.checkpointing:
        checkpoint_layers(model)
    return_freed_memory()
    examples, counts = build_examples(config, episodes, model, tokenizer)
    if not examples:
        hint = {"offline-grpo": " (every group's rewards are equal: collect with a sampling seller, --group 2 or more)",
                "rft": " (no group has an episode that beats its others and sold at a profit: collect with a sampling seller, "
                       "--group 2 or more)"}.get(config.method, "")
        raise UserError(f"no training examples{hint}", source=", ".join(config.traces))
    if ranks.main:
        out.mkdir(parents=True, exist_ok=True)
    log.info("train", method=config.method, model=config.model, **counts, load_s=round(time.perf_counter() - began, 1),
             rank=ranks.rank, world=ranks.world)
    metrics = MetricsLog(out / "metrics.jsonl" if ranks.main else None)
    rng = random.Random(config.seed)  # the same on every rank: each draws the same global batches
    # --max-steps is the number of steps, as in transformers' Trainer: fewer than one pass stops early, more
    # go round the reshuffled decisions again (a dagger round's few hundred labelled states, say).
    total_steps = config.max_steps or math.ceil(len(examples) * config.epochs / config.batch_size)
    trainable = [p for p in model.parameters() if p.requires_grad]
    broadcast_parameters(trainable, ranks)
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    evals: list[dict] = []

    def run_eval(step: int) -> None:
        if config.eval_episodes <= 0:
            return
        played = evaluate_splits(model, tokenizer, config, out / "eval", step, ranks)
        row = {"step": step, "eval": summarize_episodes(played, config.reward)}
        evals.append(row)
        metrics.write(row)
        log.info("eval", step=step, **row["eval"])

    order: list[int] = []
    model.train()
    run_eval(0)
    done = 0  # steps whose update is in the weights
    try:
        for step in range(1, total_steps + 1):
            picked = []
            while len(picked) < config.batch_size:
                if not order:
                    order = list(range(len(examples)))
                    rng.shuffle(order)
                picked.append(order.pop())
            batch = [examples[k] for k in picked]
            mine = share(picked, ranks)
            unset = [k for k in mine if examples[k].old_logprobs is None]
            tokens = sum(len(ex.completion_ids) for ex in batch)  # the whole batch's: the ranks' losses add up to one step's
            stats: dict[str, list] = {"ratio": [], "clipped": [], "kl": []}
            optimizer.zero_grad(set_to_none=True)
            tick = time.perf_counter()
            loss_sum = batch_loss_backward(config, model, [examples[k] for k in mine], stats, tokens)
            sum_gradients(trainable, ranks)
            norm = torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
            optimizer.step()
            done = step
            if ranks.many and config.method == "offline-grpo":  # every rank, always: a collective
                _share_old_logprobs(examples, unset, ranks)
            keys = sorted(stats)
            totals = sum_floats([loss_sum] + [sum(stats[k]) for k in keys] + [len(stats[k]) for k in keys], ranks)
            row = {"step": step, "epoch": round(step * config.batch_size / len(examples), 3), "loss": round(totals[0], 6),
                   "grad_norm": round(float(norm), 4), "tokens": tokens, "seconds": round(time.perf_counter() - tick, 3),
                   "batch_reward": round(sum(ex.reward for ex in batch) / len(batch), 6),
                   "batch_valid": round(sum(ex.valid for ex in batch) / len(batch), 4)}
            for k, key in enumerate(keys):
                total, count = totals[1 + k], totals[1 + len(keys) + k]
                if count:
                    row[key] = round(total / count, 6)
            metrics.write(row)
            if progress is not None and ranks.main:
                progress(step, total_steps, row)
            if config.eval_every and step % config.eval_every == 0 and step < total_steps:
                run_eval(step)
        run_eval(total_steps)
        if ranks.main:
            save_policy(model, tokenizer, out)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: keep what the finished steps learned, and say so (run_train prints it)
        stop.steps, stop.total_steps, stop.checkpoint = done, total_steps, None
        if done and ranks.main:
            save_policy(model, tokenizer, out)
            write_summary(config, counts, done, began, evals, out, metrics.rows, ranks, interrupted=True)
            stop.checkpoint = str(out)
        raise
    finally:
        metrics.close()
    return write_summary(config, counts, total_steps, began, evals, out, metrics.rows, ranks)


def write_summary(config: TrainConfig, counts: dict, steps: int, began: float, evals: list, out: Path, rows: list, ranks: Ranks, *,
                   interrupted: bool = False) -> dict:
    """The run's summary, written (rank 0) to ``OUT/train.json`` with the curve: ``interrupted`` when a stop cut the run
    short after ``steps`` steps (the checkpoint holds what they learned)."""
    summary = {"config": config.to_json(), "data": counts, "steps": steps, "seconds": round(time.perf_counter() - began, 1),
               "evals": evals, "checkpoint": str(out), "curve": str(out / "curve.png"), "load_as": f"hf:{out}", "processes": ranks.world}
    if interrupted:
        summary["interrupted"] = True
    if ranks.main:
        from negotiate.training.curves import write_curve

        summary["curve"] = str(write_curve(rows, out / "curve.png", title=f"{config.method} from {config.model}"))
        (out / "train.json").write_text(json.dumps(summary, indent=2))
    return summary


def _share_old_logprobs(examples: list[Example], unset: list[int], ranks: Ranks) -> None:
    """offline-grpo under several processes: the log-probs a rank set as an example's reference point (its first use)
    go to every rank, so that the example's ratio is taken against the same values wherever it is drawn next."""
    for fresh in gather({k: examples[k].old_logprobs for k in unset}, ranks):
        for k, old in fresh.items():
            if examples[k].old_logprobs is None:
                examples[k].old_logprobs = old
