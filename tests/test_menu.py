"""The menu (``negotiate.agents.menu``): the legal moves the runtime lays out at a seller decision, and the fixed rules
over it."""

from __future__ import annotations

import pytest

from negotiate.agents.menu import GRID, LETTERS, PICKS, Menu, Move, Option, build_menu, grid_prices, render_menu, snap
from negotiate.agents.registry import parse_agent
from negotiate.errors import UserError
from negotiate.market import SPLITS, Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import EpisodeState
from negotiate.rollout import play_out
from negotiate.runner import build_episode


def _state() -> EpisodeState:
    """p1 costs $300 (1 left), p2 $500 (1 left); b1 bid $420 for p1 after an offer of $900; b2 owes a reply to an offer;
    b3 is free and has not been written to. Range $100-$1000: grid steps of $9."""
    market = Market(MarketSpec(), 0, (Product("p1", "A", 300, 1), Product("p2", "B", 500, 1)),
                    (Buyer("b1", (600, 400)), Buyer("b2", (700, 800)), Buyer("b3", (200, 910))), 12, 100, 1000)
    state = EpisodeState(market)
    state.seller_send(Message(SELLER, "b1", "", Action("offer", "p1", 900)))
    state.buyer_reply("b1", Message("b1", SELLER, "", Action("bid", "p1", 420)))
    state.seller_send(Message(SELLER, "b2", "", Action("offer", "p2", 850)))
    return state


def test_the_menu_holds_the_tools_moves_the_planners_neighbours_every_bid_accepted_wait_and_end():
    obs = _state().seller_observation()
    planner = Message(SELLER, "b1", "", Action("offer", "p1", 513), "b1 bids $420 (first bid, covers cost); 10 turns for 3 buyers: hold out")
    greedy = Message(SELLER, "b1", "", Action("accept", "p1", 420))
    menu = build_menu(obs, (planner, greedy))
    # 513 snaps to the grid's 514 (100 + 46 x 9); its neighbours 3 and 6 steps away are 460, 487, 541 and 568.
    assert menu.lines() == [
        "A: offer b1 p1 $568", "B: offer b1 p1 $541", "C: offer b1 p1 $514 (planner: hold out)", "D: offer b1 p1 $487",
        "E: offer b1 p1 $460", "F: accept b1 p1 $420 (greedy)", "G: wait", "H: end"]
    assert (menu.tagged("planner"), menu.tagged("greedy"), menu.letters) == (2, 5, "ABCDEFGH")
    assert menu.message(6) is None
    sent = menu.message(2)
    assert (sent.to, sent.action, sent.thought) == ("b1", Action("offer", "p1", 514), "option C of 8: offer b1 p1 $514 (planner: hold out)")
    assert menu.message(7).action.kind == "end"


def test_neighbours_below_cost_are_left_out_and_one_move_proposed_twice_is_one_option():
    obs = _state().seller_observation()
    low = Message(SELLER, "b1", "", Action("offer", "p1", 310))  # 310 snaps to 307: 3 and 6 steps down are below the $300 cost
    menu = build_menu(obs, (low, low))
    assert [o.move.price for o in menu.options if o.move.kind == "offer"] == [361, 334, 307]
    assert menu.options[2].tags == ("planner", "greedy")


def test_the_prompt_shows_the_state_and_the_options_and_no_value():
    state = _state()
    obs = state.seller_observation()
    menu = build_menu(obs, (None, None))
    system, user = render_menu(obs, menu)
    assert "answer with its letter" in system["content"]
    # Both tools wait (None while b2 owes a reply): their move is the wait; every bid is accepted too, and end.
    assert user["content"].splitlines() == [
        "10 turns left of 12; 3 buyers active; values $100-$1000",
        "p1: cost $300, 1 left",
        "p2: cost $500, 1 left",
        "b1 free: offer p1 $900, bid p1 $420",
        "b2 waits: offer p2 $850",
        "b3 free",
        "A accept b1 p1 $420",
        "B wait (planner; greedy)",
        "C end"]
    for values in ("600", "400", "700", "800", "200", "910"):  # valuations never reach the seller's prompt
        assert f"${values}" not in user["content"]


def test_a_refused_message_is_marked_where_it_happened():
    state = _state()
    state.seller_send(Message(SELLER, "b3", "", Action("offer", "p1", 250)))  # below p1's $300 cost: refused
    obs = state.seller_observation()
    assert "b3 free: offer p1 $250 (refused)" in render_menu(obs, build_menu(obs, (None, None)))[1]["content"]


def test_snap_takes_the_nearest_grid_price_that_covers_the_cost():
    grid = grid_prices(100, 1000, GRID)
    assert (len(grid), grid[:3], grid[-1]) == (101, [100, 109, 118], 1000)
    assert snap(513, 300, grid) == 514 and snap(113, 100, grid) == 109 and snap(150, 300, grid) == 307


@pytest.mark.parametrize("buyers", ["threshold", "concession"])
def test_the_planners_pick_sends_the_planners_move_on_the_grid(buyers):
    seen = 0
    for index in range(10):
        market, menu_seller, players = build_episode(SPLITS["train"], parse_agent("menu", "seller"), parse_agent(buyers, "buyer"), 4, index)
        state = EpisodeState(market)

        class Check:
            instant = True

            def decide(self, obs):
                nonlocal seen
                said = menu_seller.adviser.advise(obs)
                message = menu_seller.decide(obs)
                planner = said[0]
                if planner is None or message is None:
                    assert planner is None or planner.action.kind != "offer"
                    return message
                seen += 1
                assert (message.to, message.action.kind, message.action.product) == (planner.to, planner.action.kind, planner.action.product)
                if planner.action.kind == "offer":
                    cost = next(p.cost for p in obs.products if p.id == planner.action.product)
                    # The nearest grid price, half a $9 step away at most, or the first at or above the cost.
                    assert abs(message.action.price - planner.action.price) <= (9 if planner.action.price < cost + 9 else 5)
                else:
                    assert message.action.price == planner.action.price
                return message

        play_out(state, Check(), players)
    assert seen > 20


def test_each_pick_is_a_seller_and_a_bad_pick_is_one_line():
    for pick in PICKS:
        parse_agent(f"menu?pick={pick}", "seller")
    with pytest.raises(UserError, match=r"parameter pick='best': choose from planner, greedy, down6, down3, up3, up6"):
        parse_agent("menu?pick=best", "seller")


def test_a_step_pick_takes_the_planners_neighbour_or_the_planners_own_option():
    grid = tuple(grid_prices(100, 1000, GRID))
    menu = Menu((Option(Move("offer", "b1", "p1", 541)), Option(Move("offer", "b1", "p1", 514), ("planner",)), Option(Move("end"))), grid)
    assert PICKS["up3"](menu) == 0 and PICKS["down3"](menu) == 1 and PICKS["greedy"](menu) == 2
    assert len(LETTERS) == 26
