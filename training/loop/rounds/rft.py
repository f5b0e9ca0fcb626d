"""The ``rft`` round (rejection-sampling fine-tuning): the policy imitates each group's best episode, the episode
of a market that made the most of its group; a group whose episodes all scored alike gives nothing to imitate."""

from __future__ import annotations

from negotiate.training.loop.rounds.method import RoundMethod

__all__ = ["Rft"]


class Rft(RoundMethod):
    name = "rft"
