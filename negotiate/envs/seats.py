"""Seats: agents whose decisions come from outside the episode, and the driver that hands their questions out.

An environment adapter (PettingZoo, verifiers) does not re-implement the market's schedule: it plays the episode
with :func:`negotiate.episode.run_episode`, as ``negotiate serve`` does, and puts a :class:`Seat` where an agent
would sit. The bus asks the seat for a decision (``act``); the seat posts the question at its :class:`Desk` and
waits; the :class:`Driver` runs the episode until a question is posted (or the episode ends) and hands it to the
caller, whose answer resumes the episode.

A seat is marked ``instant`` and has no ``decide``: the bus then asks it exactly where it would ask a scripted
agent, inline and in the same order (the bus awaits ``act`` of an instant agent that has no ``decide``; see
:mod:`negotiate.bus`), so only one question is ever open at a time, and scripted agents driven through seats play
the very episode ``negotiate serve`` plays with them (``tests/test_envs_pettingzoo.py`` compares the traces). No
deadline applies to a seat: the outside takes the time it takes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from negotiate.episode import Episode

__all__ = ["Seat", "Seats", "Desk", "Question", "Driver"]


@dataclass(frozen=True)
class Question:
    """One decision the episode waits for."""

    who: str
    """``seller`` or a buyer id."""
    obs: object
    """What the observer gave the seat: a :class:`~negotiate.regulator.SellerObservation` or ``BuyerObservation``."""
    answer: asyncio.Future
    """Set to the decision (a Message, ParseFailure, Generated or None) to resume the episode."""


class Desk:
    """Where a seat's question waits for the outside: at most one at a time (the bus asks one agent at a time)."""

    def __init__(self) -> None:
        self.open: Question | None = None
        """The question the episode waits on, if any."""
        self._posted: asyncio.Future | None = None

    async def ask(self, who: str, obs) -> object:
        if self.open is not None:
            raise RuntimeError(f"{who} asked while {self.open.who}'s question is still open")
        question = self.open = Question(who, obs, asyncio.get_running_loop().create_future())
        if self._posted is not None and not self._posted.done():
            self._posted.set_result(None)
        return await question.answer

    def posted(self) -> asyncio.Future:
        """A future done once a question is posted (already done if one is open)."""
        self._posted = asyncio.get_running_loop().create_future()
        if self.open is not None:
            self._posted.set_result(None)
        return self._posted


class Seat:
    """An agent of the episode played from outside it: ``act`` posts the observation at the desk and returns the answer.
    ``who`` names the agent in its questions; None: the buyer it observes as (``obs.buyer``)."""

    instant = True
    """Asked inline, where a scripted agent would be (no deadline, no task of its own)."""

    def __init__(self, who: str | None, desk: Desk, description: dict | None = None):
        self.who = who
        self.desk = desk
        self.description = description or {"kind": "external"}

    async def act(self, obs):
        return await self.desk.ask(self.who or obs.buyer, obs)

    def describe(self) -> dict:
        return dict(self.description)


@dataclass(frozen=True)
class Seats:
    """Seats as an agent spec of :class:`~negotiate.run.Run` (anything with ``text`` and ``build``): where the run builds
    the seller, or each buyer, of an episode, it gets a :class:`Seat` at ``desk``. So an environment adapter builds its
    episodes as every other player of the project does (``Run.episode``: the market, the seeds, the labels, the
    deadlines), with seats in the places the outside takes."""

    desk: Desk
    text: str
    """The name the trace's labels give these agents (``seller`` or ``buyers``)."""
    description: dict
    """What ``episode_start`` records of each seat."""
    who: str | None = None
    """The seller's seat names itself; None: each buyer's seat is named by the buyer it observes as."""

    def build(self, market, seed, pools=None) -> Seat:
        return Seat(self.who, self.desk, self.description)


class Driver:
    """One episode played as a coroutine, stopped at each question a seat posts.

    ``await driver.start(coroutine)`` runs the episode (``run_episode(...)`` not yet awaited) to its first question;
    ``await driver.answer(decision)`` answers it and runs to the next. Both return the open :class:`Question`, or None
    once the episode has ended (then :attr:`episode` holds it). An error of the engine propagates from them."""

    def __init__(self, desk: Desk):
        self.desk = desk
        self.task: asyncio.Task | None = None
        self.episode: Episode | None = None

    async def start(self, coroutine) -> Question | None:
        self.task = asyncio.ensure_future(coroutine)
        return await self._next()

    async def answer(self, decision) -> Question | None:
        question = self.desk.open
        if question is None:
            raise RuntimeError("no question is open: the episode has ended")
        self.desk.open = None
        question.answer.set_result(decision)
        return await self._next()

    async def _next(self) -> Question | None:
        if self.desk.open is None and not self.task.done():
            await asyncio.wait([self.task, self.desk.posted()], return_when=asyncio.FIRST_COMPLETED)
        if self.task.done():
            self.episode = self.task.result()
            return None
        return self.desk.open

    async def stop(self) -> None:
        """Cancel an episode still running (nothing of it is recorded); a no-op once it has ended."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
