"""The seller's seat: the person sells, with the catalog and its costs, the turn budget, and a conversation per buyer.

The accept key and its hint are offered only for a bid the seller may accept now;
ending the market (^t) asks first.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, Label, ProgressBar, Tab, Tabs

from negotiate.protocol import SELLER, Message

from negotiate.tui.play import PlayScreen, board_table, fill_table, live, product_name, thread_text
from negotiate.tui.session import PlaySession
from negotiate.tui.text import esc
from negotiate.tui.widgets import Composer, Conversation, TooSmall

__all__ = ["SellerScreen"]


TAB_LEGEND = "● unread · … owes a reply · ✓ bought · ✗ left"
"""What the marks on the buyer tabs mean (under the conversation, whose tabs they are)."""


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

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield TooSmall()
        with Horizontal(id="top"):
            with Vertical(id="catalog-box"):
                yield board_table("catalog")
                with Horizontal(id="meter"):
                    yield Label("turns", id="meter-label")
                    yield ProgressBar(total=self.session.market.budget, show_eta=False, show_percentage=False, id="budget")
            yield board_table("buyers", padding=0)  # five columns in 44 cells at 80x24: spaced by hand
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
        self.query_one(Conversation).border_subtitle = TAB_LEGEND

    def reset_tables(self) -> None:
        catalog = self.query_one("#catalog", DataTable)
        catalog.clear(columns=True)
        catalog._shown = None
        catalog.add_columns("", "product", "cost", "left")

    # -- drawing ----------------------------------------------------------------------

    def _conversation(self, obs, buyer: str, *, notices: bool = False) -> list:
        """The messages between the seller and ``buyer``; with ``notices``, the market's notices too: a deal or a
        refused message after the exchange it came from, a product sold out in every conversation."""
        items, party = [], None
        for item in obs.history:
            if isinstance(item, Message):
                party = item.to if item.sender == SELLER else item.sender
                if party == buyer:
                    items.append(item)
            elif notices and (party == buyer or item.kind not in ("deal", "violation")):
                items.append(item)
        return items

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
        fill_table(self.query_one("#catalog", DataTable), [
            (Text(product.id, style="bold"), product_name(product.name, self._name_width), Text(f"${product.cost}"),
             Text("sold" if product.stock == 0 else str(product.stock), style="dim" if product.stock == 0 else ""))
            for product in obs.products])
        self.query_one("#budget", ProgressBar).update(total=obs.budget, progress=obs.turns_used)
        self.query_one("#meter-label", Label).update(Text(f"turns {obs.turns_used}/{obs.budget}"))
        rows = []
        for view in obs.buyers:
            items = self._conversation(obs, view.id)
            state, style = self._state(view)
            deal = self._deal(items) if view.status == "served" else None
            offer, bid = live(view.offer, obs.products), live(view.bid, obs.products)
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
        fill_table(self.query_one("#buyers", DataTable), rows)
        conversation = self.query_one(Conversation)
        conversation.border_title = esc(f"Conversation with {self.active}")
        conversation.show(thread_text(self._conversation(obs, self.active, notices=True), SELLER))
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
            bid = live(view.bid, obs.products)
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
        bid = live(view.bid, obs.products)
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

