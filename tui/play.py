"""The screens of ``negotiate play``: the person as buyer b1, or as the seller; and the results.

Each play screen starts the episode in a Textual worker (``run_episode`` runs on
Textual's own asyncio loop) and redraws when the session reports a change. The
person's view is ``observe(state, <their id>)`` and nothing else: a buyer sees its
own values, the seller's talk and actions to it (never the seller's thoughts) and
the stock; the seller sees costs, stock, the turn budget and each buyer's public
replies. The composer's draft is checked by :meth:`HumanAgent.draft` before it is
sent; the regulator still judges it. An offer or bid on a product that has sold
out is dead (nobody can accept it): the screens drop it rather than show it as
standing, and the seller's accept key and hint are offered only for a bid it
may accept now. Ending the market (the seller's ``end``, ^t) asks first: it
cannot be undone.
"""

from __future__ import annotations

import time

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message as UIMessage
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Header, Label, ProgressBar, Static, Tab, Tabs
from textual.worker import Worker, WorkerState

from negotiate.agents.human import DraftError
from negotiate.protocol import SELLER, Message, Notice
from negotiate.report import short_label

from negotiate.tui.session import PlayResult, PlaySession
from negotiate.tui.text import action_label, clean, esc, money, ratio
from negotiate.tui.transcript import Recorded
from negotiate.tui.widgets import Composer, Conversation, TooSmall

__all__ = ["BuyerScreen", "SellerScreen", "ResultScreen", "ConfirmEnd"]


def _thread_text(items, me: str) -> Table | None:
    """A conversation, literally: who spoke, their talk and their action (wrapped under the talk); notices dimmed."""
    if not items:
        return None
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(width=6, justify="right", no_wrap=True)
    grid.add_column(ratio=1)
    for item in items:
        if isinstance(item, Notice):
            grid.add_row(Text("·", style="dim"), Text(clean(item.text), style="dim italic"))
            continue
        mine = item.sender == me
        who = Text("you" if mine else clean(item.sender), style="bold cyan" if mine else "bold yellow")
        body = Text(clean(item.talk)) if item.talk else Text("(says nothing)", style="dim")
        body.append("\n" + action_label(item.action), style="bold" if item.action.kind != "reject" else "dim bold")
        grid.add_row(who, body)
    return grid


RULES_BUYER = Text(
    "You want one item.\n"
    "Surplus = your value - the price.\n"
    "The seller bargains with every\n"
    "buyer at once; stock is short.\n"
    "A bid may not exceed your value.",
    style="dim",
)


def _name(name: str, width: int = 14) -> Text:
    """A product name, cut to fit the side tables (14 cells up to 119 columns, 28 from 120)."""
    name = clean(name)
    return Text(name if len(name) <= width else name[: width - 1] + "…")


def _fill(table: DataTable, rows: list[tuple[Text, ...]]) -> None:
    """Replace a table's rows, unless they are what it shows already (a redraw restyles every cell)."""
    key = [tuple((cell.plain, str(cell.style)) for cell in row) for row in rows]
    if getattr(table, "_shown", None) == key:
        return
    table._shown = key
    table.clear()
    for row in rows:
        table.add_row(*row)


def _live(standing: tuple[str, int] | None, products) -> tuple[str, int] | None:
    """A standing offer or bid, or None once its product has sold out (nobody can accept it then)."""
    if standing is None:
        return None
    return standing if any(p.id == standing[0] and p.stock > 0 for p in products) else None


def _table(ident: str, padding: int = 1) -> DataTable:
    """A display-only table: no cursor, and no focus while it shows every row (the keyboard stays with the composer
    and the conversation); one that overflows (a big market) takes the focus, so the arrow keys can scroll it."""
    table = DataTable(id=ident, cursor_type="none", zebra_stripes=True, cell_padding=padding, classes="board-table")
    table.can_focus = False
    return table


def _focus_overflowing(screen: Screen) -> None:
    """Let Tab reach the board's tables that have rows or columns out of sight, and only those."""
    for table in screen.query(".board-table").results(DataTable):
        table.can_focus = table.max_scroll_y > 0 or table.max_scroll_x > 0


class PlayScreen(Screen):
    """What both seats share: the episode worker, redraws on change, sending, the results."""

    AUTO_FOCUS = ""  # none: the composer's first field (the price, or the action) takes the focus when a turn starts
    BINDINGS = [
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
        self.call_after_refresh(_focus_overflowing, self)  # once the new rows are laid out

    def draw(self, obs) -> None:  # pragma: no cover - every seat overrides it
        raise NotImplementedError

    def turn_started(self, obs) -> None:
        """The bus now waits for the person: put the cursor in the composer's first field, the action's price (the
        action itself when it takes none), unless it is in the composer already. The talk comes after it (Tab): a
        price typed first used to land in the talk."""
        offer = _live(getattr(obs, "offer", None), obs.products)
        if offer is not None:
            self.query_one(Composer).choose_product(offer[0])  # a bid or an accept is most likely about it

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


class BuyerScreen(PlayScreen):
    """The person is buyer b1: own values, the seller's messages to it, a reply composer."""

    BINDINGS = [
        Binding("ctrl+y", "fill('accept')", "Accept offer", priority=True),
        Binding("ctrl+o", "fill('bid')", "Bid", priority=True),
        Binding("ctrl+r", "fill('reject')", "Reject", priority=True),
        Binding("ctrl+l", "fill('quit')", "Leave", priority=True),
    ]

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield TooSmall()
        with Horizontal(id="board"):
            with Vertical(id="side"):
                yield _table("values")
                yield Static(id="standing")
                yield Static(RULES_BUYER, id="rules")
            yield Conversation("The seller has not written to you yet. It bargains with every buyer at once.", id="conversation")
        yield Composer("buyer", id="composer")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#values", DataTable).border_title = "Your values (private)"
        self.reset_tables()
        self.query_one("#conversation").border_title = "The seller and you"
        self.query_one("#standing").border_title = "Where you stand"
        self.query_one("#rules").border_title = "How it works"
        self.query_one(Composer).border_title = "Your reply"

    def reset_tables(self) -> None:
        table = self.query_one("#values", DataTable)
        table.clear(columns=True)
        table._shown = None
        table.add_columns("", "product", "value", "")

    def _deal(self, thread) -> Message | None:
        """The accept that made this buyer's deal, if it has one."""
        last_accept = None
        for item in thread:
            if isinstance(item, Message) and item.action.kind == "accept":
                last_accept = item
            elif isinstance(item, Notice) and item.kind == "deal":
                return last_accept
        return None

    def draw(self, obs) -> None:
        session = self.session
        offer, bid = _live(obs.offer, obs.products), _live(obs.bid, obs.products)
        rows = []
        for j, product in enumerate(obs.products):
            sold = product.stock == 0
            mark = Text("sold", style="dim") if sold else Text("◀ offer", style="yellow") if offer and offer[0] == product.id else Text("")
            rows.append((Text(product.id, style="bold"), _name(product.name, self._name_width), Text(f"${obs.values[j]}", style="dim" if sold else "bold green"), mark))
        _fill(self.query_one("#values", DataTable), rows)
        deal = self._deal(obs.thread)
        left_market = self._left(obs.thread)
        standing = Text()
        if deal is not None:
            j = next(k for k, p in enumerate(obs.products) if p.id == deal.action.product)
            standing.append("Deal: ", style="bold green")
            standing.append(f"{deal.action.product} at ${deal.action.price}\nyour surplus ${obs.values[j] - deal.action.price}")
        elif left_market:
            standing.append("You left the market.", style="bold")
        else:
            standing.append("Offer to you: ", style="bold")
            if offer:
                j = next(k for k, p in enumerate(obs.products) if p.id == offer[0])
                standing.append(f"{offer[0]} ${offer[1]}", style="yellow")
                standing.append(f" (value ${obs.values[j]})", style="dim")
            else:
                standing.append("none", style="dim")
            standing.append("\nYour bid: ", style="bold")
            standing.append(f"{bid[0]} ${bid[1]}" if bid else "none", style="cyan" if bid else "dim")
        stock = {p.id: p.stock for p in obs.products}
        for pid, before in getattr(self, "_stock", stock).items():
            if before and not stock[pid] and (deal is None or deal.action.product != pid):
                self.notify(f"{pid} has been sold to another buyer", timeout=5)
        self._stock = stock
        left = sum(p.stock for p in obs.products)
        turns, budget = session.seller_turns()
        standing.append(f"\nUnits left in the market: {left}", style="dim")
        standing.append("\nSeller's turns left: ", style="dim")
        standing.append(f"{turns} of {budget}", style="bold red" if turns <= 2 else "dim")
        self.query_one("#standing", Static).update(standing)
        self.query_one(Conversation).show(_thread_text(obs.thread, session.human_id))
        composer = self.query_one(Composer)
        composer.set_products([(p.id if p.stock else f"{p.id} sold", p.id, p.stock > 0) for p in obs.products])
        self._status(obs, offer, deal, left_market)

    def _left(self, thread) -> bool:
        """Whether this person has left the market (sent ``quit``)."""
        me = self.session.human_id
        return any(isinstance(item, Message) and item.sender == me and item.action.kind == "quit" for item in thread)

    def _status(self, obs, offer, deal, left_market: bool) -> None:
        composer = self.query_one(Composer)
        session = self.session
        turns, _ = session.seller_turns()
        budget = f" · {turns} turn{'s' if turns != 1 else ''} left"  # the seller's: short enough for 80 columns
        if self.result is not None:
            composer.status("The episode is over. v: results · ctrl+q: quit")
        elif session.human.waiting:
            if offer:
                j = next(k for k, p in enumerate(obs.products) if p.id == offer[0])
                composer.status(f"Your turn: the seller offers {offer[0]} ${offer[1]} (your value ${obs.values[j]}){budget}")
            else:
                composer.status(f"Your turn: the seller wrote to you (no offer stands){budget}")
        elif deal is not None:
            composer.status("You have your deal; the market plays out without you, then the results show.")
        elif left_market:
            composer.status("You left the market; it plays out without you, then the results show.")
        elif SELLER in session.thinking:
            composer.status(f"The seller is thinking…{budget}", thinking=True)
        else:
            composer.status("Waiting for the seller (it bargains with the other buyers too)…", thinking=True)

    def action_fill(self, kind: str) -> None:
        if not self.session.human.waiting or self.result is not None:
            return
        obs = self.session.view()
        composer = self.query_one(Composer)
        offer = _live(obs.offer, obs.products)
        if kind == "accept":
            if offer is None:
                composer.error("there is no standing offer to accept")
                return
            if _above_value(obs, offer):
                value = _value_of(obs, offer[0])
                composer.error(f"the offer, {offer[0]} at ${offer[1]}, is above your value of it (${value}); bid lower instead")
                return
            composer.fill("accept", offer[0], offer[1], focus="talk")
        elif kind == "bid":
            in_stock = [p.id for p in obs.products if p.stock]
            favourite = max(in_stock, key=lambda pid: obs.values[[p.id for p in obs.products].index(pid)], default=None)
            product = offer[0] if offer else favourite
            composer.fill("bid", product, None, focus="price")
        else:
            composer.fill(kind, focus="talk")

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "fill":
            waiting = self.ready and self.session.human.waiting and self.result is None
            if not waiting:
                return False
            if parameters and parameters[0] == "accept":  # an offer it can take: standing, in stock, within its value
                obs = self.session.view()
                offer = _live(obs.offer, obs.products)
                return offer is not None and not _above_value(obs, offer)
            return True
        return super().check_action(action, parameters)


def _above_value(obs, offer: tuple[str, int]) -> bool:
    """Whether a buyer's observed offer asks more than its value of the product (a deal the market refuses)."""
    value = _value_of(obs, offer[0])
    return value is not None and offer[1] > value


def _value_of(obs, product: str) -> int | None:
    """The buyer's value of ``product`` in its observation (None: not in the catalog)."""
    ids = [p.id for p in obs.products]
    return obs.values[ids.index(product)] if product in ids else None


class SellerScreen(PlayScreen):
    """The person is the seller: catalog and costs, the turn budget, a conversation per buyer."""

    BINDINGS = [
        Binding("ctrl+o", "fill('offer')", "Offer", priority=True),
        Binding("ctrl+y", "fill('accept')", "Accept", priority=True),
        Binding("ctrl+r", "fill('reject')", "Reject", priority=True),
        Binding("ctrl+t", "end", "End market", priority=True),
        Binding("ctrl+n", "next_buyer(1)", "Next buyer", priority=True),
        Binding("ctrl+p", "next_buyer(-1)", "Prev", show=False, priority=True),
        # Digits pick a buyer while the cursor is not in a text field (in one, they are text).
        *(Binding(str(k), f"buyer({k})", show=False) for k in range(1, 10)),
    ]

    def __init__(self, session: PlaySession) -> None:
        super().__init__(session)
        self.active = session.market.buyers[0].id
        self.seen: dict[str, int] = {b.id: 0 for b in session.market.buyers}
        self._notices = 0

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield TooSmall()
        with Horizontal(id="top"):
            with Vertical(id="catalog-box"):
                yield _table("catalog")
                with Horizontal(id="meter"):
                    yield Label("turns", id="meter-label")
                    yield ProgressBar(total=self.session.market.budget, show_eta=False, show_percentage=False, id="budget")
            yield _table("buyers", padding=0)  # five columns in 44 cells at 80x24: spaced by hand
        yield Tabs(*(Tab(b.id, id=f"tab-{b.id}") for b in self.session.market.buyers), id="threads")
        yield Conversation("Nothing said yet. ctrl+o makes this buyer an offer. Every message you send costs one turn; "
                           "buyers answer each one, and their values are theirs alone.", id="conversation")
        yield Composer("seller", id="composer")
        yield Footer()

    def on_mount(self) -> None:
        catalog = self.query_one("#catalog", DataTable)
        catalog.border_title = "Your catalog"
        market = self.session.market
        catalog.border_subtitle = f"values ${market.price_low}-${market.price_high}"
        self.reset_tables()
        buyers = self.query_one("#buyers", DataTable)
        buyers.border_title = "Buyers: your offers, their bids"
        buyers.add_columns(*(Text(f" {title}") for title in ("", "state", "offer", "bid", "deal")))

    def reset_tables(self) -> None:
        catalog = self.query_one("#catalog", DataTable)
        catalog.clear(columns=True)
        catalog._shown = None
        catalog.add_columns("", "product", "cost", "left")

    # -- drawing ----------------------------------------------------------------------

    def _conversation(self, obs, buyer: str) -> list:
        return [item for item in obs.history if isinstance(item, Message)
                and (item.sender == buyer or (item.sender == SELLER and item.to == buyer))]

    def _deal(self, items) -> Message | None:
        return next((item for item in reversed(items) if item.action.kind == "accept"), None)

    def _state(self, view) -> tuple[str, str]:
        if view.status == "served":
            return "bought", "green"
        if view.status == "gone":
            return "left", "dim"
        if view.id in self.session.thinking:
            return "thinking", "yellow"
        if view.awaiting:
            return "to reply", "yellow"
        return "free", "bold"

    def draw(self, obs) -> None:
        _fill(self.query_one("#catalog", DataTable), [
            (Text(product.id, style="bold"), _name(product.name, self._name_width), Text(f"${product.cost}"),
             Text("sold" if product.stock == 0 else str(product.stock), style="dim" if product.stock == 0 else ""))
            for product in obs.products])
        self.query_one("#budget", ProgressBar).update(total=obs.budget, progress=obs.turns_used)
        self.query_one("#meter-label", Label).update(Text(f"turns {obs.turns_used}/{obs.budget}"))
        rows = []
        for view in obs.buyers:
            items = self._conversation(obs, view.id)
            state, style = self._state(view)
            deal = self._deal(items) if view.status == "served" else None
            offer, bid = _live(view.offer, obs.products), _live(view.bid, obs.products)
            rows.append((Text(f" {view.id}", style="bold"), Text(f" {state}", style=style),
                          Text(f" {offer[0]} ${offer[1]}" if offer else " -", style="yellow" if offer else "dim"),
                          Text(f" {bid[0]} ${bid[1]}" if bid else " -", style="cyan" if bid else "dim"),
                          Text(f" {deal.action.product} ${deal.action.price}" if deal else " -", style="bold green" if deal else "dim")))
            said = sum(1 for item in items if item.sender == view.id)
            if view.id == self.active:
                self.seen[view.id] = said
            mark = " ●" if said > self.seen[view.id] else " ✓" if view.status == "served" else " ✗" if view.status == "gone" else " …" if view.awaiting else ""
            tab = self.query_one(f"#tab-{view.id}", Tab)
            if tab.label.plain != view.id + mark:
                tab.label = Text(view.id + mark)
        _fill(self.query_one("#buyers", DataTable), rows)
        conversation = self.query_one(Conversation)
        conversation.border_title = esc(f"Conversation with {self.active}")
        conversation.show(_thread_text(self._conversation(obs, self.active), SELLER))
        for item in obs.history[self._notices:]:
            if isinstance(item, Notice):
                self.notify(esc(item.text), severity="error" if item.kind == "violation" else "information", timeout=6)
        self._notices = len(obs.history)
        composer = self.query_one(Composer)
        composer.border_title = esc(f"Your message to {self.active}")
        composer.set_products([(p.id if p.stock else f"{p.id} sold", p.id, p.stock > 0) for p in obs.products])
        self._status(obs)

    def _status(self, obs) -> None:
        composer = self.query_one(Composer)
        session = self.session
        thinking = sorted(session.thinking)
        busy = f"{', '.join(thinking)} thinking…" if thinking else ""
        if self.result is not None:
            composer.status("The episode is over. v: results · ctrl+q: quit")
            return
        if not session.human.waiting:
            composer.status(f"Waiting for replies. {busy}".strip(), thinking=True)
            return
        view = next(b for b in obs.buyers if b.id == self.active)
        free = [b.id for b in obs.buyers if b.status == "active" and not b.awaiting]
        left = obs.budget - obs.turns_used
        head = f"Your turn · {left} turn{'s' if left != 1 else ''} left · "
        if view.status != "active" or view.awaiting:
            state = {"bought": "has bought", "left": "has left", "thinking": "is thinking"}.get(self._state(view)[0], "owes you a reply")
            others = f"free: {', '.join(free)} (^n)" if free else "no buyer is free"
            composer.status(f"{head}{self.active} {state}; {others}. {busy}".strip(), thinking=bool(thinking))
        else:
            bid = _live(view.bid, obs.products)
            if bid is None:
                said = f"Write to {self.active}. "
            elif self._acceptable(obs, view):
                said = f"{self.active} bids {bid[0]} ${bid[1]} (^y accepts). "
            else:
                cost = next(p.cost for p in obs.products if p.id == bid[0])
                said = f"{self.active} bids {bid[0]} ${bid[1]}, below its cost ${cost}. "
            composer.status(f"{head}{said}{busy}".strip(), thinking=bool(thinking))

    @staticmethod
    def _acceptable(obs, view) -> bool:
        """Whether the seller may accept this buyer's standing bid now: in stock, at or above cost, the buyer free."""
        bid = _live(view.bid, obs.products)
        if bid is None or view.status != "active" or view.awaiting:
            return False
        return next(p.cost for p in obs.products if p.id == bid[0]) <= bid[1]

    # -- the person's keys -----------------------------------------------------------------

    def addressee(self) -> str | None:
        return self.active

    @on(Tabs.TabActivated, "#threads")
    def _tab(self, event: Tabs.TabActivated) -> None:
        self.active = event.tab.id.removeprefix("tab-")
        self.sync()

    def action_buyer(self, number: int) -> None:
        ids = [b.id for b in self.session.market.buyers]
        if 1 <= number <= len(ids):
            self.query_one(Tabs).active = f"tab-{ids[number - 1]}"

    def action_next_buyer(self, step: int) -> None:
        ids = [b.id for b in self.session.market.buyers]
        self.query_one(Tabs).active = f"tab-{ids[(ids.index(self.active) + step) % len(ids)]}"

    def action_fill(self, kind: str) -> None:
        if not self.session.human.waiting or self.result is not None:
            return
        obs = self.session.view()
        composer = self.query_one(Composer)
        view = next(b for b in obs.buyers if b.id == self.active)
        if kind == "accept":
            if not self._acceptable(obs, view):
                composer.error(f"{self.active} has no bid you may accept now")
                return
            composer.fill("accept", view.bid[0], view.bid[1], focus="talk")
        elif kind == "offer":
            in_stock = [p.id for p in obs.products if p.stock]
            product = view.bid[0] if view.bid and view.bid[0] in in_stock else composer.query_one("#product").value
            if product not in in_stock:
                product = in_stock[0] if in_stock else None
            composer.fill("offer", product, None, focus="price")
        else:
            composer.fill(kind, focus="talk")

    def action_end(self) -> None:
        """End the market: the composer's talk goes with it, after the person confirms."""
        self.action_fill("end")
        self.action_send()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "end":
            action, parameters = "fill", ("end",)
        if action == "fill":
            if not self.ready or not self.session.human.waiting or self.result is not None:
                return False
            if parameters and parameters[0] == "accept":
                obs = self.session.view()
                view = next((b for b in obs.buyers if b.id == self.active), None)
                return view is not None and self._acceptable(obs, view)
            return True
        return super().check_action(action, parameters)

    def after_send(self, message: Message) -> None:
        """Move to the next buyer the seller may message (the one just messaged owes a reply)."""
        if message.action.kind == "end":
            return
        obs = self.session.view()
        ids = [b.id for b in obs.buyers]
        start = ids.index(self.active)
        for step in range(1, len(ids)):
            view = obs.buyers[(start + step) % len(ids)]
            if view.status == "active" and not view.awaiting and view.id != message.to:
                self.query_one(Tabs).active = f"tab-{view.id}"
                return


class ConfirmEnd(ModalScreen[bool]):
    """Asks before the seller ends the market: y ends it, n or Esc goes back."""

    BINDINGS = [
        Binding("y", "dismiss(True)", "End the market"),
        Binding("n,escape", "dismiss(False)", "Keep selling"),
    ]

    def __init__(self, session: PlaySession) -> None:
        super().__init__()
        self.session = session

    def compose(self) -> ComposeResult:
        yield TooSmall()
        with Vertical(id="confirm-box"):
            yield Static(self._question(), id="confirm")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#confirm-box").border_title = "End the market?"

    def _question(self) -> Text:
        obs = self.session.view()
        units = sum(p.stock for p in obs.products)
        active = sum(1 for b in obs.buyers if b.status == "active")
        left = obs.budget - obs.turns_used
        out = Text()
        out.append("End the market now? It cannot be undone.\n\n", style="bold")
        out.append(f"{units} unit{'s' if units != 1 else ''} unsold, {active} buyer{'s' if active != 1 else ''} still in the market, "
                   f"{left} turn{'s' if left != 1 else ''} left.\n\n")
        return _yes_no(out, "end it", "keep selling")


class ConfirmLeave(ConfirmEnd):
    """Asks before the buyer leaves the market: y leaves, n or Esc goes back."""

    BINDINGS = [
        Binding("y", "dismiss(True)", "Leave the market"),
        Binding("n,escape", "dismiss(False)", "Stay"),
    ]

    def on_mount(self) -> None:
        self.query_one("#confirm-box").border_title = "Leave the market?"

    def _question(self) -> Text:
        left, _ = self.session.seller_turns()
        out = Text()
        out.append("Leave the market now? It cannot be undone.\n\n", style="bold")
        out.append(f"You have no deal: leaving, your surplus is $0. The market has {left} turn{'s' if left != 1 else ''} left.\n\n")
        return _yes_no(out, "leave", "stay")


def _yes_no(out: Text, yes: str, no: str) -> Text:
    """``out`` with the dialog's keys appended: ``y: YES   n or Esc: NO``."""
    out.append("y", style="bold")
    out.append(f": {yes}   ")
    out.append("n", style="bold")
    out.append(" or ")
    out.append("Esc", style="bold")
    out.append(f": {no}")
    return out


_END_WORDS = {"sold_out": "every unit sold", "no_buyers": "no buyer left", "seller_end": "the seller ended it",
              "seller_idle": "the seller waited with no reply to come", "budget": "the turn budget ran out"}
"""Why an episode ended (``negotiate.trace.EndReason``), in words for the results."""


class ResultScreen(ModalScreen[None]):
    """The end of a play: the person's outcome and the market against OPT (and, for a seller, the oracle)."""

    BINDINGS = [
        Binding("escape", "dismiss", "Back to the board"),
        Binding("v", "replay", "Replay this episode"),
        Binding("q", "quit", "Quit"),  # the screen's own action, so that the typing guard below holds it back too
    ]
    GRACE = 0.8
    """Seconds the keys wait after the results appear: the person may still be typing a message."""

    def __init__(self, session: PlaySession) -> None:
        super().__init__()
        self.session = session
        self._opened = time.monotonic()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("dismiss", "replay", "quit") and time.monotonic() - self._opened < self.GRACE:
            return False
        return True

    def compose(self) -> ComposeResult:
        yield TooSmall()
        with Vertical(id="result-box"):
            yield Static(self._summary(), id="result")
        yield Footer()

    def on_mount(self) -> None:
        self._opened = time.monotonic()  # the guard runs from when the results are there to see, not from when they were built
        self.query_one("#result-box").border_title = "Episode over"
        self.set_timer(self.GRACE + 0.05, self.refresh_bindings)

    def _summary(self) -> Text:
        session = self.session
        result = session.result
        episode = result.episode
        end = episode.end
        m = episode.metrics or {}
        out = Text()
        if episode.outcome == "failed":
            out.append(f"The episode failed: {clean(episode.reason)}\n\n", style="bold red")
            out.append(f"Nobody's play decided it, so it has no score. It is kept in {clean(result.trace)} as "
                       f"{clean(episode.id)}, marked failed; training skips it.")
            return out
        why = _END_WORDS.get(end.reason, clean(end.reason))
        out.append(f"The market ended: {why}, after {end.turns_used} of {end.budget} turns\n\n", style="bold")
        deals = episode.deals()
        opt_value, pairs = session.opt
        if session.role == "buyer":
            mine = next((d for d in deals if d.buyer == session.human_id), None)
            out.append("You: ", style="bold cyan")
            if mine:
                out.append(f"bought {mine.product} at ${mine.price}; your value ${mine.value}, so your surplus is ")
                out.append(f"${mine.value - mine.price}\n", style="bold green")
            else:
                out.append("no deal; your surplus is $0\n")
            best = [p for b, p in sorted(pairs) if b == session.human_id]
            out.append(f"     OPT would match you with {best[0]}\n" if best else "     OPT would not sell to you\n", style="dim")
            out.append("\nThe market: ", style="bold")
            out.append(f"{len(deals)} deal{'s' if len(deals) != 1 else ''} for {len(session.market.buyers)} buyer{'s' if len(session.market.buyers) != 1 else ''}\n")
            out.append(f"  seller profit {money(m.get('profit'))} of OPT {money(opt_value)}: profit/OPT {ratio(m.get('profit_ratio'))}\n")
            out.append(f"  welfare {money(m.get('welfare'))}: welfare/OPT {ratio(m.get('welfare_ratio'))}\n")
            out.append(f"  OPT matching: {', '.join(f'{b}-{p}' for b, p in sorted(pairs)) or 'none'}; "
                       f"made: {', '.join(d.buyer + '-' + d.product for d in deals) or 'none'}\n")
        else:
            oracle = result.oracle.metrics if result.oracle is not None and result.oracle.metrics else {}
            rows = [
                ("profit", money(m.get("profit")), money(oracle.get("profit"))),
                ("profit/OPT", ratio(m.get("profit_ratio")), ratio(oracle.get("profit_ratio"))),
                ("welfare/OPT", ratio(m.get("welfare_ratio")), ratio(oracle.get("welfare_ratio"))),
                ("deals", str(m.get("deals", "-")), str(oracle.get("deals", "-"))),
                ("turns used", str(m.get("turns_used", "-")), str(oracle.get("turns_used", "-"))),
                ("violations", str(sum((m.get("violations") or {}).values())), str(sum((oracle.get("violations") or {}).values()))),
            ]
            out.append(f"{'':14}{'you':>10}{'oracle':>10}\n", style="bold")
            for name, you, them in rows:
                out.append(f"{name:14}{you:>10}{them:>10}\n")
            out.append(f"OPT {money(opt_value)}. The oracle sees every valuation and faces the same buyers.\n", style="dim")
            made = {(d.buyer, d.product): d for d in deals}
            out.append("OPT matching: ")
            for k, (b, p) in enumerate(sorted(pairs)):
                out.append(", " if k else "")
                out.append(f"{b}-{p}", style="green" if (b, p) in made else "red")
            out.append("\nYour deals: " + (", ".join(f"{d.buyer}-{d.product} ${d.price}" for d in deals) or "none") + "\n")
        out.append(f"\nSaved to {clean(result.trace)} as {clean(episode.id)}", style="dim")
        return out

    def action_quit(self) -> None:
        self.app.exit()

    def action_replay(self) -> None:
        from negotiate.tui.replay import ReplayScreen

        result = self.session.result
        self.app.switch_screen(ReplayScreen([Recorded(result.episode.events)], str(result.trace)))
