"""The ``offline-grpo`` round: the clipped group-relative policy gradient on the round's rollouts, each decision
weighed by its episode's advantage within its market's group (so action weights do not apply), with an optional KL
to the base model (``--kl-beta``)."""

from __future__ import annotations

from negotiate.training.loop.rounds.method import RoundMethod

__all__ = ["OfflineGrpo"]


class OfflineGrpo(RoundMethod):
    name = "offline-grpo"
    weighs_actions = False

    def train_options(self, config) -> dict:
        return {"kl_beta": config.kl_beta}
