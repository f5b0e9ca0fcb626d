"""The messages greedy and the planner send, market by market: a fingerprint to hold their speed work to (issue 51).

The sellers of the ladder (``greedy``, ``planner``) and everything built on them (the menu's tools, the rollout
seller's continuation, the teacher's labels, every study in docs/experiments) depend on each message they send. Work
that makes them faster must not change one. This script plays a fixed set of episodes (:func:`cases`: small markets
of 2 to 4 buyers and products, the compact specs in ``specs/``, the named splits, and larger markets on the array
paths; threshold, concession, stubborn and mixed buyers; the menu and rollout sellers, which copy and follow both)
and writes, for each, the number of messages and a SHA-256 of every message event (sender, addressee, thought, talk,
action, validity) and of the episode's end, to ``tests/golden/seller_traces.json``. ``tests/test_seller_traces.py``
plays them again and compares.

Recorded from the tree at 6f58f87 (before issue 51's work on big markets). Write it again only where the sellers are
meant to change, and say so in the commit:

    python benchmarks/seller_traces.py                # writes tests/golden/seller_traces.json
    python benchmarks/seller_traces.py --check        # compares, prints the first episodes that differ
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import anyio
import orjson

from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import SPLITS, MarketSpec, load_spec
from negotiate.runner import build_episode
from negotiate.trace import EpisodeEnd, MessageEvent

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "seller_traces.json"
BUYERS = ("threshold", "concession", "stubborn")
SELLERS = ("greedy", "planner", "planner?reasons=1")


def _shape(buyers: int, products: int, stock: int = 1, valuation: str = "uniform") -> MarketSpec:
    return MarketSpec(name=f"{buyers}x{products}s{stock}{valuation[0]}", buyers=buyers, products=products, stock=stock,
                      valuation=valuation)


def cases() -> list[tuple[str, MarketSpec, str, str, int, bool]]:
    """(group, spec, seller, buyers, index, fresh): every episode of the fingerprint. ``group`` names the set it is in
    (the test runs a set per case); ``fresh``: played as ``run_episode(fresh=True)`` plays it (the rollouts' order)."""
    out = []
    small = [_shape(b, p) for b in (2, 3, 4) for p in (2, 3, 4)] + [_shape(3, 2, stock=2), _shape(2, 3, valuation="correlated"),
                                                                  _shape(4, 4, valuation="correlated")]
    for spec in small:
        for seller in SELLERS:
            for buyers in BUYERS:
                for index in range(4):
                    out.append(("small", spec, seller, buyers, index, index == 3))
    compact = [load_spec(ROOT / "specs" / name) for name in ("compact.toml", "compact-shapes.toml", "compact-correlated.toml")]
    for spec in compact + [SPLITS[name] for name in ("train", "shapes", "correlated", "prices-x10")]:
        for seller in SELLERS:
            for buyers in (*BUYERS, "mixed"):
                for index in range(6):
                    out.append(("splits", spec, seller, buyers, index, index == 5))
    # The array paths: greedy from 64 pairs, the planner's kept ladders on every size; stock above one copies columns.
    large = [_shape(8, 8), _shape(10, 7, stock=2), _shape(16, 16), _shape(12, 12, valuation="correlated"), _shape(30, 30),
             _shape(20, 9, stock=3), _shape(9, 20)]
    for spec in large:
        for seller in ("greedy", "planner"):
            for buyers in (*BUYERS, "mixed"):
                for index in range(2 if spec.buyers < 30 else 1):
                    out.append(("large", spec, seller, buyers, index, False))
    for spec in (_shape(2, 2), _shape(3, 3), SPLITS["train"]):
        for buyers in ("concession", "mixed"):
            for index in range(3):
                out.append(("menu", spec, "menu", buyers, index, False))
    for buyers in ("threshold", "concession"):
        out.append(("rollout", _shape(2, 2), "rollout?worlds=2", buyers, 0, False))
    return out


def key(spec: MarketSpec, seller: str, buyers: str, index: int, fresh: bool) -> str:
    return f"{spec.name}|{seller}|{buyers}|{index}{'|fresh' if fresh else ''}"


def fingerprint(spec: MarketSpec, seller: str, buyers: str, index: int, fresh: bool) -> tuple[int, str]:
    """(messages, SHA-256 of every message and the end) of episode ``index`` of a run seeded 51."""
    market, agent, players = build_episode(spec, parse_agent(seller, "seller"), parse_agent(buyers, "buyer"), 51, index)
    episode = anyio.run(lambda: run_episode(market, agent, players, episode_id="golden", fresh=fresh))
    digest = hashlib.sha256()
    count = 0
    for event in episode.events:
        if isinstance(event, MessageEvent):
            count += 1
            digest.update(orjson.dumps([event.sender, event.to, event.thought, event.talk, event.action, event.valid,
                                        event.error_kind], option=orjson.OPT_SORT_KEYS))
        elif isinstance(event, EpisodeEnd):
            digest.update(orjson.dumps([str(event.outcome), str(event.reason), event.turns_used]))
    return count, digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or --check) the fingerprint of greedy's and the planner's messages.")
    parser.add_argument("--check", action="store_true", help="compare with tests/golden/seller_traces.json instead of writing it")
    parser.add_argument("--group", default=None, help="only this group of cases (small, splits, large, menu, rollout)")
    args = parser.parse_args(argv)
    golden = json.loads(GOLDEN.read_text()) if args.check else {}
    found, differ, began = {}, [], time.perf_counter()
    for group, spec, seller, buyers, index, fresh in cases():
        if args.group and group != args.group:
            continue
        name = key(spec, seller, buyers, index, fresh)
        found[name] = fingerprint(spec, seller, buyers, index, fresh)
        if args.check and list(found[name]) != golden.get(name):
            differ.append(name)
            print(f"differs: {name}: {found[name][0]} messages, golden {golden.get(name, ['absent'])[0]}", flush=True)
    print(f"{len(found)} episodes, {sum(n for n, _ in found.values()):,} messages, {time.perf_counter() - began:.1f} s")
    if args.check:
        print(f"{len(differ)} differ")
        return 1 if differ else 0
    GOLDEN.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
