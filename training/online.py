"""``online-grpo``: TRL's GRPOTrainer, with a rollout function that plays real episodes in this runtime.

The prompt dataset is a list of market instances (``market 17`` names market 17 of the run
seeded ``config.seed`` on ``config.split``... or the first of ``eval_splits`` when no split is given).
TRL repeats each prompt ``num_generations`` (= ``config.group``) times and calls
:func:`rollout` with the repeated list; the rollout plays one full episode per entry with the
policy's current weights as the seller (scripted buyers, the same for every repeat), and returns
one seller decision per episode: its prompt ids, completion ids and sampling log-probs, with
the episode's reward as an extra field that :func:`episode_reward` hands to TRL. The decision is
drawn uniformly from the episode's turns (seeded), an unbiased sample of the episode's
per-decision policy gradient: TRL takes exactly one completion per prompt entry.

Generation runs through the ``hf`` backend on the trainer's own model (transformers, batched
across the group's episodes). With LoRA, TRL wraps the model (``peft_config``) and its
reference is the model with the adapter off.

Under ``torchrun`` or ``accelerate launch`` (N processes), accelerate sets up the process group
(gloo on CPUs) and TRL hands each process ``--batch-size / N`` of the step's prompt copies, gathering
the rewards for the group advantages. The rollout numbers each copy of a market across all
processes (the prompts are gathered first), so that no two processes play the same episode of a
group; the logged reward is over every process's episodes. Rank 0 alone writes.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from pathlib import Path

import structlog

from negotiate.errors import UserError
from negotiate.trace import EpisodeRecord

from negotiate.training.ranks import ONE, Ranks, from_env, gather, leave
from negotiate.training.rewards import reward_fn
from negotiate.training.trainer import MetricsLog, TrainConfig, eval_splits_of, evaluate_splits, load_policy, lora_config, play_episodes
from negotiate.training.trainer import save_policy, summarize_episodes, write_summary

__all__ = ["train_online", "make_rollout", "episode_reward", "market_prompts"]

log = structlog.get_logger("negotiate.training")


def market_prompts(count: int) -> list[str]:
    """The prompt dataset: one line per market instance (the rollout reads the index back)."""
    return [f"market {i}" for i in range(count)]


def _index(prompt) -> int:
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    try:
        return int(text.rsplit(" ", 1)[-1])
    except ValueError:
        raise ValueError(f"not a market prompt: {text!r}") from None


def episode_reward(prompts, completions, episode_reward, **kwargs) -> list[float]:
    """TRL reward function: the reward the rollout computed from the whole episode."""
    return list(episode_reward)


def make_rollout(config: TrainConfig, tokenizer, *, split: str, record: list, ranks: Ranks = ONE):
    """The ``rollout_func`` for GRPOTrainer; ``record`` gathers each call's episode summary (the metrics log),
    over every rank's episodes."""
    score = reward_fn(config.reward)
    calls = {"n": 0}

    def rollout(prompts: list, trainer) -> dict:
        model = trainer.accelerator.unwrap_model(trainer.model)
        indices = [_index(p) for p in prompts]
        # TRL lists each prompt num_generations times, a group's copies possibly spread over the ranks: number each
        # copy after those the ranks before this one hold, so every copy of a market is a different episode.
        seen = Counter(index for earlier in gather(indices, ranks)[: ranks.rank] for index in earlier)
        repeats = []
        for index in indices:
            repeats.append(seen[index])
            seen[index] += 1
        calls["n"] += 1
        step = calls["n"]
        jobs = [(index, repeat + config.group * step) for index, repeat in zip(indices, repeats)]  # fresh samples each step
        played = play_episodes(model, tokenizer, config, jobs, run_seed=config.seed, split=split, group=config.group, label="rollout")
        rng = random.Random(hash((config.seed, step)) & 0xFFFFFFFF)
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "episode_reward": [], "valid": []}
        for events in played:
            episode = EpisodeRecord.of(events)
            reward = score(episode.events)
            turns = [e for e in episode.seller_messages() if (e.extra or {}).get("token_ids")]
            if not turns:
                raise RuntimeError(f"episode {episode.id} has no seller reply with token ids ({episode.reason})")
            chosen = rng.choice(turns)
            extra = chosen.extra
            out["prompt_ids"].append(extra["prompt_token_ids"])
            out["completion_ids"].append(extra["token_ids"])
            out["logprobs"].append(extra["logprobs"])
            out["episode_reward"].append(0.0 if reward is None else reward)
            out["valid"].append(bool(chosen.valid))
        everyone = [events for share in gather(played, ranks) for events in share]
        record.append(summarize_episodes(everyone, config.reward))
        return out

    return rollout


def train_online(config: TrainConfig, *, progress=None) -> dict:
    """Run GRPOTrainer for ``config.max_steps`` steps (default: one pass over ``config.markets``)."""
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, ProgressCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    out = Path(config.out)
    if (out / "train.json").exists():
        raise UserError("already holds a trained checkpoint; choose another --out", source=str(out))
    if config.group < 2:
        raise UserError("online-grpo compares episodes of one market: --group must be 2 or more", field="--group", value=config.group)
    if config.batch_size % config.group:
        raise UserError(f"must be a multiple of --group ({config.group})", field="--batch-size", value=config.batch_size)
    if config.threads:
        torch.set_num_threads(config.threads)
    ranks = from_env()
    config.check_ranks(ranks)
    if torch.cuda.is_available():
        torch.cuda.set_device(ranks.local % torch.cuda.device_count())  # load_policy's .to("cuda") lands on this rank's GPU
    began = time.perf_counter()
    split = config.split or eval_splits_of(config)[0]
    model, tokenizer = load_policy(config, wrap=False)
    if ranks.main:
        out.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(out / "metrics.jsonl" if ranks.main else None)
    record: list[dict] = []
    steps = config.max_steps or max(1, config.markets * config.group // config.batch_size)
    args = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=config.batch_size // ranks.world, num_generations=config.group,
        max_completion_length=config.max_tokens, learning_rate=config.lr, weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm, beta=config.kl_beta, epsilon=config.clip_eps, max_steps=steps,
        temperature=config.temperature, scale_rewards="group" if config.scale_advantages else "none",
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=not torch.cuda.is_available(),
        bf16=False, gradient_checkpointing=False, seed=config.seed, disable_tqdm=True,
        ddp_backend="gloo" if ranks.many and not torch.cuda.is_available() else None,
    )
    dataset = Dataset.from_dict({"prompt": market_prompts(config.markets)})
    rollout = make_rollout(config, tokenizer, split=split, record=record, ranks=ranks)

    class Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            episodes = record[-1] if record else {}
            row = {"step": state.global_step, "loss": round(float(logs["loss"]), 6),
                   "reward": episodes.get("reward"), "valid_rate": episodes.get("valid_rate"),
                   "profit_ratio": episodes.get("profit_ratio"), "kl": logs.get("kl"), "seconds": round(time.perf_counter() - began, 1)}
            metrics.write(row)
            if progress is not None and ranks.main:
                progress(state.global_step, steps, row)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16; pinned, and tested here
    trainer = GRPOTrainer(
        model=model, reward_funcs=[episode_reward], args=args, train_dataset=dataset, processing_class=tokenizer,
        peft_config=lora_config(config) if config.lora else None, rollout_func=rollout, callbacks=[Log()],
    )
    trainer.remove_callback(PrinterCallback)  # our progress bar and metrics.jsonl say it once
    trainer.remove_callback(ProgressCallback)
    evals: list[dict] = []

    def run_eval(step: int) -> None:
        if config.eval_episodes > 0:
            played = evaluate_splits(trainer.model, tokenizer, config, out / "eval", step, ranks)
            row = {"step": step, "eval": summarize_episodes(played, config.reward)}
            evals.append(row)
            metrics.write(row)

    try:
        run_eval(0)
        trainer.train()
        run_eval(steps)
        if ranks.main:
            save_policy(trainer.model, tokenizer, out)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: keep what the finished steps learned, and say so (as sft does)
        leave(ranks.many, wait=False)
        done = trainer.state.global_step
        stop.steps, stop.total_steps, stop.checkpoint = done, steps, None
        if done and ranks.main:
            save_policy(trainer.model, tokenizer, out)
            write_summary(config, {"rollouts": len(record)}, done, began, evals, out, metrics.rows, ranks, interrupted=True)
            stop.checkpoint = str(out)
        raise
    except BaseException:
        leave(ranks.many, wait=False)  # another rank may be inside a collective; torchrun ends them
        raise
    finally:
        metrics.close()
    summary = write_summary(config, {"rollouts": len(record)}, steps, began, evals, out, metrics.rows, ranks)
    if ranks.many:
        # The DDP reducer holds the gloo group: freed last, with the GIL held, its destructor joins gloo's thread, which
        # may be freeing a finished collective's tensor and waiting for the GIL (a deadlock seen after the run ended).
        # Freed here instead, while the group lives on in torch's own table, and the group itself in leave().
        import gc

        del trainer
        gc.collect()
    leave(ranks.many)  # the group accelerate made: every rank returns once the checkpoint is written
    return summary
