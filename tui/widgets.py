"""The widgets the screens are built from.

Widgets show what they are given and post typed messages for what the person
does (:class:`Composer.Send`); the screens decide. Every string that came from an
agent or a trace is shown as :class:`rich.text.Text` (see ``tui/text.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message as UIMessage
from textual.widget import Widget
from textual.widgets import Button, Input, Label, LoadingIndicator, Select, Static

from negotiate.protocol import BUYER_ACTIONS, PRICED, SELLER_ACTIONS, TALK_MAX

from negotiate.tui.text import clean

__all__ = ["TooSmall", "Conversation", "Composer", "PriceChart", "MIN_SIZE"]

MIN_SIZE = (80, 24)
"""The smallest terminal the layouts are made for."""


class TooSmall(Static):
    """Shown instead of the layout when the terminal is smaller than :data:`MIN_SIZE`."""

    def __init__(self) -> None:
        super().__init__(self._message(None), id="too-small")

    @staticmethod
    def _message(size) -> Text:
        now = f" (now {size.width}x{size.height})" if size is not None else ""
        return Text(f"terminal too small (need {MIN_SIZE[0]}x{MIN_SIZE[1]}){now}\n\nEnlarge the window, or press ctrl+q to quit.", justify="center")

    def on_resize(self) -> None:
        self.update(self._message(self.app.size))


class Conversation(VerticalScroll):
    """A scrolling transcript; :meth:`show` replaces its text and scrolls to the newest line."""

    def __init__(self, placeholder: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.placeholder = placeholder
        self.can_focus = True

    def compose(self) -> ComposeResult:
        yield Static(Text(self.placeholder, style="dim"), classes="body")

    def show(self, content, *, follow: bool = True) -> None:
        """Show ``content`` (a Rich renderable; None or empty text shows the placeholder)."""
        body = self.query_one(".body", Static)
        empty = content is None or (isinstance(content, Text) and not content.plain)
        body.update(Text(self.placeholder, style="dim") if empty else content)
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False)


@dataclass(frozen=True)
class Draft:
    """What the person put in the composer, as typed (``HumanAgent.draft`` checks it)."""

    kind: str
    """The action: offer / accept / reject / end, or bid / accept / reject / quit."""
    product: str | None
    """The product chosen, if any."""
    price: str
    """The price field's text."""
    talk: str
    """The talk field's text."""


class Composer(Widget):
    """Action, product, price and talk, with a status line; posts :class:`Composer.Send`.

    Enter in the price or talk field sends; the screen checks the draft and either
    sends it or shows why not with :meth:`error`. An error stays on the status line,
    over any status the screen sets meanwhile (the market moves on while the person
    reads), until the person changes a field, sends, or the turn ends
    (:meth:`clear_error`). The fields take what is typed as typed; checking is the
    draft's job, so nothing is silently dropped or rewritten.
    """

    BINDINGS = [
        Binding("up", "cycle_product(-1)", "Product", key_display="↑↓"),
        Binding("down", "cycle_product(1)", "Product", show=False),
    ]

    class Send(UIMessage):
        """The person asked to send the draft."""

        def __init__(self, draft: Draft) -> None:
            super().__init__()
            self.draft = draft

    def __init__(self, role: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.role = role
        self.kinds = SELLER_ACTIONS if role == "seller" else BUYER_ACTIONS
        self._products: list[tuple[str, str, bool]] = []
        self._status: tuple[Text, bool] = (Text(""), False)
        """The screen's latest status and spinner, shown again once an error is cleared."""
        self.error_text: str | None = None
        """The error on show, if any."""

    def compose(self) -> ComposeResult:
        with Horizontal(classes="fields"):
            yield Select([(kind, kind) for kind in self.kinds], value=self.kinds[0], allow_blank=False, compact=True, id="kind")
            yield Select([], prompt="product", compact=True, id="product")
            yield Input(placeholder="price $", compact=True, id="price")
            yield Input(placeholder="talk (what you say)", compact=True, max_length=TALK_MAX, id="talk")
            yield Button("Send", compact=True, variant="primary", id="send")
        with Horizontal(classes="status-row"):
            yield LoadingIndicator(id="spinner")
            yield Label("", id="status")

    def on_mount(self) -> None:
        self._sync_fields()

    # -- what the screen sets -------------------------------------------------------

    def set_products(self, products: list[tuple[str, str, bool]]) -> None:
        """(label, id, available) triples; the chosen product stays chosen while it is available. One that sold out
        meanwhile is not kept: the field goes back to its prompt, and the person chooses again (it used to stay, so
        the seller's next message, to the next buyer, was about the product just sold)."""
        if products == self._products:
            return
        self._products = products
        select = self.query_one("#product", Select)
        keep = select.value
        select.set_options([(Text(label), pid) for label, pid, _ in products])
        if keep in self.available():
            select.value = keep

    def available(self) -> list[str]:
        """The products the person may choose now (in stock), in catalog order."""
        return [pid for _, pid, available in self._products if available]

    @property
    def product(self) -> str | None:
        """The product chosen, or None while the field shows its prompt."""
        value = self.query_one("#product", Select).value
        return value if isinstance(value, str) else None

    def choose_product(self, product: str) -> None:
        if product in [pid for _, pid, _ in self._products]:
            self.query_one("#product", Select).value = product

    def fill(self, kind: str, product: str | None = None, price: int | None = None, *, focus: str = "talk") -> None:
        """Set the action (and product and price: a price left None keeps what the person typed), then focus one
        field: ``talk``, ``price`` (the action instead, when it takes no price) or ``none``."""
        self.query_one("#kind", Select).value = kind
        if product is not None:
            select = self.query_one("#product", Select)
            if product in [pid for _, pid, _ in self._products]:
                select.value = product
        if price is not None:
            self.query_one("#price", Input).value = str(price)
        self._sync_fields()
        if focus == "price":
            self.focus_first()
        elif focus != "none":
            self._focus(self.query_one(f"#{focus}", Input))

    def focus_first(self) -> None:
        """Focus the field a person fills first: the price of a priced action, else the action (the talk comes after)."""
        self._focus(self.query_one("#price" if self.kind in PRICED else "#kind"))

    def _focus(self, field: Widget) -> None:
        """Move the cursor to ``field`` now, not after the keys already queued (``Widget.focus`` waits for them): a
        person who presses ^y and types on at once has the words in the talk field, not in the field left behind."""
        if field.focusable:
            self.screen.set_focus(field)
        else:
            field.focus()

    def clear(self) -> None:
        """After a send: empty fields and the first action again (a reject or a leave is never carried to the next message)."""
        self.query_one("#talk", Input).value = ""
        self.query_one("#price", Input).value = ""
        self.query_one("#kind", Select).value = self.kinds[0]
        self._sync_fields()
        self.clear_error()

    def status(self, text: str | Text, *, thinking: bool = False) -> None:
        """Set the status line (kept behind an error until it is cleared)."""
        self._status = (text if isinstance(text, Text) else Text(text), thinking)
        if self.error_text is None:
            self._show(*self._status, error=False)

    def error(self, text: str, *, field: str | None = None) -> None:
        """Show why the draft was not sent, marking ``field`` (``price``, ``product``, ``talk``) if it is the cause."""
        self.error_text = clean(text)
        for name in ("product", "price", "talk"):
            self.query_one(f"#{name}").set_class(name == field, "wrong")
        self._show(Text(self.error_text), False, error=True)

    def clear_error(self) -> None:
        if self.error_text is None:
            return
        self.error_text = None
        for name in ("product", "price", "talk"):
            self.query_one(f"#{name}").remove_class("wrong")
        self._show(*self._status, error=False)

    def _show(self, text: Text, thinking: bool, *, error: bool) -> None:
        label = self.query_one("#status", Label)
        label.update(text)
        label.set_class(error, "error")
        self.query_one("#spinner", LoadingIndicator).display = thinking and not error

    def action_cycle_product(self, step: int) -> None:
        """Choose the previous or next product in stock without leaving the price or talk field."""
        products = self.available()
        select = self.query_one("#product", Select)
        if not products or select.disabled:
            return
        index = products.index(select.value) + step if select.value in products else (0 if step > 0 else -1)
        select.value = products[index % len(products)]

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "cycle_product":
            return self.kind in PRICED and not self.disabled
        return True

    @property
    def kind(self) -> str:
        return str(self.query_one("#kind", Select).value)

    # -- events ----------------------------------------------------------------------

    def _sync_fields(self) -> None:
        priced = self.kind in PRICED
        self.query_one("#product", Select).disabled = not priced
        self.query_one("#price", Input).disabled = not priced
        # Input's own up/down bindings hide the product keys from the footer: say them here.
        self.border_subtitle = "↑↓ product · Enter sends · Esc board" if priced else "Enter sends · Esc board"

    @on(Select.Changed, "#kind")
    def _kind_changed(self) -> None:
        self._sync_fields()

    @on(Input.Changed)
    @on(Select.Changed)
    def _edited(self) -> None:
        self.clear_error()

    @on(Input.Submitted)
    @on(Button.Pressed, "#send")
    def _submit(self, event) -> None:
        event.stop()
        self.request_send()

    def request_send(self) -> None:
        product = self.query_one("#product", Select).value
        self.post_message(self.Send(Draft(
            kind=self.kind,
            product=product if isinstance(product, str) else None,
            price=self.query_one("#price", Input).value,
            talk=self.query_one("#talk", Input).value,
        )))


BLOCKS = "▁▂▃▄▅▆▇█"
KIND_STYLES = {"offer": "yellow", "bid": "cyan", "accept": "bold green"}


class PriceChart(Static):
    """Prices over time, one row per buyer: a bar per priced message, height = price in the public range.

    Seller offers are yellow, buyer bids cyan, accepts green; the row ends with the
    buyer's deal. Scaled on the market's price range so buyers compare at a glance.
    A market with more buyers than :attr:`ROWS` shows the buyers with prices first
    and ends with a row that counts and names the others (they used to be cut off
    with no hint).
    """

    ROWS = 7
    """Buyer rows that fit (the chart is at most 10 rows high: its border, the legend and these)."""

    def plot(self, buyers: list[str], points: dict[str, list[tuple[str, int]]], deals: dict[str, tuple[str, int]],
             low: int, high: int) -> None:
        self._data = (buyers, points, deals, low, high)
        self.refresh()

    def render(self) -> Text:
        data = getattr(self, "_data", None)
        out = Text()
        out.append("offer", style=KIND_STYLES["offer"])
        out.append(" ")
        out.append("bid", style=KIND_STYLES["bid"])
        out.append(" ")
        out.append("accept", style=KIND_STYLES["accept"])
        if data is None:
            return out
        buyers, points, deals, low, high = data
        out.append(f" ▁${low}..█${high}", style="dim")
        span = max(1, high - low)
        width = max(8, self.content_size.width)
        hidden: list[str] = []
        if len(buyers) > self.ROWS:
            priced = [b for b in buyers if points.get(b) or b in deals]
            keep = set((priced + [b for b in buyers if b not in priced])[: self.ROWS - 1])
            hidden = [b for b in buyers if b not in keep]
            buyers = [b for b in buyers if b in keep]
        for buyer in buyers:
            series = points.get(buyer, [])
            deal = deals.get(buyer)
            tail = f" {series[-1][0]} ${series[-1][1]}" if series and not deal else ""
            if deal:
                tail = f" deal {deal[0]} ${deal[1]}"
            room = max(1, width - 4 - len(tail))
            shown = series[-room:]
            out.append("\n")
            out.append(f"{buyer:<4}", style="bold")
            for kind, price in shown:
                level = min(len(BLOCKS) - 1, max(0, int((price - low) / span * len(BLOCKS))))
                out.append(BLOCKS[level], style=KIND_STYLES.get(kind, ""))
            if not series:
                out.append("·", style="dim")
            out.append(tail, style="bold green" if deal else "dim")
        if hidden:
            out.append("\n")
            out.append(_cut(f"+{len(hidden)} more buyers, not shown: {' '.join(hidden)}", width), style="dim italic")
        return out


def _cut(line: str, width: int) -> str:
    """``line``, cut to ``width`` cells with an ellipsis.

    >>> _cut("+3 more buyers, not shown: b8 b9 b10", 30)
    '+3 more buyers, not shown: b8…'
    """
    return line if cell_len(line) <= width else line[: width - 1] + "…"
