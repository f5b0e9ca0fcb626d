"""Teacher episodes for the ``tools`` prompt: in each state, the better of the planner's and greedy's messages, found by replaying the market.

The seller walks each market with both tools beside it (each decides on a copy of itself, then both take the message sent,
as a teacher walks a trace). In each state where they would send different messages, the market is replayed from the start
twice, with the choices made so far: once sending the planner's message there and once greedy's, the planner sending every
later message. The buyers are scripted and seeded, so each replay is exact, and the difference of the two profits over OPT
is the one-step advantage of greedy's move in that state (policy improvement by rollouts). The episode sends the better
message (``--ties``: which one where both come to the same) and goes on to the next state.

The replays read the buyers' answers, which no seller sees: a state's label says which move did better on that market.
A model shown the state and both moves (``prompt=tools``) and trained on the labels (``negotiate loop --teacher-traces``)
learns which move does better from what it sees. The script also prints a lookup table's version of that: the share of
states, per kind of state, where greedy's move did better, and the held-out profit/OPT of a seller that follows the
table, paired against the planner::

    python benchmarks/hindsight.py --out runs/hindsight --buyers concession --markets 200

writes ``runs/hindsight/hindsight.jsonl`` (600 episodes, about 25 s on one core) and the tables' held-out checks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

import numpy as np

from negotiate.agents.llm import TOOLS
from negotiate.agents.registry import adviser
from negotiate.agents.rule import state_of, table_rule
from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.errors import UserError
from negotiate.market import resolve_spec
from negotiate.metrics import mean_ci, opt
from negotiate.regulator import SellerObservation
from negotiate.run import seller_seed
from negotiate.runner import build_episode
from negotiate.trace import TraceWriter

SPLITS = "specs/compact.toml,specs/compact-correlated.toml,specs/compact-shapes.toml"
EVAL_SEED = 1_000_003
"""The loop's held-out run seed: the table is checked there, and no teacher episode may use it."""


def differ(planner, greedy) -> bool:
    """Whether sending greedy's message instead of the planner's is another move (greedy has one to send)."""
    return greedy is not None and (planner is None or planner.to != greedy.to or planner.action != greedy.action)


class Chooser:
    """A seller that sends the planner's message but where ``switch`` (decision index -> bool) or ``table`` (kind of
    state -> bool) says to send greedy's. It records every state where the two differ."""

    instant = True

    def __init__(self, market, seed, switch: dict[int, bool] | None = None, table: dict[str, bool] | None = None):
        self.tools = adviser(market, seed, TOOLS)  # both walk the episode as the tools prompt's lines do
        self.switch, self.table = switch or {}, table
        self.step = 0
        self.states: list[tuple[int, str]] = []

    def decide(self, obs: SellerObservation):
        planner, greedy = self.tools.advise(obs)
        send = planner
        if differ(planner, greedy):
            kind = state_of(obs, (planner, greedy))
            self.states.append((self.step, kind))
            if self.switch.get(self.step, False) or (self.table is not None and self.table.get(kind, False)):
                send = greedy
        self.step += 1
        self.tools.follow(obs, send)
        return send

    def describe(self) -> dict:
        return {"kind": "scripted", "name": "hindsight", "params": {"tools": ",".join(TOOLS)}}


def ratio(episode) -> float:
    value = episode.metrics.get("profit_ratio")
    return 0.0 if value is None else float(value)


class Market:
    """One market of a run: replays it with a :class:`Chooser`."""

    def __init__(self, split: str, buyers: str, seed: int, index: int):
        self.spec, self.buyers, self.seed, self.index = resolve_spec(split), parse_agent(buyers, "buyer"), seed, index
        self.opt = None

    async def play(self, **chooser):
        market, _, players = build_episode(self.spec, parse_agent("planner", "seller"), self.buyers, self.seed, self.index)
        if self.opt is None:
            self.opt = opt(market)
        seller = Chooser(market, seller_seed(market.seed), **chooser)
        episode = await run_episode(market, seller, players, fresh=True, opt_value=self.opt,
                                    episode_id=f"hindsight-{self.spec.name}-{self.index:06d}",
                                    labels={"run_seed": self.seed, "index": self.index, "seed": market.seed, "seller": "hindsight",
                                            "buyers": self.buyers.text})
        return episode, seller


class Labelled(NamedTuple):
    episode: object
    """The hindsight episode."""
    planner_ratio: float
    """The planner's profit/OPT on the same market."""
    switch: dict[int, bool]
    """Per decision index where the tools differ: whether greedy's message was sent."""


async def label(market: Market, ties: str, advantages: dict[str, list[tuple[float, bool]]]) -> Labelled:
    """The market's hindsight episode. ``advantages`` gathers, per kind of state, each labelled state's one-step advantage
    of greedy's move and its label."""
    switch: dict[int, bool] = {}
    episode, seller = await market.play()
    planner_ratio = ratio(episode)
    start = 0
    while True:
        pending = [(step, kind) for step, kind in seller.states if step >= start]
        if not pending:
            return Labelled(episode, planner_ratio, switch)
        step, kind = pending[0]
        other, other_seller = await market.play(switch={**switch, step: True})
        gain = ratio(other) - ratio(episode)
        switch[step] = gain > 0 or (gain == 0 and ties == "greedy")
        advantages[kind].append((gain, switch[step]))
        if switch[step]:
            episode, seller = other, other_seller
        start = step + 1


async def check_table(name: str, table: dict[str, bool], splits: list[str], buyers: str, markets: int) -> None:
    print(f"\na table seller ({name}) on the held-out markets (run seed {EVAL_SEED}, {markets} per split), {buyers} buyers; "
          "paired against the planner")
    mine_all, base_all = [], []
    for split in splits:
        mine, base = [], []
        for index in range(markets):
            market = Market(split, buyers, EVAL_SEED, index)
            base.append(ratio((await market.play())[0]))
            mine.append(ratio((await market.play(table=table))[0]))
        mine, base = np.array(mine), np.array(base)
        mine_all.append(mine), base_all.append(base)
        print(f"  {split:34s} table {mine.mean():.3f}  planner {base.mean():.3f}  {'%+.3f ± %.3f' % mean_ci(mine - base)}")
    mine, base = np.concatenate(mine_all), np.concatenate(base_all)
    print(f"  {'all splits':34s} table {mine.mean():.3f}  planner {base.mean():.3f}  {'%+.3f ± %.3f' % mean_ci(mine - base)}")


async def main(args) -> None:
    splits = [s for s in args.splits.split(",") if s]
    if args.seed == EVAL_SEED:
        raise UserError("is the held-out run seed; teacher episodes must come from other markets", field="--seed", value=args.seed)
    out = Path(args.out)
    path = out / "hindsight.jsonl"
    if path.exists():
        raise UserError("already holds a trace; give a new folder", field="--out", value=str(out))
    began = time.perf_counter()
    advantages: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    totals, ours, planners = Counter(), [], []
    with TraceWriter(path) as writer:
        for split in splits:
            for index in range(args.markets):
                done = await label(Market(split, args.buyers, args.seed, index), args.ties, advantages)
                writer.write(done.episode.events)
                ours.append(ratio(done.episode)), planners.append(done.planner_ratio)
                totals["greedy"] += sum(done.switch.values())
                totals["states"] += len(done.switch)
    ours, planners = np.array(ours), np.array(planners)
    summary = {"episodes": len(ours), "labelled_states": totals["states"], "greedy_labels": totals["greedy"],
               "profit_ratio": round(float(ours.mean()), 4), "planner_profit_ratio": round(float(planners.mean()), 4),
               "seconds": round(time.perf_counter() - began, 1), "splits": splits, "buyers": args.buyers, "seed": args.seed,
               "ties": args.ties}
    (out / "hindsight.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{path}: {len(ours)} episodes in {summary['seconds']}s; {totals['states']} states where the two differ, "
          f"{totals['greedy']} labelled greedy's move; profit/OPT {ours.mean():.3f} (the planner's on the same markets "
          f"{planners.mean():.3f}, paired {'%+.3f ± %.3f' % mean_ci(ours - planners)})")
    print("\nkinds of state (verdict/planner's action/greedy's/same buyer/turns per active buyer), 20 or more seen:")
    by_mean, by_label = {}, {}
    for kind, rows in sorted(advantages.items(), key=lambda kv: -len(kv[1])):
        gains, labels = np.array([gain for gain, _ in rows]), np.array([chosen for _, chosen in rows])
        if len(gains) < 20:
            continue
        by_mean[kind], by_label[kind] = bool(gains.mean() > 0), bool(labels.mean() > 0.5)
        print(f"  {str(kind):58s} n={len(gains):5d} greedy better {np.mean(gains > 0):.2f}, worse {np.mean(gains < 0):.2f}, "
              f"mean {gains.mean():+.4f}, labelled greedy {labels.mean():.2f}")
    for file, table in (("table-mean.json", by_mean), ("table-label.json", by_label)):  # the tables as rule sellers (agents/rule.py)
        (out / file).write_text(json.dumps({kind: "greedy" if pick else "planner" for kind, pick in table.items()}, indent=1) + "\n")
        print(f"{file}: play it as {table_rule(TOOLS, str(out / file))}")
    if args.check:
        for name, table in (("greedy where its mean advantage is above 0", by_mean), ("the label most states of a kind have", by_label)):
            await check_table(name, table, splits, args.buyers, args.check)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for hindsight.jsonl and hindsight.json")
    parser.add_argument("--splits", default=SPLITS, help="comma-separated splits or TOML specs")
    parser.add_argument("--buyers", default="concession")
    parser.add_argument("--markets", type=int, default=200, help="markets per split")
    parser.add_argument("--seed", type=int, default=7, help=f"run seed of the markets (not the held-out {EVAL_SEED})")
    parser.add_argument("--ties", choices=("greedy", "planner"), default="greedy",
                        help="the label where both moves come to the same profit")
    parser.add_argument("--check", type=int, default=64, help="held-out markets per split for the table's check (0: none)")
    args = parser.parse_args(argv)
    try:
        asyncio.run(main(args))
    except UserError as error:
        raise SystemExit(f"hindsight.py: {error}") from None


if __name__ == "__main__":
    cli()
