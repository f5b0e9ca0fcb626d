"""The training curve: reward and adherence over steps, from ``metrics.jsonl`` rows (PNG, headless)."""

from __future__ import annotations

from pathlib import Path

from negotiate.plots import pyplot

__all__ = ["write_curve"]


def write_curve(rows: list[dict], path: Path, *, title: str = "training") -> Path:
    """Two panels: the training loss per step, and the policy's reward, adherence and profit/OPT
    (evaluation rows, or online rollouts' ``reward``/``valid_rate``) over steps."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    steps = [r["step"] for r in rows if "loss" in r]
    left.plot(steps, [r["loss"] for r in rows if "loss" in r], color="tab:gray", lw=1)
    left.set_xlabel("step")
    left.set_title("training loss")
    evals = [(r["step"], r["eval"]) for r in rows if "eval" in r]
    if not evals:  # online rollouts carry their own reward and adherence
        evals = [(r["step"], r) for r in rows if r.get("reward") is not None]
    for key, label, color in (("reward", "reward", "tab:blue"), ("valid_rate", "adherence (valid messages)", "tab:green"),
                              ("profit_ratio", "profit / OPT", "tab:orange")):
        points = [(s, e[key]) for s, e in evals if e.get(key) is not None]
        if points:
            right.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label, color=color)
    if not evals:
        right.text(0.5, 0.5, "no evaluation in this run\n(--eval-episodes N plays held-out markets)", ha="center", va="center",
                   transform=right.transAxes, color="tab:gray")
    right.set_xlabel("step")
    right.set_title("policy")
    right.set_ylim(-1.05, 1.05)
    right.axhline(0, color="black", lw=0.5)
    if right.get_legend_handles_labels()[0]:
        right.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
