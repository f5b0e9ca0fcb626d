"""PNG plots of evaluation results (matplotlib, headless), all drawn from trace rows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from negotiate.metrics import aggregate, mean_ci

__all__ = ["plot_by_split", "plot_violations", "plot_by_tier", "write_plots"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _order(values, preferred=()):
    values = list(dict.fromkeys(values))
    return [v for v in preferred if v in values] + sorted(v for v in values if v not in preferred)


def plot_by_split(rows: list[dict], path: Path, sellers: list[str], splits: list[str]) -> Path:
    """Grouped bars: profit/OPT and welfare/OPT per split, one bar per seller, 95% CI whiskers."""
    plt = _pyplot()
    summaries = {s.key: s for s in aggregate(rows, ("seller", "split"))}
    fig, axes = plt.subplots(1, 2, figsize=(max(7, 1.6 * len(splits) * 2), 4), sharey=True)
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
            ax.bar(xs, means, width, yerr=errs, capsize=2, label=seller)
        ax.set_xticks(range(len(splits)), splits)
        ax.set_title(title)
        ax.set_ylim(0, 1.05)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("sellers by split (mean, 95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_violations(rows: list[dict], path: Path, sellers: list[str]) -> Path:
    """Stacked bars: seller violations per episode, by type."""
    plt = _pyplot()
    per_seller: dict[str, dict[str, float]] = {}
    kinds: set[str] = set()
    for seller in sellers:
        done = [r for r in rows if r["seller"] == seller and r.get("metrics")]
        counts: dict[str, float] = defaultdict(float)
        for r in done:
            for kind, n in r["metrics"]["violations"].items():
                counts[kind] += n / max(1, len(done))
        per_seller[seller] = counts
        kinds.update(counts)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(sellers)), 4))
    bottom = [0.0] * len(sellers)
    for kind in sorted(kinds):
        heights = [per_seller[s].get(kind, 0.0) for s in sellers]
        ax.bar(sellers, heights, bottom=bottom, label=kind)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if not kinds:
        ax.text(0.5, 0.5, "no violations", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("violations per episode")
    ax.set_title("seller violations by type")
    if kinds:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _tier_low(tier: str) -> float:
    try:
        return float(str(tier).split("-")[0])
    except ValueError:
        return float("inf")


def plot_by_tier(rows: list[dict], path: Path, sellers: list[str]) -> Path:
    """Profit/OPT against the market's price range, one line per seller (95% CI whiskers)."""
    plt = _pyplot()
    tiers = sorted({str(r["tier"]) for r in rows}, key=_tier_low)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(tiers)), 4))
    for seller in sellers:
        means, errs = [], []
        for tier in tiers:
            values = [r["metrics"]["profit_ratio"] for r in rows
                      if r["seller"] == seller and str(r["tier"]) == tier and r.get("metrics") and r["metrics"]["profit_ratio"] is not None]
            mean, half = mean_ci(values)
            means.append(mean)
            errs.append(half)
        ax.errorbar(range(len(tiers)), means, yerr=errs, marker="o", capsize=3, label=seller)
    ax.set_xticks(range(len(tiers)), tiers)
    ax.set_xlabel("price range of the market")
    ax.set_ylabel("profit / OPT")
    ax.set_ylim(0, 1.05)
    ax.set_title("profit / OPT by price tier")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(rows: list[dict], out: Path, sellers: list[str] | None = None, splits: list[str] | None = None) -> list[Path]:
    """All three plots into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    sellers = sellers or _order(r["seller"] for r in rows)
    splits = splits or _order((r["split"] for r in rows), ("train", "shapes", "correlated", "prices-x10"))
    return [
        plot_by_split(rows, out / "profit_welfare_by_split.png", sellers, splits),
        plot_violations(rows, out / "violations_by_type.png", sellers),
        plot_by_tier(rows, out / "profit_by_tier.png", sellers),
    ]
