"""The replay screen: pick a recorded episode, step through it, watch the prices move.

Everything recorded is shown, thoughts included (a replay is for the researcher):
every message with its talk, action and thought, violations, deals, notices, and
the final metrics. Keys step forward and back, jump to the start or end, play on a
timer, and switch episode; the list and the transcript work with the mouse too.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, OptionList, Static
from textual.widgets.option_list import Option

from negotiate.report import short_label
from negotiate.trace import DealEvent, MessageEvent, ViolationEvent
from negotiate.tui.text import clean, esc, money, ratio
from negotiate.tui.transcript import Recorded, event_lines, hang_width, price_points
from negotiate.tui.widgets import Conversation, PriceChart, TooSmall

__all__ = ["ReplayScreen"]


_NEVER_WRAPS = 40
"""Cells a transcript line always has room for: the transcript is 41 cells wide after its marker at 80 columns,
the smallest terminal the screen draws in. Shorter lines stay plain text (a grid per line costs a redraw time)."""


LABEL = 25
"""Cells of an episode's label in the episode list, its id's end and its score or mark: one line at 80 columns."""


def _tail(text: str, width: int) -> str:
    """``text``, or its last ``width - 1`` characters after an ellipsis: a model seller's episode ids differ at the end.

    >>> _tail("greedy-000003", 20), _tail("openai-round-1-http-127-0-0-1-50353-v1-prompt-facts-000002", 20)
    ('greedy-000003', '…prompt-facts-000002')
    """
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _hanging(line: str, style: str) -> Text | Table:
    """A transcript line whose wrapped rest lines up under its text (:func:`hang_width`), not at the margin."""
    width = hang_width(line)
    if not width or cell_len(line) <= _NEVER_WRAPS:
        return Text(line, style=style)
    cell = Table.grid()
    cell.add_column(width=width, no_wrap=True)
    cell.add_column(ratio=1)
    cell.add_row(Text(line[:width], style=style), Text(line[width:], style=style))
    return cell


class Steps(Conversation):
    """The replay's transcript: one widget a step, made when first shown and hidden when stepped back over, so a key
    draws the step it shows or hides and the two marked as current, not the whole transcript again (a redraw of
    every step took 0.3 s a key at 1 KB fields on a busy machine, and grew with the steps shown)."""

    def __init__(self, placeholder: str = "", **kwargs) -> None:
        super().__init__(placeholder, **kwargs)
        self._steps: list[Static] = []
        self._key: object = None
        self._current = -1

    def show_steps(self, shown: int, draw, key: object) -> None:
        """Show steps ``0 .. shown - 1``, each drawn by ``draw(k, current)`` once (again when it becomes or stops
        being the current step); ``key`` changes when every step must be drawn afresh (another episode, thoughts)."""
        if key != self._key:
            for widget in self._steps:
                widget.remove()
            self._steps, self._key, self._current = [], key, -1
        new = [Static(draw(k, k == shown - 1), classes="step") for k in range(len(self._steps), shown)]
        if self._current != shown - 1:
            for k in (self._current, shown - 1):
                if 0 <= k < len(self._steps):
                    self._steps[k].update(draw(k, k == shown - 1))
            self._current = shown - 1
        self._steps += new
        if new:
            self.mount_all(new)
        for k, widget in enumerate(self._steps):
            widget.display = k < shown
        self.query_one(".body", Static).display = shown == 0
        self.call_after_refresh(self.scroll_end, animate=False)

    def shown(self) -> Group:
        """What the steps shown draw, first to last (for a test, or a copy)."""
        return Group(*(widget.content for widget in self._steps if widget.display))


class ReplayScreen(Screen):
    """Step through the episodes of one trace file."""

    STEP = Binding.Group("Step", compact=False)
    ENDS = Binding.Group("Start/End", compact=False)
    EPISODE = Binding.Group("Episode", compact=False)
    # Quit comes first, and related keys share one label, so the footer keeps every key at 80 columns.
    BINDINGS = [
        Binding("q,escape", "leave('quit')", "Quit", priority=True),  # the replay alone: q quits
        Binding("q,escape", "leave('back')", "Back", priority=True),  # opened from a play's results: back to the board
        Binding("left,h", "step(-1)", "Back", priority=True, key_display="←", group=STEP),
        Binding("right,l", "step(1)", "Next", priority=True, key_display="→", group=STEP),
        Binding("home,g", "jump(0)", "Start", priority=True, key_display="g", group=ENDS),
        Binding("end,G", "jump(-1)", "End", priority=True, key_display="G", group=ENDS),
        Binding("space", "autoplay", "Play", priority=True),
        Binding("p,[", "episode(-1)", "Prev episode", key_display="p", group=EPISODE),
        Binding("n,]", "episode(1)", "Next episode", key_display="n", group=EPISODE),
        Binding("t", "thoughts", "Thoughts"),
    ]

    autoplay_seconds = 0.8
    """Seconds between steps while autoplay runs."""
    field_limit: int | None = 1000
    """Characters of a talk, thought or raw reply drawn (about 17 lines of the transcript at 80 columns), the rest cut
    with a marker: a step is drawn when it is first shown (:class:`Steps`), and 100 KB fields drawn whole take 1.3 s
    a key, cut at 4000 characters 0.18 s, at 1000 0.13 s, as 1 KB fields do (``benchmarks/bench_replay.py``)."""

    def __init__(self, episodes: list[Recorded], source: str, index: int = 0) -> None:
        super().__init__()
        self.episodes = episodes
        self.source = source
        self.index = index
        self.step = 0
        """Steps shown: 0 is the market alone, len(steps) the whole episode."""
        self.thoughts = True
        self.playing = False
        """True while autoplay steps on a timer."""
        self.ready = False
        """True once mounted: keys that arrive earlier are ignored."""
        self._timer = None
        self._market_drawn: tuple | None = None
        """The episode and deals the market table last showed."""

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield TooSmall()
        with Horizontal(id="replay"):
            with Vertical(id="left"):
                yield OptionList(*(Option(self._label(e), id=str(k)) for k, e in enumerate(self.episodes)), id="episodes")
                yield DataTable(id="market", cursor_type="none", zebra_stripes=True, cell_padding=0)
                yield Static(id="score")
            with Vertical(id="right"):
                yield Steps("Press → to play the first message.", id="transcript")
                yield PriceChart(id="chart")
        yield Footer()

    @staticmethod
    def _label(episode: Recorded) -> Text:
        m = episode.metrics
        mark, style = (" failed", "red") if episode.failed else (f" {ratio(m.get('profit_ratio'))}", "dim") if m is not None else ("", "")
        # The id's end and the mark on one line of the 80-column episode list (LABEL cells; " failed" used to wrap)
        text = Text(_tail(episode.id, LABEL - len(mark)))
        text.append(mark, style=style)
        return text

    def on_mount(self) -> None:
        self.query_one("#episodes").border_title = esc(f"Episodes ({len(self.episodes)})")
        self.query_one("#episodes").border_subtitle = "profit/OPT"
        self.query_one("#market").border_title = "Market: costs and values"
        self.query_one("#market").border_subtitle = "underlined: OPT pair"
        self.query_one("#chart").border_title = "Prices over time, per buyer"
        self.query_one("#score").border_title = "Score"
        self._timer = self.set_interval(self.autoplay_seconds, self._tick, pause=True)
        episodes = self.query_one("#episodes", OptionList)
        episodes.highlighted = self.index
        episodes.focus()
        self.load(self.index)
        self.ready = True

    # -- state -------------------------------------------------------------------------

    @property
    def episode(self) -> Recorded:
        return self.episodes[self.index]

    def load(self, index: int) -> None:
        self.index = index
        self.step = 0
        episode = self.episode
        start = episode.start
        # Within the 50 cells an 80-column header leaves (a split's long name aside): the list and `--text` give the
        # (long, for a model) id.
        self.sub_title = " · ".join((
            f"{index + 1}/{len(self.episodes)}", clean(f"{start.split or '?'} {start.shape or ''}".strip()),
            f"{clean(short_label(start.seller or '?'))} vs {clean(short_label(start.buyers or '?'))}"))
        table = self.query_one("#market", DataTable)
        table.clear(columns=True)
        numbers = [clean(p.get("cost", "")) for p in episode.market.get("products", []) if isinstance(p, dict)]
        numbers += [clean(v) for b in episode.market.get("buyers", []) if isinstance(b, dict) for v in (b.get("values") or [])]
        self._width = max([len(n) for n in numbers] + [4]) + 1
        table.add_columns(*(Text(f"{label:>{width}}") for label, width in
                            [("", 3), ("cost", self._width)] + [(b, self._width) for b in episode.buyer_ids]))
        best = episode.opt()
        self._opt_pairs = best[1] if best else frozenset()
        self._market_drawn = None  # its rows were cleared with its columns
        self.draw()

    def step_table(self, k: int, current: bool) -> Table:
        """Step ``k`` of the episode as the transcript draws it: its lines, marked when it is the current step."""
        lines = Table.grid(expand=True)
        lines.add_column(width=1, no_wrap=True)
        lines.add_column(ratio=1)
        mark = Text("▌" if current else " ", style="bold magenta")
        for event in self.episode.steps[k]:
            for style, line in event_lines(event, thoughts=self.thoughts, arrow="→", limit=self.field_limit):
                lines.add_row(mark, _hanging(line, style))
        return lines

    def _draw_market(self) -> None:
        episode = self.episode
        dealt = {(clean(e.buyer), clean(e.product)) for step in episode.steps[: self.step] for e in step if isinstance(e, DealEvent)}
        if (self.index, dealt) == self._market_drawn:
            return  # deals are rare: most keys leave the market table as it was
        self._market_drawn = (self.index, dealt)
        table = self.query_one("#market", DataTable)
        table.clear()
        buyers = [b for b in episode.market.get("buyers", []) if isinstance(b, dict)]
        for j, product in enumerate(p for p in episode.market.get("products", []) if isinstance(p, dict)):
            pid = clean(product.get("id", "?"))
            cells = []
            for buyer in buyers:
                values = buyer.get("values") if isinstance(buyer.get("values"), list) else []
                bid = clean(buyer.get("id", "?"))
                value = clean(values[j]) if j < len(values) else "?"
                style = "bold green reverse" if (bid, pid) in dealt else "underline" if (bid, pid) in self._opt_pairs else ""
                cells.append(Text(f"{value:>{self._width}}", style=style))
            table.add_row(Text(f"{pid:>3}", style="bold"), Text(f"{clean(product.get('cost', '?')):>{self._width}}", style="dim"), *cells)

    def draw(self) -> None:
        episode = self.episode
        steps = episode.steps
        transcript = self.query_one("#transcript", Steps)
        transcript.border_title = esc(f"Step {self.step} of {len(steps)}" + ("  ▶ playing" if self.playing else ""))
        transcript.show_steps(self.step, self.step_table, (self.index, self.thoughts, self.field_limit))
        points, deals = price_points(steps[: self.step])
        market = episode.market
        low, high = market.get("price_low", 0), market.get("price_high", 1)
        self.query_one("#chart", PriceChart).plot(episode.buyer_ids, points, deals,
                                                  low if isinstance(low, int) else 0, high if isinstance(high, int) else 1)
        self.query_one("#score", Static).update(self._score())
        self._draw_market()

    def _score(self) -> Text:
        episode = self.episode
        shown = [e for step in episode.steps[: self.step] for e in step]
        turns = max([e.turn for e in shown if isinstance(e, MessageEvent) and isinstance(e.turn, int)] + [0])
        deals = [e for e in shown if isinstance(e, DealEvent)]
        profit = sum(e.price - e.cost for e in deals if isinstance(e.price, int) and isinstance(e.cost, int))
        violations = sum(1 for e in shown if isinstance(e, ViolationEvent))
        out = Text()
        out.append(f"turn {turns} of {clean(episode.market.get('budget', '?'))} · deals {len(deals)}\n")
        out.append(f"profit {money(profit)} · ")
        out.append(f"violations {violations}", style="red" if violations else "")
        if self.step >= len(episode.steps):
            end = episode.end
            out.append(f"\n{clean(end.outcome or '?')} ({clean(end.reason or '?')})", style="bold")
            m = episode.metrics
            if m:
                out.append(f"\nprofit/OPT {ratio(m.get('profit_ratio'))}", style="bold")
                out.append(f"\nwelfare/OPT {ratio(m.get('welfare_ratio'))}", style="bold")
                out.append(f"\nOPT {money(m.get('opt'))} · valid {ratio(m.get('valid_rate'))}")
        return out

    # -- keys ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "leave":  # one of its two bindings, named for what q does here
            return (parameters[:1] == ("back",)) == self._nested()
        return self.ready

    @property
    def lists_quit(self) -> bool:
        """Whether the footer lists q as Quit (the app leaves ctrl+q unlisted then): alone, not over a play's results."""
        return not self._nested()

    def _nested(self) -> bool:
        """Opened over another screen (a play's results): leaving goes back to it."""
        return len(self.app.screen_stack) > 1

    def action_step(self, delta: int) -> None:
        self.step = max(0, min(len(self.episode.steps), self.step + delta))
        self.draw()

    def action_jump(self, where: int) -> None:
        self.step = 0 if where == 0 else len(self.episode.steps)
        self.draw()

    def action_autoplay(self) -> None:
        self.playing = not self.playing
        if self.playing:
            if self.step >= len(self.episode.steps):
                self.step = 0
            self._timer.resume()
        else:
            self._timer.pause()
        self.draw()

    def _tick(self) -> None:
        if not self.playing:
            # A tick posted before autoplay stopped can still arrive (timer events queue up on a busy
            # machine): once stopped, the step stays where the person stopped it.
            return
        if self.step >= len(self.episode.steps):
            self.playing = False
            self._timer.pause()
            self.draw()
            return
        self.action_step(1)

    def action_episode(self, delta: int) -> None:
        index = (self.index + delta) % len(self.episodes)
        self.query_one("#episodes", OptionList).highlighted = index  # the list's event loads it

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        index = int(event.option.id)
        if self.ready and index != self.index:
            self.load(index)

    def action_thoughts(self) -> None:
        self.thoughts = not self.thoughts
        self.notify("thoughts shown" if self.thoughts else "thoughts hidden", timeout=2)
        self.draw()

    def action_leave(self, how: str = "quit") -> None:
        if self._nested():
            self.app.pop_screen()
        else:
            self.app.exit()
