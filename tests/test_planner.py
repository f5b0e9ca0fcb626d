"""The planning seller: it sees only its observation, it is deterministic, it breaks no rule,
its ladders are the optimal ones, and it reads counter-bids the way the buyers make them."""

from __future__ import annotations

import dataclasses

import anyio
import numpy as np
import pytest

from negotiate.agents.llm import render_seller
from negotiate.agents.planner import PlannerSeller, read_reason
from negotiate.agents.registry import _PARAMS, parse_agent
from negotiate.agents.scripted import BUYERS, SELLERS
from negotiate.agents.scripted import _tries_value
from negotiate.episode import run_episode
from negotiate.market import SPLITS, Buyer, Market, MarketSpec, Product
from negotiate.metrics import opt
from negotiate.protocol import Action, Message
from negotiate.runner import build_buyers, build_episode


def _play(market: Market, seller, buyers: str = "threshold"):
    agents = build_buyers(market, parse_agent(buyers, "buyer"))
    return anyio.run(lambda: run_episode(market, seller, agents, opt_value=opt(market)))


def _messages(episode) -> list[tuple]:
    return [(e["sender"], e["to"], e["action"] and tuple(e["action"].values())) for e in episode.events if e["type"] == "message"]


class _SpecOnly:
    """Stands in for the market when the planner is built: it has the public spec and nothing else."""

    def __init__(self, spec: MarketSpec):
        self.spec = spec

    def __getattr__(self, name):
        raise AssertionError(f"the planner read market.{name}: private information")


def _one_by_one(value: int, cost: int = 100, budget: int = 10) -> Market:
    return Market(MarketSpec(), 0, (Product("p1", "A", cost, 1),), (Buyer("b1", (value,)),), budget, 100, 1000)


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("buyers", ["threshold", "concession", "stubborn"])
def test_it_plays_the_same_without_the_markets_private_values(split, buyers):
    # Built from a stand-in that raises on anything but the spec, and from a market whose
    # values are all poisoned: both must play exactly the episode the real market gets.
    spec = parse_agent("planner", "seller")
    for index in range(3):
        market, seller, _ = build_episode(SPLITS[split], spec, parse_agent(buyers, "buyer"), 0, index)
        blind = PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=[market.seed, 2])
        poisoned = dataclasses.replace(market, buyers=tuple(Buyer(b.id, (10**9,) * len(b.values)) for b in market.buyers))
        fooled = PlannerSeller.create("planner", {}, market=poisoned, seed=[market.seed, 2])
        reference = _messages(_play(market, seller, buyers))
        assert _messages(_play(market, blind, buyers)) == reference
        assert _messages(_play(market, fooled, buyers)) == reference


def test_same_seed_same_trace():
    spec = parse_agent("planner", "seller")
    for index in range(5):
        traces = []
        for _ in range(2):
            market, seller, agents = build_episode(SPLITS["shapes"], spec, parse_agent("concession", "buyer"), 7, index)
            traces.append(_messages(anyio.run(lambda: run_episode(market, seller, agents))))
        assert traces[0] == traces[1]


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("buyers", ["threshold", "concession", "stubborn", "random"])
def test_no_violation_and_no_overrun(split, buyers):
    spec = parse_agent("planner", "seller")
    for index in range(15):
        market, seller, agents = build_episode(SPLITS[split], spec, parse_agent(buyers, "buyer"), 3, index)
        episode = anyio.run(lambda: run_episode(market, seller, agents, opt_value=opt(market)))
        assert episode.outcome in ("terminated", "truncated"), episode.reason
        assert episode.metrics["violations"] == {}
        assert episode.metrics["budget_overrun"] == 0


@pytest.mark.parametrize("tries", [1, 2, 4, 8])
def test_the_ladder_matches_the_closed_form_on_a_uniform_belief(tries):
    # Uniform value on [100, 1000], cost 100: the k-offer ladder earns k / (2 (k + 1)) * 900
    # (225 for one offer, 300 for two) and first asks 100 + 900 k / (k + 1). The programme
    # works on 24 cells of 37.5, so it may ask up to a cell off and earn a little less.
    seller = PlannerSeller.create("planner", {}, market=_SpecOnly(MarketSpec()), seed=0)
    market = _one_by_one(500)
    seller._learn(_observation(market))
    ladder = seller._ladders([0], (tries,))
    worth, price = _tries_value(100, 1000, 100, tries)
    assert ladder["value"][tries][0, 0, -1] == pytest.approx(worth, rel=0.02)
    first = ladder["sale"][0, 0] * (ladder["prices"][0, 0] - 100) + seller._rest[0, 0]
    assert abs(ladder["prices"][0, 0, int(np.argmax(first))] - price) <= 38


def _observation(market: Market, new=()):
    from negotiate.regulator import EpisodeState

    state = EpisodeState(market)
    obs = state.seller_observation()
    return obs._replace(new=tuple(new))


def test_on_correlated_markets_a_reject_lowers_the_belief_about_the_other_products():
    # Same buyer, two products: a reject of p1 at 300 says the buyer's common factor is low,
    # so its value of p2 is believed lower too; on an independent split it changes nothing.
    def mean_of_p2(spec: MarketSpec, rejected: bool) -> float:
        market = Market(spec, 0, (Product("p1", "A", 300, 1), Product("p2", "B", 300, 1)), (Buyer("b1", (1, 1)),), 6, 100, 1000)
        seller = PlannerSeller.create("planner", {}, market=_SpecOnly(spec), seed=0)
        seller._learn(_observation(market))
        if rejected:
            seller.last[0] = (0, 300)
            seller._learn(_observation(market, [Message("b1", "seller", "", Action("reject"))]))
        seller.lo_price = 100
        floor, top = np.array([[100.0, 100.0]]), np.array([[1001.0, 1001.0]])
        masses = seller._cell_masses([0], floor, top)[0, 1]
        centres = 100 + (np.arange(len(masses)) + 0.5) * 901 / len(masses)
        return float((masses * centres).sum() / masses.sum())

    correlated, uniform = SPLITS["correlated"], SPLITS["train"]
    assert mean_of_p2(correlated, True) < mean_of_p2(correlated, False) - 50
    assert mean_of_p2(uniform, True) == pytest.approx(mean_of_p2(uniform, False))


def test_a_stubborn_bid_is_accepted_once_it_does_not_move():
    # Value 500, share 0.8: the anchor is 400. The first ask (about 900) draws a bid of 400;
    # the planner asks 400 + 400 / 4 * 2 = 600 to see whether the bid climbs; it does not
    # (400 again), so it accepts 400 on the third turn.
    market = _one_by_one(500)
    episode = _play(market, PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0), "stubborn?share=0.8")
    actions = [a for _, _, a in _messages(episode)]
    assert actions[1] == ("bid", "p1", 400) and actions[3] == ("bid", "p1", 400)
    assert actions[2] == ("offer", "p1", 600) and actions[4] == ("accept", "p1", 400)
    assert episode.metrics["profit"] == 300


def test_a_conceding_buyer_is_held_while_its_bids_rise():
    # Value 800, start 0.5, patience 3: targets 400, 600, 800 over its first three messages.
    # The first bid is 400; the planner asks 400 + 2 * 100 = 600, which the buyer's second
    # target (600) meets: a sale at 600, where accepting the first bid would have made 400.
    market = _one_by_one(800)
    seller = PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0)
    episode = _play(market, seller, "concession?start=0.5&patience=3")
    actions = [a for _, _, a in _messages(episode)]
    assert actions[1] == ("bid", "p1", 400)
    assert actions[2:] == [("offer", "p1", 600), ("accept", "p1", 600)]
    assert episode.metrics["profit"] == 500


def test_with_one_turn_per_buyer_left_a_rising_bid_is_taken():
    # Budget 2: the first offer leaves one turn, so the planner accepts the first bid (400).
    market = _one_by_one(800, budget=2)
    seller = PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0)
    episode = _play(market, seller, "concession?start=0.5&patience=3")
    assert [a for _, _, a in _messages(episode)][1:] == [("bid", "p1", 400), ("accept", "p1", 400)]


def _two_by_two(values, costs=(100, 100), budget=6) -> Market:
    products = tuple(Product(f"p{j + 1}", "A", cost, 1) for j, cost in enumerate(costs))
    buyers = tuple(Buyer(f"b{i + 1}", tuple(v)) for i, v in enumerate(values))
    return Market(MarketSpec(), 0, products, buyers, budget, 100, 1000)


def test_while_buyers_only_accept_or_reject_it_waits_for_each_reply():
    # Threshold buyers: every seller message is answered before the next one is sent.
    market = _two_by_two([(300, 900), (900, 300)])
    episode = _play(market, PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0))
    senders = [sender for sender, _, _ in _messages(episode)]
    assert senders[0] == "seller" and len(senders) >= 4
    assert all(a != b for a, b in zip(senders, senders[1:])), senders


def test_once_buyers_bid_every_free_buyer_hears_an_offer_before_the_replies():
    # Conceding buyers: the first offer draws a bid, then both buyers are asked before either answers,
    # so both bids are on the table before a unit goes to one of them.
    market = _two_by_two([(800, 700), (750, 800)])
    episode = _play(market, PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0), "concession?start=0.5&patience=3")
    senders = [sender for sender, _, _ in _messages(episode)]
    assert senders[0] == "seller" and senders[1] in ("b1", "b2") and senders[2:4] == ["seller", "seller"], senders


def test_a_bid_for_another_product_bounds_the_offered_one():
    # Offered p1 at 800, the buyer bids 300 for p2: p1 at 800 is refused, so the bound on p1 drops to 799
    # (the planner used to ask 800 again and again). p2's lower bound becomes the bid.
    market = _two_by_two([(1, 1)], budget=6)
    seller = PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0)
    seller._learn(_observation(market))
    seller.last[0] = (0, 800)
    seller._learn(_observation(market, [Message("b1", "seller", "", Action("bid", "p2", 300))]))
    assert seller.hi[0].tolist() == [799.0, 1000.0] and seller.lo[0].tolist() == [100.0, 300.0]


def test_a_bid_that_does_not_move_caps_every_product_of_that_buyer():
    # A stubborn buyer bids its highest anchor: after 400 twice (an ask of 600 between), no product sells above 400.
    market = _two_by_two([(1, 1)], budget=6)
    seller = PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0)
    seller._learn(_observation(market))
    for ask in (900, 600):
        seller.last[0] = (0, ask)
        seller._learn(_observation(market, [Message("b1", "seller", "", Action("bid", "p1", 400))]))
    assert seller.stubborn[0]
    assert seller.hi[0].tolist() == [400.0, 400.0] and seller.lo[0].tolist() == [400.0, 100.0]


def test_the_first_ask_is_priced_for_the_turns_left_per_possible_deal():
    # Uniform values on [100, 1000], costs 100. The first price is the first step of a ladder of
    # k = 0.7 x (turns left / deals still possible) offers, 100 + 900 k / (k + 1) in closed form,
    # interpolated between the whole ladders either side (cells of 37.5 allow a cell either way).
    # Four buyers, one unit, 12 turns: one deal, k = 8.4: 0.6 x 900 + 0.4 x 910 = 904 (a ladder per
    # buyer, 12 / 4 = 3 offers, would ask 775).
    one_unit = Market(MarketSpec(), 0, (Product("p1", "A", 100, 1),), tuple(Buyer(f"b{i + 1}", (101,)) for i in range(4)), 12, 100, 1000)
    # Two buyers, two units, 6 turns: two deals, k = 2.1: 0.9 x 700 + 0.1 x 775 = 707.5.
    two_by_two = _two_by_two([(101, 101), (101, 101)])
    for market, price in ((one_unit, 904), (two_by_two, 707)):
        seller = PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0)
        first = _messages(_play(market, seller))[0][2]
        assert first[0] == "offer" and abs(first[2] - price) <= 38, first


def test_with_the_last_turn_a_climbing_buyer_is_asked_one_step_above_its_bid():
    # Value 800, start 0.5, patience 5: targets 400, 500, 600, 700, 800. Three turns: the first offer
    # draws 400; the planner holds (asks 400 + 2 * 100 = 600) and the bid climbs to 500. With one
    # turn left it asks where the next target lands, 500 + 100 - 1 = 599 (a buyer that climbs for 3 to
    # 6 rounds is sure to climb at its third), and the buyer takes it: 499 instead of the bid's 400.
    market = _one_by_one(800, budget=3)
    seller = PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0)
    episode = _play(market, seller, "concession?start=0.5&patience=5")
    actions = [a for _, _, a in _messages(episode)]
    assert actions[1:] == [("bid", "p1", 400), ("offer", "p1", 600), ("bid", "p1", 500), ("offer", "p1", 599), ("accept", "p1", 599)]
    assert episode.metrics["profit"] == 499


def test_a_climbing_bid_below_cost_is_closed_by_the_next_target_when_it_covers_the_cost():
    # Cost 550, value 800, start 0.5, patience 5: targets 400, 500, 600. The bids (400, 500) are below
    # cost, so neither can be taken; with the last turn the planner asks 500 + 100 - 1 = 599, above
    # cost, and sells (it used to hold at 700 and sell nothing).
    market = _one_by_one(800, cost=550, budget=3)
    seller = PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0)
    episode = _play(market, seller, "concession?start=0.5&patience=5")
    actions = [a for _, _, a in _messages(episode)]
    assert actions[1:] == [("bid", "p1", 400), ("offer", "p1", 600), ("bid", "p1", 500), ("offer", "p1", 599), ("accept", "p1", 599)]
    assert episode.metrics["profit"] == 49


def _thoughts(episode) -> list[str]:
    return [e["thought"] for e in episode.events if e["type"] == "message" and e["sender"] == "seller"]


def test_reasons_state_what_each_choice_turned_on_and_change_no_action():
    # The held conceding buyer above (value 800, bids 400 then meets 600), with reasons=1: the same
    # messages; the first offer had no bid to go on (budget 10, one buyer); the second holds the first
    # bid of 400 with 9 turns left for 1 buyer (turns per buyer 9 > patience 1).
    market = _one_by_one(800)
    plain = _play(market, PlannerSeller.create("planner", {}, market=_SpecOnly(market.spec), seed=0), "concession?start=0.5&patience=3")
    spec = parse_agent("planner?reasons=1", "seller")
    seller = PlannerSeller.create(spec.text, spec.params, market=_SpecOnly(market.spec), seed=0)
    episode = _play(market, seller, "concession?start=0.5&patience=3")
    assert _messages(episode) == _messages(plain)
    assert _thoughts(plain) == ["", ""]
    assert _thoughts(episode) == ["b1 has not bid; 10 turns for 1 buyer: offer p1",
                                  "b1 bids $400 (first bid, covers cost); 9 turns for 1 buyer: hold out"]


def test_reasons_name_the_last_turn_when_a_bid_is_taken():
    # Budget 2: one turn left after the first offer, so the first bid (400, over the cost of 100) is taken, and the
    # thought says why.
    market = _one_by_one(800, budget=2)
    seller = PlannerSeller.create("planner", {"reasons": 1}, market=_SpecOnly(market.spec), seed=0)
    episode = _play(market, seller, "concession?start=0.5&patience=3")
    assert _thoughts(episode)[-1] == "b1 bids $400 (first bid, covers cost); 1 turn for 1 buyer: take it"
    assert _messages(episode)[-1] == ("seller", "b1", ("accept", "p1", 400))


def test_reasons_for_a_bid_that_stopped_moving():
    # The stubborn buyer above (anchor 400): offer, bid 400, ask 600, bid 400 again: taken as not rising.
    # Only the seller's messages spend the budget of 10: 9 turns at the second message, 8 at the third.
    market = _one_by_one(500)
    seller = PlannerSeller.create("planner", {"reasons": 1}, market=_SpecOnly(market.spec), seed=0)
    episode = _play(market, seller, "stubborn?share=0.8")
    assert _thoughts(episode)[1:] == ["b1 bids $400 (first bid, covers cost); 9 turns for 1 buyer: hold out",
                                      "b1 bids $400, $400 (not rising, covers cost); 8 turns for 1 buyer: take it"]


def test_reasons_say_when_a_bid_is_below_cost():
    # The buyer above whose first bid (400) is under the cost of 550, budget 3: the planner holds out at 600 with 2
    # turns left for 1 buyer, then with 1 turn left asks one step up from the rising bids (400, 500) at 599, over cost.
    market = _one_by_one(800, cost=550, budget=3)
    seller = PlannerSeller.create("planner", {"reasons": 1}, market=_SpecOnly(market.spec), seed=0)
    episode = _play(market, seller, "concession?start=0.5&patience=5")
    assert _thoughts(episode)[1:] == ["b1 bids $400 (first bid, below cost); 2 turns for 1 buyer: hold out",
                                      "b1 bids $400, $500 (rising, below cost); 1 turn for 1 buyer: ask one step up"]


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("buyers", ["threshold", "concession", "stubborn", "random"])
def test_reasons_change_no_action_and_every_message_has_one(split, buyers):
    plain, reasons = parse_agent("planner", "seller"), parse_agent("planner?reasons=1", "seller")
    for index in range(10):
        episodes = []
        for spec in (plain, reasons):
            market, seller, agents = build_episode(SPLITS[split], spec, parse_agent(buyers, "buyer"), 5, index)
            episodes.append(anyio.run(lambda: run_episode(market, seller, agents)))
        assert _messages(episodes[1]) == _messages(episodes[0])
        assert all(_thoughts(episodes[1])) and not any(_thoughts(episodes[0]))


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("buyers", ["concession", "stubborn", "random"])
def test_the_facts_prompt_holds_the_facts_of_every_reason(split, buyers):
    # A policy taught by planner?reasons=1 and served with prompt=facts can copy its thought's facts and turns
    # from its prompt: on every message of every episode the prompt holds both, word for word.
    spec = parse_agent("planner?reasons=1", "seller")
    seen = []

    class Watched(PlannerSeller):
        def decide(self, obs):
            message = super().decide(obs)
            if message is not None:
                seen.append((read_reason(message.thought), render_seller(obs, "tagged", "facts")[1]["content"]))
            return message

    for index in range(6):
        market, _, agents = build_episode(SPLITS[split], spec, parse_agent(buyers, "buyer"), 5, index)
        seller = Watched.create(spec.text, spec.params, market=market, seed=index)
        anyio.run(lambda: run_episode(market, seller, agents))
    bids = 0
    for (facts, turns, _), prompt in seen:
        assert f"\n{turns}: " in prompt if turns else facts in ("nothing left to sell", "no sale is worth its cost")
        if " bids $" in facts or facts.endswith("has not bid"):
            bids += " bids $" in facts
            assert f". {facts}\n" in prompt
        else:
            assert facts in ("nothing left to sell", "no sale is worth its cost")
    assert bids > 0 or buyers == "random"


def test_reasons_is_a_flag_of_the_planner_only():
    assert parse_agent("planner?reasons=1", "seller").params == {"reasons": 1}
    with pytest.raises(Exception, match="outside"):
        parse_agent("planner?reasons=2", "seller")
    with pytest.raises(Exception, match="unknown parameter 'reasons' for greedy"):
        parse_agent("greedy?reasons=1", "seller")


def test_settings_fill_in_the_defaults_a_spec_leaves_out():
    # patience=1 and reasons=0 are the planner's defaults: spelled out or not, the same settings (how a loop's
    # results find the ladder's seller that plays as its teacher does); a buyer's drawn parameters have no default.
    assert parse_agent("planner", "seller").settings == parse_agent("planner?patience=1&reasons=0", "seller").settings
    assert parse_agent("planner?reasons=1", "seller").settings == {"patience": 1, "reasons": 1}
    assert parse_agent("concession", "seller").settings == {"beta": 0.5}
    assert parse_agent("concession?patience=4", "buyer").settings == {"patience": 4}


def test_every_default_is_a_parameter_the_registry_takes_and_in_its_range():
    for role, table in (("seller", SELLERS), ("buyer", BUYERS)):
        for name, agent in table.items():
            for key, value in agent.defaults.items():
                if isinstance(_PARAMS[role, name][key], str):  # a text parameter: the agent's own parse_params reads it
                    assert parse_agent(f"{name}?{key}={value}", role).params[key] == value, (role, name, key)
                    continue
                low, inclusive, high = _PARAMS[role, name][key]
                assert (value >= low if inclusive else value > low) and value <= high, (role, name, key)
