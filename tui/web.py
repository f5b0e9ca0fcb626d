"""``negotiate play --web``: the play screens in a browser, one process and one episode per visitor.

Whoever starts the server fixes everything a visitor plays: the role, the market spec,
the seller and the buyers, the trace folder. A visitor opens the page; the page's
websocket asks for a seat; the server starts ``python -m negotiate play`` for it with
the server's own arguments plus a market seed and an episode index of its choosing,
through textual-serve's :class:`~textual_serve.app_service.AppService` (the process
runs the same Textual app as the terminal, on Textual's web driver, its screen and keys
carried over the websocket). Nothing the visitor sends reaches a shell or names a file:
the command is built here and quoted, the visitor's keys go to the app's stdin, and the
screen size they ask for is clamped. The page is served from here too (textual-serve's
own script and font, no third-party font request, no directory listing, no download
route: the app delivers no files).

* **One episode per visitor.** Each seat gets the run's next episode index (one past
  the highest in ``OUT/play.jsonl`` when the server started) and a market seed that no
  other visitor of this server got: ``--seed S`` gives visitor k (from 0) market S + k,
  so a study can be played again market for market; without it each seed is fresh. The
  index makes the episode id (``play-buyer-0007``) and keeps ``report`` and ``train``
  able to tell the episodes apart; the children append to one ``play.jsonl`` under an
  ``flock`` (:class:`~negotiate.tui.session.PlaySession`). A visitor who leaves before
  the end leaves no episode (as in the terminal) and a gap in the indices.
* **A cap on players** (``--max-players``). At the cap the page says, in words, that
  every seat is taken and retries by itself every 30 s (HTTP 503); a websocket that
  comes in past the cap (two pages loaded at once) shows the same sentence in the
  terminal, and no process starts.
* **The keyboard goes to the game.** The page gives the terminal the keyboard as soon as
  the app has drawn (a visitor's first keys used to reach nothing until they clicked,
  and the app's footer showed no keys until then).
* **An idle seat is given up** after :data:`~negotiate.tui.commands.IDLE_S` without a key
  or a click from the visitor (the person's deadline is an hour, so an idle visitor held a
  seat that long): the app warns a minute before, then quits (an unfinished episode is not
  saved, as when the visitor leaves), and the page says the game has ended. The market waits for a person whose turn it is
  (:mod:`negotiate.tui.session`), so only the visitor's own time runs out.
* **What the log counts.** Each seat's line says whether its episode was saved (read
  from ``OUT/play.jsonl``), and the last line counts the visitors and the episodes
  saved apart: "9 visitors played" once counted 5 who had saved nothing.
* **127.0.0.1 by default.** Serving other machines is a choice (``--host 0.0.0.0``); the
  page builds its websocket address from the address the browser used (``wss`` where a
  TLS proxy says ``X-Forwarded-Proto: https``), so it works behind whatever name
  reaches the server. There is no login: a study on the open internet puts the server
  behind a proxy that has one.

Measured (``benchmarks/web_players.py``, 4 to 16 players on 2 busy cores; see
``docs/web-play.md``): a player is one Python process of about 95 MB (PSS; 136 MB RSS)
that takes about 2 CPU s to start, 2% of a core while the person thinks, and 0.5-0.6
CPU s per move: some 12 people per core who move every 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import shlex
import signal
import sys
from pathlib import Path

from negotiate.errors import UserError
from negotiate.trace import scan

from negotiate.tui.commands import IDLE_S, prepare
from negotiate.tui.session import TRACE_NAME, fresh_seed

try:
    import textual_serve
    from aiohttp import WSMsgType, web
    from textual_serve.app_service import AppService
    from textual_serve.download_manager import DownloadManager
except ImportError:  # the extra is missing: serve() says so in one line
    web = DownloadManager = None

__all__ = ["serve", "Seats", "child_command", "PlayServer", "DEFAULT_HOST", "DEFAULT_PORT", "DEFAULT_MAX_PLAYERS"]

DEFAULT_HOST = "127.0.0.1"
"""Only this machine, unless ``--host`` says otherwise."""
DEFAULT_PORT = 8000
DEFAULT_MAX_PLAYERS = 8
"""Visitors playing at once; see the measured cost of one in ``docs/web-play.md``."""
MAX_SIZE = (400, 150)
"""The largest screen (columns, rows) a visitor's browser may ask for: a bigger one costs the server memory and
time for nothing a person could read."""
FULL_RETRY_S = 30
"""How often the "every seat is taken" page reloads itself."""


class Seats:
    """Who is playing now, and what the next visitor gets: the run's next episode index and a market seed of its own."""

    def __init__(self, limit: int, first_index: int, seed: int | None = None):
        self.limit = limit
        """``--max-players``."""
        self.playing = 0
        """Visitors with a process now."""
        self.given = 0
        """Seats given so far (visitor k gets market ``seed + k`` with ``--seed``)."""
        self.first_index = first_index
        self.seed = seed
        self._seeds: set[int] = set()

    def take(self) -> tuple[int, int] | None:
        """(episode index, market seed) for a new visitor, or None when every seat is taken."""
        if self.playing >= self.limit:
            return None
        if self.seed is not None:
            seed = self.seed + self.given
        else:
            seed = fresh_seed()
            while seed in self._seeds:
                seed = fresh_seed()
        self._seeds.add(seed)
        index = self.first_index + self.given
        self.given += 1
        self.playing += 1
        return index, seed

    def leave(self) -> None:
        self.playing -= 1


def child_command(args: argparse.Namespace, index: int, seed: int) -> str:
    """The shell command that plays one visitor's episode: the server's own settings, quoted, and the seat's seed and
    index; nothing in it comes from the visitor.

    >>> args = argparse.Namespace(role="buyer", split="specs/my market.toml", seller=None, buyers="concession", out=Path("t"))
    >>> child_command(args, 3, 41).split(" -m ")[1]
    "negotiate play --role buyer --split 'specs/my market.toml' --buyers concession --out t --seed 41 --index 3"
    """
    argv = [sys.executable, "-m", "negotiate", "play", "--role", args.role, "--split", str(args.split)]
    if args.seller is not None:
        argv += ["--seller", args.seller]
    argv += ["--buyers", args.buyers, "--out", str(args.out), "--seed", str(seed), "--index", str(index)]
    return shlex.join(argv)


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="/static/css/xterm.css">
<script src="/static/js/textual.js"></script>
<style>
@font-face {{ font-family: "Roboto Mono"; src: url("/static/fonts/RobotoMono-VariableFont_wght.ttf"); }}
body {{ margin: 0; background: #0c181f; color: #eee; font: 18px "Roboto Mono", monospace; }}
.ended {{ display: none; position: absolute; inset: 0; z-index: 10; background: rgba(12, 24, 31, 0.92);
          align-items: center; justify-content: center; text-align: center; }}
body.-closed .ended {{ display: flex; }}
a {{ color: #8cf; }}
</style>
</head>
<body>
<div class="ended"><p>This game has ended. A finished episode is saved; an unfinished one is not.<br>
A game left without a key for {idle_minutes} minutes ends, so that its seat goes to the next visitor.<br>
<a href="/">Play another</a></p></div>
<div id="terminal" class="textual-terminal" data-session-websocket-url="{websocket}" data-font-size="{font_size}"></div>
<script>
// The terminal takes the keyboard once the app has drawn (its socket is open then): no click is needed first.
window.addEventListener("load", () => {{
  const drawn = new MutationObserver(() => {{
    if (!document.body.classList.contains("-first-byte")) return;
    drawn.disconnect();
    const keys = document.querySelector("#terminal textarea.xterm-helper-textarea");
    if (keys) keys.focus();
  }});
  drawn.observe(document.body, {{attributes: true, attributeFilter: ["class"]}});
}});
</script>
</body>
</html>
"""

FULL_PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><meta http-equiv="refresh" content="{retry}"><title>{title}: every seat is taken</title>
<style>body {{ background: #0c181f; color: #eee; font: 18px monospace; margin: 4em; }}</style></head>
<body><h1>Every seat is taken</h1>
<p>{limit} people are playing, as many as this server takes at once. This page tries again every {retry} seconds;
you can also come back later.</p></body>
</html>
"""


class PlayServer:
    """The web server: the page, its websocket, and one play process per seat."""

    def __init__(self, args: argparse.Namespace, seats: Seats, idle: float = IDLE_S):
        self.args = args
        self.seats = seats
        self.idle = idle
        """Seconds without a key or a click from a visitor before their seat is given up."""
        self.trace = Path(args.out) / TRACE_NAME
        self.seat = "the seller" if args.role == "seller" else "a buyer"
        self.title = f"negotiate: bargain as {self.seat}"
        self._sockets: set = set()
        self._downloads = DownloadManager() if DownloadManager else None  # AppService wants one; the play app delivers no files

    def application(self) -> web.Application:
        static = Path(textual_serve.__file__).parent / "static"  # its terminal script, styles and font
        app = web.Application()
        app.add_routes([web.get("/", self.page), web.get("/ws", self.websocket), web.static("/static", static)])
        app.on_shutdown.append(self._close_sockets)
        return app

    async def page(self, request: web.Request) -> web.Response:
        title = html.escape(self.title)
        if self.seats.playing >= self.seats.limit:
            return web.Response(status=503, content_type="text/html", headers={"Retry-After": str(FULL_RETRY_S)},
                                text=FULL_PAGE.format(title=title, limit=self.seats.limit, retry=FULL_RETRY_S))
        # Behind a proxy that ends TLS the page is https, and a browser refuses a plain ws:// socket from it.
        scheme = "wss" if request.secure or request.headers.get("X-Forwarded-Proto") == "https" else "ws"
        websocket = html.escape(f"{scheme}://{request.host}/ws", quote=True)
        font_size = _number(request.query.get("fontsize"), 16, 8, 32)
        return web.Response(content_type="text/html", text=PAGE.format(title=title, websocket=websocket, font_size=font_size,
                                                                       idle_minutes=f"{self.idle / 60:g}"))

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(heartbeat=15)
        await socket.prepare(request)
        self._sockets.add(socket)
        try:
            seat = self.seats.take()
            if seat is None:
                await socket.send_bytes(_full_screen(self.seats.limit))
                async for _ in socket:  # the sentence stays up until the visitor goes
                    pass
                return socket
            index, seed = seat
            try:
                await self._play(socket, request, index, seed)
            finally:
                self.seats.leave()
                saved = index in await asyncio.to_thread(self.saved)
                _log(f"seat {index} left (seed {seed}): "
                     f"{'episode saved' if saved else 'no episode saved (it was not finished)'}; {self.seats.playing} playing")
        finally:
            self._sockets.discard(socket)
        return socket

    async def _play(self, socket, request: web.Request, index: int, seed: int) -> None:
        """Run one visitor's process until the visitor or the app goes: keys and sizes in, screen out."""
        service = AppService(child_command(self.args, index, seed), write_bytes=socket.send_bytes,
                             write_str=socket.send_str, close=socket.close, download_manager=self._downloads)
        width = _number(request.query.get("width"), 80, 1, MAX_SIZE[0])
        height = _number(request.query.get("height"), 24, 1, MAX_SIZE[1])
        _log(f"seat {index}: episode play-{self.args.role}-{index:04d}, seed {seed}; {self.seats.playing} playing")
        await service.start(width, height)
        clock = asyncio.get_running_loop()
        heard = clock.time()  # the visitor's last key or click

        async def give_up_when_idle() -> None:
            while (left := heard + self.idle - clock.time()) > 0:
                await asyncio.sleep(left)
            _log(f"seat {index}: no key or click for {self.idle:g} s: the seat is given up")
            await socket.close()  # ends the loop below: the app quits, and the page says the game has ended

        idle = asyncio.create_task(give_up_when_idle())
        try:
            async for message in socket:
                if message.type != WSMsgType.TEXT:
                    continue
                if await _relay(socket, service, message.data):
                    heard = clock.time()
        finally:
            idle.cancel()
            await service.stop()
            await _release(service)

    def saved(self) -> set[int]:
        """The indices of this server's visitors whose episodes are in the trace (complete ones only)."""
        first = self.seats.first_index
        try:
            complete = scan(self.trace).complete
        except UserError as error:  # the file was damaged from outside: say so, count nothing
            _log(f"cannot count the saved episodes: {error}")
            return set()
        return {e.index for e in complete if e.index is not None and first <= e.index < first + self.seats.given}

    async def _close_sockets(self, _app) -> None:
        for socket in list(self._sockets):
            await socket.close()

    async def run(self) -> int:
        """Serve until SIGINT or SIGTERM; the exit code (130 or 143, as the shell reports a signal)."""
        runner = web.AppRunner(self.application(), handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.args.host, self.args.port)
        try:
            await site.start()
        except OSError as error:
            await runner.cleanup()
            raise UserError(f"cannot listen on {self.args.host} ({error.strerror or error})", field="--port",
                            value=self.args.port) from None
        stop = asyncio.get_running_loop().create_future()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, lambda s=signum: stop.done() or stop.set_result(s))
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"negotiate play --web: http://{shown}:{port}/ serves play as {self.seat}, up to {self.seats.limit} at once; "
              f"episodes from index {self.seats.first_index} go to {Path(self.args.out) / TRACE_NAME}; ctrl+c stops",
              flush=True)
        try:
            signum = await stop
        finally:
            await runner.cleanup()  # closes every websocket: each visitor's app quits (an unfinished episode is not saved)
        print(f"negotiate play --web: stopped; {self.summary(len(self.saved()))}", flush=True)
        return 128 + signum

    def summary(self, saved: int) -> str:
        """The visitors, and the episodes saved apart from those left unfinished.

        >>> server = PlayServer(argparse.Namespace(role="buyer", out=Path("o")), Seats(8, 0))
        >>> server.seats.given = 9
        >>> server.summary(4)
        '9 visitors; 4 finished and saved an episode, 5 left before the end (nothing saved)'
        >>> server.seats.given = 1
        >>> server.summary(1)
        '1 visitor; 1 finished and saved an episode'
        """
        given = self.seats.given
        line = f"{given} visitor{'s' if given != 1 else ''}; {saved} finished and saved an episode"
        return line + (f", {given - saved} left before the end (nothing saved)" if given > saved else "")


async def _relay(socket, service, data: str) -> bool:
    """One message from the page: keys, a new size, a ping, focus. Anything else is dropped. True for what the
    visitor typed or clicked (the terminal's input: keys, the mouse, a paste), which keeps the seat theirs."""
    try:
        kind, *rest = json.loads(data)
    except (ValueError, TypeError):
        return False
    payload = rest[0] if rest else None
    if kind == "stdin" and isinstance(payload, str):
        await service.send_bytes(payload.encode("utf-8", "replace"))
        return True
    elif kind == "resize" and isinstance(payload, dict):
        await service.set_terminal_size(_number(payload.get("width"), 80, 1, MAX_SIZE[0]),
                                        _number(payload.get("height"), 24, 1, MAX_SIZE[1]))
    elif kind == "ping" and isinstance(payload, str):
        await socket.send_json(["pong", payload[:32]])
    elif kind == "blur":
        await service.blur()
    elif kind == "focus":
        await service.focus()
    return False


async def _release(service) -> None:
    """Reap a visitor's process once it has quit and close its pipes: textual-serve does neither, so each of them
    held three file descriptors until the garbage collector closed them, with a ResourceWarning each."""
    process = getattr(service, "_process", None)
    if process is None:
        return
    try:
        await asyncio.wait_for(process.wait(), timeout=10)
    except TimeoutError:  # it did not quit when asked: it goes now
        process.kill()
        await process.wait()
    transport = getattr(process, "_transport", None)  # asyncio's own: Process has no public close
    if transport is not None:
        transport.close()


def _number(value, default: int, low: int, high: int) -> int:
    """An integer the browser sent, clamped to [low, high]; ``default`` where it is not one.

    >>> _number("120", 80, 1, 400), _number("99999", 80, 1, 400), _number("x", 80, 1, 400), _number(None, 24, 1, 150)
    (120, 400, 80, 24)
    """
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return min(max(number, low), high)


def _full_screen(limit: int) -> bytes:
    """The terminal's text when a websocket comes in past the cap."""
    return (f"\x1b[2J\x1b[H\r\n  Every seat is taken: {limit} people are playing, as many as this server takes at once."
            "\r\n\r\n  Reload the page in a minute or two.\r\n").encode()


def _log(line: str) -> None:
    print(f"negotiate play --web: {line}", flush=True)


def serve(args: argparse.Namespace) -> int:
    """``negotiate play --web``: check the settings as ``play`` would, then serve until stopped."""
    if web is None:
        raise UserError("needs the web extra: pip install 'negotiate[web]'", field="--web")
    args.host = args.host if args.host is not None else DEFAULT_HOST
    args.port = args.port if args.port is not None else DEFAULT_PORT
    limit = args.max_players if args.max_players is not None else DEFAULT_MAX_PLAYERS
    if not 0 <= args.port <= 65535:
        raise UserError("is a TCP port, 0 to 65535 (0: any free one)", field="--port", value=args.port)
    if limit < 1:
        raise UserError("must be at least 1", field="--max-players", value=limit)
    if args.index is not None:
        raise UserError("is chosen by the server for each visitor", field="--index", value=args.index)
    # One line for a bad setting, before any visitor; only the first index is kept (the session, with any model it
    # loaded, is not: each visitor's process loads its own).
    first = prepare(args, args.seed if args.seed is not None else 0).index
    return asyncio.run(PlayServer(args, Seats(limit, first, args.seed)).run())
