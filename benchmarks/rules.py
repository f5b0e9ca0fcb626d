"""The baselines a policy shown the ``tools`` prompt must beat: every fixed rule over its two tools, tuned on a training
seed and measured on held-out seeds (issue 41, docs/experiments/rule-baselines.md).

The ``tools`` prompt shows the planner's (``planner?reasons=1``) and greedy's next messages, both walking the model's
episode. A fixed rule over them sends one of the two in each state, picked by the kind of move one of them proposes
(offer, accept, reject, end, wait): the ``rule`` seller (agents/rule.py). Keyed on either tool, with either tool's
message for each of the five kinds, that is 2 x 2^5 = 64 specs, 62 of them distinct rules (always the planner and
always greedy come once each), and each tool alone. Each plays the three compact training splits at a training run seed
(200 markets each) against conceding and against threshold buyers, as ``negotiate eval`` plays them (``Run``'s seeds,
``run_batch``, ``--fresh`` as the tools prompt's runs). The best rule per buyer type there, by mean profit/OPT, is then
played on held-out run seeds no training or tuning used, paired with the planner and with greedy on the same markets
(``negotiate.report.paired_differences``: mean, 95% CI over markets, n)::

    python benchmarks/rules.py                       # about 6 min on 2 busy cores

prints the training seed's ranking and the held-out table in markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from pathlib import Path

import numpy as np

from negotiate.agents.rule import KINDS
from negotiate.agents.views.tools import TOOLS
from negotiate.errors import UserError
from negotiate.metrics import mean_ci
from negotiate.report import paired_differences
from negotiate.run import RunConfig
from negotiate.runner import prepare, run_batch

SPLITS = ("specs/compact.toml", "specs/compact-correlated.toml", "specs/compact-shapes.toml")
HELD_OUT = (1_000_003, 2_000_003, 3_000_017)
"""Held-out run seeds: the loop's (``eval_seed``, the README's held-out tables) and two more no run has used."""
PLANNER, GREEDY = TOOLS
ISSUE_RULE = f"rule?tools={GREEDY},{PLANNER}&accept=planner&reject=planner&end=planner&wait=planner"
"""Send greedy's message where greedy would offer, otherwise the planner's: what the tools prompt's SFT played."""


def rule_specs(tools: tuple[str, str] = TOOLS) -> list[str]:
    """Every fixed rule over two tools keyed on one tool's kind of move, once each: per key tool (the first), the kinds
    whose message is the other tool's. Always-one-tool comes once, keyed on that tool.

    >>> specs = rule_specs(("a", "b"))
    >>> len(specs), specs[0], specs[1], specs[-1]
    (62, 'rule?tools=a,b', 'rule?tools=a,b&wait=b', 'rule?tools=b,a&offer=a&accept=a&reject=a&end=a')
    """
    out = []
    for first, other in (tools, tools[::-1]):
        name = other.split("?")[0]
        for picks in itertools.product((False, True), repeat=len(KINDS)):
            if first != tools[0] and (all(picks) or not any(picks)):
                continue  # always one tool: the first key's rules have both
            if all(picks):
                out.append(f"rule?tools={first},{other}&else={name}")
                continue
            out.append("&".join([f"rule?tools={first},{other}", *(f"{kind}={name}" for kind, pick in zip(KINDS, picks) if pick)]))
    return out


async def play(sellers: list[str], buyers: str, seed: int, markets: int, concurrency: int) -> list[dict]:
    """Each seller on ``markets`` markets of each split at run ``seed``: one row per episode (``run_batch``'s, with the
    buyers and market seed that pair it)."""
    rows: list[dict] = []
    for split in SPLITS:
        config = RunConfig(sellers=tuple(sellers), buyers=buyers, split=split, episodes=markets, seed=seed, fresh=True)
        prepared = prepare(config, Path("unused"), resume=False)

        def keep(seller: str, events: list, row: dict) -> None:
            rows.append(row | {"seller": seller, "buyers": buyers, "seed": events[0].seed, "run_seed": seed})

        await run_batch(prepared, Path("unused"), concurrency=concurrency, sink=keep)
    failed = [row for row in rows if not row.get("metrics")]
    if failed:  # a table from part of the markets is not a result
        raise SystemExit(f"rules.py: {len(failed)} episodes failed (first: {failed[0]['seller']} on {failed[0]['split']})")
    return rows


def profit(rows: list[dict], seller: str) -> np.ndarray:
    """``seller``'s profit/OPT per market, in one order of the markets for every seller."""
    mine = sorted((row for row in rows if row["seller"] == seller), key=lambda row: (row["split"], row["run_seed"], row["index"]))
    return np.array([row["metrics"]["profit_ratio"] or 0.0 for row in mine])


def paired_cells(rows: list[dict], seller: str, baseline: str) -> dict[str, str]:
    """Per split and ``all``: ``seller`` − ``baseline``, paired on the same markets, as ``+0.012 ± 0.010 (n)``."""
    cells = {}
    for pair in paired_differences([row for row in rows if row["seller"] in (seller, baseline)], baseline):
        mean, half, n = pair.diffs["profit_ratio"]
        cells[pair.split] = f"{mean:+.3f} ± {half:.3f} ({n})"
    return cells


def short(spec: str) -> str:
    """A rule as the table writes it: ``key planner: offer→greedy`` (the kinds sent as the other tool)."""
    if not spec.startswith("rule?"):
        return spec
    head, *picks = spec.split("&")
    first = head.removeprefix("rule?tools=").split(",")[0].split("?")[0]
    if picks and picks[0].startswith("else="):
        return f"always {picks[0][5:]}"
    if not picks:
        return f"always {first}"
    return f"key {first}: {', '.join(p.split('=')[0] for p in picks)} → {picks[0].split('=')[1]}"


async def main(args) -> None:
    began = time.perf_counter()
    rules = rule_specs()
    sellers = [PLANNER, GREEDY, *rules]
    print(f"{len(rules)} rules over {PLANNER} and {GREEDY}, and each tool alone; {args.markets} markets of each of "
          f"{len(SPLITS)} splits, run seed {args.seed}, --fresh\n")
    chosen = {}
    for buyers in args.buyers.split(","):
        t0 = time.perf_counter()
        rows = await play(sellers, buyers, args.seed, args.markets, args.concurrency)
        # Rules that make the same profit on every market play alike here: one row each, the first in rule_specs'
        # order (the fewest kinds sent as the other tool, keyed on the planner first) standing for the rest.
        alike: dict[tuple, list[str]] = {}
        for spec in rules:
            alike.setdefault(tuple(profit(rows, spec)), []).append(spec)
        ranked = sorted(alike.values(), key=lambda specs: -profit(rows, specs[0]).mean())
        chosen[buyers] = ranked[0][0]
        print(f"### Training seed {args.seed}, {buyers} buyers ({len(rows)} episodes, {time.perf_counter() - t0:.0f} s)\n")
        print(f"{len(alike)} distinct outcomes among the {len(rules)} rules; the best {args.top}, and each tool alone:\n")
        print("| rule | alike | profit/OPT | − planner (paired, n) |\n|---|---|---|---|")
        for specs in [*ranked[: args.top], [PLANNER], [GREEDY]]:
            spec = specs[0]
            mean, half = mean_ci(profit(rows, spec))
            versus = paired_cells(rows, spec, PLANNER)["all"] if spec != PLANNER else "0"
            print(f"| `{spec}` ({short(spec)}) | {len(specs)} | {mean:.3f} ± {half:.3f} | {versus} |")
        issue = next(k for k, specs in enumerate(ranked) if ISSUE_RULE in specs)
        print(f"\nissue 41's rule (offer as greedy, otherwise the planner: `{ISSUE_RULE}`) ranks {issue + 1} of {len(ranked)}, "
              f"{profit(rows, ISSUE_RULE).mean():.3f}\n")
    for buyers, spec in chosen.items():
        t0 = time.perf_counter()
        rows = []
        for seed in HELD_OUT:
            rows += await play([PLANNER, GREEDY, spec], buyers, seed, args.markets, args.concurrency)
        print(f"### Held out: run seeds {', '.join(map(str, HELD_OUT))}, {buyers} buyers ({time.perf_counter() - t0:.0f} s)\n")
        print(f"the rule chosen on seed {args.seed}: `{spec}` ({short(spec)})\n")
        vs_planner, vs_greedy = paired_cells(rows, spec, PLANNER), paired_cells(rows, spec, GREEDY)
        print("| split | rule | planner | greedy | rule − planner (n) | rule − greedy (n) |\n|---|---|---|---|---|---|")
        for split in [*(Path(s).stem for s in SPLITS), "all"]:
            mine = [row for row in rows if split == "all" or row["split"] == split]
            cells = [f"{mean_ci(profit(mine, who))[0]:.3f}" for who in (spec, PLANNER, GREEDY)]
            print(f"| {split} | {' | '.join(cells)} | {vs_planner[split]} | {vs_greedy[split]} |")
        print()
    print(f"{time.perf_counter() - began:.0f} s in all")


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7, help="training run seed the rules are ranked on")
    parser.add_argument("--markets", type=int, default=200, help="markets per split and run seed")
    parser.add_argument("--buyers", default="concession,threshold", help="comma-separated buyer specs, one ranking each")
    parser.add_argument("--top", type=int, default=8, help="rules shown per ranking")
    parser.add_argument("--concurrency", type=int, default=64, help="episodes in flight")
    args = parser.parse_args(argv)
    if args.seed in HELD_OUT:
        parser.error(f"--seed {args.seed} is a held-out run seed; rank the rules on another")
    try:
        asyncio.run(main(args))
    except UserError as error:  # a bad --buyers spec
        parser.error(str(error))


if __name__ == "__main__":
    cli()
