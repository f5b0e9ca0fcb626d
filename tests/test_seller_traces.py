"""Greedy and the planner send, market by market, the messages they sent before issue 51 made them fast on big markets.

``tests/golden/seller_traces.json`` holds, for 1,060 episodes (2x2 to 4x4 markets, the compact specs, the named splits,
markets of 64 to 900 pairs on the array paths; threshold, concession, stubborn and mixed buyers; the menu and the rollout
seller, which copy and follow both), the number of messages and a SHA-256 of every message and of the end, recorded by
``benchmarks/seller_traces.py`` from the tree before that work. Any change to a message, a thought or the episode's end
shows here.
"""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("seller_traces", ROOT / "benchmarks" / "seller_traces.py")
seller_traces = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seller_traces)

GOLDEN = json.loads(seller_traces.GOLDEN.read_text())
GROUPS = defaultdict(list)
for case in seller_traces.cases():
    GROUPS[case[0], case[2].split("?")[0]].append(case[1:])


def test_the_golden_file_holds_every_case_and_nothing_else():
    names = {seller_traces.key(*case[1:]) for case in seller_traces.cases()}
    assert names == set(GOLDEN) and len(names) == 1060


@pytest.mark.parametrize("group", sorted(GROUPS), ids=lambda group: "-".join(group))
def test_every_message_is_the_one_sent_before(group):
    differ = []
    for spec, seller, buyers, index, fresh in GROUPS[group]:
        name = seller_traces.key(spec, seller, buyers, index, fresh)
        if list(seller_traces.fingerprint(spec, seller, buyers, index, fresh)) != GOLDEN[name]:
            differ.append(name)
    assert not differ, f"{len(differ)} of {len(GROUPS[group])} episodes differ, the first: {differ[:5]}"
