"""PNG plots of evaluation results (matplotlib, headless), all drawn from trace rows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from negotiate.metrics import aggregate

__all__ = ["plot_by_split", "plot_violations", "plot_paired", "violations_per_episode", "write_plots", "pyplot"]


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, never a window): the one way every plot of the project, the
    evaluation's here and the training and loop curves, gets it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_pyplot = pyplot
"""The name training/teach.py's curve imports (its owner moves it to :func:`pyplot`)."""


_CHAR_IN = 0.075
"""About the width of one character at the 8-point legend size, in inches (DejaVu Sans averages ~0.6 em)."""


def _legend_in(labels, title: str = "") -> float:
    """Width in inches a legend outside the axes needs: constrained layout takes it from the axes, and
    labels long enough (a model spec) collapse them to zero width ("constrained_layout not applied")."""
    longest = max([len(str(label)) for label in labels] + [len(title)], default=0)
    return max(1.5, 0.6 + _CHAR_IN * longest)


def _tick_names(sellers: list[str], limit: int = 32) -> list[str]:
    """Seller names short enough to stand under a bar: a model spec without its URL and options (a local
    model by its folder's name, with its parent where two share one), then at most ``limit`` characters
    (the middle elided); the full names where shortening would merge two.

    >>> _tick_names(["greedy", "openai:smol@http://localhost:8000/v1?temperature=0.7"])
    ['greedy', 'openai:smol']
    >>> _tick_names(["hf:/runs/sft/checkpoint-1?format=json", "hf:/runs/rft/checkpoint-1"])
    ['hf:sft/checkpoint-1', 'hf:rft/checkpoint-1']
    >>> _tick_names(["hf:/runs/" + "a" * 40], limit=20)
    ['hf:aaaaaaa…aaaaaaaaa']
    """
    from negotiate.report import short_labels

    labels = short_labels(sellers)
    names = []
    for seller in sellers:
        name = labels[seller]
        if len(name) > limit:
            head = (limit - 1) // 2 + (limit - 1) % 2
            name = name[:head] + "…" + name[len(name) - (limit - 1 - head):]
        names.append(name)
    return names if len(set(names)) == len(names) else list(sellers)


def _order(values, preferred=()):
    values = list(dict.fromkeys(values))
    return [v for v in preferred if v in values] + sorted(v for v in values if v not in preferred)


def plot_by_split(rows: list[dict], path: Path, sellers: list[str], splits: list[str]) -> Path:
    """Grouped bars: profit/OPT and welfare/OPT per split, one bar per seller, 95% CI whiskers (a market's repeats
    count once). The legend sits outside the axes (inside, it covered bars that reach 1.0)."""
    plt = pyplot()
    from negotiate.report import market_of

    summaries = {s.key: s for s in aggregate(rows, ("seller", "split"), cluster=market_of)}
    names = _tick_names(sellers)
    fig, axes = plt.subplots(1, 2, figsize=(max(7, 1.6 * len(splits) * 2) + _legend_in(names, "seller"), 4), sharey=True,
                             layout="constrained")
    width = 0.8 / max(1, len(sellers))
    for ax, metric, title in zip(axes, ("profit_ratio", "welfare_ratio"), ("profit / OPT", "welfare / OPT")):
        for k, seller in enumerate(sellers):
            means, errs = [], []
            for split in splits:
                s = summaries.get((seller, split))
                mean, half, _ = s.stats[metric] if s else (float("nan"), 0.0, 0)
                means.append(mean)
                errs.append(half)
            xs = [x + (k - (len(sellers) - 1) / 2) * width for x in range(len(splits))]
            ax.bar(xs, means, width, yerr=errs, capsize=2, label=names[k] if ax is axes[0] else None)
        ax.set_xticks(range(len(splits)), splits)
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
        ax.grid(axis="y", alpha=0.3)
    fig.legend(fontsize=8, loc="outside right upper", title="seller")
    fig.suptitle("sellers by split (mean, 95% CI)")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def violations_per_episode(rows: list[dict], seller: str, split: str) -> dict[str, float]:
    """Mean seller violations per episode of ``seller`` on ``split``, by type (episodes that did not fail).

    >>> rows = [{"seller": "a", "split": "s", "metrics": {"violations": v}} for v in ({"sold_out": 2}, {"sold_out": 1, "below_cost": 1})]
    >>> violations_per_episode(rows, "a", "s")
    {'sold_out': 1.5, 'below_cost': 0.5}
    """
    done = [r for r in rows if r["seller"] == seller and r["split"] == split and r.get("metrics")]
    counts: dict[str, float] = defaultdict(float)
    for r in done:
        for kind, n in r["metrics"]["violations"].items():
            counts[kind] += n / len(done)
    return dict(counts)


def plot_violations(rows: list[dict], path: Path, sellers: list[str], splits: list[str]) -> Path:
    """Stacked bars: seller violations per episode, by type; one panel per split (a mean over splits would
    hide the split where a seller breaks the rules)."""
    plt = pyplot()
    counts = {(seller, split): violations_per_episode(rows, seller, split) for seller in sellers for split in splits}
    kinds = sorted({kind for per_kind in counts.values() for kind in per_kind})
    names = _tick_names(sellers)
    # Seller names run under the bars at 45 degrees, as far left as down: each panel grows by both.
    names_in = 0.1 * 0.71 * max((len(name) for name in names), default=0)
    width = len(splits) * (max(2.5, 0.45 * len(sellers)) + names_in) + _legend_in(kinds, "type")
    fig, axes = plt.subplots(1, len(splits), figsize=(width, 4 + names_in), sharey=True, squeeze=False, layout="constrained")
    for ax, split in zip(axes[0], splits):
        bottom = [0.0] * len(sellers)
        for kind in kinds:
            heights = [counts[(seller, split)].get(kind, 0.0) for seller in sellers]
            ax.bar(names, heights, bottom=bottom, label=kind if ax is axes[0][0] else None)
            bottom = [b + h for b, h in zip(bottom, heights)]
        if not any(bottom):
            ax.text(0.5, 0.5, "no violations", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(split)
        ax.tick_params(axis="x", labelrotation=45)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("violations per episode")
    if kinds:
        fig.legend(fontsize=8, loc="outside right upper", title="type")
    fig.suptitle("seller violations per episode by type, per split")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_paired(rows: list[dict], path: Path, sellers: list[str], splits: list[str], baseline: str) -> Path:
    """The evaluation's question in one picture: each seller's profit/OPT minus the baseline's on the same
    markets, per split, with its 95% CI (a whisker that crosses 0 is no measured difference)."""
    from negotiate.report import paired_differences

    plt = pyplot()
    found = {(p.seller, p.split): p.diffs["profit_ratio"] for p in paired_differences(rows, baseline, {"seller": sellers, "split": splits})}
    others = [seller for seller in sellers if seller != baseline]
    names = _tick_names(others)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(splits) * len(others)) + _legend_in(names, "seller"), 4), layout="constrained")
    width = 0.8 / max(1, len(others))
    for k, seller in enumerate(others):
        means = [found.get((seller, split), (float("nan"), 0.0, 0))[0] for split in splits]
        errs = [found.get((seller, split), (float("nan"), 0.0, 0))[1] for split in splits]
        xs = [x + (k - (len(others) - 1) / 2) * width for x in range(len(splits))]
        ax.bar(xs, means, width, yerr=errs, capsize=2, label=names[k])
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(splits)), splits)
    ax.set_ylabel(f"profit / OPT minus {baseline}'s")
    ax.set_title(f"paired differences against {baseline} (same markets; mean, 95% CI)")
    ax.grid(axis="y", alpha=0.3)
    if others:
        fig.legend(fontsize=8, loc="outside right upper", title="seller")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(rows: list[dict], out: Path, sellers: list[str] | None = None, splits: list[str] | None = None,
                baseline: str | None = None) -> list[Path]:
    """All three plots into ``out``; returns their paths. ``baseline`` (default: the first seller) is the
    seller the paired plot compares the others with."""
    out.mkdir(parents=True, exist_ok=True)
    sellers = sellers or _order(r["seller"] for r in rows)
    played = _order((r["split"] for r in rows), ("train", "shapes", "correlated", "prices-x10"))
    # Rows name a split by its spec's name: one given as a spec file (`--split specs/tiny.toml`) is drawn
    # under that name, after the splits named, never as an empty panel labelled with the path.
    splits = [s for s in splits if s in played] + [s for s in played if s not in splits] if splits else played
    return [
        plot_by_split(rows, out / "profit_welfare_by_split.png", sellers, splits),
        plot_violations(rows, out / "violations_by_type.png", sellers, splits),
        plot_paired(rows, out / "paired_profit_by_split.png", sellers, splits, baseline or sellers[0]),
    ]
