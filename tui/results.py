"""The results of a play: the person's outcome and the market against OPT (and, for a seller, the oracle)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from negotiate.tui.session import PlaySession
from negotiate.tui.text import clean, money, ratio
from negotiate.tui.transcript import Recorded
from negotiate.tui.widgets import TooSmall

__all__ = ["ResultScreen", "END_WORDS"]


END_WORDS = {"sold_out": "every unit sold", "no_buyers": "no buyer left", "seller_end": "the seller ended it",
              "seller_idle": "the seller waited with no reply to come", "budget": "the turn budget ran out"}
"""Why an episode ended (``negotiate.trace.EndReason``), in words for the results."""


class ResultScreen(ModalScreen[None]):
    """The end of a play: the person's outcome and the market against OPT (and, for a seller, the oracle)."""

    BINDINGS = [
        Binding("escape", "dismiss", "Back to the board"),
        Binding("v", "replay", "Replay this episode"),
        Binding("q", "quit", "Quit"),  # the screen's own action, so that the typing guard below holds it back too
    ]
    lists_quit = True
    """Its footer lists q, which quits as ctrl+q does (the app leaves ctrl+q unlisted here)."""
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
        why = END_WORDS.get(end.reason, clean(end.reason))
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
