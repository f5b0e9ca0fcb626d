"""Report tables from traces alone: recompute every episode's metrics, group, summarize.

The tables that ``serve``, ``eval`` and ``report`` print read compact rows (:class:`ReportRow`, from
``rows_from_traces(..., compact=True)``): an episode's labels, one object per distinct value shared by the rows,
and of its metrics the eight numbers the tables read, in an array of doubles. Rows as dicts with every metric held
2.4 kB an episode (tracemalloc, 20,000 greedy episodes) and a report's peak RSS grew 2.9 kB an episode (404 MB
for 100,000); compact rows hold 0.5 kB, and the peak grows 0.7-0.8 kB (198 MB; ``benchmarks/scale.py --report``),
the rest being what the summaries and the pairing build for a moment. The numbers are the same to the last bit.
Reading takes the time, not the tables: of a report of 20,000 episodes, parsing the events took 60%, recomputing
the metrics 22% (OPT's assignment 5%), the tables 12%.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import re
from array import array
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import groupby
from pathlib import Path
from types import MappingProxyType

import orjson
from rich import box
from rich.table import Table

from negotiate.errors import UserError
from negotiate.metrics import RATIO_METRICS, Summary, sort_key, aggregate, mean_ci, metrics_from_events
from negotiate.trace import EpisodeEnd, EpisodeStart, read_records, trace_files

__all__ = [
    "rows_from_traces", "ReportRow", "Scores", "SCORED", "overlapping_runs", "run_order", "summary_table", "summary_markdown", "summary_csv", "GROUP_KEYS",
    "paired_differences", "baseline_of", "market_key", "paired_table", "paired_markdown", "paired_csv", "PAIRED_METRICS", "Paired",
    "agreement_rows", "agreement_tables", "agreement_markdown", "agreement_csv", "short_runs", "resolve_run",
]

GROUP_KEYS = ("seller", "buyers", "split", "shape", "tier", "run")
"""Labels a report can be broken down by (``run``: the run id, or for traces older than run ids, the folder)."""


def rows_from_traces(paths: Iterable[str | Path], *, allow_partial: bool = False,
                     on_skip: Callable[[str], None] | None = None, compact: bool = False) -> list[dict] | list[ReportRow]:
    """One row per episode: its labels and metrics recomputed from its events.

    Episodes are told apart by run (the ``run`` id a run writes into each episode; the trace's folder
    for older traces), seller, split, run seed and index: the shards of one run merge, separate runs
    stay apart (see :func:`overlapping_runs`), and one episode passed twice is an error.

    ``compact``: each row a :class:`ReportRow`, which keeps what the tables read, the same numbers in a fifth
    of the memory (0.5 kB an episode, where a dict with every metric takes 2.4 kB): what ``serve``, ``eval`` and
    ``report`` print their tables from.
    """
    episodes = _episodes(paths, allow_partial=allow_partial, on_skip=on_skip)
    if compact:
        shared: dict[object, object] = {}  # one object per distinct label (seller, run, reason...), not one per row
        one = lambda value: shared.setdefault(value, value)
        return [ReportRow(
            seller=one(start.seller), buyers=one(start.buyers), split=one(start.split), shape=one(start.shape),
            tier=one(start.tier), run=one(run), index=start.index, seed=start.seed, run_seed=one(start.run_seed),
            repeat=start.repeat, market=market_key(start.market), outcome=one(end.outcome), reason=one(end.reason),
            metrics=None if metrics is None else Scores.of(metrics),
        ) for run, start, end, metrics in episodes]
    return [{k: getattr(start, k) for k in GROUP_KEYS + ("index", "episode", "seed", "run_seed", "repeat")} | {
                "run": run,
                "market": market_key(start.market),
                "outcome": end.outcome,
                "reason": end.reason,
                "metrics": metrics,
            } for run, start, end, metrics in episodes]


def _episodes(paths: Iterable[str | Path], *, allow_partial: bool,
              on_skip: Callable[[str], None] | None) -> Iterator[tuple[str, EpisodeStart, EpisodeEnd, dict | None]]:
    """Each episode of the traces, once: (its run, its start and end events, its metrics recomputed; None where it failed).
    A one-line :class:`UserError` where an episode comes twice or its events are not an episode this runtime could play."""
    seen: dict[tuple, dict[int, int]] = {}  # the indices of each run, seller, run seed and split: which file read each
    files = trace_files(paths)
    for read, path in enumerate(files):
        # unique: an id twice in one file is refused, the same line as replay's, wherever the copies stand
        for episode in read_records(path, allow_partial=allow_partial, on_skip=on_skip, unique=True):
            start, end = episode.start, episode.end
            run = start.run or str(path.parent)
            indices = seen.setdefault((run, start.seller, start.run_seed, start.split), {})
            if start.index is not None:
                if start.index in indices:
                    before = indices[start.index]
                    where = files[before]
                    also = ("in this file under another id" if before == read else
                            "the file is given twice; pass each shard once" if where == path else f"also in {where}; pass each shard once")
                    raise UserError(f"episode index {start.index} of run {run} appears twice ({also})",
                                    source=str(path), field="episode", value=start.episode)
                indices[start.index] = read
            try:
                metrics = None if episode.failed else metrics_from_events(episode.events)
            except (ValueError, UserError) as error:  # a record that parses but is not an episode this runtime could have played
                raise UserError(f"episode {start.episode}: {error}", source=str(path)) from None
            yield run, start, end, metrics


SCORED = tuple(name for name, _ in RATIO_METRICS if name != "violations_per_episode")
"""The metrics a :class:`Scores` keeps as numbers: the tables' (:data:`negotiate.metrics.RATIO_METRICS`, of which the
paired table's are a part), but violations per episode, the sum of its violations by kind."""
_SCORED_AT = {name: k for k, name in enumerate(SCORED)}
_NO_VIOLATIONS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Scores:
    """One episode's metrics that the tables read, read as its metrics dict is (``scores["profit_ratio"]``,
    ``scores.get("capture")``: None where undefined; ``scores["violations"]``), so that
    :func:`negotiate.metrics.aggregate`, :func:`paired_differences` and the plots take either.

    >>> s = Scores.of({name: 0.5 for name in SCORED} | {"capture": None, "regret": 12, "violations": {}, "budget_overrun": 0})
    >>> s["profit_ratio"], s.get("capture"), s["regret"], dict(s["violations"]), s.get("opt", "not kept")
    (0.5, None, 12.0, {}, 'not kept')
    """

    values: array
    """The :data:`SCORED` metrics, in that order, as doubles (exact for these ints and floats); nan where one is
    None (undefined: no deal, no OPT), which no metric ever is."""
    violations: Mapping[str, int]
    """The seller's violations by kind (the metrics' ``violations``)."""
    budget_overrun: int
    """Turns past the budget."""

    @classmethod
    def of(cls, metrics: dict) -> Scores:
        """The scores in a metrics dict (:func:`negotiate.metrics.episode_metrics`)."""
        values = array("d", (math.nan if metrics[name] is None else metrics[name] for name in SCORED))
        return cls(values, metrics["violations"] or _NO_VIOLATIONS, metrics["budget_overrun"])

    def get(self, name: str, default: object = None) -> object:
        k = _SCORED_AT.get(name)
        if k is None:
            return getattr(self, name) if name in ("violations", "budget_overrun") else default
        value = self.values[k]
        return None if math.isnan(value) else value

    def __getitem__(self, name: str) -> object:
        if name not in _SCORED_AT and name not in ("violations", "budget_overrun"):
            raise KeyError(name)
        return self.get(name)


@dataclass(frozen=True, slots=True)
class ReportRow:
    """One episode as the report tables see it (``rows_from_traces(..., compact=True)``): a row of :func:`rows_from_traces`
    without its episode id, its metrics as :class:`Scores`. Read as that row is (``row["seller"]``, ``row.get("market")``), so
    that every function of this module (and :func:`negotiate.metrics.aggregate`) takes either kind of row."""

    seller: str | None
    buyers: str | None
    split: str | None
    shape: str | None
    tier: str | None
    run: str
    """The run id; for traces older than run ids, the trace's folder."""
    index: int | None
    seed: int | None
    """The market seed."""
    run_seed: int | None
    repeat: int | None
    """The place in a group of repeats (None without ``--group``)."""
    market: str | None
    """The market's :func:`market_key`."""
    outcome: str | None
    reason: str | None
    metrics: Scores | None
    """None for a failed episode."""

    def get(self, name: str, default: object = None) -> object:
        return getattr(self, name) if name in _ROW_FIELDS else default

    def __getitem__(self, name: str) -> object:
        if name not in _ROW_FIELDS:
            raise KeyError(name)
        return getattr(self, name)


_ROW_FIELDS = frozenset(field.name for field in fields(ReportRow))


def market_key(market: dict | None) -> str | None:
    """A fingerprint of a market's full private information (budget, prices, products, every buyer's values):
    two episodes, of one run or of two, played the same market when theirs match. None without one (old traces).

    >>> market_key({"budget": 12, "buyers": [1, 2]}) == market_key({"buyers": [1, 2], "budget": 12})
    True
    >>> market_key({"budget": 12}) == market_key({"budget": 13}), market_key(None)
    (False, None)
    """
    if not market:
        return None
    return hashlib.blake2b(orjson.dumps(market, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()


def overlapping_runs(rows: list[dict]) -> list[str]:
    """The runs that played an episode another run also played (same seller, split, run seed and
    index: ``serve`` then ``eval`` with one seed, say). Their rows are not shards of one run: a report
    keeps them apart. Empty when every run is disjoint from the others (shards merge).

    >>> rows = [{"run": r, "seller": "a", "split": "train", "run_seed": 0, "index": i} for r, i in [("x", 0), ("y", 1), ("z", 0)]]
    >>> overlapping_runs(rows)
    ['x', 'z']
    """
    first: dict[tuple, dict] = defaultdict(dict)  # the run that played each episode first (a set per episode: 0.3 kB more)
    shared = set()
    for row in rows:
        run = first[(row.get("seller"), row.get("split"), row.get("run_seed"))].setdefault(row.get("index"), row["run"])
        if run != row["run"]:
            shared.update((run, row["run"]))
    return list(dict.fromkeys(row["run"] for row in rows if row["run"] in shared))


def run_order(paths: Iterable[str | Path]) -> dict[str, list[str]]:
    """The sellers in the order their runs list them (``run.json``, ``eval.json`` beside the traces), so a
    report shows them as ``serve`` and ``eval`` did; sellers no run file names come after, alphabetically."""
    sellers: list[str] = []
    folders = dict.fromkeys(folder for path in trace_files(paths) for folder in (path.parent, path.parent.parent))
    for folder in folders:
        for name in ("eval.json", "run.json"):
            try:
                listed = orjson.loads((folder / name).read_bytes()).get("sellers") or []
            except (OSError, orjson.JSONDecodeError, AttributeError):
                continue
            sellers.extend(str(s).strip() for s in listed if str(s).strip() not in sellers)
    return {"seller": sellers}


def _cell(mean: float, half: float, name: str) -> str:
    if math.isnan(mean):
        return "-"
    digits = 1 if name in ("regret", "turns_per_deal") else 3 if name != "violations_per_episode" else 2
    return f"{mean:.{digits}f}" + ("" if math.isnan(half) else f" ± {half:.{digits}f}")  # nan: one market, no interval


def _header(by: Sequence[str]) -> list[str]:
    return [*by, "episodes", *(title for _, title in RATIO_METRICS), "overruns"]


def _values(summary: Summary) -> list[str]:
    failed = f" ({summary.failed} failed)" if summary.failed else ""
    return [*summary.key, f"{summary.episodes}{failed}",
            *(_cell(summary.stats[name][0], summary.stats[name][1], name) for name, _ in RATIO_METRICS),
            str(summary.budget_overruns)]


_SHORT_TITLES = {
    "valid_rate": "valid", "violations_per_episode": "viol\n/ep", "profit_ratio": "profit\n/OPT", "capture": "capt",
    "deal_rate": "deal\nrate", "welfare_ratio": "welf\n/OPT", "opt_pairs_share": "OPT\npairs", "regret": "regret",
    "turns_per_deal": "turns\n/deal",
}
_HEADLINE = ("profit_ratio", "welfare_ratio")
"""Metrics shown with their confidence interval in the terminal table (all of them in Markdown and CSV)."""


def _short(mean: float, half: float, name: str, with_ci: bool) -> str:
    if math.isnan(mean):
        return "-"
    if name in ("regret",):
        text, ci = f"{mean:.0f}", f"±{half:.0f}"
    elif name in ("turns_per_deal", "violations_per_episode"):
        text, ci = f"{mean:.1f}", f"±{half:.1f}"
    else:
        text, ci = f"{mean:.2f}", f"±{half:.2f}".replace("0.", ".", 1)
    return f"{text}\n{ci}" if with_ci and not math.isnan(half) else text


def _longest_word(header: str) -> int:
    return max(len(word) for word in header.split())


def short_label(value: str) -> str:
    """A model spec shortened for the terminal: ``openai:MODEL@URL?k=v`` -> ``openai:MODEL``; a local model's
    ``hf:PATH?k=v`` or ``vllm:PATH?k=v`` -> its folder's name.

    >>> short_label("vllm:/runs/a/round-01/checkpoint/merged?format=json&max_tokens=64")
    'vllm:merged'
    >>> short_label("hf:smollm2"), short_label("greedy?reserve=0.5")
    ('hf:smollm2', 'greedy?reserve=0.5')
    """
    return _local_label(value, 1) or value.partition("@")[0]


def _local_label(value: str, parts: int) -> str | None:
    """``backend:`` and the last ``parts`` names of a local model's path (None: not an ``hf:``/``vllm:`` spec)."""
    backend, colon, rest = value.partition(":")
    if not colon or backend not in ("hf", "vllm"):
        return None
    names = [name for name in rest.partition("?")[0].split("/") if name]
    return f"{backend}:{'/'.join(names[-parts:])}" if names else value


def _wider_label(value: str) -> str:
    """The next label to try where :func:`short_label` is ambiguous: the server's host and port, the model's parent folder."""
    from urllib.parse import urlsplit

    local = _local_label(value, 2)
    if local is not None:
        return local
    return f"{short_label(value)}@{urlsplit(value.partition('@')[2]).netloc}" if "@" in value else value


def short_labels(values: Iterable[str]) -> dict[str, str]:
    """Each value's :func:`short_label`, unless it would read like another value's: those keep the server's
    host and port (two servers of ``openai:round-0`` on other ports are two sellers) or the model's parent
    folder, or stay whole.

    >>> short_labels(["greedy", "openai:a@http://h:1/v1", "openai:b@http://h:1/v1"])
    {'greedy': 'greedy', 'openai:a@http://h:1/v1': 'openai:a', 'openai:b@http://h:1/v1': 'openai:b'}
    >>> list(short_labels(["openai:a@http://h:1/v1?t=1", "openai:a@http://h:2/v1?t=1"]).values())
    ['openai:a@h:1', 'openai:a@h:2']
    >>> list(short_labels(["openai:a@http://h:1/v1?t=1", "openai:a@http://h:1/v1?t=2"]).values())
    ['openai:a@http://h:1/v1?t=1', 'openai:a@http://h:1/v1?t=2']
    >>> list(short_labels(["openai:a", "openai:a@http://h:1/v1"]).values())
    ['openai:a', 'openai:a@h:1']
    >>> list(short_labels(["vllm:/r/x/base?t=1", "vllm:/r/y/base?t=1", "hf:/r/x/sft"]).values())
    ['vllm:x/base', 'vllm:y/base', 'hf:sft']
    >>> list(short_labels(["vllm:/r/x/base?t=1", "vllm:/r/x/base?t=0"]).values())
    ['vllm:/r/x/base?t=1', 'vllm:/r/x/base?t=0']
    """
    values = list(dict.fromkeys(values))
    out = {}
    for shorten in (short_label, _wider_label, str):
        names = {v: shorten(v) for v in values if v not in out}
        taken = list(names.values())
        out |= {v: name for v, name in names.items() if taken.count(name) == 1 or shorten is str}
    return {v: out[v] for v in values}


_RUN_ID = re.compile(r"([a-z]+)-\d{8}-\d{6}-([0-9a-f]{4})")
"""A run id as :func:`negotiate.runner.new_run_id` makes it: the command, the date and time, 4 random hex digits."""


def short_runs(runs: Iterable[object]) -> dict[str, str]:
    """Run ids for the terminal: the command and the random digits (a whole id takes a third of an 80-column table
    and wraps), unless two would read alike; ``--baseline-run`` takes either form (:func:`resolve_run`).

    >>> short_runs(["eval-20261203-191136-dfc8", "serve-20261203-191207-badb", "old"])
    {'eval-20261203-191136-dfc8': 'eval-dfc8', 'serve-20261203-191207-badb': 'serve-badb', 'old': 'old'}
    >>> list(short_runs(["eval-20261203-191136-dfc8", "eval-20261204-101010-dfc8"]).values())
    ['eval-20261203-191136-dfc8', 'eval-20261204-101010-dfc8']
    """
    values = list(dict.fromkeys(map(str, runs)))
    short = {v: f"{m[1]}-{m[2]}" if (m := _RUN_ID.fullmatch(v)) else v for v in values}
    taken = list(short.values())
    return {v: name if taken.count(name) == 1 else v for v, name in short.items()}


def resolve_run(rows: list[dict], run: str) -> str:
    """The run id that ``run`` names among ``rows``: a whole id, or the short form the tables show."""
    ids = {str(row.get("run")): row.get("run") for row in rows}
    if run in ids:
        return run
    found = next((whole for whole, name in short_runs(ids).items() if name == run), None)
    if found is None:
        raise UserError(f"no run of that id in the traces; runs there: {', '.join(short_runs(ids).values())}",
                        field="--baseline-run", value=run)
    return found


def summary_table(summaries: list[Summary], by: Sequence[str], title: str = "negotiate: metrics, mean (± 95% CI)") -> Table:
    """A compact terminal table: every metric's mean, the headline ratios with their CI."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    for name in by:  # labels may fold (a long model spec); headers never break inside a word
        table.add_column(name, overflow="fold", min_width=len(name))
    table.add_column("n", justify="right", no_wrap=True)
    for name, title_text in RATIO_METRICS:
        header = _SHORT_TITLES.get(name, title_text)
        table.add_column(header, justify="right", no_wrap=True, min_width=_longest_word(header))
    overruns = 0
    labels = [(short_runs if name == "run" else short_labels)(str(s.key[i]) for s in summaries) for i, name in enumerate(by)]
    for s in summaries:
        failed = f"/{s.failed}✗" if s.failed else ""
        table.add_row(*(labels[i][str(value)] for i, value in enumerate(s.key)), f"{s.episodes}{failed}",
                      *(_short(*s.stats[name][:2], name, name in _HEADLINE) for name, _ in RATIO_METRICS))
        overruns += s.budget_overruns
    notes = [*LEGEND, f"budget overruns: {overruns}"] + (["n/k✗: k episodes failed"] if any(s.failed for s in summaries) else [])
    table.caption = "\n".join(_packed(notes, LEGEND_WIDTH))
    table.caption_justify = "left"
    return table


def _packed(items: Sequence[str], width: int) -> list[str]:
    """``items`` joined by `` · `` into lines of at most ``width`` columns, none split (one longer stands alone).

    >>> _packed(["a: one", "b: two", "c: three"], 15)
    ['a: one · b: two', 'c: three']
    """
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 3 + len(item) <= width:
            lines[-1] += " · " + item
        else:
            lines.append(item)
    return lines


LEGEND = ("±: 95% CI of the mean", "viol/ep: seller violations an episode", "capt: capture, a deal's (price - cost) / (value - cost)",
          "welf/OPT: welfare (value - cost over the deals) / OPT", "OPT: the best matching's welfare",
          "OPT pairs: share of OPT's buyer-product pairs made", "regret: OPT - welfare, in the market's $")
"""What the terminal table's short column titles mean, and their units: its caption, under every such table (``serve``,
``collect``, ``eval``, ``report``)."""
LEGEND_WIDTH = 66
"""The columns a line of the legend takes: the narrowest table (one short seller, at 80 columns) is about as wide."""


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table, one line per row, ending in a newline.

    >>> print(markdown_table(["seller", "n"], [["greedy", "4"]]), end="")
    | seller | n |
    |---|---|
    | greedy | 4 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def summary_markdown(summaries: list[Summary], by: Sequence[str]) -> str:
    return markdown_table(_header(by), (_values(s) for s in summaries))


def summary_csv(summaries: list[Summary], by: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([*by, "episodes", "failed", *(f"{n}{s}" for n, _ in RATIO_METRICS for s in ("_mean", "_ci95", "_n")), "budget_overruns"])
    for s in summaries:
        writer.writerow([*s.key, s.episodes, s.failed,
                         *(f"{v:.6g}" for n, _ in RATIO_METRICS for v in s.stats[n]), s.budget_overruns])
    return buffer.getvalue()


DEFAULT_ORDER = {"split": ("train", "shapes", "correlated", "prices-x10")}


def summarize(rows: list[dict], by: Sequence[str], order: dict[str, Sequence[str]] | None = None) -> list[Summary]:
    for key in by:
        if key not in GROUP_KEYS:
            raise UserError(f"cannot group by it; choose from {', '.join(GROUP_KEYS)}", field="--by", value=key)
    return aggregate(rows, by, DEFAULT_ORDER | (order or {}), cluster=market_of)


# -- paired differences against a baseline seller --------------------------------

PAIRED_METRICS = (
    ("profit_ratio", "Δ profit/OPT"),
    ("welfare_ratio", "Δ welfare/OPT"),
    ("capture", "Δ capture"),
    ("deal_rate", "Δ deal rate"),
    ("opt_pairs_share", "Δ OPT pairs"),
    ("regret", "Δ regret"),
    ("valid_rate", "Δ valid"),
)
"""Metrics compared pair by pair (seller minus baseline on the same market)."""


@dataclass(frozen=True)
class Paired:
    """One seller against the baseline on one split: mean paired difference and its 95% CI."""

    seller: str
    split: str
    pairs: int
    """Markets both sellers completed."""
    diffs: dict[str, tuple[float, float, int]]
    """metric -> (mean of seller - baseline, 95% CI half-width, pairs with the metric defined for both)."""
    run: str | None = None
    """The seller's run, where separate runs of the same markets are told apart (None otherwise)."""


def baseline_of(rows: list[dict], baseline: str, run: str | None = None, *,
                by_run: bool = False) -> dict[str | None, list[str | None]] | None:
    """Per buyer spec, the runs whose ``baseline`` episodes the others are compared with; None where runs are not
    told apart (every episode of ``baseline`` is the baseline). Where they are (``by_run``, or ``run`` given),
    no two runs of ``baseline`` may have played one market against the same buyers, or ``run`` must say which.
    A one-line :class:`UserError` naming ``--baseline`` or ``--baseline-run`` otherwise.

    >>> rows = [{"seller": "a", "run": r, "buyers": b, "split": "s", "seed": k}
    ...         for r, b, k in [("x", "threshold", 1), ("y", "concession", 1), ("z", "concession", 2)]]
    >>> baseline_of(rows, "a"), baseline_of(rows, "a", by_run=True), baseline_of(rows, "a", "y")
    (None, {'threshold': ['x'], 'concession': ['y', 'z']}, {'concession': ['y']})
    """
    sellers = sorted({r["seller"] for r in rows})
    if baseline not in sellers:
        raise UserError(f"no episodes of this seller in the traces; sellers there: {', '.join(sellers)}", field="--baseline", value=baseline)
    if not by_run and run is None:
        return None
    runs: dict[str | None, dict[str | None, None]] = {}
    played: dict[tuple, set[str | None]] = defaultdict(set)
    for r in rows:
        if r["seller"] == baseline:
            runs.setdefault(r.get("buyers"), {})[r.get("run")] = None
            played[_same_market(r)].add(r.get("run"))
    if run is not None:
        chosen = {buyers: [run] for buyers, theirs in runs.items() if run in theirs}
        if not chosen:
            raise UserError(f"{baseline} did not play in this run; runs it played in: "
                            f"{', '.join(str(r) for theirs in runs.values() for r in theirs)}", field="--baseline-run", value=run)
        return chosen
    for (buyers, *_), theirs in played.items():
        if len(theirs) > 1:
            raise UserError(f"played the same markets against buyers {buyers} in {len(theirs)} separate runs "
                            f"({', '.join(map(str, sorted(theirs, key=str)))}); name one with --baseline-run", field="--baseline",
                            value=baseline)
    return {buyers: list(theirs) for buyers, theirs in runs.items()}


def _same_market(row: dict, repeat: object = ...) -> tuple:
    """What pairs two episodes: the buyers, the split, the market itself (by :func:`market_key`; the run and
    market seed in traces without one) and the place in a group of repeats."""
    market = row.get("market") or (row.get("run"), row["seed"])
    return row.get("buyers"), row["split"], market, row.get("repeat") if repeat is ... else repeat


def market_of(row: dict) -> Hashable:
    """The market an episode row played against its buyers, repeats aside: the unit of the confidence intervals,
    so that a ``--group`` run's repeats of one market count once (:func:`negotiate.metrics.mean_ci`'s clusters)."""
    if not row.get("market") and row.get("seed") is None:
        return id(row)  # nothing tells its market: its own unit
    return _same_market(row, None)


def paired_differences(rows: list[dict], baseline: str, order: dict[str, Sequence[str]] | None = None, *,
                       baseline_run: str | None = None, by_run: bool = False,
                       on_unpaired: Callable[[str], None] | None = None,
                       on_unfinished: Callable[[str], None] | None = None) -> list[Paired]:
    """Per split, every other seller minus ``baseline`` on the same markets: same buyers, split and market
    (:func:`market_key`), in one run or across runs; each of a group's repeats with the baseline's same repeat,
    or with its one episode there. With ``by_run`` (separate runs of the same markets) a seller of each run is
    its own row, and the baseline is the one of :func:`baseline_of`. A seller paired on several splits also gets
    a row of split ``all`` that pools them. ``on_unpaired`` hears of each seller and split with finished episodes
    but no market in common with the baseline (left out); ``on_unfinished`` of each seller (the baseline included)
    and split with no finished episode there, which leaves nothing to pair.

    >>> rows = [{"seller": s, "split": "train", "seed": k, "metrics": {"profit_ratio": p}}
    ...         for s, k, p in [("a", 1, 0.5), ("a", 2, 0.7), ("b", 1, 0.6), ("b", 2, 0.9)]]
    >>> d = paired_differences(rows, "a")[0]   # differences 0.1 and 0.2: mean 0.15
    >>> d.seller, d.pairs, round(d.diffs["profit_ratio"][0], 3)
    ('b', 2, 0.15)
    """
    by_run = by_run or baseline_run is not None
    chosen = baseline_of(rows, baseline, baseline_run, by_run=by_run)

    def is_base(row: dict) -> bool:
        return row["seller"] == baseline and (chosen is None or row.get("run") in chosen.get(row.get("buyers"), ()))

    base = {_same_market(r): r["metrics"] for r in rows if is_base(r) and r.get("metrics")}
    base_splits = {r["split"] for r in rows if is_base(r) and r.get("metrics")}
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    unpaired: dict[tuple, None] = {}
    unfinished: dict[tuple, None] = {}  # every episode failed: of a seller, or of the baseline on a split
    for r in rows:  # first the splits where every episode of the baseline failed: nothing there pairs
        if is_base(r) and r["split"] not in base_splits:
            unfinished[(None, baseline, r["split"])] = None
    for r in rows:
        if is_base(r):
            continue
        key = ((r.get("run") if by_run else None), r["seller"], r["split"])
        if not r.get("metrics"):
            unfinished[key] = None
            continue
        other = base.get(_same_market(r))
        if other is None and r.get("repeat") is not None:
            other = base.get(_same_market(r, None))  # a group's repeat against a baseline that played the market once
        if other is not None:
            groups.setdefault(key, []).append((r["metrics"], other, market_of(r)))
        elif (None, baseline, r["split"]) not in unfinished:  # else the baseline's failures there say why
            unpaired[key] = None
    def named(run, seller, split) -> str:
        return f"{short_label(seller)} on {split}" + (f" (run {run})" if run is not None else "")

    for key in unpaired:
        if on_unpaired is not None and key not in groups:
            on_unpaired(named(*key))
    for key in unfinished:
        if on_unfinished is not None and key not in groups and key not in unpaired:
            on_unfinished(named(*key))
    out = []
    order = DEFAULT_ORDER | (order or {})
    ordered = sorted(groups.items(), key=lambda item: sort_key((str(item[0][0]), *item[0][1:]), ("run", "seller", "split"), order))
    for (run, seller), splits in groupby(ordered, key=lambda item: item[0][:2]):
        splits = list(splits)
        out += [_paired(seller, split, pairs, run) for (_, _, split), pairs in splits]
        if len(splits) > 1:  # after a seller's last split: every split's pairs pooled
            out.append(_paired(seller, ALL_SPLITS, [pair for _, pairs in splits for pair in pairs], run))
    return out


ALL_SPLITS = "all"
"""The split of a paired row that pools a seller's pairs on every split (where it played more than one)."""


def _paired(seller: str, split: str, pairs: list[tuple[dict, dict, Hashable]], run: str | None) -> Paired:
    """Pairs (seller's metrics, baseline's, market): a market's repeats are one unit of the interval."""
    diffs = {}
    for name, _ in PAIRED_METRICS:
        both = [(a[name] - b[name], market) for a, b, market in pairs if a.get(name) is not None and b.get(name) is not None]
        mean, half = mean_ci([d for d, _ in both], clusters=[m for _, m in both])
        diffs[name] = (mean, half, len(both))
    return Paired(seller, split, len(pairs), diffs, run)


def _signed(mean: float, half: float, name: str) -> str:
    if math.isnan(mean):
        return "-"
    digits = 0 if name == "regret" else 3
    return f"{mean:+.{digits}f}" + ("" if math.isnan(half) else f" ± {half:.{digits}f}")


def _by_run(paired: list[Paired], by_run: bool | None = None) -> list[str]:
    """The run column where rows are a run's sellers: as the caller says (so an empty table keeps its columns), else
    where some row has a run."""
    return ["run"] if (any(p.run is not None for p in paired) if by_run is None else by_run) else []


def paired_table(paired: list[Paired], baseline: str, by_run: bool | None = None) -> Table:
    table = Table(title=f"paired differences against {baseline} (same markets; mean ± 95% CI)", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    runs = _by_run(paired, by_run)
    for name in (*runs, "seller", "split"):
        table.add_column(name, overflow="fold", min_width=len(name))
    table.add_column("pairs", justify="right", no_wrap=True)
    for _name, title in PAIRED_METRICS[:3] + PAIRED_METRICS[5:6]:
        table.add_column(title, justify="right", no_wrap=True, min_width=_longest_word(title))
    labels, run_labels = short_labels(p.seller for p in paired), short_runs(p.run for p in paired)
    for p in paired:
        table.add_row(*(run_labels[str(p.run)] for _ in runs), labels[p.seller], p.split, str(p.pairs),
                      *(_signed(*p.diffs[name][:2], name).replace(" ± ", "\n±") for name, _ in PAIRED_METRICS[:3] + PAIRED_METRICS[5:6]))
    return table


def paired_markdown(paired: list[Paired], by_run: bool | None = None) -> str:
    runs = _by_run(paired, by_run)
    header = [*runs, "seller", "split", "pairs", *(title for _, title in PAIRED_METRICS)]
    return markdown_table(header, ([*(str(p.run) for _ in runs), p.seller, p.split, str(p.pairs),
                                    *(_signed(*p.diffs[n][:2], n) for n, _ in PAIRED_METRICS)] for p in paired))


def paired_csv(paired: list[Paired], baseline: str, by_run: bool | None = None, baseline_runs: Sequence[str] = ()) -> str:
    """The paired table as CSV: ``baseline`` is the seller's name; where runs are told apart, a ``baseline_run``
    column holds the run (or space-separated runs, one per buyer spec) of ``baseline_runs``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    runs = _by_run(paired, by_run)
    theirs = ["baseline_run"] if runs and baseline_runs else []
    writer.writerow([*runs, "seller", "baseline", *theirs, "split", "pairs",
                     *(f"{n}{s}" for n, _ in PAIRED_METRICS for s in ("_diff", "_ci95", "_n"))])
    for p in paired:
        writer.writerow([*(p.run for _ in runs), p.seller, baseline, *(" ".join(baseline_runs) for _ in theirs), p.split, p.pairs,
                         *(f"{v:.6g}" for n, _ in PAIRED_METRICS for v in p.diffs[n])])
    return buffer.getvalue()


# -- against a teacher (negotiate report --teacher) ---------------------------------------------------

_TEACHER_ROWS = ("offer", "accept", "reject", "end", "wait")
_SELLER_COLUMNS = ("offer", "accept", "reject", "end", "invalid", "timeout")


def _agreement_lines(a, columns: Sequence[str]):
    """(teacher's reply or ``all``, states, the seller's replies by kind in ``columns``, same kind, the states
    the same-kind share is of) for one seller's :class:`negotiate.training.dataset.Agreement`."""
    for theirs in (*(t for t in _TEACHER_ROWS if any(k[0] == t for k in a.kinds)), "all"):
        mine = {c: sum(n for (t, m), n in a.kinds.items() if m == c and theirs in (t, "all")) for c in columns}
        states = sum(n for (t, _), n in a.kinds.items() if theirs in (t, "all"))
        same = a.same_kind if theirs == "all" else a.kinds[(theirs, theirs)]
        yield theirs, states, mine, same, a.spoken if theirs == "all" else states  # where the teacher would wait, nothing is "the same"


def agreement_rows(agreements: dict, teacher: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the teacher table: for each seller, one row per reply the teacher would have sent
    (``wait``: none) with what the seller sent in those states, the share where it chose the same kind (on the
    ``all`` row, of the states where the teacher would have spoken), and on
    the ``offer`` row, of the states where both offered (that row's ``offer`` cell), the share to the same buyer
    and product and the mean |price gap| there; then the seller's ``all`` row. ``agreements``: :func:`negotiate.training.dataset.teacher_agreement`."""
    used = [c for c in _SELLER_COLUMNS if c in ("offer", "accept") or any(n for a in agreements.values()
                                                                              for (_, mine), n in a.kinds.items() if mine == c)]
    header = ["seller", f"{teacher} would", "states", *used, "same kind", "same buyer & product", "mean price gap"]
    rows = []
    for seller, a in agreements.items():
        for theirs, states, counts, same, spoken in _agreement_lines(a, used):
            offers = theirs == "offer" and a.both_offered
            rows.append([seller, theirs, str(states), *(str(counts[c]) for c in used),
                         "-" if theirs == "wait" or not spoken else f"{same / spoken:.0%}",
                         f"{a.same_offer / a.both_offered:.0%}" if offers else "",
                         f"${a.price_gap / a.same_offer:.0f}" if offers and a.same_offer else ""])
    return header, rows


REASON_COLUMNS = (("is_reason", "a reason"), ("facts", "same facts"), ("turns", "same turns & buyers"),
                  ("verdict", "same verdict"), ("buyer", "same buyer"), ("buyer_facts", "same facts, same buyer"),
                  ("follows", "acts on its verdict"))
"""The reasons table's columns (:attr:`negotiate.training.dataset.Agreement.reasons`): each a share of the states
where the teacher gave a reason, but ``buyer_facts``, a share of the states where the seller wrote to the teacher's
buyer with a reason as its thought (``buyer_reason``), and ``follows``, a share of the seller's thoughts that are reasons."""
_REASON_OF = {"follows": "is_reason", "buyer_facts": "buyer_reason"}


def reasons_rows(agreements: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the reasons table, one row per seller, against a teacher that gives its reasons
    (``planner?reasons=1``); no rows where it gave none."""
    header = ["seller", "states", *(title for _, title in REASON_COLUMNS)]
    rows = []
    for seller, a in agreements.items():
        r = a.reasons
        if not r["states"]:
            continue
        of = {name: r[_REASON_OF.get(name, "states")] for name, _ in REASON_COLUMNS}
        rows.append([seller, str(r["states"]), *(f"{r[name] / of[name]:.0%}" if of[name] else "-" for name, _ in REASON_COLUMNS)])
    return header, rows


def _reasons_title(teacher: str) -> str:
    return f"thoughts against {teacher}'s reasons: {_reasons_caption()}"


def _reasons_caption() -> str:
    return ("of the states where the teacher gave a reason and the seller's message was valid: the share where the seller's "
            "thought is a reason at all; where it states the teacher's facts; the teacher's turns and buyers; the teacher's "
            "verdict; the teacher's buyer; and where it wrote to that buyer with a reason, the teacher's facts (where they "
            "differ, a misreading, not another buyer). Last column: of the seller's reasons, the share followed by the action "
            "their own verdict names")


def agreement_tables(agreements: dict, teacher: str) -> list[Table]:
    """The teacher table for the terminal: one table per seller (its label in the title)."""
    header, rows = agreement_rows(agreements, teacher)
    short = {"same kind": "same\nkind", "same buyer & product": "same\nbuyer &\nproduct", "mean price gap": "price\ngap",
             f"{teacher} would": "teacher\nwould"}
    tables = []
    for seller in agreements:
        table = Table(title=f"{short_label(seller)} against what {teacher} would have sent",
                      title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
        for k, name in enumerate(header[1:]):  # headers break between words only; numbers fold, never cut
            title = short.get(name, name)
            table.add_column(title, overflow="fold", min_width=max(map(len, title.split("\n"))), justify="left" if k == 0 else "right")
        for row in rows:
            if row[0] == seller:
                table.add_row(*row[1:], end_section=row[1] == "all")
        tables.append(table)
    header, rows = reasons_rows(agreements)
    if rows:
        table = Table(title=f"thoughts against {teacher}'s reasons", title_justify="left", box=box.SIMPLE_HEAD,
                      padding=(0, 0), pad_edge=False, caption=_reasons_caption(), caption_justify="left")
        for k, name in enumerate(header):
            title = name.replace(" ", "\n").replace("\n&\n", " &\n")
            table.add_column(title, overflow="fold", justify="left" if k == 0 else "right", min_width=_longest_word(name) + (k > 0))
        labels = short_labels(row[0] for row in rows)
        for row in rows:
            table.add_row(labels[row[0]], *row[1:])
        tables.append(table)
    return tables


def agreement_markdown(agreements: dict, teacher: str) -> str:
    text = markdown_table(*agreement_rows(agreements, teacher))  # always: a header with no rows says there was nothing
    header, rows = reasons_rows(agreements)
    if rows:
        title = _reasons_title(teacher)
        text += f"\nThe {title[0].lower()}{title[1:]}:\n\n" + markdown_table(header, rows)
    return text


def agreement_csv(agreements: dict, teacher: str) -> str:
    """The teacher table as numbers: one line per seller and teacher reply (and ``all``), the seller's replies by kind;
    against a teacher that gives reasons, the counts of the reasons table (``reason_*``) on each ``all`` line."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    reasoned = any(a.reasons["states"] for a in agreements.values())
    reasons = ["states", *(name for name, _ in REASON_COLUMNS), "buyer_reason"] if reasoned else []
    writer.writerow(["seller", "teacher", "teacher_would", "states", *_SELLER_COLUMNS, "same_kind", "both_offered", "same_offer",
                     "price_gap_sum", *(f"reason_{name}" for name in reasons)])
    for seller, a in agreements.items():
        for theirs, states, mine, same, _ in _agreement_lines(a, _SELLER_COLUMNS):
            offers = [a.both_offered, a.same_offer, a.price_gap] if theirs in ("offer", "all") else ["", "", ""]
            writer.writerow([seller, teacher, theirs, states, *mine.values(), same, *offers,
                             *((a.reasons[name] if theirs == "all" else "") for name in reasons)])
    return buffer.getvalue()
