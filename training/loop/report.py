"""A loop run's report, ``results.md``: for each ``--eval-buyers`` column, every policy and baseline on the same
held-out markets with paired differences (:func:`results_table`); each policy's held-out states against the teacher
(:func:`teacher_section`); under ``--prompt tools``, which tool each policy followed (:func:`tools_section`); the
rounds that had nothing to learn. Rewritten, with the curve, after every evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import structlog

from negotiate.errors import UserError
from negotiate.runner import slug as _slug
from negotiate.training.loop.config import LoopConfig, _list
from negotiate.training.loop.curve import write_loop_curve
from negotiate.training.loop.state import State
from negotiate.training.loop.summary import _mean_ci, per_market, teacher_row

__all__ = ["ALL_SPLITS", "results_table", "rule_baselines", "teacher_section", "tools_section", "write_report"]

log = structlog.get_logger("negotiate.loop")


def _fmt(mean: float | None, half: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f} ± {half:.3f}" if half is not None and np.isfinite(half) else f"{mean:.3f}"


ALL_SPLITS = "all splits"


def results_table(rows: list[tuple[str, dict]], splits: list[str], pairs: list[tuple[str, str]] = ()) -> str:
    """A markdown table: one row per (label, market -> metrics) entry, profit/OPT (valid rate) per split, and
    with several splits a last column of every market pooled; then one row per (a, b) of ``pairs``: the paired
    difference a - b on the markets both played."""
    columns = [*splits, ALL_SPLITS] if len(splits) > 1 else list(splits)
    lines = ["| seller | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    data = dict(rows)

    def within(split: str, column: str) -> bool:
        return split == column or (column == ALL_SPLITS and split in splits)

    for label, markets in rows:
        cells = []
        for split in columns:
            picked = [m for (s, _), m in markets.items() if within(s, split)]
            ratios = [m["profit_ratio"] for m in picked if m["profit_ratio"] is not None]
            valid = [m["valid_rate"] for m in picked if m["valid_rate"] is not None]
            mean, half = _mean_ci(ratios)
            cells.append(f"{_fmt(mean, half)} (valid {np.mean(valid):.2f}, n={len(picked)})" if picked else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for first, second in pairs:
        if first not in data or second not in data:
            continue
        cells = []
        for split in columns:
            keys = [k for k in data[first] if within(k[0], split) and k in data[second]
                    and data[first][k]["profit_ratio"] is not None and data[second][k]["profit_ratio"] is not None]
            diffs = [data[first][k]["profit_ratio"] - data[second][k]["profit_ratio"] for k in keys]
            mean, half = _mean_ci(diffs)
            cells.append(f"{_fmt(mean, half)} (n={len(keys)})" if diffs else "-")
        lines.append(f"| {first} − {second} (paired) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rule_baselines(config: LoopConfig) -> list[str]:
    """The fixed rules over the scripted moves the policy's prompt shows it (:func:`~negotiate.agents.rule.rules_over`
    of its view's tools; none where it shows none), and the lookup tables of ``rule_tables`` over the same two tools: the
    baselines evaluated beside the ladder, the best of which heads ``results.md``."""
    from negotiate.agents.rule import rules_over, table_rule
    from negotiate.agents.views import view

    tools = view(config.prompt).tools
    return rules_over(tools) + [table_rule(tools, path) for path in _list(config.rule_tables)] if len(tools) == 2 else rules_over(tools)


def _best_rule(rows: list[tuple[str, dict]], rules: list[str]) -> str | None:
    """The rule row with the highest mean profit/OPT over every market it played (chosen on the held-out markets
    themselves: a choice that favours the rule, so the model's difference to it is a conservative one)."""
    means = {}
    for label, markets in rows:
        ratios = [m["profit_ratio"] for m in markets.values() if m["profit_ratio"] is not None]
        if label in rules and ratios:
            means[label] = float(np.mean(ratios))
    return max(means, key=means.get) if means else None


def provenance(config: LoopConfig, state: State) -> str:
    """What ``results.md`` was made from and under: each command that ran the loop with the code's commit and the
    cores, the seeds, the wall time in stages, and the load they ran under (the 5-minute load average as each ended)."""
    runs = state.data.get("invocations") or []
    lines = [f"- `{run['command']}` at commit `{run['commit']}`, {run['started']}, {run.get('cores')} cores" for run in runs]
    seconds = state.data.get("seconds") or {}
    loads = [load for load in (state.data.get("load") or {}).values() if load is not None]
    long = ", ".join(f"{name} {seconds[name] / 60:.0f} min" for name in sorted(seconds, key=seconds.get, reverse=True)[:4]
                     if seconds[name] >= 60)
    splits = ", ".join(_list(config.eval_splits))
    lines.append(f"- seeds: training run seed {config.seed} (round K collects on {config.seed} + K); held out: run seed "
                 f"{config.eval_seed}, {config.eval_episodes} markets of each of {splits}")
    if seconds:
        lines.append(f"- wall time in stages: {sum(seconds.values()) / 60:.0f} min" + (f" ({long})" if long else ""))
    if loads:
        lines.append(f"- load (5-minute average as each stage ended): {min(loads):.1f} to {max(loads):.1f}")
    return "\n".join(lines) + "\n"


def write_report(out: Path, config: LoopConfig, state: State) -> None:
    """``results.md`` (every row paired on the same held-out markets) and ``curve.png``. Where the prompt shows the
    policy scripted moves, the first paired row is the headline: the last policy against the best fixed rule over
    those moves."""
    sections = [f"## negotiate loop: {out}\n\n{provenance(config, state)}"]
    rules = rule_baselines(config)
    for buyers in _list(config.eval_buyers):
        rows: list[tuple[str, dict]] = []
        base_folder = out / "baselines" / _slug(buyers)
        baseline = per_market(base_folder) if base_folder.exists() else {}
        for seller, markets in baseline.items():
            if seller.startswith("openai:"):
                rows.insert(0, ("untrained", markets))
        for k in range(config.rounds + 1):
            folder = out / f"round-{k:02d}" / "eval" / _slug(buyers)
            if folder.exists():
                for _, markets in per_market(folder).items():
                    rows.append(("SFT (round 0)" if k == 0 else f"round {k}", markets))
        rows += [(seller, markets) for seller, markets in baseline.items() if not seller.startswith("openai:")]
        splits = sorted({s for _, markets in rows for (s, _) in markets})
        trained = [label for label, _ in rows if label.startswith("round")]
        chain = ["SFT (round 0)", *trained]
        teacher = teacher_row(config.teacher, [label for label, _ in rows])
        pairs = [("SFT (round 0)", teacher)]
        best = _best_rule(rows, rules)
        if best is not None and chain[-1] in {label for label, _ in rows}:
            pairs.insert(0, (chain[-1], best))
        pairs += [(later, earlier) for earlier, later in zip(chain[:-1], chain[1:])]  # each round against the one before
        if len(trained) > 1:
            pairs.append((trained[-1], "SFT (round 0)"))
        if trained:
            pairs.append((trained[-1], teacher))
        table = results_table(rows, splits, pairs)
        headline = (f"The headline is the first paired row: {chain[-1]} against the best of the {len(rules)} fixed rules over the "
                    f"prompt's scripted moves (those of {' and '.join(rules[:2])}; the best chosen on "
                    "these markets, which favours the rule).\n\n" if best is not None else "")
        sections.append(f"### buyers: {buyers}\n\n{headline}profit/OPT mean ± 95% CI (valid-message rate, markets)\n\n{table}\n")
    against = teacher_section(out, config)
    if against:
        sections.append(against)
    followed = tools_section(out, config) if config.prompt == "tools" else None
    if followed:
        sections.append(followed)
    for k, note in sorted((state.data.get("notes") or {}).items(), key=lambda item: int(item[0])):  # round 10 after 2
        sections.append(f"Round {k}: {note}.\n")
    (out / "results.md").write_text("\n".join(sections))
    write_loop_curve(out, config, state)


def _held_out_evals(out: Path, config: LoopConfig) -> tuple[str, list[tuple[int, str, Path]]]:
    """The buyer column the per-state tables read (``--buyers`` where it is one, else the first), and each evaluated
    round's (number, row label, evaluation folder) in it."""
    columns = _list(config.eval_buyers)  # never empty: LoopConfig.check refuses that
    buyers = config.buyers if config.buyers in columns else columns[0]
    folders = [(k, out / f"round-{k:02d}" / "eval" / _slug(buyers)) for k in range(config.rounds + 1)]
    return buyers, [(k, "SFT (round 0)" if k == 0 else f"round {k}", folder) for k, folder in folders if folder.exists()]


def tools_section(out: Path, config: LoopConfig) -> str | None:
    """Under ``--prompt tools``: which tool each evaluated policy followed on the held-out states (the ``--buyers``
    column, else the first), from :func:`~negotiate.training.dataset.tool_choices`. None where nothing was evaluated."""
    from negotiate.training.dataset import tool_choices

    buyers, evaluated = _held_out_evals(out, config)
    lines = []
    for k, policy, folder in evaluated:
        try:
            choices = tool_choices([folder], allow_partial=True)
        except UserError as error:  # a table for the reader: it never stops the loop
            log.warning("tools table skipped", round=k, error=str(error))
            continue
        for c in choices.values():
            planner = sum(n for key, n in c.items() if key[0] == "planner")
            lines.append(f"| {policy} | {sum(c.values())} | {c['both']} | {c[('greedy', 'offer')]} | {c[('greedy', 'accept')]} | "
                         f"{c[('planner', 'offer')]} | {c[('planner', 'accept')]} | {planner - c[('planner', 'offer')] - c[('planner', 'accept')]} | "
                         f"{c['neither']} | {c['invalid'] + c['timeout']} |")
    if not lines:
        return None
    return (f"### which tool the policy followed, on the held-out states (buyers: {buyers})\n\n"
            "Each policy message against the planner's and greedy's in that state (the tools prompt's two lines). Where they "
            "differed: whose message it sent, by the kind of greedy's.\n\n"
            "| policy | messages | both tools' | greedy's offer | greedy's accept | the planner's, greedy would offer | "
            "the planner's, greedy would accept | the planner's, other | neither | invalid |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")


def teacher_section(out: Path, config: LoopConfig) -> str | None:
    """Each evaluated policy's held-out states (the ``--buyers`` column, else the first) answered by the teacher
    (``negotiate report --teacher``): how often the policy chose the teacher's kind of reply, its accepts against
    the teacher's, and where both offered, the same buyer and product and the price gap. None for a teacher that
    cannot follow another seller's episode."""
    from negotiate.training.dataset import check_teacher, teacher_agreement

    try:
        check_teacher(config.teacher)
    except UserError:
        return None
    buyers, evaluated = _held_out_evals(out, config)
    lines, reasoned = [], []
    for k, policy, folder in evaluated:
        try:
            agreements = teacher_agreement([folder], config.teacher, allow_partial=True)
        except UserError as error:  # a table for the reader: it never stops the loop
            log.warning("teacher table skipped", round=k, error=str(error))
            lines.append(f"| {policy} | not replayable: {error} | | | | | |")
            continue
        for a in agreements.values():
            accepts = sum(n for (theirs, _), n in a.kinds.items() if theirs == "accept")
            wrong = sum(n for (theirs, mine), n in a.kinds.items() if mine == "accept" and theirs != "accept")
            same = f"{a.same_offer / a.both_offered:.0%}" if a.both_offered else "-"
            gap = f"${a.price_gap / a.same_offer:.0f}" if a.same_offer else "-"
            lines.append(f"| {policy} | {a.states} | {a.same_kind / max(1, a.spoken):.0%} | "
                         f"{a.kinds[('accept', 'accept')]} of {accepts} | {wrong} | {same} | {gap} |")
            if a.reasons["states"]:
                reasoned.append((policy, a))
    if not lines:
        return None
    text = (f"### against the teacher ({config.teacher}), on the held-out states (buyers: {buyers})\n\n"
            f"Each policy message against what {config.teacher} would have sent in that state (`negotiate report --teacher`).\n\n"
            "| policy | states | same kind | accepts where the teacher would | accepts where it would not | "
            "both offer: same buyer & product | price gap there |\n|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    if reasoned:  # a teacher that gives its reasons: the policy's thoughts against them
        from negotiate.report import markdown_table, reasons_rows

        header, rows = reasons_rows(dict(reasoned))
        text += ("\nThe policy's thoughts against the teacher's reasons, in the states where the teacher gave one and the policy's "
                 "message was valid (same facts, same buyer: of the states where it wrote to the teacher's buyer with a reason, "
                 "the share with the teacher's facts; the last column: of the policy's thoughts that are reasons, the share "
                 "followed by the action their own verdict names):\n\n" + markdown_table(["policy", *header[1:]], rows))
    return text
