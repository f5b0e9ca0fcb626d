"""negotiate.tui: Pilot-driven play as a buyer and as the seller, replay navigation, literal model text, small terminals, --text."""

from __future__ import annotations

import argparse
import html
import io
import time

import orjson
import pytest
from rich.console import Console
from textual.widgets import OptionList

from negotiate.agents.registry import parse_agent
from negotiate.cli import main
from negotiate.errors import UserError
from negotiate.market import SPLITS, MarketSpec
from negotiate.metrics import opt
from negotiate.trace import TraceWriter, read_episodes
from negotiate.tui import commands
from negotiate.tui.app import NegotiateApp
from negotiate.tui.results import ResultScreen
from negotiate.tui.replay import ReplayScreen
from negotiate.tui.session import PlaySession
from negotiate.tui.transcript import Recorded, load_trace, plain_transcript
from negotiate.tui.widgets import Composer

SIZE = (100, 32)
INJECTED = "[bold red]x[/] \x1b[31m"
"""A talk that must show literally: markup stays text, the escape sequence loses its ESC."""
SHOWN = "[bold red]x[/] [31m"

SOLO = MarketSpec(name="solo", buyers=1, products=2, budget=8)
"""One buyer (the person) and two products: the seller's every message is to the person."""


async def my_turn(pilot, play) -> None:
    """Wait until the person is asked for a message and the cursor is in the composer (the price field, at first)."""
    app = pilot.app
    await until(pilot, lambda: play.result is not None or (
        play.human.waiting and app.focused is not None and app.screen.query_one(Composer) in app.focused.ancestors_with_self))


async def until(pilot, condition, timeout: float = 60.0) -> None:
    """Let the app run until ``condition()`` holds; ``timeout`` only guards against a hang (a loaded 2-core CI machine is slow)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.01)


def screen_text(app) -> str:
    """What the terminal shows, as plain text (from the SVG screenshot)."""
    return html.unescape(app.export_screenshot()).replace("\xa0", " ")


def result_text(app) -> str:
    """The results screen's text."""
    return str(app.screen.query_one("#result").content)


def tab_labels(app) -> dict[str, str]:
    return {tab.id: tab.label.plain for tab in app.screen.query("Tab")}


def session(tmp_path, role: str, spec=SOLO, seed: int = 7, seller: str = "greedy", buyers: str = "threshold") -> PlaySession:
    return PlaySession(role, spec, seed, seller=parse_agent(seller, "seller"), buyers=parse_agent(buyers, "buyer"),
                       out=tmp_path, pace=0, others_pace=0)


# -- playing ----------------------------------------------------------------------------------------------


async def test_play_a_whole_episode_as_a_buyer(tmp_path):
    play = session(tmp_path, "buyer")
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: play.human.waiting)
        assert "OFFER" in screen_text(app)  # the seller's first offer is on screen
        # First a counter-offer through the composer: the turn opens on a bid's price, the price goes in, Enter sends.
        obs = play.view()
        await until(pilot, lambda: app.focused is not None and app.focused.id == "price")  # a turn puts the cursor on the price
        await pilot.press(*str(obs.values[0] // 3), "enter")
        turns = 1
        while play.result is None:
            await my_turn(pilot, play)
            if play.result is not None:
                break
            obs = play.view()
            value = obs.values[int(obs.offer[0][1:]) - 1] if obs.offer else -1
            if obs.offer and obs.offer[1] <= value:
                await pilot.press("ctrl+y", "o", "k", "enter")  # accept exactly the standing offer
            else:
                await pilot.press("ctrl+r", "enter")
            turns += 1
            await until(pilot, lambda: not play.human.waiting or play.result is not None)
            assert turns < 10
        await until(pilot, lambda: isinstance(app.screen, ResultScreen))
        text = result_text(app)
        assert "your surplus" in text and "profit/OPT" in text and "welfare/OPT" in text
    episode = play.result.episode
    deals = [e for e in episode.events if e["type"] == "deal"]
    assert len(deals) == 1 and deals[0]["buyer"] == "b1" and deals[0]["price"] <= deals[0]["value"]
    sent = [e for e in episode.events if e["type"] == "message" and e["sender"] == "b1"]
    assert sent[0]["action"]["kind"] == "bid" and all(e["valid"] for e in sent)
    # Traced like any other episode, with the labels serve writes and the person described as human.
    [written] = list(read_episodes(tmp_path / "play.jsonl"))
    start = written[0]
    assert start["episode"] == "play-buyer-0000" and start["seed"] == 7 and start["index"] == 0
    assert start["seller"] == "greedy" and start["buyers"] == "human+threshold" and start["play"] == "buyer"
    assert start["agents"]["buyers"]["b1"]["kind"] == "human"


@pytest.mark.parametrize("role", ["buyer", "seller"])
async def test_the_composer_opens_on_the_action_and_its_price_and_the_talk_comes_after(tmp_path, role):
    # What a person types first is a price: it lands in the price of the first action (bid, offer), and Tab
    # moves on to the talk. A reject takes no price: the cursor goes to the action itself.
    play = session(tmp_path, role, spec=SOLO if role == "buyer" else SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: play.human.waiting and app.focused is not None)
        composer = app.screen.query_one(Composer)
        fields = [widget.id for widget in composer.query("Select, Input")]
        assert fields == ["kind", "product", "price", "talk"]  # the action and its price, then the talk
        await until(pilot, lambda: app.focused.id == "price")
        assert composer.kind == ("bid" if role == "buyer" else "offer")
        await pilot.press("4", "2", "tab", "h", "i")
        assert (composer.query_one("#price").value, composer.query_one("#talk").value) == ("42", "hi")
        assert app.focused.id == "talk"
        await pilot.press("ctrl+r")  # a reject: no price to type
        composer.focus_first()
        await pilot.pause()
        assert composer.kind == "reject" and app.focused.id == "kind"


async def test_play_a_whole_episode_as_the_seller(tmp_path, monkeypatch):
    monkeypatch.setattr(ResultScreen, "GRACE", 0.0)  # no typing to protect here
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    market = play.market
    best, pairs = opt(market)
    assert len(pairs) >= 2
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        composer = app.screen.query_one(Composer)
        # Below cost is refused by the composer before anything is sent (no turn spent).
        await pilot.press("ctrl+o", "0", "enter")
        assert "below the cost" in str(composer.query_one("#status").content)
        assert play.state.turns_used == 0
        # Offer each OPT pair at the buyer's exact value: threshold buyers accept at or below value.
        for k, (buyer, product) in enumerate(sorted(pairs)):
            i, j = int(buyer[1:]) - 1, int(product[1:]) - 1
            await my_turn(pilot, play)
            await pilot.press("escape", buyer[1:])  # on the board, a digit picks the buyer's conversation
            await pilot.press("ctrl+o")
            composer.query_one("#product").value = product
            await pilot.press(*str(market.buyers[i].values[j]), "tab", *("[b]ok" if k == 0 else "x"), "enter")
            await until(pilot, lambda: any(e["type"] == "deal" and e["buyer"] == buyer for e in play.state.events) or play.result is not None)
        if play.result is None:
            await my_turn(pilot, play)
            if play.result is None:
                await pilot.press("ctrl+t", "y")
        await until(pilot, lambda: isinstance(app.screen, ResultScreen))
        text = result_text(app)
        assert "oracle" in text and "profit/OPT" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ResultScreen))  # back to the board
    result = play.result
    assert result.episode.metrics["profit_ratio"] == 1.0 and result.episode.metrics["violations"] == {}
    assert result.oracle is not None and result.oracle.metrics["profit_ratio"] == 1.0
    talks = [e["talk"] for e in result.episode.events if e["type"] == "message" and e["sender"] == "seller"]
    assert talks[0] == "[b]ok"  # what the person typed, kept as typed
    start = next(read_episodes(tmp_path / "play.jsonl"))[0]
    assert start["seller"] == "human" and start["agents"]["seller"]["kind"] == "human"


async def test_seller_view_marks_and_talk_shown_literally(tmp_path):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=SIZE) as pilot:
        await my_turn(pilot, play)
        await pilot.press("ctrl+o", *str(play.market.price_high), "tab")
        app.screen.query_one("#talk").value = "[bold red]x[/]"
        await pilot.press("enter")  # b1 rejects the top of the range, above its values
        await until(pilot, lambda: any(e["type"] == "message" and e["sender"] == "b1" for e in play.state.events))
        await until(pilot, lambda: tab_labels(app)["tab-b1"].endswith("●"))  # an unread reply; the view moved on to b2
        assert app.screen.active == "b2"
        await pilot.press("ctrl+p")  # back to b1
        await until(pilot, lambda: tab_labels(app)["tab-b1"] == "b1")  # read now
        await until(pilot, lambda: "[bold red]x[/]" in screen_text(app))
        await pilot.press("ctrl+q")  # once: a warning, the episode is unfinished
        await until(pilot, lambda: app._quit_asked > 0)
        assert app.is_running and app.return_code is None
        await pilot.press("ctrl+q")
        await until(pilot, lambda: app.return_code is not None)
    assert play.result is None and not (tmp_path / "play.jsonl").exists()


# -- replay -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """Two recorded greedy episodes; the first message's talk and thought carry markup and an escape sequence."""
    import anyio

    from negotiate.episode import run_episode
    from negotiate.runner import build_episode

    async def record():
        out = []
        for index in range(2):
            market, seller, buyers = build_episode(SPLITS["train"], parse_agent("greedy", "seller"), parse_agent("concession", "buyer"), 0, index)
            out.append(await run_episode(market, seller, buyers, episode_id=f"greedy-{index:06d}"))
        return out

    episodes = anyio.run(record)
    first = next(e for e in episodes[0].events if e["type"] == "message")
    first["talk"] = INJECTED
    first["thought"] = "[link=http://x]click[/link] \x1b]0;pwned\x07"
    path = tmp_path_factory.mktemp("replay") / "greedy.jsonl"
    with TraceWriter(path) as writer:
        for episode in episodes:
            writer.write(episode.events)
    return path


async def test_replay_steps_and_switches_episodes(trace, monkeypatch):
    monkeypatch.setattr(ReplayScreen, "autoplay_seconds", 0.05)
    episodes = load_trace(trace)
    app = NegotiateApp.replay(episodes, str(trace))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, ReplayScreen) and screen.index == 0 and screen.step == 0
        await pilot.press("right", "right", "right")
        await until(pilot, lambda: screen.step == 3)
        await pilot.press("left")
        await until(pilot, lambda: screen.step == 2)
        await pilot.press("end")
        await until(pilot, lambda: screen.step == len(episodes[0].steps))
        assert "profit/OPT" in screen.query_one("#score").content.plain  # the final metrics
        await pilot.press("right", "left")  # no step past the end: one back is the step before it
        await until(pilot, lambda: screen.step == len(episodes[0].steps) - 1)
        await pilot.press("home")
        await until(pilot, lambda: screen.step == 0)
        await pilot.press("n")
        await until(pilot, lambda: screen.index == 1)
        assert screen.step == 0 and screen.sub_title.startswith("2/2 · ")
        await pilot.press("p")
        await until(pilot, lambda: screen.index == 0)
        await pilot.press("space")  # autoplay
        await until(pilot, lambda: screen.step >= 3)
        await pilot.press("space")
        await until(pilot, lambda: not screen.playing)
        stopped = screen.step
        screen._tick()  # a tick that was already queued when autoplay stopped
        assert screen.step == stopped
        await pilot.click("#episodes", offset=(3, 2))  # the mouse picks the second episode
        await until(pilot, lambda: screen.index == 1)


def _plain(renderable, width: int = 120) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


async def test_replay_draws_a_step_once_and_shows_what_a_whole_redraw_shows(trace, monkeypatch):
    """Issue 44: a key draws the step it shows (and the two whose current-step mark moves), not every step again; what
    is on screen is, line for line, what drawing every shown step afresh gives, after steps forward and back,
    thoughts hidden, and another episode."""
    drawn = []
    episodes = load_trace(trace)
    app = NegotiateApp.replay(episodes, str(trace))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        transcript = screen.query_one("#transcript")
        real = transcript.show_steps

        def counted(shown, draw, key):
            return real(shown, lambda k, current: (drawn.append((k, current)), draw(k, current))[1], key)

        monkeypatch.setattr(transcript, "show_steps", counted)

        def afresh() -> str:  # every shown step drawn again, the last one marked
            return "".join(_plain(screen.step_table(k, k == screen.step - 1)) for k in range(screen.step))

        for keys, step in ((("right",) * 4, 4), (("left",), 3), (("right",), 4), (("t",), 4), (("home",), 0), (("end",), None)):
            drawn.clear()
            await pilot.press(*keys)
            want = len(episodes[screen.index].steps) if step is None else step
            await until(pilot, lambda: screen.step == want)
            await pilot.pause()
            assert _plain(transcript.shown()) == afresh()
            market = screen.query_one("#market")
            assert market.row_count == len(episodes[screen.index].market["products"])  # kept, not cleared, between deals
            if keys == ("left",):
                assert sorted(drawn) == [(2, True), (3, False)]  # the mark moves; nothing else is drawn
            if keys == ("right",):
                assert sorted(drawn) == [(2, False), (3, True)]  # step 4 is shown again as it was drawn
        assert len(transcript.query(".step")) == len(episodes[0].steps)
        await pilot.press("n")
        await until(pilot, lambda: screen.index == 1)
        await pilot.press("right")
        await until(pilot, lambda: screen.step == 1)
        await pilot.pause()
        assert len(transcript.query(".step")) == 1 and _plain(transcript.shown()) == afresh()



async def test_replay_shows_model_text_literally(trace):
    app = NegotiateApp.replay(load_trace(trace), str(trace))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right")
        await until(pilot, lambda: SHOWN in screen_text(app))
        text = screen_text(app)
        assert SHOWN in text and "[link=http://x]click[/link]" in text
        assert "\x1b" not in text and "\x07" not in text
        body = app.screen.query_one("#transcript").shown()
        shown = [(segment.text, str(segment.style)) for segment in app.console.render(body)]
        assert any(SHOWN in text for text, _ in shown) and not any("bold red" in style for _, style in shown)


async def test_replay_wraps_long_lines_under_their_text(trace, tmp_path):
    """A talk or thought too long for the transcript wraps under its first word, not at the margin."""
    events = next(read_episodes(trace))
    first = next(e for e in events if e["type"] == "message")
    first["talk"] = " ".join(f"word{k}" for k in range(40))
    first["thought"] = " ".join(f"idea{k}" for k in range(40))
    path = tmp_path / "long.jsonl"
    with TraceWriter(path) as writer:
        writer.write(events)
    app = NegotiateApp.replay(load_trace(path), str(path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right")
        await until(pilot, lambda: "word0" in screen_text(app))
        transcript = app.screen.query_one("#transcript")
        console = Console(width=transcript.query_one(".step").content_size.width, file=io.StringIO(), record=True)
        console.print(transcript.shown())
        rows = console.export_text().splitlines()
        talk = [row for row in rows if "word" in row]
        thought = [row for row in rows if "idea" in row]
        assert len(talk) >= 2 and len(thought) >= 2  # both wrapped
        # the marker column, then 7 spaces and the quote; the rest lines up one cell right of the quote
        assert talk[0].startswith('▌       "word0 ') and all(row.startswith(" " * 9 + "word") for row in talk[1:])
        assert thought[0].startswith("▌       thought: idea0 ") and all(row.startswith(" " * 17 + "idea") for row in thought[1:])


async def test_replay_header_names_a_model_seller_short(trace, tmp_path):
    """A served model's seller spec (URL, query), its episode ids (the spec's slug) and the trace's folder would
    push the header past 80 columns, and the ids would fold over lines of the episode list."""
    events = next(read_episodes(trace))
    events[0]["seller"] = "openai:round-1@http://127.0.0.1:50353/v1?format=tagged&server=vllm&temperature=0&max_tokens=80"
    events[0]["buyers"] = "concession"
    events[0]["episode"] = "openai-round-1-http-127-0-0-1-50353-v1-format-tagged-temperature-0-max-tokens-80-000000"
    path = tmp_path / "runs" / "a4r1-t0" / "eval" / "compact" / "round-1.jsonl"
    path.parent.mkdir(parents=True)
    with TraceWriter(path) as writer:
        writer.write(events)
    app = NegotiateApp.replay(load_trace(path), str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.screen.sub_title == f"1/1 · train {events[0]['shape']} · openai:round-1 vs concession"
        await until(pilot, lambda: "openai:round-1 vs concession" in screen_text(app))  # all of it shows
        assert "…" not in screen_text(app).split("openai:round-1 vs concession")[0][-80:]
        label = app.screen.query_one("#episodes", OptionList).get_option_at_index(0).prompt.plain
        assert label.startswith("…ax-tokens-80-000000 ")  # the id's end, where a model's episodes differ, then the score
    # A failed episode's mark is longer than a score: its id gives way, and the label still takes one line.
    events[-1] = {**events[-1], "outcome": "failed", "reason": "LLMError: boom", "metrics": None}
    path.unlink()
    with TraceWriter(path) as writer:  # more episodes than the list shows: its scroll bar takes 2 of its cells
        for k in range(12):
            writer.write([{**event, "episode": events[0]["episode"][:-2] + f"{k:02d}"} for event in events])
    app = NegotiateApp.replay(load_trace(path), str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "failed" in screen_text(app))
        label = app.screen.query_one("#episodes", OptionList).get_option_at_index(0).prompt.plain
        episodes = app.screen.query_one("#episodes", OptionList)
        room = episodes.scrollable_content_region.width - episodes.get_component_styles("option-list--option").padding.width
        assert len(label) <= room  # one line, not two (the old label, 27 cells, wrapped in 26)
        assert label == "…-tokens-80-000000 failed"


async def test_terminal_too_small(trace):
    app = NegotiateApp.replay(load_trace(trace), str(trace))
    async with app.run_test(size=(60, 20)) as pilot:
        await until(pilot, lambda: app.screen.query_one("#too-small").display)
        assert not app.screen.query_one("#replay").display
        assert "terminal too small (need 80x24)" in screen_text(app)
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: app.screen.query_one("#replay").display)
        assert not app.screen.query_one("#too-small").display


async def test_play_fits_80x24(tmp_path):
    play = session(tmp_path, "seller", spec=SPLITS["train"], seed=3)
    app = NegotiateApp.play(play)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: play.human.waiting and app.screen.query_one("#conversation").region.height > 0)
        for selector in ("#catalog", "#buyers", "#conversation", "Composer", "#threads"):
            region = app.screen.query_one(selector).region
            assert region.height > 0 and region.right <= 80 and region.bottom <= 24, selector
        assert app.screen.query_one("#conversation").region.height >= 4
        shape = play.market.shape
        assert f"you sell · seed 3 · train {shape} · buyers threshold" in screen_text(app)  # the header, whole


def test_replay_text_is_plain(trace, capsys):
    assert main(["replay", str(trace), "--text"]) == 0
    out = capsys.readouterr().out
    assert SHOWN in out and "\x1b" not in out and "\x07" not in out
    assert "t1" in out and "thought:" in out and "END" in out and "profit/OPT" in out
    assert "greedy-000001" not in out  # the first episode only
    assert main(["replay", str(trace), "--text", "--episode", "greedy-000001"]) == 0
    assert "episode greedy-000001" in capsys.readouterr().out


def _with_long_fields(trace, tmp_path, talk: str, thought: str):
    """The trace's first episode with its first message's talk and thought replaced."""
    events = next(read_episodes(trace))
    first = next(e for e in events if e["type"] == "message")
    first["talk"], first["thought"] = talk, thought
    path = tmp_path / "long.jsonl"
    with TraceWriter(path) as writer:
        writer.write(events)
    return path


def test_replay_text_cuts_long_fields_with_a_marker_and_full_prints_them_whole(trace, tmp_path, capsys):
    path = _with_long_fields(trace, tmp_path, "a" * 50_000, "b\x1b" * 5_000)  # 10,000 characters, 5,000 of them ESC
    assert main(["replay", str(path), "--text"]) == 0
    out = capsys.readouterr().out
    # 4000 characters shown, then how many were left out: 46,000 of the talk, 6,000 of the thought (counted before
    # the escapes were cleaned out of what shows: 2,000 b's of the 4,000 characters).
    assert '"' + "a" * 4000 + ' … [46,000 more characters cut; replay --text --full prints them]"' in out
    assert "thought: " + "b" * 2000 + " … [6,000 more characters cut; replay --text --full prints them]" in out
    assert "a" * 4001 not in out and "\x1b" not in out
    assert main(["replay", str(path), "--text", "--full"]) == 0
    whole = capsys.readouterr().out
    assert '"' + "a" * 50_000 + '"' in whole and "thought: " + "b" * 5000 + "\n" in whole and "more characters cut" not in whole
    assert main(["replay", str(path), "--full"]) == 2  # the viewer always cuts: one line saying so
    assert capsys.readouterr().err == ("negotiate replay: error: --full: prints whole fields with --text only "
                                       "(the viewer cuts them to stay quick)\n")


async def test_replay_viewer_cuts_a_100_kb_reply_with_a_marker(trace, tmp_path):
    path = _with_long_fields(trace, tmp_path, "word " * 20_000, "idea " * 20_000)
    app = NegotiateApp.replay(load_trace(path), str(path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("right")
        body = app.screen.query_one("#transcript").shown()
        console = Console(width=200, file=io.StringIO(), record=True)
        console.print(body)
        text = console.export_text()
        cut_at = ReplayScreen.field_limit
        assert text.count("more characters cut") == 2
        assert f"{100_000 - cut_at:,} more characters cut; replay --text --full prints them" in text
        assert text.count("word") == cut_at // 5 and text.count("idea") == cut_at // 5


def test_replay_errors_are_one_line(tmp_path, trace, capsys):
    def error_line() -> str:
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    assert main(["replay", str(tmp_path / "missing.jsonl"), "--text"]) == 2
    assert "no such trace file" in error_line()
    assert main(["replay", str(trace), "--episode", "nope", "--text"]) == 2
    line = error_line()
    assert "--episode" in line and "'nope'" in line and "greedy-000000" in line
    truncated = tmp_path / "cut.jsonl"
    truncated.write_bytes(b"".join(trace.read_bytes().splitlines(keepends=True)[:5]))
    assert main(["replay", str(truncated), "--text"]) == 2
    assert "truncated" in error_line()
    lines = trace.read_bytes().splitlines(keepends=True)
    first_end = next(k for k, line in enumerate(lines) if orjson.loads(line)["type"] == "episode_end")
    truncated.write_bytes(b"".join(lines[: first_end + 3]))  # the second episode as a killed (or running) serve leaves it
    assert main(["replay", str(truncated), "--text"]) == 2
    assert "--allow-partial skips it" in error_line()
    assert main(["replay", str(truncated), "--text", "--allow-partial"]) == 0
    captured = capsys.readouterr()
    assert "episode greedy-000000" in captured.out and "END" in captured.out
    assert captured.err == (f"negotiate replay: --allow-partial skipped {truncated}:{first_end + 2}: "
                            "episode 'greedy-000001' has no episode_end\n")
    assert main(["replay", str(tmp_path), "--text"]) == 2
    assert "folder" in error_line()
    assert main(["replay", str(trace)]) == 2  # no terminal under pytest: the UI is not started
    assert "--text" in error_line()


def test_play_errors_are_one_line(tmp_path, capsys):
    base = ["play", "--out", str(tmp_path / "p")]
    assert main([*base, "--seller", "nobody"]) == 2
    assert "nobody" in capsys.readouterr().err
    assert main([*base, "--buyers", "ghost?x=1"]) == 2
    assert "ghost" in capsys.readouterr().err
    assert main([*base, "--split", "nowhere"]) == 2
    assert "nowhere" in capsys.readouterr().err
    assert main([*base, "--role", "seller", "--seller", "planner"]) == 2  # the person is the seller: it would be ignored
    assert "--seller: 'planner'" in capsys.readouterr().err
    args = argparse.Namespace(role="buyer", split="train", seed=1, seller="greedy", buyers="threshold", out=tmp_path)
    (tmp_path / "play.jsonl").write_bytes(orjson.dumps({"type": "episode_start"}) + b"\n" + b"{oops\n")
    with pytest.raises(UserError) as raised:
        commands.play(args)
    assert "play.jsonl" in str(raised.value)


def test_recorded_steps_group_each_message_with_its_effects(trace):
    episode = load_trace(trace)[0]
    assert isinstance(episode, Recorded)
    assert all(step[0]["type"] in ("message", "episode_end") for step in episode.steps)
    assert episode.steps[-1][0]["type"] == "episode_end"
    assert sum(len(step) for step in episode.steps) == len(episode.events) - 1


def test_transcript_survives_odd_events_and_failed_episodes(trace):
    import doctest

    import negotiate.tui.text as text_module

    assert doctest.testmod(text_module).failed == 0
    events = [dict(e) for e in load_trace(trace)[0].events]
    events[1] = {"type": "message", "episode": "x"}  # every field missing
    events.insert(2, {"type": "surprise", "episode": "x"})  # an event kind this reader does not know
    events[-1] = {"type": "episode_end", "episode": "x", "outcome": "failed", "reason": "RuntimeError: boom", "metrics": None}
    out = plain_transcript(Recorded(events))
    assert "END failed (RuntimeError: boom)" in out and "(surprise event)" in out and "? -> ?" in out
    assert ReplayScreen._label(Recorded(events)).plain.endswith("failed")


def test_one_screen_per_module_and_no_module_over_800_lines():
    """Textual's shape (issue 50): each screen in a module of its own (the two confirmations are one modal with two sets
    of words, so they share one), and no module of tui/ over 800 lines (play.py held three screens and three modals in
    841)."""
    import importlib
    import inspect
    from pathlib import Path

    from textual.screen import Screen

    folder = Path(commands.__file__).parent
    screens = {}
    for path in sorted(folder.glob("*.py")):
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 800, path.name
        module = importlib.import_module(f"negotiate.tui.{path.stem}")
        screens[path.stem] = sorted(name for name, value in vars(module).items() if inspect.isclass(value)
                                    and issubclass(value, Screen) and value.__module__ == module.__name__)
    assert {stem: names for stem, names in screens.items() if names} == {
        "play": ["PlayScreen"], "buyer": ["BuyerScreen"], "seller": ["SellerScreen"], "results": ["ResultScreen"],
        "confirm": ["ConfirmEnd", "ConfirmLeave"], "replay": ["ReplayScreen"]}
