"""The round methods of ``negotiate loop`` (``--round-method``), one module each, listed in :data:`ROUNDS`, and the
question every round asks before it trains: do its episodes give its method anything to learn
(:func:`learning_signal`)? Where they do not, the round keeps the previous policy."""

from __future__ import annotations

from pathlib import Path

from negotiate.training.loop.rounds.dagger import Dagger
from negotiate.training.loop.rounds.method import RoundMethod
from negotiate.training.loop.rounds.offline_grpo import OfflineGrpo
from negotiate.training.loop.rounds.rft import Rft

__all__ = ["ROUNDS", "RoundMethod", "learning_signal"]

ROUNDS: dict[str, RoundMethod] = {method.name: method for method in (Rft(), Dagger(), OfflineGrpo())}
"""``--round-method``'s choices, in the order the help lists them."""


def learning_signal(traces: list[Path], method: str = "offline-grpo") -> bool:
    """Whether the episodes the round trains on (its rollouts; an aggregated dagger round's also the teacher's
    and every earlier round's) give its method anything to learn: for offline-grpo a group whose rewards differ
    (a nonzero advantage), for rft a group with a best episode to imitate, for dagger any seller message (a
    state for the teacher to label)."""
    from negotiate.training.dataset import DataFilter, load_episodes
    from negotiate.training.trainer import TrainConfig, select

    def learns_from(folder: Path) -> bool:  # what the round's training would learn from; one folder at a time, where each
        episodes = load_episodes([folder], where=DataFilter(min_group=ROUNDS[method].min_group))  # group lies whole
        return bool(select(TrainConfig(method=method, traces=(str(folder),)), episodes))

    return any(learns_from(folder) for folder in traces)
