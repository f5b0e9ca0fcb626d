"""RLVR for the seller: rewards from traces, training data, and the trainer (``negotiate train``).

``rewards`` and ``dataset`` need only the core install; ``trainer`` and ``online`` import
torch, transformers, peft and TRL inside their functions (``pip install 'negotiate[train]'``).
"""

from negotiate.training.dataset import DataFilter, Decision, ScoredEpisode, advantages, decisions, group_key, load_episodes, replay
from negotiate.training.dataset import Episode  # noqa: F401  (the former name of ScoredEpisode, not in __all__)
from negotiate.training.rewards import DEFAULT_REWARD, PENALTY, REWARDS, reward_fn
from negotiate.training.trainer import METHODS, TrainConfig
from negotiate.training.methods import train

__all__ = [
    "DataFilter", "Decision", "ScoredEpisode", "advantages", "decisions", "group_key", "load_episodes", "replay",
    "DEFAULT_REWARD", "PENALTY", "REWARDS", "reward_fn", "METHODS", "TrainConfig", "train",
]
