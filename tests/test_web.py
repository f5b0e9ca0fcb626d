"""negotiate.tui.web: ``negotiate play --web`` in a real browser (headless Chromium driven by Playwright), its seats,
and the terminal check that lets textual-serve's children through.

The browser tests start the real server (``python -m negotiate play --web``) on a free port and play through the
page as a person would: keys typed on the page, with no click first (the page gives the terminal the keyboard). What the page shows is read from the websocket's frames
(the terminal is drawn on a canvas): the composer's status line says whose turn it is, with the seller's offer and the
person's value, and the seller's turns left, which drop by one at each of the person's turns. They skip without
textual-serve, Playwright (the Python package; its own browsers are not needed) or ``/usr/bin/chromium``, unless
``NEGOTIATE_REQUIRE_WEB=1`` (``.ci/run``) makes a missing one a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import doctest
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from negotiate.cli import main
from negotiate.errors import UserError
from negotiate.report import rows_from_traces
from negotiate.trace import read_episodes
from negotiate.tui import commands
from negotiate.tui import web as web_module
from negotiate.tui.web import Seats, child_command

from needs import missing

CHROMIUM = Path("/usr/bin/chromium")
SOLO = 'name = "solo"\nbuyers = 1\nproducts = 2\nbudget = 8\n'
"""One buyer (the person) and two products: every seller message is to the person, so an episode is a few turns."""
CROWD = 'name = "crowd"\nbuyers = 4\nproducts = 2\nbudget = 6\n'
"""The issue's market: four buyers share a budget of 6, the person one of them."""
TURN = re.compile(r"Your turn: the seller (?:offers (p\d+) \$(\d+) \(your value \$(\d+)\)|wrote to you \(no offer stands\)) · "
                  r"(\d+) turns? left")
OVER = re.compile(r"The episode is over|your surplus")
SCREENSHOT_ENV = "NEGOTIATE_WEB_SCREENSHOT"
"""Where the first browser test also saves its screenshot (``docs/web-play.png`` makes the docs' copy)."""


# -- without a browser ------------------------------------------------------------------------------------


def test_the_terminal_check_lets_textual_web_driver_through(monkeypatch):
    # Under pytest stdin and stdout are not a terminal, as in textual-serve's children.
    monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    with pytest.raises(UserError, match="interactive terminal"):
        commands._need_terminal()
    monkeypatch.setenv("TEXTUAL_DRIVER", "textual.drivers.web_driver:WebDriver")  # what textual-serve sets
    commands._need_terminal()
    monkeypatch.setenv("TEXTUAL_DRIVER", "textual.drivers.headless_driver:HeadlessDriver")  # only the web driver
    with pytest.raises(UserError, match="interactive terminal"):
        commands._need_terminal()


def test_seats_give_each_visitor_its_own_index_and_market_up_to_the_cap():
    seats = Seats(2, first_index=5, seed=100)
    assert seats.take() == (5, 100) and seats.take() == (6, 101)
    assert seats.take() is None and seats.playing == 2  # full: no index or seed is used up
    seats.leave()
    assert seats.take() == (7, 102)  # the index of a visitor who left is not given again
    fresh = Seats(50, first_index=0)
    given = [fresh.take() for _ in range(50)]
    assert [index for index, _ in given] == list(range(50))
    assert len({seed for _, seed in given}) == 50


def test_the_child_command_is_the_servers_settings_quoted():
    args = argparse.Namespace(role="seller", split="a b.toml; rm -rf /", seller=None, buyers="threshold", out=Path("o"))
    command = child_command(args, 4, 9)
    assert command.startswith(f"{sys.executable} -m negotiate play --role seller --split 'a b.toml; rm -rf /' ")
    assert command.endswith("--buyers threshold --out o --seed 9 --index 4")


async def test_the_page_names_its_websocket_by_the_address_the_browser_used_and_says_when_seats_are_full():
    pytest.importorskip("textual_serve", reason="the web extra: pip install -e '.[web]'")
    from aiohttp.test_utils import TestClient, TestServer

    from negotiate.tui.web import PlayServer

    args = argparse.Namespace(role="buyer", split="train", seller=None, buyers="concession", out=Path("o"))
    seats = Seats(1, first_index=0)
    async with TestClient(TestServer(PlayServer(args, seats).application())) as client:
        page = await client.get("/", headers={"Host": "study.example:8443"})
        assert page.status == 200 and 'data-session-websocket-url="ws://study.example:8443/ws"' in await page.text()
        page = await client.get("/", headers={"Host": "study.example", "X-Forwarded-Proto": "https"})
        assert 'data-session-websocket-url="wss://study.example/ws"' in await page.text()  # an https page needs wss
        assert (await client.get("/static/js/textual.js")).status == 200
        assert (await client.get("/static/")).status in (403, 404)  # no listing
        assert (await client.get("/download/x")).status == 404  # no download route
        seats.take()
        full = await client.get("/")
        assert full.status == 503 and "Every seat is taken" in await full.text()


async def test_an_idle_visitor_gives_up_the_seat_and_an_active_one_keeps_it(tmp_path, capsys):
    pytest.importorskip("textual_serve", reason="the web extra: pip install -e '.[web]'")
    from aiohttp.test_utils import TestClient, TestServer

    from negotiate.tui.web import PlayServer

    args = argparse.Namespace(role="buyer", split="train", seller=None, buyers="threshold", out=tmp_path / "o")
    seats = Seats(2, first_index=0, seed=3)
    server = PlayServer(args, seats, idle=3.0)
    async with TestClient(TestServer(server.application())) as client:
        idle = await client.ws_connect("/ws?width=80&height=24")
        active = await client.ws_connect("/ws?width=80&height=24")
        started = time.monotonic()
        while not idle.closed:
            assert time.monotonic() - started < 60, "the idle seat was kept"
            await active.send_json(["stdin", "\x1b[A"])  # a key (up) every half second keeps a seat
            try:
                await idle.receive(timeout=0.5)
            except TimeoutError:
                pass
        assert time.monotonic() - started >= 2.5  # its clock started as it connected, a moment before this one
        while seats.playing > 1:  # the idle one's app quits, then its seat is free again
            assert time.monotonic() - started < 60, "the idle seat was not freed"
            await active.send_json(["stdin", "\x1b[A"])
            await asyncio.sleep(0.5)
        assert not active.closed and seats.playing == 1
        await active.close()
    out = capsys.readouterr().out
    assert "seat 0: no key or click for 3 s: the seat is given up" in out
    assert "seat 0 left (seed 3): no episode saved (it was not finished)" in out
    assert "seat 1: no key" not in out
    assert server.summary(len(server.saved())) == "2 visitors; 0 finished and saved an episode, 2 left before the end (nothing saved)"
    page = page_text(server)
    assert "A game left without a key for 0.05 minutes ends" in page


def page_text(server) -> str:
    """The page's text as the server fills it in."""
    from negotiate.tui.web import PAGE

    return PAGE.format(title="t", websocket="ws://x/ws", font_size=16, idle_minutes=f"{server.idle / 60:g}")


def test_the_readme_names_only_flags_and_keys_that_play_replay_and_train_take(capsys):
    """Each ``negotiate play|replay|train ...`` in the README (code spans and blocks): its flags are in the command's
    --help, and a ``--set key=value`` names one of its settings (it said ``train --seller human``, a flag train lacks)."""
    from negotiate.cli import command_settings

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    used = re.findall(r"(?:`|^)(?:negotiate )?(play|replay|train)((?: --?[\w-]+(?: (?!--)[^\s`#]+)?)+)", readme, re.M)
    used += [("train", f" --set {key}") for key in re.findall(r"`train` \(`--set (\w+)=", readme)]
    assert ("train", " --set seller") in used and len(used) >= 4
    for command, words in used:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        options = capsys.readouterr().out
        for flag in re.findall(r"(?<![\w-])(--[\w-]+)", words):
            assert re.search(rf"(?<![\w-]){flag}\b", options), (command, flag)
        for key in re.findall(r"--set (\w+)", words):
            assert key in {field for cls in command_settings()[command] for field in cls.__dataclass_fields__}, (command, key)


def test_the_web_module_doctests_pass():
    result = doctest.testmod(web_module, report=False)
    assert result.attempted >= 2 and result.failed == 0


def test_web_flags_are_refused_one_line_each(tmp_path, capsys, monkeypatch):
    base = ["play", "--out", str(tmp_path / "p")]
    assert main([*base, "--port", "8001"]) == 2
    assert "--port: 8001: serves the game to browsers: give it with --web" in capsys.readouterr().err
    with monkeypatch.context() as patch:
        patch.setattr(web_module, "web", None)  # as without the extra
        assert main([*base, "--web"]) == 2
        assert "--web: needs the web extra: pip install 'negotiate[web]'" in capsys.readouterr().err
    pytest.importorskip("textual_serve", reason="the web extra: pip install -e '.[web]'")
    assert main([*base, "--web", "--max-players", "0"]) == 2
    assert "--max-players: 0: must be at least 1" in capsys.readouterr().err
    assert main([*base, "--web", "--port", "70000"]) == 2
    assert "--port: 70000" in capsys.readouterr().err
    assert main([*base, "--web", "--index", "3"]) == 2
    assert "--index: 3: is chosen by the server" in capsys.readouterr().err
    assert main([*base, "--web", "--seller", "nobody"]) == 2  # play's own checks, before the server starts
    assert "nobody" in capsys.readouterr().err


# -- in the browser ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    for module, what in (("textual_serve", "textual-serve (pip install -e '.[web]')"),
                         ("playwright.sync_api", "Playwright (pip install playwright; no browser download needed)")):
        try:
            __import__(module)
        except ImportError:
            missing(f"the browser tests need {what}", "NEGOTIATE_REQUIRE_WEB")
    if not CHROMIUM.exists():
        missing(f"the browser tests need Chromium at {CHROMIUM} (apt-get install chromium)", "NEGOTIATE_REQUIRE_WEB")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class Server:
    """``negotiate play --web`` as a child process on a free port: its address, its folder, its log."""

    def __init__(self, tmp_path: Path, *flags: str):
        (tmp_path / "solo.toml").write_text(SOLO)
        (tmp_path / "crowd.toml").write_text(CROWD)
        self.out = tmp_path / "traces" / "web"
        seller = () if "seller" in flags else ("--seller", "greedy")  # the person is the seller with --role seller
        split = () if "--split" in flags else ("--split", "solo.toml")
        self.process = subprocess.Popen(  # in tmp_path, as a researcher would start it in their project
            [sys.executable, "-m", "negotiate", "play", "--web", "--port", "0", *split, *seller,
             "--buyers", "threshold", "--out", "traces/web", *flags],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            self.log = [self._line(deadline=time.monotonic() + 60)]
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", self.log[0])
            assert found, self.log
        except BaseException:
            self.process.kill()
            self.process.wait()
            self.process.stdout.close()
            raise
        self.url = f"http://127.0.0.1:{found[1]}/"

    def _line(self, deadline: float) -> str:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.5)
            if ready:
                return self.process.stdout.readline()
            assert self.process.poll() is None, "the server exited"
        raise AssertionError("the server said nothing")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout=60)
        finally:
            self.process.kill()
        self.log += self.process.stdout.readlines()
        self.process.stdout.close()
        return code


@pytest.fixture
def server(tmp_path, request):
    started = Server(tmp_path, *getattr(request, "param", ()))
    yield started
    if started.process.poll() is None:
        started.stop()


class Visitor:
    """One browser page playing the buyer: a bid of a third of its value at the first turn, then it accepts an offer
    it can afford and rejects the rest."""

    def __init__(self, browser, url: str):
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.page = self.context.new_page()
        self.frames: list[bytes] = []
        self.page.on("websocket", lambda ws: ws.on("framereceived", self._received))
        self.page.goto(url, wait_until="domcontentloaded")
        self.turns_left: int | None = None
        self.done = False
        self.moves: list[tuple[str, int | None]] = []
        """What this visitor did at each turn: ("bid", price), ("accept", price) or ("reject", None)."""

    def _received(self, payload) -> None:
        self.frames.append(payload if isinstance(payload, bytes) else payload.encode())

    def screen(self) -> str:
        """Everything the app has drawn on this page so far, as text."""
        return b"".join(self.frames).decode("utf-8", "replace")

    def wait_for(self, text: bytes, since: int, timeout: float = 30) -> None:
        """Until ``text`` is drawn in a frame from the ``since``-th on."""
        deadline = time.monotonic() + timeout
        while not any(text in frame for frame in self.frames[since:]):
            assert time.monotonic() < deadline, f"{text!r} was not drawn"
            self.page.wait_for_timeout(20)

    def confirm_to_the_end(self, question: bytes, since: int, server: Server) -> list[dict]:
        """Say yes to ``question`` (ending the market, leaving it), wait for the results, leave the page, stop the
        server: the one episode's events."""
        self.wait_for(question, since=since)
        self.page.keyboard.press("y")
        self.wait_for(b"Saved to", since=since, timeout=60)
        self.context.close()
        assert server.stop() == 128 + signal.SIGINT
        [events] = list(read_episodes(server.out / "play.jsonl"))
        return events

    def step(self) -> None:
        """Act once if a new turn is on screen; note the end."""
        text = self.screen()
        if OVER.search(text):
            self.done = True
            return
        turns = list(TURN.finditer(text))
        if not turns or (self.turns_left is not None and int(turns[-1][4]) >= self.turns_left):
            return
        turn = turns[-1]
        self.turns_left = int(turn[4])
        self.page.wait_for_timeout(300)  # the turn's cursor lands on the composer one refresh after the status shows
        keyboard = self.page.keyboard  # no click first: the page gave the terminal the keyboard
        if not self.moves and turn[3]:
            price = int(turn[3]) // 3
            drawn = len(self.frames)
            keyboard.type(str(price))  # the turn opens on a bid's price
            self.wait_for(str(price).encode(), since=drawn)  # in the price field, before it is sent
            keyboard.press("Enter")
            self.moves.append(("bid", price))
        elif turn[2] and int(turn[2]) <= int(turn[3]):
            keyboard.press("Control+y")  # accept exactly the standing offer: the action, then the cursor to the talk
            keyboard.type("ok")  # at once: the cursor is on the talk before the next key is read
            keyboard.press("Enter")
            self.moves.append(("accept", int(turn[2])))
        else:
            keyboard.press("Control+r")
            keyboard.press("Enter")
            self.moves.append(("reject", None))


def play(visitors: list[Visitor], screenshot: Path | None = None, timeout: float = 120, max_moves: int = 10) -> None:
    """Play every visitor's episode to its end (then a screenshot of the first one's results)."""
    deadline = time.monotonic() + timeout
    while not all(v.done for v in visitors):
        assert time.monotonic() < deadline, [v.screen()[-2000:] for v in visitors]
        for visitor in visitors:
            if not visitor.done:
                visitor.step()
                assert len(visitor.moves) < max_moves
        visitors[0].page.wait_for_timeout(50)  # lets Playwright deliver the pages' frames
    if screenshot is not None:
        first = visitors[0]
        while "Saved to" not in first.screen():  # the results, over the whole conversation
            assert time.monotonic() < deadline, first.screen()[-2000:]
            first.page.wait_for_timeout(50)
        first.page.wait_for_timeout(500)
        first.page.screenshot(path=str(screenshot))


def human_messages(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "message" and e["sender"] == "b1"]


@pytest.mark.parametrize("server", [("--seed", "7")], indirect=True)
def test_a_visitor_plays_a_whole_episode_as_the_buyer_in_the_browser(browser, server, tmp_path):
    visitor = Visitor(browser, server.url)
    shot = tmp_path / "web-play.png"
    play([visitor], screenshot=shot)
    assert shot.stat().st_size > 10_000
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(shot, os.environ[SCREENSHOT_ENV])
    # the results' keys wait ResultScreen.GRACE after they appear (the person may still be typing): past it, q (which
    # the footer lists as Quit) quits, and the page says the game ended
    from negotiate.tui.results import ResultScreen

    visitor.page.wait_for_timeout(int(ResultScreen.GRACE * 1000) + 300)
    visitor.page.keyboard.press("q")
    visitor.page.wait_for_selector("body.-closed .ended", state="visible", timeout=30_000)
    visitor.context.close()
    assert server.stop() == 128 + signal.SIGINT
    assert any(line.endswith("stopped; 1 visitor; 1 finished and saved an episode\n") for line in server.log), server.log
    assert any("seat 0 left (seed 7): episode saved" in line for line in server.log), server.log
    # The trace: one complete episode under the first index, on the server's seed, with the person's moves as typed.
    [events] = list(read_episodes(server.out / "play.jsonl"))
    start, end = events[0], events[-1]
    assert start["type"] == "episode_start" and end["type"] == "episode_end" and isinstance(start["schema"], int)
    assert start["episode"] == "play-buyer-0000" and start["index"] == 0 and start["seed"] == 7
    assert start["seller"] == "greedy" and start["buyers"] == "human+threshold" and start["play"] == "buyer"
    assert start["agents"]["buyers"]["b1"]["kind"] == "human"
    sent = human_messages(events)
    assert [(m["action"]["kind"], m["action"].get("price")) for m in sent] == visitor.moves
    assert all(m["valid"] for m in sent)
    deals = [e for e in events if e["type"] == "deal"]
    if visitor.moves[-1][0] == "accept":
        assert [(d["buyer"], d["price"]) for d in deals] == [("b1", visitor.moves[-1][1])]
        assert sent[-1]["talk"] == "ok"
    # Readable by report and replay like any trace.
    [row] = rows_from_traces([server.out])
    assert row["episode"] == "play-buyer-0000" and row["outcome"] == end["outcome"]
    assert main(["replay", str(server.out / "play.jsonl"), "--text"]) == 0
    assert any("seat 0: episode play-buyer-0000, seed 7" in line for line in server.log)


READ_S = 20
"""How long the newcomer reads before the first move: the issue's "20 s in, turns left: 1 of 6" (test_tui_fair.py waits
the equivalent of 75 s at the play's pace; 30 s here would take this test past a minute)."""


@pytest.mark.parametrize("server", [("--split", "crowd.toml", "--seed", "4")], indirect=True)
def test_a_newcomer_types_with_no_click_and_the_market_waits_while_they_read(browser, server):
    visitor = Visitor(browser, server.url)
    # Without a click or a key, the app has the keyboard: its footer lists the keys (it showed none until a click).
    visitor.wait_for(b"Leave", since=0, timeout=60)
    visitor.wait_for(b"Your turn", since=0, timeout=60)
    first = list(TURN.finditer(visitor.screen()))[-1]
    drawn = len(visitor.frames)
    visitor.page.wait_for_timeout(READ_S * 1000)  # the newcomer reads the first screen
    # Nothing moved meanwhile: every redraw shows the turns the person started with, and no unit sold.
    later = b"".join(visitor.frames[drawn:]).decode("utf-8", "replace")
    assert set(re.findall(r"(\d+) turns? left", later)) <= {first[4]} and "sold" not in later, later[-2000:]
    # The first move, typed as a burst with no click: a bid's price, Tab, the talk, Enter.
    price = int(first[3]) // 3 if first[3] else 150
    drawn = len(visitor.frames)
    visitor.page.keyboard.type(f"{price}\thello\n")
    visitor.wait_for(b"BID", since=drawn)
    # Then, at their next turn, the person leaves (asked first): the market plays out without them, at the agents' speed.
    deadline = time.monotonic() + 60
    while not any(int(turn[4]) < int(first[4]) for turn in TURN.finditer(b"".join(visitor.frames[drawn:]).decode("utf-8", "replace"))):
        assert time.monotonic() < deadline, "no second turn"
        visitor.page.wait_for_timeout(50)
    visitor.page.keyboard.press("Control+l")
    visitor.page.keyboard.press("Enter")
    events = visitor.confirm_to_the_end(b"Leave the market now?", since=drawn, server=server)
    messages = [e for e in events if e["type"] == "message"]
    mine = [k for k, e in enumerate(messages) if e["sender"] == "b1"]
    asked = max(k for k, e in enumerate(messages[: mine[0]]) if e["to"] == "b1")
    assert mine[0] == asked + 1  # not one message between the seller's offer to the person and the person's answer
    assert messages[mine[0]]["ts"] - messages[asked]["ts"] >= READ_S
    assert sum(1 for e in messages[: mine[0]] if e["sender"] == "seller") == 6 - int(first[4])  # every turn they had
    bid = messages[mine[0]]
    assert (bid["action"]["kind"], bid["action"]["price"], bid["talk"]) == ("bid", price, "hello")  # each key where typed
    assert [messages[k]["action"]["kind"] for k in mine] == ["bid", "quit"]


@pytest.mark.parametrize("server", [("--seed", "7", "--max-players", "2")], indirect=True)
def test_two_visitors_at_once_play_two_episodes_and_a_third_is_told_every_seat_is_taken(browser, server):
    first, second = Visitor(browser, server.url), Visitor(browser, server.url)
    seated = time.monotonic() + 60
    while not (TURN.search(first.screen()) and TURN.search(second.screen())):
        assert time.monotonic() < seated, "the visitors were not both seated"
        first.page.wait_for_timeout(50)
    # Both are seated (each has had a turn): a third visitor gets the "full" page, and no process.
    third = browser.new_page()
    response = third.goto(server.url, wait_until="domcontentloaded")
    assert response.status == 503 and "Every seat is taken" in third.content()
    third.close()
    play([first, second])
    for visitor in (first, second):
        visitor.context.close()
    assert server.stop() == 128 + signal.SIGINT
    episodes = list(read_episodes(server.out / "play.jsonl"))
    starts = sorted((e[0]["episode"], e[0]["index"], e[0]["seed"]) for e in episodes)
    assert starts == [("play-buyer-0000", 0, 7), ("play-buyer-0001", 1, 8)]  # whole episodes, none over the other
    by_seed = {e[0]["seed"]: human_messages(e) for e in episodes}
    for visitor in (first, second):  # each page's header names its market's seed; that episode holds its moves
        seed = int(re.search(r"seed (\d+)", visitor.screen())[1])
        assert [(m["action"]["kind"], m["action"].get("price")) for m in by_seed[seed]] == visitor.moves
    assert len(rows_from_traces([server.out])) == 2


@pytest.mark.parametrize("server", [("--role", "seller", "--seed", "3")], indirect=True)
def test_a_visitor_plays_the_seller_and_train_reads_the_episode(browser, server):
    visitor = Visitor(browser, server.url)
    visitor.wait_for("Your turn · 8 turns left · Write to b1".encode(), since=0, timeout=60)
    visitor.page.wait_for_timeout(300)
    drawn = len(visitor.frames)
    visitor.page.keyboard.press("Control+t")  # end the market: it asks first
    events = visitor.confirm_to_the_end(b"End the market", since=drawn, server=server)
    start = events[0]
    assert start["episode"] == "play-seller-0000" and start["seller"] == "human" and start["seed"] == 3
    assert [(e["sender"], e["action"]["kind"]) for e in events if e["type"] == "message"] == [("seller", "end")]
    dataset = pytest.importorskip("negotiate.training.dataset", reason="the train extra")
    [episode] = dataset.load_episodes([server.out], where=dataset.DataFilter(seller="human"))  # what train --seller human reads
    assert episode.group == dataset.group_key(start)
