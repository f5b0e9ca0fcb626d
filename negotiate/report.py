"""Report tables from traces alone: recompute every episode's metrics, group, summarize."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from rich.table import Table

from negotiate.errors import UserError
from negotiate.metrics import RATIO_METRICS, Summary, aggregate, metrics_from_events
from negotiate.trace import read_episodes, trace_files

__all__ = ["rows_from_traces", "summary_table", "summary_markdown", "summary_csv", "GROUP_KEYS"]

GROUP_KEYS = ("seller", "buyers", "split", "shape", "tier")
"""Labels a report can be broken down by."""


def rows_from_traces(paths: Iterable[str | Path], *, allow_partial: bool = False) -> list[dict]:
    """One row per episode: its labels and metrics recomputed from its events."""
    rows = []
    seen: dict[tuple, Path] = {}
    for path in trace_files(paths):
        for events in read_episodes(path, allow_partial=allow_partial):
            start, end = events[0], events[-1]
            key = (start.get("seller"), start.get("run_seed"), start.get("index"), start.get("split"))
            if key in seen and start.get("index") is not None:
                raise UserError(
                    f"episode {start.get('episode')} appears twice (also in {seen[key]}); pass each shard once",
                    source=str(path), field="episode", value=start.get("episode"),
                )
            seen[key] = path
            failed = end.get("outcome") == "failed"
            rows.append({k: start.get(k) for k in GROUP_KEYS + ("index", "episode")} | {
                "outcome": end.get("outcome"),
                "reason": end.get("reason"),
                "metrics": None if failed else metrics_from_events(events),
            })
    return rows


def _cell(mean: float, half: float, name: str) -> str:
    if math.isnan(mean):
        return "-"
    digits = 1 if name in ("regret", "turns_per_deal") else 3 if name != "violations_per_episode" else 2
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def _header(by: Sequence[str]) -> list[str]:
    return [*by, "episodes", *(title for _, title in RATIO_METRICS), "overruns"]


def _values(summary: Summary) -> list[str]:
    failed = f" ({summary.failed} failed)" if summary.failed else ""
    return [*summary.key, f"{summary.episodes}{failed}",
            *(_cell(summary.stats[name][0], summary.stats[name][1], name) for name, _ in RATIO_METRICS),
            str(summary.budget_overruns)]


def summary_table(summaries: list[Summary], by: Sequence[str], title: str = "negotiate: metrics (mean ± 95% CI)") -> Table:
    table = Table(title=title, title_justify="left")
    for k, name in enumerate(_header(by)):
        table.add_column(name, justify="left" if k < len(by) else "right", no_wrap=k < len(by))
    for summary in summaries:
        table.add_row(*_values(summary))
    return table


def summary_markdown(summaries: list[Summary], by: Sequence[str]) -> str:
    header = _header(by)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_values(s)) + " |" for s in summaries]
    return "\n".join(lines) + "\n"


def summary_csv(summaries: list[Summary], by: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([*by, "episodes", "failed", *(f"{n}{s}" for n, _ in RATIO_METRICS for s in ("_mean", "_ci95", "_n")), "budget_overruns"])
    for s in summaries:
        writer.writerow([*s.key, s.episodes, s.failed,
                         *(f"{v:.6g}" for n, _ in RATIO_METRICS for v in s.stats[n]), s.budget_overruns])
    return buffer.getvalue()


def summarize(rows: list[dict], by: Sequence[str]) -> list[Summary]:
    for key in by:
        if key not in GROUP_KEYS:
            raise UserError(f"cannot group by it; choose from {', '.join(GROUP_KEYS)}", field="--by", value=key)
    return aggregate(rows, by)
