"""The ``dagger`` round: the teacher (``--teacher``) labels every state the policy reached in its rollouts with the
reply it would have sent there, and the policy imitates those labels. One episode per market is enough (nothing is
compared within a group). With ``--aggregate`` a round learns from DAgger's aggregated data set: the teacher's own
episodes and every round's rollouts so far, not only its own."""

from __future__ import annotations

from pathlib import Path

from negotiate.training.loop.rounds.method import RoundMethod

__all__ = ["Dagger"]


class Dagger(RoundMethod):
    name = "dagger"
    min_group = 1
    labels_with_teacher = True
    aggregates = True
    no_signal = "no finished episode has a seller message for the teacher to label"

    def traces(self, config, out: Path, k: int) -> list[Path]:
        if config.aggregate:  # every state labelled so far, the teacher's own first
            return [out / "round-00" / "teacher", *(out / f"round-{j:02d}" / "rollouts" for j in range(1, k + 1))]
        return super().traces(config, out, k)

    def train_options(self, config) -> dict:
        return {"teacher": config.teacher, "min_group": self.min_group, **super().train_options(config)}
