"""The menu's teacher (``negotiate.training.teacher``): every option of every state a seller visited, valued by replaying
the market with the trace's own buyers, then a continuation seller. A value is exact: the option the seller sent, with
itself as the continuation, is worth what the episode made."""

from __future__ import annotations

import dataclasses

import pytest

from negotiate.agents.menu import Move
from negotiate.agents.registry import parse_agent
from negotiate.episode import run_episode
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.run import Run, RunConfig, build_buyers
from negotiate.trace import EpisodeRecord
from negotiate.training.teacher import CONTINUATION, Labelled, continuation_for, label_episode


@pytest.mark.parametrize("buyers", ["concession", "threshold", "mixed"])
async def test_the_option_sent_is_worth_what_the_episode_made_when_the_seller_continues(buyers):
    run = Run(RunConfig(sellers=("menu",), buyers=buyers, split="specs/compact-shapes.toml", seed=11, fresh=True))
    decisions = 0
    for index in range(8):
        episode = await run.episode(parse_agent("menu", "seller"), index).play()
        labels = label_episode(episode, "menu")
        assert len(labels) == len(episode.seller_messages())
        for label in labels:
            decisions += 1
            assert label.chosen == label.planner  # menu?pick=planner sends the planner's option
            assert label.values[label.chosen] == pytest.approx(episode.metrics["profit_ratio"], abs=1e-12)
            assert label.options[label.best].startswith(label.options[label.best][0])
            assert max(v for v in label.values if v is not None) >= label.values[label.chosen]
    assert decisions >= 30


def _one_buyer(budget: int) -> Market:
    """p1 costs $100; b1 values it at $500; OPT is 400. The range is $100-$1000, so the grid steps by $9."""
    return Market(MarketSpec(name="hand", buyers=1, products=1), 77, (Product("p1", "Lite", 100, 1),), (Buyer("b1", (500,)),),
                  budget, 100, 1000)


async def _episode(market: Market, seller: str, buyers: str = "threshold") -> EpisodeRecord:
    agents = build_buyers(market, parse_agent(buyers, "buyer"))
    return await run_episode(market, parse_agent(seller, "seller").build(market, [market.seed, 2]), agents, fresh=True,
                             labels={"buyers": buyers, "seed": market.seed})


async def test_with_one_turn_an_offer_is_worth_its_margin_if_the_buyer_takes_it_and_nothing_if_not():
    market = _one_buyer(budget=1)
    episode = await _episode(market, "menu")
    (label,) = label_episode(episode, "planner")
    for line, value in zip(label.options, label.values):
        move = line.split(": ", 1)[1].split(" (")[0]
        if move == "end":
            assert value == 0.0
            continue
        price = int(move.split("$")[1])
        # A threshold buyer takes any price up to its value; with the one turn spent, nothing follows a refusal.
        assert value == pytest.approx((price - 100) / 400 if price <= 500 else 0.0), line


async def test_a_second_turn_lets_the_continuation_sell_after_a_refusal():
    market = _one_buyer(budget=2)
    episode = await _episode(market, "menu")
    first = label_episode(episode, "planner")[0]
    refused = [(line, value) for line, value in zip(first.options, first.values) if "offer" in line and int(line.split("$")[1].split(" ")[0]) > 500]
    assert refused, first.options
    for line, value in refused:
        # Refused at that price, b1's value is known to be below it; the planner's last offer then sells at some price.
        assert 0.0 < value <= 1.0, line


async def test_buyers_that_are_not_the_traces_are_refused_with_the_turn_where_they_part():
    run = Run(RunConfig(sellers=("menu",), buyers="concession", split="specs/compact.toml", seed=3, fresh=True))
    episode = await run.episode(parse_agent("menu", "seller"), 0).play()
    start = dataclasses.replace(episode.start, buyers="threshold")
    with pytest.raises(ValueError, match="not the trace's buyers"):
        label_episode(EpisodeRecord([start, *episode.events[1:]]), "planner")


def test_the_continuation_is_chosen_by_the_buyers_kind():
    assert continuation_for("concession?patience=3") == CONTINUATION["concession"]
    assert continuation_for("threshold") == "planner"
    assert continuation_for("stubborn") == "planner"
    assert continuation_for("stubborn", {"*": "greedy"}) == "greedy"


def test_a_label_survives_its_json():
    label = Labelled("e", "g", "threshold", 0, [{"role": "user", "content": "x"}], ["A: end"], [0.0], 0, None, 0, [1.0])
    assert Labelled.from_json(label.to_json()) == label
    assert Move("end").text() == "end"
