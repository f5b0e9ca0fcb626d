"""``negotiate play`` and ``negotiate replay``: check the arguments, run the app, say where things went.

Bad input (an unknown agent, a bad split or spec, a missing or truncated trace, an
unknown episode id) raises :class:`~negotiate.errors.UserError` before any screen
opens; the CLI prints it on one line and exits with 2. So does a model the person
would play against that cannot answer: ``play`` asks every ``openai:`` server for
its models and loads every ``hf:`` model first (``runner.preload_models``, as
``serve`` does), so a wrong URL is one line, not an episode that fails on screen.
(``vllm:`` engines are left to the episode: one serves only the event loop that
first used it, and the check runs on a loop of its own.)

Behind ``negotiate play --web`` (:mod:`negotiate.tui.web`) each visitor's process
has pipes, not a terminal, and Textual's web driver named in ``TEXTUAL_DRIVER``:
the terminal check lets it through, and what ``play`` says goes to stderr, since
stdout carries the screen.

Exit codes: 0 for a finished or abandoned episode, 1 for a failed one (it is
kept in ``play.jsonl`` marked ``failed``, as ``serve`` keeps its failures; the
training reader skips it, since it has no reward), 143 after SIGTERM.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from pathlib import Path

from negotiate.agents.registry import parse_agent
from negotiate.errors import UserError
from negotiate.market import resolve_spec

from negotiate.agents.pools import Pools
from negotiate.runner import preload_models, run_async
from negotiate.tui.session import PlaySession, fresh_seed
from negotiate.tui.transcript import check_scorable, find_episode, load_trace, plain_transcript

__all__ = ["play", "replay", "prepare", "exit_summary", "web_driven", "WEB_DRIVER", "IDLE_S"]


WEB_DRIVER = "textual.drivers.web_driver:WebDriver"
"""Textual's driver for an app run behind a web page; textual-serve names it in ``TEXTUAL_DRIVER`` for each visitor's process."""
IDLE_S = 600
"""``play --web`` gives up a seat whose visitor sends no key or click for this long (seconds); the visitor's app warns
a minute before."""


def web_driven() -> bool:
    """True in a process that textual-serve started for a visitor (``negotiate play --web``): stdin and stdout are
    pipes that carry the browser's keys and the screen, not a terminal."""
    return os.environ.get("TEXTUAL_DRIVER") == WEB_DRIVER


def _need_terminal(hint: str = "") -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()) and not web_driven():
        raise UserError(f"the terminal UI needs an interactive terminal (stdin and stdout){hint}")


def play(settings, *, index: int | None = None) -> int:
    """Play one episode in the terminal UI as a buyer or as the seller; append it to OUT/play.jsonl. ``settings``: play's
    (:class:`negotiate.cli_commands.PlaySettings`, or anything with its attributes); ``index`` numbers a ``--web`` visitor's
    episode."""
    if not getattr(settings, "web", False):
        for name in ("host", "port", "max_players"):
            if getattr(settings, name, None) is not None:
                raise UserError("serves the game to browsers: give it with --web", field=f"--{name.replace('_', '-')}",
                                value=getattr(settings, name))
    seed = settings.seed if settings.seed is not None else fresh_seed()
    # Behind a web page stdout carries the screen: what play says goes to stderr, which the server logs.
    say = functools.partial(print, file=sys.stderr if web_driven() else sys.stdout)
    session = prepare(settings, seed, index=index, say=say)
    _need_terminal()
    from negotiate.tui.app import NegotiateApp  # Textual loads only once the arguments are good

    app = NegotiateApp.play(session, idle_warning=IDLE_S - 60 if web_driven() else None)
    app.run()
    if session.result is None:
        say(f"negotiate play: seed {seed}; {session.abandon_note()}")
        return app.return_code or 0
    for line in exit_summary(session, seed):
        say(line)
    return 1 if session.result.episode.outcome == "failed" else 0


def exit_summary(session: PlaySession, seed: int) -> list[str]:
    """What ``play`` prints after a finished episode: how it went, where it is kept, and the command that replays it on a
    line of its own (it used to follow the path on one line of 125 columns, which the terminal wrapped in the middle of
    the command): with the default folder every line fits 80 columns. The path is quoted for the shell, so the line can
    be pasted as it is."""
    episode = session.result.episode
    trace = shlex.quote(str(session.trace_path))
    replay_line = f"  negotiate replay {trace} --episode {shlex.quote(episode.id)}"
    if episode.outcome == "failed":
        return [f"negotiate play: the episode failed ({episode.reason}); seed {seed}",
                f"kept in {session.trace_path} as {episode.id}, marked failed (training skips it); to replay it:", replay_line]
    m = episode.metrics or {}
    deals = m.get("deals", 0)
    return [f"negotiate play: {episode.outcome} ({episode.reason}), {deals} deal{'s' if deals != 1 else ''}",
            f"profit/OPT {_r(m.get('profit_ratio'))}, welfare/OPT {_r(m.get('welfare_ratio'))}; market seed {seed}",
            f"saved to {session.trace_path} as {episode.id}; to replay it:", replay_line]


def prepare(settings, seed: int, *, index: int | None = None, say=print) -> PlaySession:
    """The session ``play``'s settings describe, on market ``seed``, once every setting and model has been checked
    (a :class:`UserError` naming the flag otherwise); ``play --web`` checks its visitors' settings with it."""
    if settings.role == "seller" and settings.seller is not None:  # it would be ignored: the person is the seller
        raise UserError("you are the seller with --role seller; --seller names the agent you bargain with as a buyer "
                        "(--buyers names the buyers you sell to)", field="--seller", value=settings.seller)
    spec = resolve_spec(settings.split)
    seller = parse_agent(settings.seller or "greedy", "seller", field_name="--seller")
    buyers = parse_agent(settings.buyers, "buyer", field_name="--buyers")
    out = Path(settings.out)
    _check_writable(out)
    session = PlaySession(settings.role, spec, seed, seller=seller, buyers=buyers, out=out, index=index)
    check_models([buyers] if settings.role == "seller" else [seller, buyers], session.episodes.pools, say=say)
    return session


def check_models(specs, pools: Pools, say=print) -> None:
    """Ask each ``openai:`` server for its models and load each ``hf:`` model into the session's ``pools``,
    before the UI opens; a UserError naming the flag (``--seller``, ``--buyers``) if one cannot play."""
    from negotiate.agents.backends import BACKENDS

    # A vLLM engine serves the loop that started it: it is not loaded here, on a loop of its own.
    wanted = [spec for spec in specs if spec.backend in BACKENDS and not BACKENDS[spec.backend].loop_bound]
    if not wanted:
        return

    async def check() -> None:
        try:
            await preload_models(wanted, pools)
        finally:
            await pools.aclose()  # this loop ends here; the episode opens clients on the app's own

    say(f"negotiate play: checking {', '.join(spec.text for spec in wanted)} ...", flush=True)
    run_async(check)


def _check_writable(out: Path) -> None:
    """The trace folder can be made and written (it is made when the episode is saved, not before)."""
    if out.exists() and not out.is_dir():
        raise UserError("is not a folder", field="--out", value=str(out))
    existing = next(p for p in (out, *out.parents) if p.exists()) if not out.exists() else out
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write the trace folder (no write access to {existing})", field="--out", value=str(out))


def _r(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def replay(trace: Path, settings) -> int:
    """Step through the episodes of ``trace`` in the UI, or print one (``--all``: every one) as plain text with
    ``--text``. ``settings``: replay's (:class:`negotiate.cli_commands.ReplaySettings`)."""
    if settings.full and not settings.text:
        raise UserError("prints whole fields with --text only (the viewer cuts them to stay quick)", field="--full")
    every = getattr(settings, "every", False)
    if every and not settings.text:
        raise UserError("prints every episode with --text only (the viewer steps through them all: n and p)", field="--all")
    if every and settings.episode is not None:
        raise UserError("prints every episode, --episode one of them: give one of the two", field="--all")
    skipped: list[str] = []
    episodes = load_trace(trace, allow_partial=settings.allow_partial, on_skip=skipped.append)
    if skipped:
        print(f"negotiate replay: --allow-partial skipped {'; '.join(skipped)}", file=sys.stderr)
    index = find_episode(episodes, settings.episode, source=str(trace))
    if settings.text:
        printed = episodes if every else [episodes[index]]
        for episode in printed:  # what report would refuse is refused before a line is printed
            check_scorable(episode, source=str(trace))
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(errors="replace")  # a talk in any script still prints under an ASCII locale
        try:
            for k, episode in enumerate(printed):
                sys.stdout.write(("\n" if k else "") + plain_transcript(episode, full=settings.full))
            sys.stdout.flush()
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    _need_terminal("; --text prints a plain transcript")
    from negotiate.tui.app import NegotiateApp

    app = NegotiateApp.replay(episodes, str(trace), index)
    app.run()
    return app.return_code or 0
