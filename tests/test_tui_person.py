"""negotiate.tui as a person plays it (issue 12): small terminals, SIGTERM, the price field, errors that stay,
the buyer's view of the seller's budget, leaving, the seller's hints and ^t, focus, the replay footer, esc()."""

from __future__ import annotations

import html
import os
import pty
import re
import select
import signal
import struct
import sys
import time

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_tui import my_turn, session, until
from textual.content import Content
from textual.widgets import DataTable, Label, Static
from textual.widgets._toast import Toast

from negotiate.agents.human import HumanAgent
from negotiate.cli import main
from negotiate.market import SPLITS, MarketSpec
from negotiate.protocol import SELLER, Action, Message
from negotiate.training.dataset import load_episodes
from negotiate.tui.app import SIGTERM_EXIT, NegotiateApp
from negotiate.tui.confirm import ConfirmEnd, ConfirmLeave
from negotiate.tui.results import ResultScreen
from negotiate.tui.text import clean, esc
from negotiate.tui.transcript import Recorded
from negotiate.tui.widgets import Composer

SIZE = (100, 32)
SOLO = MarketSpec(name="solo", buyers=1, products=2, budget=8)
"""One buyer (the person), two products: the seller's every message is to the person."""
DUO = MarketSpec(name="duo", buyers=2, products=2, budget=10)
"""Seed 5: costs p1 124, p2 273; b1 values (825, 827), b2 (564, 357)."""


def screen_lines(app) -> list[str]:
    """The terminal's lines as plain text, from the SVG screenshot (each character placed by its x)."""
    rows: dict[int, dict[int, str]] = {}
    svg = app.export_screenshot()
    for x, line, text in re.findall(r'<text[^>]*x="([\d.]+)"[^>]*clip-path="url\(#[^)]*-line-(\d+)\)">([^<]*)</text>', svg):
        row = rows.setdefault(int(line), {})
        for k, char in enumerate(html.unescape(text).replace("\xa0", " ")):
            row[round(float(x) / 12.2) + k] = char
    return ["".join(row.get(c, " ") for c in range(max(row, default=-1) + 1)) for _, row in sorted(rows.items())]


def screen_text(app) -> str:
    return "\n".join(screen_lines(app))


def status(app) -> str:
    return str(app.screen.query_one(Composer).query_one("#status", Label).content)


async def turn_on(pilot, agent: HumanAgent) -> None:
    """Wait until the bus asks ``agent`` (a buyer the test plays) for its reply."""
    await until(pilot, lambda: agent.waiting)


# -- "terminal too small" -----------------------------------------------------------------------------------


async def test_keys_do_not_reach_the_hidden_seller_screen_while_the_terminal_is_too_small(tmp_path):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=(60, 20)) as pilot:
        await until(pilot, lambda: play.human.waiting and app.focused is not None)
        assert "terminal too small" in screen_text(app)
        await pilot.press("ctrl+o", "5", "5", "5", "enter")  # an offer of $555, typed blind
        await pilot.press("ctrl+t", "y")  # and ending the market
        await pilot.resize_terminal(*SIZE)
        await until(pilot, lambda: app.screen.query_one("#top").display)
        composer = app.screen.query_one(Composer)
        assert composer.query_one("#price").value == "" and composer.kind == "offer"
        assert not isinstance(app.screen, ConfirmEnd)
        assert play.human.waiting and play.human.decisions == 0 and play.state.turns_used == 0 and not play.state.done
        await pilot.press("ctrl+o", "5", "5", "5")  # the same keys reach the board once it shows
        assert composer.query_one("#price").value == "555"


async def test_keys_do_not_reach_the_hidden_buyer_screen_while_the_terminal_is_too_small(tmp_path):
    play = session(tmp_path, "buyer")
    app = NegotiateApp.play(play)
    async with app.run_test(size=(60, 20)) as pilot:
        await until(pilot, lambda: play.human.waiting and play.view().offer is not None)
        await pilot.press("ctrl+y", "enter")  # accepting the offer, blind
        await pilot.resize_terminal(*SIZE)
        await until(pilot, lambda: app.screen.query_one("#board").display)
        assert play.human.waiting and play.human.decisions == 0 and app.screen.query_one(Composer).kind == "bid"
        await pilot.press("ctrl+q", "ctrl+q")  # ctrl+q still quits, small or not
    assert play.result is None


# -- SIGTERM ----------------------------------------------------------------------------------------------


def _read_until(fd: int, done, timeout: float = 60.0) -> bytes:
    """Read the terminal's output until ``done(output)`` or the end of output."""
    out = b""
    deadline = time.monotonic() + timeout
    while not done(out):
        assert time.monotonic() < deadline, out[-400:]
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    return out


def test_sigterm_leaves_the_alternate_screen_and_mouse_tracking(tmp_path):
    import fcntl
    import subprocess
    import termios

    main_fd, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    child = subprocess.Popen([sys.executable, "-m", "negotiate.cli", "play", "--seed", "3", "--out", str(tmp_path)],
                             stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True,
                             env={**os.environ, "TERM": "xterm-256color"})
    os.close(terminal)
    try:
        shown = _read_until(main_fd, lambda out: b"Your values" in out)
        assert b"\x1b[?1049h" in shown and b"\x1b[?1000h" in shown  # the app took the alternate screen and the mouse
        child.send_signal(signal.SIGTERM)
        after = _read_until(main_fd, lambda out: False)
        code = child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        os.close(main_fd)
    assert code == SIGTERM_EXIT == 143
    assert b"\x1b[?1049l" in after  # back to the main screen
    assert b"\x1b[?1000l" in after and b"\x1b[?1003l" in after  # mouse tracking off
    assert b"the episode was not finished, so it was not saved" in after


# -- the price field ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("typed", "problem"), [
    ("-5", "price -5 is negative"),
    ("12.5", "price '12.5' is not a whole number of dollars"),
    ("999999999999", "$999999999999 is above every buyer's value (the range is $100-$1000)"),
    ("99999999999999999999", "price 999999... (20 digits) is far too large"),
])
async def test_the_seller_price_field_keeps_what_was_typed_and_names_the_problem(tmp_path, typed, problem):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+o", *typed, "enter")
        price = app.screen.query_one("#price")
        assert price.value == typed  # as typed: nothing dropped, nothing rewritten
        assert problem in status(app) and price.has_class("wrong")
        assert play.human.waiting and play.human.decisions == 0 and play.state.turns_used == 0  # not sent


async def test_the_buyer_price_field_refuses_a_bid_above_the_value(tmp_path):
    play = session(tmp_path, "buyer")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+o")
        product = app.screen.query_one("#product").value
        value = play.view().values[int(product[1:]) - 1]
        await pilot.press(*"999999999999", "enter")
        assert status(app) == f"$999999999999 is above your value of {product} (${value}); the market refuses that"
        assert play.human.decisions == 0


async def test_an_action_key_keeps_the_typed_price(tmp_path):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+o", *"999", "ctrl+r", "ctrl+o")  # typed, then a look at reject, then back
        composer = app.screen.query_one(Composer)
        assert composer.kind == "offer" and composer.query_one("#price").value == "999"


async def test_after_a_send_the_composer_is_back_on_its_first_action(tmp_path):
    # A reject sent to b1 must not stay chosen: the next Enter, to another buyer, would reject that one too.
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+r", *"no thanks", "enter")
        await until(pilot, lambda: play.human.decisions == 1)
        composer = app.screen.query_one(Composer)
        assert composer.kind == "offer" and composer.query_one("#talk").value == ""
        assert not composer.query_one("#price").disabled  # the fields follow the action
    sent = [e for e in play.state.events if e["type"] == "message" and e["sender"] == SELLER]
    assert [e["action"]["kind"] for e in sent][:1] == ["reject"]


async def test_the_buyer_is_not_offered_an_accept_above_its_value(tmp_path):
    # SOLO seed 7: the seller's first offer is p2 at $911, above b1's value of p2 ($907).
    play = session(tmp_path, "buyer", spec=SOLO, seed=7, buyers="threshold")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        obs = play.view()
        assert obs.offer == ("p2", 911) and obs.values[1] == 907
        assert not app.screen.check_action("fill", ("accept",))
        app.screen.action_fill("accept")
        assert status(app) == "the offer, p2 at $911, is above your value of it ($907); bid lower instead"
        assert app.screen.query_one(Composer).kind != "accept" and play.human.decisions == 0


async def test_typing_on_as_the_results_open_does_not_quit(tmp_path, monkeypatch):
    # SOLO seed 7, threshold buyers: a bid of $800 is accepted at once and the results open while the person types.
    # The guard is widened to 60 s so that a slow machine cannot let it lapse before the keys arrive (CI did, at
    # 0.8 s); its end is then brought forward by moving the screen's opening time back.
    monkeypatch.setattr(ResultScreen, "GRACE", 60.0)
    play = session(tmp_path, "buyer", spec=SOLO, seed=7, buyers="threshold")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+o", *"800", "enter")
        await until(pilot, lambda: isinstance(app.screen, ResultScreen))
        await pilot.press(*"quick")  # q within the guard: held back like Esc and v
        assert app.is_running and isinstance(app.screen, ResultScreen)
        app.screen._opened -= ResultScreen.GRACE  # the guard is over
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running)


def test_every_end_reason_has_words_in_the_results():
    from negotiate.trace import EndReason
    from negotiate.tui.results import END_WORDS

    assert set(END_WORDS) == {reason.value for reason in EndReason}


async def test_the_replay_opened_from_the_results_says_q_goes_back_and_does(tmp_path):
    from negotiate.tui.replay import ReplayScreen

    play = session(tmp_path, "buyer", spec=SOLO, seed=7, buyers="threshold")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+o", *"800", "enter")  # accepted at once: the results open
        await until(pilot, lambda: isinstance(app.screen, ResultScreen))
        assert "The market ended: no buyer left, after 2 of 8 turns" in screen_text(app)  # the one buyer bought
        await pilot.pause(ResultScreen.GRACE + 0.1)
        await pilot.press("v")
        await until(pilot, lambda: isinstance(app.screen, ReplayScreen) and "Thoughts" in screen_lines(app)[-1])
        footer = screen_lines(app)[-1]
        assert "q Back" in footer and not re.search(r"(?<!\^)q Quit", footer), footer  # ^q still quits the app
        await pilot.press("q")
        await until(pilot, lambda: not isinstance(app.screen, ReplayScreen))
        assert app.is_running  # back on the board, not quit


# -- errors stay; toasts keep off the status line ------------------------------------------------------------


async def test_a_check_error_stays_until_the_input_changes(tmp_path):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+o", "0", "enter")
        error = status(app)
        assert "below the cost" in error
        for _ in range(3):  # the market moves on (another reply, an agent thinking): the screen redraws
            play.changed()
            await until(pilot, lambda: not app.screen._sync_pending)
            assert status(app) == error
        await pilot.press("backspace")  # the person edits the price
        await until(pilot, lambda: status(app) != error)
        assert status(app).startswith("Your turn")
        assert not app.screen.query_one("#price").has_class("wrong")


async def test_toasts_do_not_cover_the_status_line(tmp_path):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await my_turn(pilot, play)
        app.notify("deal: b2 buys p1 at $500 " * 3, timeout=60)
        await until(pilot, lambda: any(t.region.height for t in app.screen.query(Toast)))
        line = app.screen.query_one(Composer).query_one("#status").region
        assert line.height == 1
        assert all(not toast.region.overlaps(line) for toast in app.screen.query(Toast))


# -- the buyer's view -----------------------------------------------------------------------------------------


async def test_the_buyer_sees_the_sellers_turns_left(tmp_path):
    play = session(tmp_path, "buyer")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        assert play.state.turns_used == 1  # the seller's first offer
        assert "Seller's turns left: 7 of 8" in screen_text(app)
        assert status(app).endswith(" · 7 turns left")


async def test_after_leaving_the_status_says_so(tmp_path):
    play = session(tmp_path, "buyer", spec=DUO, seed=5)
    other = play.buyers["b2"] = HumanAgent("b2")  # the test answers for b2, so the market outlives b1
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+l", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmLeave))  # nothing undoes it: the app asks first
        assert "Leave the market now?" in screen_text(app)
        assert app.screen.query_one("#confirm-box").border_title == "Leave the market?"  # it said "End the market?"
        await pilot.press("y")
        await until(pilot, lambda: "left" in status(app))
        assert status(app) == "You left the market; it plays out without you, then the results show."
        assert not app.screen.query_one("#spinner").display
        assert "You left the market." in screen_text(app)
        await turn_on(pilot, other)
        other.send(Message("b2", SELLER, "", Action("quit")))
        await until(pilot, lambda: play.result is not None)
    assert play.result.episode.outcome == "terminated"


# -- the seller's hints, dead offers and bids, ^t ------------------------------------------------------------


async def turn_settled(pilot, play) -> None:
    """Wait until the person is asked for a message and the turn has placed its cursor (keys pressed earlier would
    go where the cursor was, then the cursor would move)."""
    await until(pilot, lambda: play.human.waiting and not pilot.app.screen.focus_pending)


async def _offer(pilot, app, play, buyer: str, product: str, price: int) -> None:
    """The person, as the seller, offers ``product`` at ``price`` to ``buyer``."""
    await turn_settled(pilot, play)
    turns = play.state.turns_used
    await pilot.press("escape", buyer[1:], "ctrl+o")
    app.screen.query_one("#product").value = product
    await pilot.press(*str(price), "enter")
    await until(pilot, lambda: play.state.turns_used == turns + 1)


async def test_the_seller_sees_only_bids_it_can_accept_as_acceptable(tmp_path):
    play = session(tmp_path, "seller", spec=DUO, seed=5)
    b1 = play.buyers["b1"] = HumanAgent("b1")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#buyers", DataTable)

        def b1_row() -> list[str]:
            return [cell.plain.strip() for cell in table.get_row_at(0)]

        # A bid below cost: shown, but ^y is not offered for it.
        await _offer(pilot, app, play, "b1", "p1", 800)
        await turn_on(pilot, b1)
        b1.send(Message("b1", SELLER, "", Action("bid", "p1", 123)))
        await turn_settled(pilot, play)
        await pilot.press("escape", "1")
        await until(pilot, lambda: "b1 bids" in status(app))
        assert "b1 bids p1 $123, below its cost $124." in status(app) and "^y" not in status(app)
        assert not app.screen.check_action("fill", ("accept",))
        await pilot.press("ctrl+y")
        assert "no bid you may accept" not in status(app) and app.screen.query_one(Composer).kind == "offer"
        # A bid at cost on a product in stock: ^y accepts it.
        await _offer(pilot, app, play, "b1", "p2", 800)
        await turn_on(pilot, b1)
        b1.send(Message("b1", SELLER, "", Action("bid", "p2", 273)))
        await turn_settled(pilot, play)
        await pilot.press("escape", "1")
        await until(pilot, lambda: "(^y accepts)" in status(app))
        assert b1_row()[3] == "p2 $273"
        # b2 buys p2: b1's bid on it is dead, and no longer shown or offered.
        await _offer(pilot, app, play, "b2", "p2", 357)
        await until(pilot, lambda: any(e["type"] == "deal" for e in play.state.events) and play.human.waiting)
        await turn_settled(pilot, play)
        await pilot.press("escape", "1")
        await until(pilot, lambda: b1_row()[3] == "-")
        assert status(app).endswith("Write to b1.") and not app.screen.check_action("fill", ("accept",))


async def test_the_sellers_footer_keeps_quit_at_80_columns_with_every_key_on_offer(tmp_path):
    play = session(tmp_path, "seller", spec=DUO, seed=5)
    b1 = play.buyers["b1"] = HumanAgent("b1")
    app = NegotiateApp.play(play)
    async with app.run_test(size=(80, 24)) as pilot:
        await _offer(pilot, app, play, "b1", "p2", 800)
        await turn_on(pilot, b1)
        b1.send(Message("b1", SELLER, "", Action("bid", "p2", 300)))  # above p2's cost: ^y is on offer too
        await turn_settled(pilot, play)
        await pilot.press("escape", "1")
        await until(pilot, lambda: "(^y accepts)" in status(app))
        await pilot.pause(0.1)
        footer = screen_lines(app)[-1]
        assert "^y Accept" in footer and "^t End market" in footer and footer.rstrip().endswith("^q Quit"), footer


async def test_ending_the_market_asks_first(tmp_path):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+t")
        await until(pilot, lambda: isinstance(app.screen, ConfirmEnd))
        question = str(app.screen.query_one("#confirm", Static).content)
        assert question.startswith("End the market now? It cannot be undone.")
        assert "2 units unsold, 4 buyers still in the market, 12 turns left." in question
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmEnd))
        assert play.human.waiting and play.state.turns_used == 0 and not play.state.done
        assert app.screen.query_one(Composer).kind == "offer"  # back as it was: Enter does not end the market
        await pilot.press("ctrl+t")
        await until(pilot, lambda: isinstance(app.screen, ConfirmEnd))
        await pilot.press("y")
        await until(pilot, lambda: play.result is not None)
    assert (play.state.outcome, play.state.reason, play.state.turns_used) == ("terminated", "seller_end", 1)


async def test_the_end_dialog_closes_when_the_market_ends_while_it_is_open(tmp_path):
    play = session(tmp_path, "seller", spec=MarketSpec(name="one", buyers=2, products=1, budget=6), seed=1)
    b1 = play.buyers["b1"] = HumanAgent("b1")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        price = play.market.products[0].cost
        await _offer(pilot, app, play, "b1", "p1", price)
        await until(pilot, lambda: play.human.waiting)  # b2 is free: the seller's turn
        await pilot.press("ctrl+t")
        await until(pilot, lambda: isinstance(app.screen, ConfirmEnd))
        await turn_on(pilot, b1)
        b1.send(Message("b1", SELLER, "", Action("accept", "p1", price)))  # the last unit goes
        await until(pilot, lambda: isinstance(app.screen, ResultScreen))
        assert not any(isinstance(screen, ConfirmEnd) for screen in app.screen_stack)
    assert (play.result.episode.outcome, play.result.episode.reason) == ("terminated", "sold_out")


async def test_a_table_with_rows_out_of_sight_takes_the_focus_and_scrolls(tmp_path):
    play = session(tmp_path, "seller", spec=MarketSpec(name="big", buyers=10, products=10, budget=40), seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=(80, 24)) as pilot:
        await my_turn(pilot, play)
        catalog = app.screen.query_one("#catalog", DataTable)
        await until(pilot, lambda: catalog.can_focus)  # 10 products do not fit at 80x24
        catalog.focus()
        await pilot.press("down", "down")
        assert catalog.scroll_y == 2
    small = session(tmp_path / "small", "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(small)
    async with app.run_test(size=SIZE) as pilot:  # every row in sight: Tab passes the tables by
        await my_turn(pilot, small)
        await pilot.pause(0.2)
        assert not any(table.can_focus for table in app.screen.query(DataTable))


# -- focus, the replay footer ------------------------------------------------------------------------------------


async def test_the_focused_field_stands_out(tmp_path):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        talk, price = app.screen.query_one("#talk"), app.screen.query_one("#price")
        await pilot.press("ctrl+o")
        await until(pilot, lambda: app.focused is price and price.rich_style.bold)
        focused, other = price.background_colors[1], talk.background_colors[1]
        assert abs(focused.brightness - other.brightness) >= 0.15, (focused, other)
        assert not talk.rich_style.bold


@pytest.mark.parametrize("width", [80, 100])
async def test_replay_footer_keeps_quit_below_120_columns(width):
    from negotiate.tui.replay import ReplayScreen

    events = [{"type": "episode_start", "episode": "e", "market": {}}, {"type": "episode_end", "episode": "e", "outcome": "terminated"}]
    app = NegotiateApp.replay([Recorded(events)], "x.jsonl")
    async with app.run_test(size=(width, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ReplayScreen) and "Thoughts" in screen_lines(app)[-1])
        footer = screen_lines(app)[-1]
        for shown in ("q Quit", "← → Step", "g G Start/End", "space Play", "p n Episode", "t Thoughts"):
            assert shown in footer, footer
        await pilot.press("q")
        await until(pilot, lambda: app.return_code is not None)


# -- esc() -------------------------------------------------------------------------------------------------------


@given(st.text(alphabet=st.sampled_from("[]\\/@=$#ab .:'\"()"), max_size=40) | st.text(max_size=40))
def test_esc_round_trips_through_textual_markup(text):
    content = Content.from_markup(esc(text))
    assert content.plain == clean(text) and not content.spans


async def test_escaped_markup_is_shown_literally_and_does_nothing_when_clicked():
    hostile = "[@click=app.quit]quit[/] [b]bold[/b] [link='http://x']link[/link] [ @click=app.quit]q[/]"
    events = [{"type": "episode_start", "episode": "e", "market": {}}, {"type": "episode_end", "episode": "e", "outcome": "terminated"}]
    app = NegotiateApp.replay([Recorded(events)], "x.jsonl")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.screen.query("#score"))
        label = Static(esc(hostile), id="hostile")
        await app.screen.mount(label)
        await until(pilot, lambda: label.region.height > 0)
        assert label.visual.plain == hostile and not label.visual.spans
        assert hostile in screen_text(app)
        await pilot.click("#hostile", offset=(1, 0))  # on "@click=app.quit"
        await pilot.click("#hostile", offset=(len(hostile) - 4, 0))
        assert app.is_running
        app.notify(esc(hostile), timeout=60)
        await until(pilot, lambda: any(t.region.height for t in app.screen.query(Toast)))
        assert hostile in " ".join(line.strip(" │▌") for line in screen_lines(app))


# -- play against a model: checked before the screen opens; a failed episode -----------------------------------


@pytest.mark.parametrize(("role", "flag"), [("buyer", "--seller"), ("seller", "--buyers")])
def test_play_checks_the_model_server_before_opening(tmp_path, capsys, role, flag):
    out = tmp_path / "p"
    url = "openai:x@http://127.0.0.1:9/v1"
    assert main(["play", "--role", role, flag, url, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{flag}: '{url}'" in lines[0] and "cannot reach the server" in lines[0]
    assert not out.exists()


async def test_a_failed_episode_is_kept_marked_failed_and_training_skips_it(tmp_path):
    class Broken:
        async def act(self, obs):
            raise ConnectionError("cannot reach the server")

        def describe(self) -> dict:
            return {"kind": "test", "name": "broken"}

    play = session(tmp_path, "buyer")
    play.seller.agent = Broken()
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ResultScreen))
        text = str(app.screen.query_one("#result", Static).content)
        assert "The episode failed: ConnectionError: cannot reach the server" in text
        assert "training skips it" in text
    assert play.result.episode.outcome == "failed"
    trace = tmp_path / "play.jsonl"
    ends = [e for e in map(orjson.loads, trace.read_bytes().splitlines()) if e["type"] == "episode_end"]
    assert [e["outcome"] for e in ends] == ["failed"]
    assert load_episodes([trace]) == []
