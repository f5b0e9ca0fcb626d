"""The one entry of ``negotiate train``: :func:`train` runs a :class:`~negotiate.training.trainer.TrainConfig` by its method.

The methods that learn from collected traces (sft, rft, dagger, offline-grpo) are :mod:`negotiate.training.trainer`'s;
``online-grpo`` is :mod:`negotiate.training.online`'s, which builds on the trainer's model loading and evaluation. The
choice lives here, above both, so that neither imports the other both ways.
"""

from __future__ import annotations

from negotiate.training.trainer import TrainConfig

__all__ = ["train"]


def train(config: TrainConfig, *, progress=None) -> dict:
    """Run ``config``; returns the summary also written to ``OUT/train.json``."""
    if config.method == "online-grpo":
        config.check()
        config.check_inputs()
        from negotiate.training.online import train_online  # TRL loads only for this method

        return train_online(config, progress=progress)
    from negotiate.training.trainer import train as train_from_traces

    return train_from_traces(config, progress=progress)
