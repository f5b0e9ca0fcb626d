"""What a round method is to the loop: :class:`RoundMethod`, the few things in which the methods of ``--round-method``
differ. Which traces a round trains on, the trainer settings its method adds to ``train``, how many episodes of one
market it compares, and why a round may have nothing to learn. Each method is one module beside this one (a new method
is one new module and a line in :mod:`negotiate.training.loop.rounds`); the training itself is ``negotiate train
--method NAME``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["RoundMethod"]


class RoundMethod:
    """A round method: the defaults here are those of a method that compares the episodes of a group."""

    name: str
    """``--round-method``'s value, and ``negotiate train --method``'s."""
    min_group = 2
    """Episodes per market a round needs: rft and offline-grpo compare a market's episodes with each other."""
    labels_with_teacher = False
    """Whether its labels are ``--teacher``'s replies in the policy's states (the teacher must then follow another
    seller's episode, and ``--teacher-traces``' seller cannot stand in for it)."""
    aggregates = False
    """Whether ``--aggregate`` applies: learning from the teacher's episodes and every round's rollouts so far."""
    weighs_actions = True
    """Whether ``--action-weights`` (``--round-action-weights``) weigh its imitated decisions."""
    no_signal = "no group had an episode better than its others"
    """Why a round learns nothing where its traces give it no signal (see :func:`~negotiate.training.loop.rounds.learning_signal`)."""

    def traces(self, config, out: Path, k: int) -> list[Path]:
        """The trace folders round ``k`` of the run in ``out`` trains on: its own rollouts."""
        return [out / f"round-{k:02d}" / "rollouts"]

    def train_options(self, config) -> dict:
        """The trainer settings this method adds to the round's ``train`` (a TrainConfig field name -> its value)."""
        return {"action_weights": config.round_weights} if self.weighs_actions and config.round_weights else {}
