"""The two questions asked before what cannot be undone: the seller ending the market, a buyer leaving it.

Both are one modal of one shape (:class:`ConfirmLeave` is :class:`ConfirmEnd` with its own words), so they share a module.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from negotiate.tui.session import PlaySession
from negotiate.tui.widgets import TooSmall

__all__ = ["ConfirmEnd", "ConfirmLeave"]


class ConfirmEnd(ModalScreen[bool]):
    """Asks before the seller ends the market: y ends it, n or Esc goes back."""

    BINDINGS = [
        Binding("y", "dismiss(True)", "End the market"),
        Binding("n,escape", "dismiss(False)", "Keep selling"),
    ]

    box_title = "End the market?"

    def __init__(self, session: PlaySession) -> None:
        super().__init__()
        self.session = session

    def compose(self) -> ComposeResult:
        yield TooSmall()
        with Vertical(id="confirm-box"):
            yield Static(self._question(), id="confirm")
        yield Footer()

    def on_mount(self) -> None:
        # One handler, reading the class's title: Textual runs every class's own on_mount, the base's last, so a
        # subclass's handler setting its title was overwritten (the buyer's dialog said "End the market?").
        self.query_one("#confirm-box").border_title = self.box_title

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

    box_title = "Leave the market?"

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

