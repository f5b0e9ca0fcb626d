"""negotiate.tui with a person in the loop (issue 51, items 9 and 10): the market waits for a person playing a buyer,
market news that covers nothing, the composer's product, one quit key per footer, the tabs' legend, the replay chart's
hidden buyers, the exit summary, and Tab in a burst of keys. The browser's side is in test_web.py."""

from __future__ import annotations

import shlex

import anyio
from test_tui import my_turn, session, until
from test_tui_person import _offer, screen_lines, screen_text, status, turn_on, turn_settled
from textual import events
from textual.widgets._toast import Toast

from negotiate.agents.human import HumanAgent
from negotiate.agents.registry import parse_agent
from negotiate.cli import main
from negotiate.market import MarketSpec
from negotiate.protocol import SELLER, Action, Message
from negotiate.run import HUMAN_TIMEOUT
from negotiate.tui.app import NegotiateApp
from negotiate.tui.commands import exit_summary
from negotiate.tui.replay import ReplayScreen
from negotiate.tui.results import ResultScreen
from negotiate.tui.seller import TAB_LEGEND
from negotiate.tui.session import PlaySession
from negotiate.tui.transcript import Recorded
from negotiate.tui.widgets import Composer, PriceChart

CROWD = MarketSpec(name="crowd", buyers=4, products=2, budget=6)
"""The issue's market: a budget of 6 shared by four buyers, the person one of them."""
FIVE = MarketSpec(name="five", buyers=5, products=2, budget=12)
"""Five buyer rows at 80x24: two deals' toasts used to hide four of them."""
SMALL = (80, 24)


def crowd(tmp_path, seed: int = 4) -> PlaySession:
    """The person is b1 among three threshold buyers; the agents paced as a person would see them, 50 times faster
    (the seller 0.01 s a message, the other buyers 0.08 s a reply: 0.5 s and 4 s in ``negotiate play``). On seed 4,
    with the person's first turn 3 of the 6 turns are left, and an agent that did not wait for the person spent the
    other 3 within 1.5 s."""
    return PlaySession("buyer", CROWD, seed, seller=parse_agent("greedy", "seller"), buyers=parse_agent("threshold", "buyer"),
                       out=tmp_path, pace=0.01, others_pace=0.08)


# -- the market waits for the person -----------------------------------------------------------------------------


async def test_the_market_waits_while_the_person_playing_a_buyer_reads(tmp_path):
    play = crowd(tmp_path)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await my_turn(pilot, play)
        turns, stock, thread = play.state.turns_used, [p.stock for p in play.view().products], play.view().thread
        # 1.5 s is 150 seller paces: the whole budget, had the seller gone on with the other buyers (it did: "20 s in,
        # turns left: 1 of 6", at the real pace).
        await pilot.pause(1.5)
        assert (play.state.turns_used, [p.stock for p in play.view().products], play.view().thread) == (turns, stock, thread)
        assert play.person_owes and not play.thinking  # the agents wait, and are not shown thinking
        assert "Your reply · the market waits for you" in screen_text(app)
        assert "On your turn the market waits." in screen_text(app)
        assert f"Seller's turns left: {6 - turns} of 6" in screen_text(app)
        await pilot.press("ctrl+r", "enter")  # the person answers: the market goes on
        await until(pilot, lambda: play.state.turns_used > turns or play.result is not None)
        await until(pilot, lambda: play.person_owes or play.result is not None)
        assert "the market waits" in screen_text(app) or play.result is not None
        await pilot.press("ctrl+q", "ctrl+q")


async def test_an_agent_holds_its_decision_no_longer_than_its_patience(tmp_path):
    # The agents' deadline is an hour (the person's too): an agent holds a decision for the person at most half of it,
    # so the bus never times it out for waiting.
    play = crowd(tmp_path)
    assert play.patience == HUMAN_TIMEOUT / 2
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await my_turn(pilot, play)
        with anyio.move_on_after(0.5) as waiting:
            await play.wait_for_person(anyio.current_time() + play.patience)
        assert waiting.cancelled_caught  # still waiting for the person after 0.5 s
        started = anyio.current_time()
        await play.wait_for_person(started + 0.2)
        assert 0.2 <= anyio.current_time() - started < 5 and play.person_owes  # given up at its deadline
        await pilot.press("ctrl+q", "ctrl+q")


async def test_only_a_person_playing_a_buyer_is_waited_for(tmp_path):
    seller = session(tmp_path, "seller", spec=CROWD)
    seller.human.observation = object()  # the person deciding
    assert not seller.person_owes  # buyers only answer the person's own messages: nothing runs while they think
    buyer = crowd(tmp_path)
    assert not buyer.person_owes  # the seller has not written to the person yet
    started = anyio.current_time()
    await buyer.wait_for_person(started + 60)
    assert anyio.current_time() - started < 1  # nothing owed: no wait


async def test_the_agents_wait_even_with_no_pace(tmp_path):
    # Tests run the agents unpaced: from the moment the seller's message to the person is sent, they wait.
    play = session(tmp_path, "buyer", spec=CROWD)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await my_turn(pilot, play)
        turns = play.state.turns_used
        await pilot.pause(0.3)
        assert play.state.turns_used == turns and not play.state.done
        await pilot.press("ctrl+q", "ctrl+q")


# -- news that covers nothing -------------------------------------------------------------------------------------


async def test_deals_and_sold_out_notices_cover_no_buyer_row_at_80x24(tmp_path):
    play = session(tmp_path, "seller", spec=FIVE, seed=3)
    b2 = play.buyers["b2"] = HumanAgent("b2")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await _offer(pilot, app, play, "b2", "p1", 800)  # b2 values p1 at $821
        await turn_on(pilot, b2)
        b2.send(Message("b2", SELLER, "yes", Action("accept", "p1", 800)))
        await until(pilot, lambda: play.view().products[0].stock == 0)
        await turn_settled(pilot, play)
        await pilot.pause(0.2)
        assert not app.screen.query(Toast)  # the news is in the board, not over it
        lines = screen_lines(app)
        for buyer in ("b1", "b2", "b3", "b4", "b5"):
            assert any(line[36:].lstrip("│ ").startswith(buyer) for line in lines[:9]), "\n".join(lines)
        await pilot.press("escape", "2")
        await until(pilot, lambda: "deal: b2 buys p1 at $800" in screen_text(app))
        assert "p1 is sold out" in screen_text(app)
        await pilot.press("4")  # a buyer with no deal reads what sold out, not the others' deals
        await until(pilot, lambda: "Conversation with b4" in screen_text(app))
        text = screen_text(app)
        assert "p1 is sold out" in text and "deal:" not in text


async def test_the_buyer_reads_of_a_unit_sold_to_another_in_the_conversation(tmp_path):
    play = session(tmp_path, "buyer", spec=CROWD, seed=7)
    seller = play.seller = HumanAgent(SELLER)  # the test sells, and buys as b2
    b2 = play.buyers["b2"] = HumanAgent("b2")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await turn_on(pilot, seller)
        seller.send(Message(SELLER, "b2", "", Action("offer", "p1", 500)))  # b2 values p1 at $798
        await turn_on(pilot, b2)
        b2.send(Message("b2", SELLER, "", Action("accept", "p1", 500)))
        await until(pilot, lambda: "p1 sold to another buyer" in screen_text(app))
        assert not app.screen.query(Toast)
        await pilot.press("ctrl+q", "ctrl+q")


# -- the composer's product -----------------------------------------------------------------------------------------


async def test_after_a_deal_the_sellers_composer_does_not_offer_the_product_just_sold(tmp_path):
    play = session(tmp_path, "seller", spec=FIVE, seed=3)
    b2 = play.buyers["b2"] = HumanAgent("b2")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await _offer(pilot, app, play, "b2", "p1", 800)  # then the composer moves on to b3, still on p1
        await turn_on(pilot, b2)
        b2.send(Message("b2", SELLER, "", Action("accept", "p1", 800)))
        await until(pilot, lambda: play.view().products[0].stock == 0)
        await turn_settled(pilot, play)
        assert "Your message to b3" in screen_text(app)
        composer = app.screen.query_one(Composer)
        assert composer.product is None  # p1 is sold: the field asks for a product, none is chosen for the person
        assert composer.available() == ["p2"]


async def test_the_buyers_composer_keeps_the_product_the_person_chose(tmp_path):
    play = session(tmp_path, "buyer", spec=CROWD, seed=7)
    seller = play.seller = HumanAgent(SELLER)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await turn_on(pilot, seller)
        seller.send(Message(SELLER, "b1", "", Action("offer", "p1", 900)))
        await my_turn(pilot, play)
        composer = app.screen.query_one(Composer)
        assert composer.product == "p1"  # a first reply starts on the product offered
        await pilot.press("down")
        assert composer.product == "p2"
        await pilot.press(*"300", "enter")  # a bid on p2
        await turn_on(pilot, seller)
        seller.send(Message(SELLER, "b1", "", Action("offer", "p1", 600)))  # the seller answers about p1
        await my_turn(pilot, play)
        await pilot.pause(0.1)
        assert composer.product == "p2"  # the person's choice stays; the status names the offer
        assert "the seller offers p1 $600" in status(app)
        await pilot.press("ctrl+o")
        assert composer.product == "p2" and composer.kind == "bid"
        await pilot.press("ctrl+y")  # accepting takes the offer as it stands
        assert composer.product == "p1" and composer.kind == "accept"
        await pilot.press("ctrl+q", "ctrl+q")


# -- keys named once, marks explained -------------------------------------------------------------------------


async def test_the_results_list_one_quit_key_and_it_quits(tmp_path, monkeypatch):
    monkeypatch.setattr(ResultScreen, "GRACE", 0.0)
    play = session(tmp_path, "buyer")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+o", *"800", "enter")  # SOLO seed 7: accepted at once
        await until(pilot, lambda: isinstance(app.screen, ResultScreen) and "Quit" in screen_lines(app)[-1])
        footer = screen_lines(app)[-1]
        assert footer.count("Quit") == 1 and "q Quit" in footer, footer
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running)


async def test_the_replay_footer_lists_quit_once_and_both_keys_quit():
    events_ = [{"type": "episode_start", "episode": "e", "market": {}}, {"type": "episode_end", "episode": "e", "outcome": "terminated"}]
    for key in ("q", "ctrl+q"):
        app = NegotiateApp.replay([Recorded(events_)], "x.jsonl")
        async with app.run_test(size=SMALL) as pilot:
            await until(pilot, lambda: isinstance(app.screen, ReplayScreen) and "Thoughts" in screen_lines(app)[-1])
            footer = screen_lines(app)[-1]
            assert footer.count("Quit") == 1, footer
            await pilot.press(key)
            await until(pilot, lambda: not app.is_running)


async def test_the_boards_footer_still_lists_ctrl_q(tmp_path):
    play = session(tmp_path, "buyer")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await my_turn(pilot, play)
        assert screen_lines(app)[-1].rstrip().endswith("^q Quit")


async def test_the_buyer_tabs_marks_have_a_legend(tmp_path):
    play = session(tmp_path, "seller", spec=FIVE, seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await turn_settled(pilot, play)
        assert TAB_LEGEND in screen_text(app)
        for mark, meaning in (("●", "unread"), ("…", "owes a reply"), ("✓", "bought"), ("✗", "left")):
            assert f"{mark} {meaning}" in TAB_LEGEND


# -- the replay chart ---------------------------------------------------------------------------------------------


async def test_the_replay_chart_names_the_buyers_it_leaves_out():
    from negotiate.episode import run_episode
    from negotiate.runner import build_episode

    async def record():
        market, seller, buyers = build_episode(MarketSpec(name="wide", buyers=12, products=3, budget=30),
                                               parse_agent("greedy", "seller"), parse_agent("concession", "buyer"), 0, 0)
        return await run_episode(market, seller, buyers, episode_id="wide")

    episode = await record()
    app = NegotiateApp.replay([Recorded(episode.events)], "wide.jsonl")
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ReplayScreen))
        await pilot.press("G")
        await pilot.pause(0.2)
        chart = app.screen.query_one(PriceChart)
        shown = str(chart.render()).splitlines()
        assert len(shown) == 1 + PriceChart.ROWS  # the legend, six buyers and the hint
        assert shown[-1].startswith("+6 more buyers, not shown: ")
        named = [line.split()[0] for line in shown[1:-1]]
        hidden = shown[-1].split(": ")[1].rstrip("…").split()
        assert set(named).isdisjoint(hidden) and len(named) == PriceChart.ROWS - 1
        assert "+6 more buyers" in screen_text(app)  # on screen, not cut off below the chart's border


# -- the exit summary ---------------------------------------------------------------------------------------------


async def test_the_exit_summary_keeps_the_replay_command_on_a_line_of_its_own(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    play = PlaySession("buyer", CROWD, 7, seller=parse_agent("greedy", "seller"), buyers=parse_agent("threshold", "buyer"),
                       pace=0, others_pace=0)  # the default folder, traces/play
    play.human.on_turn = lambda obs: play.human.send(Message("b1", SELLER, "", Action("quit")))
    await play.run()
    lines = exit_summary(play, 7)
    assert all(len(line) <= 80 for line in lines), lines  # nothing for an 80-column terminal to wrap
    command = shlex.split(lines[-1])
    assert command[:2] == ["negotiate", "replay"] and lines[-2].endswith("to replay it:")
    capsys.readouterr()
    assert main([*command[1:], "--text"]) == 0 and "play-buyer-0000" in capsys.readouterr().out


# -- Tab in a burst of keys ------------------------------------------------------------------------------------------


async def test_tab_moves_the_cursor_before_the_keys_typed_after_it(tmp_path):
    # A browser sends what is typed in a burst: the keys after Tab were read before Tab's own binding ran, so
    # "42<Tab>hi" put "42h" in the price and "i" in the talk.
    play = session(tmp_path, "buyer")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SMALL) as pilot:
        await my_turn(pilot, play)
        await until(pilot, lambda: app.focused.id == "price")
        for key, char in (("4", "4"), ("2", "2"), ("tab", "\t"), ("h", "h"), ("i", "i"), ("ctrl+r", None), ("o", "o"), ("k", "k")):
            app.post_message(events.Key(key, char))  # all queued before the first is read
        await pilot.pause(0.2)
        composer = app.screen.query_one(Composer)
        assert composer.query_one("#price").value == "42"
        assert composer.kind == "reject" and composer.query_one("#talk").value == "hiok"  # ^r's cursor too: on the talk
        await pilot.press("ctrl+q", "ctrl+q")



# -- the screenshots script -----------------------------------------------------------------------------------------


async def test_the_screenshots_script_draws_every_screen(tmp_path):
    # It waited for a turn's cursor on the talk field, where a turn no longer puts it, and timed out.
    from negotiate.tui import screenshots

    shots = await screenshots.main(tmp_path)
    assert [path.name for path in shots] == ["play-buyer.svg", "play-seller.svg", "play-seller-results.svg", "replay.svg"]
    assert "the market waits for you" in (tmp_path / "play-buyer.svg").read_text(encoding="utf-8").replace("&#160;", " ")


async def test_a_web_visitor_is_warned_before_an_idle_seat_is_given_up(tmp_path):
    play = session(tmp_path, "buyer")
    app = NegotiateApp.play(play, idle_warning=0.4)  # play --web: IDLE_S less a minute
    async with app.run_test(size=SMALL, notifications=True) as pilot:
        await my_turn(pilot, play)
        await until(pilot, lambda: any("Still there?" in str(toast.render()) for toast in app.screen.query(Toast)))
        app.idle_warning = 3600  # no second warning while a loaded machine checks that the first one went
        await pilot.press("escape")  # any key keeps the seat, and the warning goes
        await until(pilot, lambda: not app.screen.query(Toast))
        assert not app._warned
        await pilot.press("ctrl+q", "ctrl+q")
    quiet = NegotiateApp.play(session(tmp_path, "buyer"))  # in a terminal: no seat to give up, no warning
    assert quiet.idle_warning is None
