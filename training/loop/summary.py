"""A loop run's results read back from its traces: each seller's profit/OPT and valid-message rate per held-out
market (:func:`per_market`), their means with 95% intervals per split (:func:`summarize_folder`, kept in
``loop.json`` per round), and which row of the scripted ladder plays as the teacher does (:func:`teacher_row`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["per_market", "summarize_folder", "teacher_row"]


def _episodes(folder: Path) -> list:
    from negotiate.trace import read_records, trace_files

    if not folder.is_dir():  # a stage not run yet: nothing to read
        return []
    return [record for path in trace_files([folder]) for record in read_records(path, allow_partial=True)]


def per_market(folder: Path) -> dict[str, dict[tuple, dict]]:
    """seller -> (split, market index) -> {profit_ratio, valid_rate} for every finished episode in ``folder``."""
    table: dict[str, dict[tuple, dict]] = {}
    for episode in _episodes(folder):
        start = episode.start
        if not episode.complete or episode.failed:
            continue
        metrics = episode.metrics or {}
        sent = metrics.get("seller_messages", 0)
        valid = (sent - metrics.get("seller_invalid", 0)) / sent if sent else None
        table.setdefault(start.seller, {})[(start.split, start.index)] = {"profit_ratio": metrics.get("profit_ratio"),
                                                                        "valid_rate": valid}
    return table


def _mean_ci(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and 95% half-width, Student's t as in ``negotiate report`` (nan, shown as no interval, for one value)."""
    from negotiate.metrics import mean_ci

    if not values:
        return None, None
    mean, half = mean_ci([float(v) for v in values])
    return mean, half if len(values) > 1 else float("nan")


def summarize_folder(folder: Path) -> dict:
    """Per split and overall: mean profit/OPT and valid-message rate of every seller in ``folder``."""
    out: dict = {}
    for seller, markets in per_market(folder).items():
        by_split: dict[str, list] = {}
        for (split, _), row in markets.items():
            by_split.setdefault(split, []).append(row)
        summary = {}
        for split, rows in [*sorted(by_split.items()), ("all", [r for rows in by_split.values() for r in rows])]:
            ratios = [r["profit_ratio"] for r in rows if r["profit_ratio"] is not None]
            valid = [r["valid_rate"] for r in rows if r["valid_rate"] is not None]
            mean, half = _mean_ci(ratios)
            summary[split] = {"profit_ratio": mean, "ci": half, "valid_rate": float(np.mean(valid)) if valid else None, "n": len(rows)}
        out[seller] = summary
    return out


def teacher_row(teacher: str, sellers: list[str]) -> str:
    """The ladder's seller that plays as ``teacher`` does: the teacher itself, or for one that only adds its reasons
    (``planner?reasons=1``: the same actions, with thoughts) the same seller without them where the ladder has it.

    >>> teacher_row("planner?reasons=1", ["greedy", "planner"]), teacher_row("planner?patience=2&reasons=1", ["planner"])
    ('planner', 'planner?patience=2&reasons=1')
    >>> teacher_row("planner?reasons=1&patience=1", ["greedy", "planner"])  # patience=1 is the planner's default
    'planner'
    """
    from negotiate.agents.registry import parse_agent

    if teacher in sellers:
        return teacher
    spec = parse_agent(teacher, "seller")
    acting = {key: value for key, value in spec.settings.items() if key != "reasons"}
    for seller in sellers:
        if ":" not in seller.split("?")[0] and seller.split("?")[0] == spec.name:  # scripted sellers of that name only
            if {key: value for key, value in parse_agent(seller, "seller").settings.items() if key != "reasons"} == acting:
                return seller
    return teacher
