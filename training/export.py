"""``negotiate export``: the trainer's decisions as a Parquet file, for the RL stacks people already train with.

``negotiate train`` builds its data in memory: every seller decision of the traces, its prompt as the seller saw it
(or, for a scripted seller or a person, as the ``--prompt`` view renders the state) and its completion, the episode's
reward and the group-relative advantage (:mod:`negotiate.training.dataset`: ``load_episodes``, ``decisions``,
``advantages``; the rewards of :mod:`negotiate.training.rewards`). This module writes the same decisions, built by the
same functions, as one Parquet file: ``datasets.load_dataset("parquet", data_files=OUT)`` loads it, and TRL, verl and
OpenRLHF read its columns as they come.

One row per decision, in the traces' order (episode by episode, turn by turn). The columns (:data:`COLUMNS`):

- ``prompt``: the chat messages the seller saw, ``[{"role", "content"}, ...]`` (TRL's conversational form);
- ``completion``: what it wrote, as one assistant message ``[{"role": "assistant", "content": TEXT}]``;
- ``reward``: the reward the decision received: the episode's reward on its last decision, 0 before it (the reward
  arrives when the episode ends; the sum over an episode's rows is its reward);
- ``return``: the undiscounted return from the decision on, which is the episode's reward: what ``train`` weighs a
  decision by (``sft``'s ranking, ``rft``'s best of a group);
- ``advantage``: the episode's reward against its group's, as ``train --method offline-grpo`` computes it (the
  group's mean taken off, divided by its standard deviation unless ``scale_advantages`` is off; 0 for a group of one);
- ``episode``, ``market`` (the group: a hash of the spec and the market seed, shared by every repeat of a market),
  ``run``, ``seller``, ``split``, ``turn``, ``valid``, ``action``;
- ``prompt_ids``, ``completion_ids``, ``logprobs``: the token ids and log-probs where the trace logged them (a model
  seller's, served with ``logprobs``), else null.

The advantages are computed over the exported episodes numbered in order, not by their ids: two runs (or an
evaluation's splits) number their episodes alike, and an advantage keyed by id would take another episode's.

pyarrow comes with ``datasets`` (the ``train`` extra); nothing else here needs more than the core install.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from negotiate.agents.views import PROMPTS
from negotiate.errors import UserError
from negotiate.settings import setting

from negotiate.training.dataset import DataFilter, ScoredEpisode, advantages, check_teacher, load_episodes
from negotiate.training.rewards import DEFAULT_REWARD, REWARDS

__all__ = ["ExportConfig", "COLUMNS", "scored_episodes", "decision_rows", "export", "INSTALL"]

INSTALL = "pip install 'negotiate[train]'"
"""The extra that brings pyarrow (with ``datasets``)."""

COLUMNS = ("prompt", "completion", "reward", "return", "advantage", "episode", "market", "run", "seller", "split", "turn",
           "valid", "action", "prompt_ids", "completion_ids", "logprobs")
"""The columns of an exported file, in order (the module docstring says what each holds)."""


def _key(default, help: str, **options):
    """A setting of ``negotiate export`` that is a key only (of ``--config`` and ``--set``)."""
    return setting(help, default=default, key_only=True, **options)


@dataclass(frozen=True)
class ExportConfig:
    """One ``negotiate export``. Each field is a setting (a key of ``--config`` and ``--set``; a flag where not marked
    key-only), read as every command's are (:mod:`negotiate.settings`)."""

    traces: tuple[str, ...] = setting("trace files or folders whose seller decisions are written", default=(), kind="list",
                                      many=True, metavar="PATH")
    out: Path = setting("the Parquet file to write, a new one", default=Path("decisions.parquet"), kind="path")
    reward: str = setting("the reward of an episode (training/rewards.py)", default=DEFAULT_REWARD, choices=tuple(REWARDS))
    prompt: str = setting("the prompt view a scripted seller's or a person's decisions are rendered with, as train's --prompt "
                          "(a model's decisions keep the prompt it saw)", default="full", choices=PROMPTS)
    teacher: str | None = _key(None, "write each state answered by this scripted seller (train's dagger labels) instead of "
                                     "the seller's own message", shown="none: the seller's own")
    split: str | None = _key(None, "keep episodes of this split only (the name the trace gives)", shown="every split")
    seller: str | None = _key(None, "keep episodes of this seller spec only (as the trace names it)", shown="every seller")
    min_group: int = _key(1, "drop groups (markets) with fewer episodes than this", kind="count")
    scale_advantages: bool = _key(True, "divide each advantage by its group's standard deviation (offline-grpo's default)",
                                  kind="switch")

    def check(self) -> None:
        """What can be checked before a trace is read: traces named, a new file to write (nothing is overwritten), a
        scripted teacher."""
        if not self.traces:
            raise UserError("give the traces to export: --traces DIR", field="--traces", value=None)
        if self.out.is_dir():
            raise UserError("is a folder; give the Parquet file to write, like decisions.parquet", field="--out", value=str(self.out))
        if self.out.exists():
            raise UserError("already exists; choose another --out (nothing is overwritten)", field="--out", value=str(self.out))
        above = next((p for p in self.out.absolute().parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise UserError(f"cannot be made: {above} is a file", field="--out", value=str(self.out))
        if self.teacher is not None:
            check_teacher(self.teacher)


def scored_episodes(config: ExportConfig) -> list[ScoredEpisode]:
    """The episodes ``config`` exports, with their decisions: ``negotiate train``'s data (``load_episodes``) under the
    same reward, filters, prompt view and teacher."""
    where = DataFilter(split=config.split, seller=config.seller, min_group=config.min_group)
    return load_episodes(config.traces, reward=config.reward, where=where, prompt=config.prompt, teacher=config.teacher)


def decision_rows(episodes: Sequence[ScoredEpisode], *, scale_advantages: bool = True) -> Iterator[dict]:
    """The rows of ``episodes``' decisions, in order (:data:`COLUMNS`). The advantages are the trainer's
    (:func:`~negotiate.training.dataset.advantages`), computed over the episodes numbered in order.

    >>> a = ScoredEpisode("greedy-000000", "g", "greedy", "train", 0.5, {})
    >>> b = ScoredEpisode("greedy-000000", "g", "greedy", "train", 0.3, {})  # another run's episode 0, the same market
    >>> from negotiate.training.dataset import Decision
    >>> a.decisions = [Decision("greedy-000000", "g", 1, [{"role": "user", "content": "?"}], "Action: [END]", 0.5, True)]
    >>> b.decisions = [Decision("greedy-000000", "g", t, [], "", 0.3, True) for t in (1, 2)]
    >>> [(row["reward"], row["return"], row["advantage"]) for row in decision_rows([a, b])]
    [(0.5, 0.5, 1.0), (0.0, 0.3, -1.0), (0.3, 0.3, -1.0)]
    """
    numbered = advantages([ScoredEpisode(str(k), ep.group, ep.seller, ep.split, ep.reward, {}) for k, ep in enumerate(episodes)],
                          scale=scale_advantages)
    for k, episode in enumerate(episodes):
        start = episode.record.start if episode.record is not None else None
        last = len(episode.decisions) - 1
        for n, decision in enumerate(episode.decisions):
            yield {
                "prompt": [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in decision.prompt],
                "completion": [{"role": "assistant", "content": decision.completion}],
                "reward": episode.reward if n == last else 0.0,
                "return": episode.reward,
                "advantage": numbered[str(k)],
                "episode": episode.id,
                "market": episode.group,
                "run": start.run if start is not None else None,
                "seller": episode.seller,
                "split": episode.split,
                "turn": decision.turn,
                "valid": decision.valid,
                "action": decision.action,
                "prompt_ids": decision.prompt_ids,
                "completion_ids": decision.completion_ids,
                "logprobs": decision.logprobs,
            }


def _schema(pa, config: ExportConfig):
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    types = {"prompt": pa.list_(message), "completion": pa.list_(message), "reward": pa.float64(), "return": pa.float64(),
             "advantage": pa.float64(), "turn": pa.int64(), "valid": pa.bool_(), "prompt_ids": pa.list_(pa.int64()),
             "completion_ids": pa.list_(pa.int64()), "logprobs": pa.list_(pa.float64())}
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in asdict(config).items()}
    return pa.schema([(name, types.get(name, pa.string())) for name in COLUMNS],
                     metadata={"negotiate.export": json.dumps(settings)})  # how the file was made


def export(config: ExportConfig) -> dict:
    """Write ``config.traces``' decisions to ``config.out`` (made whole in a file beside it, then renamed: a run that
    stops leaves no half file); returns what was written: ``rows``, ``episodes`` and ``markets``. A one-line
    :class:`UserError` when pyarrow is missing (naming the extra) or no episode is left to write."""
    config.check()  # the input first: a bad file is named whatever is installed
    episodes = scored_episodes(config)
    if not episodes:
        raise UserError("no episode to export (each needs an episode_end and a reward; check split, seller and min_group "
                        "against the traces)", source=", ".join(config.traces))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"writes Parquet with pyarrow, which is not installed; it comes with the train extra: {INSTALL}",
                        field="export") from None
    schema = _schema(pa, config)
    table = pa.Table.from_pylist(list(decision_rows(episodes, scale_advantages=config.scale_advantages)), schema=schema)
    out = config.out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        pq.write_table(table, partial)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return {"rows": table.num_rows, "episodes": len(episodes), "markets": len({ep.group for ep in episodes})}
