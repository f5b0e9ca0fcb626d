"""The buyer's seat: the person is buyer b1, with its own values, the seller's messages to it and a reply composer."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, Static

from negotiate.protocol import SELLER, Message, Notice

from negotiate.tui.play import PlayScreen, board_table, fill_table, live, product_name, thread_text
from negotiate.tui.widgets import Composer, Conversation, TooSmall

__all__ = ["BuyerScreen"]


RULES_BUYER = Text(
    "You want one item. Surplus =\n"
    "value - price; bid within value.\n"
    "On your turn the market waits.\n"
    "The seller bargains with every\n"
    "buyer at once; stock is short.",
    style="dim",
)



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
                yield board_table("values")
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

    def __init__(self, session) -> None:
        super().__init__(session)
        self._news: list[tuple[int, Notice]] = []
        """What the market did that this buyer's thread does not say (a unit sold to another buyer), and where in the
        thread it happened: shown in the conversation, in its place."""

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
        offer, bid = live(obs.offer, obs.products), live(obs.bid, obs.products)
        rows = []
        for j, product in enumerate(obs.products):
            sold = product.stock == 0
            mark = Text("sold", style="dim") if sold else Text("◀ offer", style="yellow") if offer and offer[0] == product.id else Text("")
            rows.append((Text(product.id, style="bold"), product_name(product.name, self._name_width), Text(f"${obs.values[j]}", style="dim" if sold else "bold green"), mark))
        fill_table(self.query_one("#values", DataTable), rows)
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
                self._news.append((len(obs.thread), Notice(session.human_id, "sold_out", f"{pid} sold to another buyer")))
        self._stock = stock
        left = sum(p.stock for p in obs.products)
        turns, budget = session.seller_turns()
        standing.append(f"\nUnits left in the market: {left}", style="dim")
        standing.append("\nSeller's turns left: ", style="dim")
        standing.append(f"{turns} of {budget}", style="bold red" if turns <= 2 else "dim")
        self.query_one("#standing", Static).update(standing)
        self.query_one(Conversation).show(thread_text(self._with_news(obs.thread), session.human_id))
        composer = self.query_one(Composer)
        composer.set_products([(p.id if p.stock else f"{p.id} sold", p.id, p.stock > 0) for p in obs.products])
        # The market holds still while it is this person's turn (PlaySession.wait_for_person): say so where they type.
        composer.border_title = "Your reply · the market waits for you" if session.person_owes and self.result is None else "Your reply"
        self._status(obs, offer, deal, left_market)

    def _with_news(self, thread) -> list:
        """The thread with the market's news in the places it happened."""
        items = list(thread)
        for at, notice in reversed(self._news):
            items.insert(min(at, len(items)), notice)
        return items

    def turn_started(self, obs) -> None:
        """A reply is about the product the person chose last (their bid's), and stays so: the seller's offer on
        another product is in the status line, and ^y takes it. Only a composer with no product (the first turn, or
        the chosen one sold) starts on the offer's product (it used to switch to it at every offer, without a word)."""
        composer = self.query_one(Composer)
        offer = live(obs.offer, obs.products)
        if composer.product is None and offer is not None:
            composer.choose_product(offer[0])
        super().turn_started(obs)

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
        offer = live(obs.offer, obs.products)
        if kind == "accept":
            if offer is None:
                composer.error("there is no standing offer to accept")
                return
            if _above_value(obs, offer):
                value = _value_of(obs, offer[0])
                composer.error(f"the offer, {offer[0]} at ${offer[1]}, is above your value of it (${value}); bid lower instead")
                return
            composer.fill("accept", offer[0], offer[1], focus="talk")
        elif kind == "bid":  # on the product chosen; with none, the offer's, else the one the person values most
            in_stock = composer.available()
            favourite = max(in_stock, key=lambda pid: _value_of(obs, pid), default=None)
            product = composer.product or (offer[0] if offer else favourite)
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
                offer = live(obs.offer, obs.products)
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

