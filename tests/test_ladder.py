"""The seller ladder on the training split: oracle on top, greedy the best learner, random at the bottom."""

from __future__ import annotations

import numpy as np
import pytest

from negotiate.agents.registry import parse_agent
from negotiate.agents.scripted import SELLERS
from negotiate.episode import run_episode
from negotiate.market import SPLITS
from negotiate.metrics import opt
from negotiate.runner import build_episode

EPISODES = 100


@pytest.fixture(scope="module")
def ladder() -> dict[str, float]:
    import anyio

    async def play_all() -> dict[str, float]:
        buyers = parse_agent("threshold", "buyer")
        means = {}
        for name in SELLERS:
            ratios = []
            for index in range(EPISODES):
                market, seller, agents = build_episode(SPLITS["train"], parse_agent(name, "seller"), buyers, 0, index)
                episode = await run_episode(market, seller, agents, opt_value=opt(market))
                assert episode.outcome in ("terminated", "truncated"), episode.reason
                assert episode.metrics["budget_overrun"] == 0
                if episode.metrics["profit_ratio"] is not None:  # None when OPT is 0
                    ratios.append(episode.metrics["profit_ratio"])
            assert len(ratios) >= EPISODES * 0.9
            means[name] = float(np.mean(ratios))
        return means

    return anyio.run(play_all)


def test_oracle_takes_all_of_opt(ladder):
    # Threshold buyers accept any price up to their value, and the oracle offers exactly that value.
    assert ladder["oracle"] >= 0.99


def test_random_is_far_below(ladder):
    assert ladder["random"] < 0.5


def test_greedy_is_between_and_the_best_learner(ladder):
    assert ladder["random"] < ladder["greedy"] < ladder["oracle"]
    others = {name: mean for name, mean in ladder.items() if name not in ("oracle", "greedy")}
    assert all(ladder["greedy"] > mean for mean in others.values()), (ladder, others)


def test_every_learner_beats_random(ladder):
    assert all(ladder[name] > ladder["random"] for name in SELLERS if name != "random"), ladder
