"""A loop run's curve, ``curve.png``: profit/OPT and the valid-message rate of each round's policy on the held-out
markets (the first ``--eval-buyers`` column), per split and pooled, beside the training rollouts and the teacher."""

from __future__ import annotations

from pathlib import Path

from negotiate.plots import pyplot
from negotiate.runner import slug as _slug
from negotiate.training.loop.config import LoopConfig, _list
from negotiate.training.loop.state import State
from negotiate.training.loop.summary import summarize_folder, teacher_row

__all__ = ["write_loop_curve"]


def write_loop_curve(out: Path, config: LoopConfig, state: State) -> Path:
    plt = pyplot()
    rounds = sorted(int(k) for k in state.data["rounds"])
    buyers = _list(config.eval_buyers)[0]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    splits = sorted({s for k in rounds for s in state.data["rounds"][str(k)].get(buyers, {}).get(_only(state, k, buyers), {})} - {"all"})
    for split in [*splits, "all"]:
        ys = [(state.data["rounds"][str(k)][buyers][_only(state, k, buyers)].get(split) or {}) for k in rounds]
        style = {"linewidth": 2.5, "color": "black"} if split == "all" else {}
        left.plot(rounds, [y.get("profit_ratio") for y in ys], marker="o", label=f"held-out {split}", **style)
        right.plot(rounds, [y.get("valid_rate") for y in ys], marker="o", label=f"held-out {split}", **style)
    rollouts = state.data.get("rollouts", {})
    if rollouts:
        ks = sorted(int(k) for k in rollouts)
        rows = [next(iter(rollouts[str(k)].values()), {}).get("all", {}) for k in ks]
        label = "training rollouts (that round's policy)"
        left.plot([k - 1 for k in ks], [r.get("profit_ratio") for r in rows], "s--", color="gray", label=label)
        right.plot([k - 1 for k in ks], [r.get("valid_rate") for r in rows], "s--", color="gray", label=label)
    base_folder = out / "baselines" / _slug(buyers)
    if base_folder.exists():
        summary = summarize_folder(base_folder)
        teacher = summary.get(teacher_row(config.teacher, list(summary)), {}).get("all", {}).get("profit_ratio")
        if teacher is not None:
            left.axhline(teacher, color="tab:red", linestyle=":", label=f"teacher ({config.teacher})")
    left.set(title="profit / OPT", xlabel="round (0 = SFT)")
    right.set(title="adherence (valid seller messages)", xlabel="round (0 = SFT)", ylim=(0, 1.05))
    for axis in (left, right):
        axis.set_xticks(rounds or [0])
        axis.grid(alpha=0.3)
    right.legend(loc="best", fontsize=8)
    left.legend(loc="best", fontsize=8)
    fig.suptitle(f"negotiate loop: {config.model}, buyers {buyers}")
    fig.tight_layout()
    path = out / "curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _only(state: State, k: int, buyers: str) -> str:
    sellers = state.data["rounds"][str(k)].get(buyers, {})
    return next(iter(sellers), "")
