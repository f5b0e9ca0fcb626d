"""What both play seats share: :class:`PlayScreen`, the base of the buyer's and the seller's screens, and the drawing
helpers both use.

Each play screen starts the episode in a Textual worker (``run_episode`` runs on
Textual's own asyncio loop) and redraws when the session reports a change. The
person's view is ``observe(state, <their id>)`` and nothing else: a buyer sees its
own values, the seller's talk and actions to it (never the seller's thoughts) and
the stock; the seller sees costs, stock, the turn budget and each buyer's public
replies. The composer's draft is checked by :meth:`HumanAgent.draft` before it is
sent; the regulator still judges it. An offer or bid on a product that has sold
out is dead (nobody can accept it): the screens drop it rather than show it as
standing. Ending the market (the seller's ``end``) or leaving it (a buyer's ``quit``)
asks first (:mod:`negotiate.tui.confirm`): it cannot be undone. The seats' own screens
are :mod:`negotiate.tui.buyer` and :mod:`negotiate.tui.seller`; the results are
:mod:`negotiate.tui.results` (one screen per module, as Textual's own examples are laid out).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.message import Message as UIMessage
from textual.screen import Screen
from textual.widgets import DataTable
from textual.worker import Worker, WorkerState

from negotiate.agents.human import DraftError
from negotiate.protocol import Message, Notice
from negotiate.report import short_label

from negotiate.tui.confirm import ConfirmEnd, ConfirmLeave
from negotiate.tui.results import ResultScreen
from negotiate.tui.session import PlayResult, PlaySession
from negotiate.tui.text import action_label, clean, esc
from negotiate.tui.widgets import Composer, Conversation

__all__ = ["PlayScreen", "thread_text", "product_name", "fill_table", "live", "board_table", "focus_overflowing"]


def thread_text(items, me: str) -> Table | None:
    """A conversation, literally: who spoke, their talk and their action (wrapped under the talk); the market's
    notices between them, dimmed (a refused message's in red). The notices are the news of the market (a deal, a
    product sold out): shown in the conversation where they happened, they cover nothing (as toasts, two of them hid 4
    of 5 buyer rows at 80x24, just as a deal was made)."""
    if not items:
        return None
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(width=6, justify="right", no_wrap=True)
    grid.add_column(ratio=1)
    for item in items:
        if isinstance(item, Notice):
            style = "bold red" if item.kind == "violation" else "dim italic"
            grid.add_row(Text("·", style="dim"), Text(clean(item.text), style=style))
            continue
        mine = item.sender == me
        who = Text("you" if mine else clean(item.sender), style="bold cyan" if mine else "bold yellow")
        body = Text(clean(item.talk)) if item.talk else Text("(says nothing)", style="dim")
        body.append("\n" + action_label(item.action), style="bold" if item.action.kind != "reject" else "dim bold")
        grid.add_row(who, body)
    return grid


def product_name(name: str, width: int = 14) -> Text:
    """A product name, cut to fit the side tables (14 cells up to 119 columns, 28 from 120)."""
    name = clean(name)
    return Text(name if len(name) <= width else name[: width - 1] + "…")


def fill_table(table: DataTable, rows: list[tuple[Text, ...]]) -> None:
    """Replace a table's rows, unless they are what it shows already (a redraw restyles every cell)."""
    key = [tuple((cell.plain, str(cell.style)) for cell in row) for row in rows]
    if getattr(table, "_shown", None) == key:
        return
    table._shown = key
    table.clear()
    for row in rows:
        table.add_row(*row)


def live(standing: tuple[str, int] | None, products) -> tuple[str, int] | None:
    """A standing offer or bid, or None once its product has sold out (nobody can accept it then)."""
    if standing is None:
        return None
    return standing if any(p.id == standing[0] and p.stock > 0 for p in products) else None


def board_table(ident: str, padding: int = 1) -> DataTable:
    """A display-only table: no cursor, and no focus while it shows every row (the keyboard stays with the composer
    and the conversation); one that overflows (a big market) takes the focus, so the arrow keys can scroll it."""
    table = DataTable(id=ident, cursor_type="none", zebra_stripes=True, cell_padding=padding, classes="board-table")
    table.can_focus = False
    return table


def focus_overflowing(screen: Screen) -> None:
    """Let Tab reach the board's tables that have rows or columns out of sight, and only those."""
    for table in screen.query(".board-table").results(DataTable):
        table.can_focus = table.max_scroll_y > 0 or table.max_scroll_x > 0


class PlayScreen(Screen):
    """What both seats share: the episode worker, redraws on change, sending, the results."""

    AUTO_FOCUS = ""  # none: the composer's first field (the price, or the action) takes the focus when a turn starts
    BINDINGS = [
        # Tab moves the cursor before the next key is read: as the screen's own (not priority) binding it came after
        # the keys already queued, so in a browser, where keys come in a burst, "Tab hello" put "h" in the price.
        Binding("tab", "app.focus_next", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", show=False, priority=True),
        Binding("ctrl+s", "send", "Send", priority=True),
        Binding("escape", "board", "Leave field", show=False),
        Binding("v", "results", "Results"),
    ]

    class Changed(UIMessage):
        """The episode moved (a message, a reply, an agent started or stopped thinking)."""

    def __init__(self, session: PlaySession) -> None:
        super().__init__()
        self.session = session
        self._sync_pending = False
        self._was_waiting = False
        self.ready = False
        """True once mounted: keys that arrive earlier are ignored."""
        self.focus_pending = False
        """True from a turn's start until its cursor is placed (after a refresh): keys pressed meanwhile go where the
        cursor was, and tests wait for it."""

    def on_mount(self) -> None:
        # Textual calls on_mount of every class in the MRO: the seats' own (tables) run first, then this one.
        session = self.session
        market = session.market
        # Within the 50 cells an 80-column header leaves, for scripted agents.
        self.sub_title = (f"{'you sell' if session.role == 'seller' else 'you are ' + session.human_id} · "
                          f"seed {session.seed} · {clean(market.spec.name)} {market.shape} · "
                          + (f"buyers {clean(short_label(session.buyers_spec.text))}" if session.role == "seller"
                             else f"seller {clean(short_label(session.seller_spec.text))}"))
        session.on_change = self._request_sync
        self.ready = True
        self.sync()
        self.run_worker(session.run(), name="episode", exit_on_error=False)

    def _request_sync(self) -> None:
        if not self._sync_pending:
            self._sync_pending = True
            self.post_message(self.Changed())

    def on_play_screen_changed(self, _message: Changed) -> None:
        self._sync_pending = False
        self.sync()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.name != "episode":
            return
        if event.state == WorkerState.SUCCESS:
            self.sync()
            self.action_results()
        elif event.state == WorkerState.ERROR:
            error = event.worker.error
            self.query_one(Composer).error(f"the episode stopped: {type(error).__name__}: {error}")
            self.notify(esc(f"the episode stopped: {error}"), severity="error", timeout=30)

    @property
    def result(self) -> PlayResult | None:
        return self.session.result

    @property
    def _name_width(self) -> int:
        return 28 if self.app.size.width >= 120 else 14

    def on_resize(self) -> None:
        if not self.ready:
            return
        if getattr(self, "_drawn_width", None) not in (None, self._name_width):
            self.reset_tables()  # a table's columns only ever widen: start them again for the new width
        self._drawn_width = self._name_width
        self.sync()

    def reset_tables(self) -> None:
        pass

    # -- drawing ----------------------------------------------------------------------

    def sync(self) -> None:
        """Redraw everything from the person's observation."""
        waiting = self.session.human.waiting and self.result is None
        composer = self.query_one(Composer)
        composer.disabled = not waiting
        if not waiting:
            composer.clear_error()  # what it said was about a draft that can no longer be sent
            if isinstance(self.app.screen, ConfirmEnd):
                self.app.screen.dismiss(False)  # the market ended meanwhile (a buyer took the last unit)
        obs = self.session.view()
        self.draw(obs)
        if waiting and not self._was_waiting:
            self.turn_started(obs)
        self._was_waiting = waiting
        self.refresh_bindings()
        self.call_after_refresh(focus_overflowing, self)  # once the new rows are laid out

    def draw(self, obs) -> None:  # pragma: no cover - every seat overrides it
        raise NotImplementedError

    def turn_started(self, obs) -> None:
        """The bus now waits for the person: put the cursor in the composer's first field, the action's price (the
        action itself when it takes none), unless it is in the composer already. The talk comes after it (Tab): a
        price typed first used to land in the talk."""
        before = self.focused
        self.focus_pending = True

        def focus_first() -> None:  # after a refresh, once the composer is enabled again
            self.focus_pending = False
            composer = self.query_one(Composer)
            focused = self.focused
            if focused is not before:  # the person moved the cursor meanwhile (Esc, a buyer's digit): it stays there
                return
            if focused is None or composer not in focused.ancestors_with_self:
                composer.focus_first()

        self.call_after_refresh(focus_first)

    # -- sending ----------------------------------------------------------------------

    def addressee(self) -> str | None:
        return None

    @on(Composer.Send)
    def _send(self, event: Composer.Send) -> None:
        composer = self.query_one(Composer)
        human = self.session.human
        if self.result is not None or not human.waiting:
            composer.error("not your turn" if self.result is None else "the episode is over")
            return
        draft = event.draft
        try:
            message = human.draft(self.session.view(), draft.kind, product=draft.product, price=draft.price,
                                  talk=draft.talk, to=self.addressee())
        except DraftError as error:
            composer.error(str(error), field=error.field)
            return
        if message.action.kind in ("end", "quit"):  # nothing undoes these: ask first
            ask = ConfirmEnd if message.action.kind == "end" else ConfirmLeave
            self.app.push_screen(ask(self.session), lambda yes: self._deliver(message) if yes else self._keep_selling())
            return
        self._deliver(message)

    def _keep_selling(self) -> None:
        """The person said no to ending the market (or leaving it): the composer goes back to its first action."""
        composer = self.query_one(Composer)
        composer.fill(composer.kinds[0], focus="price")

    def _deliver(self, message: Message) -> None:
        human = self.session.human
        if self.result is not None or not human.waiting:  # the market ended while the dialog was open
            return
        human.send(message)
        self.query_one(Composer).clear()
        self.query_one(Conversation).focus()
        self.after_send(message)
        self.sync()

    def after_send(self, message: Message) -> None:
        pass

    def action_send(self) -> None:
        if self.session.human.waiting:
            self.query_one(Composer).request_send()

    def action_board(self) -> None:
        self.query_one(Conversation).focus()

    def action_results(self) -> None:
        if self.result is not None:
            self.app.push_screen(ResultScreen(self.session))

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if not self.ready:
            return False
        waiting = self.session.human.waiting and self.result is None
        if action == "results":
            return self.result is not None
        if action in ("send", "fill"):
            return waiting
        return True

