"""What ``negotiate train`` and ``negotiate loop`` both set, as one typed part: :class:`LearningConfig`, the dataclass
:class:`~negotiate.training.trainer.TrainConfig` and :class:`~negotiate.training.loop.LoopConfig` inherit. The model
and its adapter, the teacher, the policy's prompt, its sampling and token budget, the groups it is compared in, and
its held-out markets: the loop writes each of them into every ``train`` it runs, so each is declared once, here.

Where the loop's default differs, ``LoopConfig`` declares the field again and says why. Settings of the same name
that mean different things stay in each class (``out``: a checkpoint or a run folder; ``split``: a filter of the
traces or the training markets; ``eval_episodes``: episodes in all or markets per split; ``eval_buyers``: one buyer
spec or a list of columns).
"""

from __future__ import annotations

from dataclasses import dataclass

from negotiate.settings import setting

__all__ = ["LearningConfig", "flag_in"]


def flag_in(*commands: str, per: dict | None = None) -> dict:
    """The options of a setting that is a flag of ``commands`` only (a key of the others), with each command's own
    options (``per``: command -> {attribute: value}, its help say)."""
    options = {command: {"key_only": False} for command in commands}
    for command, more in (per or {}).items():
        options[command] = options.get(command, {}) | more
    return {"key_only": True, "per": tuple(options.items())}


def _helps(train: str, loop: str) -> dict:
    """A setting's help as ``train`` and as ``loop`` say it (:func:`flag_in`'s ``per``)."""
    return {"train": {"help": train}, "loop": {"help": loop}}


@dataclass
class LearningConfig:
    """The settings ``train`` and ``loop`` share (each a key of both; a flag where :func:`flag_in` says)."""

    model: str = setting("the starting model: a folder saved by transformers, a .gguf file, or smollm2", default="smollm2")
    teacher: str = setting("the scripted teacher", default="greedy", **flag_in("train", "loop", per=_helps(
        "dagger: the scripted seller whose replies label the episodes' states", "the scripted seller SFT imitates")))
    action_weights: str = setting("the imitated decisions (train's sft, rft and dagger; the loop's SFT and rft/dagger rounds): "
                                  "weigh each one's loss by the kind of its action, e.g. accept=4 (kinds not named weigh 1): a "
                                  "rare decision, such as the planner's accept, counts more", default="", listed=True,
                                  key_only=True)
    prompt: str = setting("the seller's prompt view", default="full", **flag_in("train", "loop", per=_helps(
        "the seller's prompt, full, compact, facts, advice or tools: how a scripted teacher's decisions are rendered, and the "
        "prompt in evaluation and rollouts (a model's own decisions keep the prompt it saw)",
        "the policy's prompt: full; compact (each buyer's thread of actions without talk, under half the tokens); facts "
        "(compact, with the turns each buyer has and each bidder's last bids and trend); advice (facts, and the message the "
        "planner would send); or tools (advice, and greedy's message). SFT renders the teacher's decisions with it, and the "
        "policy is served with it")))
    seed: int = setting("the run's seed", default=0, kind="int", **flag_in("train", per=_helps(
        "shuffling and sampling seed", "run seed of the teacher's markets; round K collects on seed + K and trains with it")))
    lora_r: int = setting("LoRA rank", default=16, kind="int", key_only=True)
    micro_batch: int = setting("decisions per training forward pass (they share one pass over their common prompt prefix); "
                               "gradients accumulate over the step", default=8, kind="int", key_only=True)
    bf16: bool = setting("compute in bfloat16 (torch.autocast; the weights and the optimizer stay float32). Off unless set, so "
                         "a run's numbers do not depend on the CPU; loop decides it from the machine and writes it here",
                         default=False, kind="switch", key_only=True)
    kl_beta: float = setting("offline-grpo: weight of the KL to the starting model (0: none)", default=0.0, kind="number",
                             key_only=True)
    threads: int | None = setting("torch threads in training, 1 or more (beside other jobs on a 2-core machine, 1 is faster: "
                                  "SmolLM2's SFT step at batch 4 took 22 s on one thread and 44 s on two)",
                                  default=None, kind="int", shown="torch's choice", **flag_in("train"))
    fresh: bool = setting("ask the policy (the loop: every seller it plays) for a message only once every scripted buyer has "
                          "answered its last one, so it decides on the state its message lands in (serve's fresh)",
                          default=False, kind="switch", key_only=True)
    temperature: float = setting("sampling temperature in evaluation and rollouts, 0 to 2 (0: greedy, which online-grpo's "
                                 "rollouts cannot be)", default=0.7, kind="number", key_only=True)
    max_tokens: int = setting("most tokens per seller reply in evaluation and rollouts (96 leaves room for a JSON reply; "
                              "loop's tagged replies default to 48)", default=96, kind="int", key_only=True)
    markets: int = setting("online-grpo: markets in the prompt dataset", default=64, kind="int", key_only=True)
    group: int = setting("episodes per market", default=4, kind="int", **flag_in(per=_helps(
        "online-grpo: episodes per market per step (GRPO's num_generations)",
        "episodes per market per round (the group its episodes are compared in)")))
    eval_splits: str = setting("comma-separated splits (or TOML specs) of the held-out markets", default="train", listed=True,
                               **flag_in("loop"))
    eval_seed: int = setting("run seed of the held-out markets (keep it apart from the training runs' seeds)", default=1_000_003,
                             kind="int", key_only=True)
