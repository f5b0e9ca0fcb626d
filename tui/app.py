"""The Textual app: one App, one first screen (buyer play, seller play or replay).

App -> Screens -> widgets. The app holds what every screen shares: the stylesheet
(``app.tcss``), the size breakpoints that swap any layout for a "terminal too
small" message below 80x24, quitting (twice, while a played episode is
unfinished, since an unfinished episode is not saved; one quit key listed per
footer), and, behind ``play --web``, the warning a minute before the server gives
up the seat of a visitor who sends no key or click.

While "terminal too small" is shown, the layout is hidden but still focused and
bound: the app drops every key (but ctrl+q) and paste before a screen sees it,
so nothing can be typed or sent blind. SIGTERM exits like ctrl+q, through
Textual's own shutdown, so the terminal leaves the alternate screen with mouse
tracking off (Python's default action kills the process with the terminal as it
was); the exit code is then 143, a shell's code for SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import time

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from negotiate.tui.session import PlaySession
from negotiate.tui.transcript import Recorded
from negotiate.tui.widgets import MIN_SIZE

__all__ = ["NegotiateApp", "SIGTERM_EXIT"]

SIGTERM_EXIT = 128 + signal.SIGTERM
"""The app's return code after SIGTERM (143)."""


class NegotiateApp(App[None]):
    """``negotiate play`` and ``negotiate replay``."""

    CSS_PATH = "app.tcss"
    TITLE = "negotiate"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (MIN_SIZE[0], "-wide"), (120, "-wider")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (MIN_SIZE[1], "-tall")]
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        # The same key, unlisted, where the screen lists a quit key of its own (q in the results and the replay):
        # the footer named Quit twice there.
        Binding("ctrl+q", "quit('unlisted')", "Quit", show=False, priority=True),
    ]

    def __init__(self, *, session: PlaySession | None = None, episodes: list[Recorded] | None = None,
                 source: str = "", index: int = 0, idle_warning: float | None = None) -> None:
        super().__init__()
        if (session is None) == (episodes is None):
            raise ValueError("give a play session or recorded episodes, not both")
        self.session = session
        self.episodes = episodes
        self.source = source
        self.index = index
        self.idle_warning = idle_warning
        """Seconds without a key or a click after which the person is told their seat will soon be given up (``play
        --web``, a minute before the server does); None: never."""
        self._heard = time.monotonic()
        self._warned = False
        self._quit_asked = 0.0

    @classmethod
    def play(cls, session: PlaySession, idle_warning: float | None = None) -> NegotiateApp:
        return cls(session=session, idle_warning=idle_warning)

    @classmethod
    def replay(cls, episodes: list[Recorded], source: str, index: int = 0) -> NegotiateApp:
        return cls(episodes=episodes, source=source, index=index)

    @property
    def too_small(self) -> bool:
        """True while the terminal is below :data:`MIN_SIZE` and the layout is hidden."""
        return self.size.width < MIN_SIZE[0] or self.size.height < MIN_SIZE[1]

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, (events.Key, events.MouseEvent, events.Paste)) and not event.is_forwarded:
            self._heard = time.monotonic()  # the person is there (the server counts the same input)
            if self._warned:
                self._warned = False
                self.clear_notifications()  # the warning is void
        if (isinstance(event, (events.Key, events.Paste)) and not event.is_forwarded and self.too_small
                and getattr(event, "key", None) != "ctrl+q"):
            event.stop()
            return
        await super().on_event(event)

    def on_mount(self) -> None:
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._terminated)
        except (NotImplementedError, RuntimeError, ValueError):  # no signals here (Windows, or not the main thread)
            pass
        if self.idle_warning is not None:
            self._heard = time.monotonic()
            self.set_interval(min(5.0, self.idle_warning / 4), self._idle_check)

    def _idle_check(self) -> None:
        if not self._warned and time.monotonic() - self._heard >= self.idle_warning:
            self._warned = True
            self.notify("Still there? Without a key or a click in the next minute, this game ends (unsaved if "
                        "unfinished) and its seat goes to the next visitor.", severity="warning", timeout=60)

    def on_unmount(self) -> None:
        try:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    def _terminated(self) -> None:
        self.exit(return_code=SIGTERM_EXIT)

    def get_default_screen(self) -> Screen:
        if self.session is not None:
            if self.session.role == "seller":
                from negotiate.tui.seller import SellerScreen

                return SellerScreen(self.session)
            from negotiate.tui.buyer import BuyerScreen

            return BuyerScreen(self.session)
        from negotiate.tui.replay import ReplayScreen

        return ReplayScreen(self.episodes, self.source, self.index)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "quit":  # one of ctrl+q's two bindings: listed unless the screen lists its own quit key
            return (parameters == ("unlisted",)) == bool(getattr(self.screen, "lists_quit", False))
        return True

    async def action_quit(self, _unlisted: str = "") -> None:
        session = self.session
        if session is not None and session.result is None and time.monotonic() - self._quit_asked > 3:
            self._quit_asked = time.monotonic()
            self.notify("The episode is not over and will not be saved. Press ctrl+q again to quit.", severity="warning", timeout=3)
            return
        self.exit()
