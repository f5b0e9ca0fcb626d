"""The message bus of one episode: mailboxes, the seller's and the buyers' loops.

A buyer that can wait (a model, a person) is a task reading its :class:`Mailbox`;
the seller runs in the episode's own task. An *instant* buyer (a scripted
strategy: a plain function of its observation, marked ``instant``) facing an
instant seller needs neither: the bus calls it where its task would have run,
first in first out, when the seller next waits. Traces are identical either way (``inline_instant=False``
gives every buyer a task; the tests compare the two), and a task per function call
cost half the throughput (benchmarks/). The bus spends the global turn budget atomically (one event
loop, no await between the budget check and the spend), lets the seller have one
unanswered message per buyer and many buyers in flight, and puts a deadline on
every wait that can block. At the end it closes every mailbox, and every loop
ends on its own.

Scripted agents never await, so an episode of them would hold the event loop from its
first turn to its last (a 100,000-turn episode stalled every episode beside it for
minutes): the seller's loop yields to the loop every :data:`YIELD_TURNS` turns, or
:data:`YIELD_SECONDS` (whichever comes first: a 200 x 200 market's turn takes milliseconds, and
SIGTERM is taken at the next yield), while it has inline buyers to answer. With every buyer inline no other task of the episode can
run meanwhile, so the trace is the same. Inline buyers beside buyers in tasks happen
only when those buyers can wait (models, people): their replies come when they come,
and the yield lets them (and their I/O) get on.

A seller that thinks (a model) is asked for its next message as soon as it has sent one, so
its observation lacks the reply to that message, which a scripted buyer gives at once: the
model then spends seconds deciding on a state that is one reply old when its message lands.
``fresh`` asks the seller only once every buyer that answers at once (instant, inline or in a
task) has answered, so a seller decides on the state it acts in, and a seller that thinks plays
the very game a scripted seller plays (the tests compare the traces); buyers that think are
not waited for. A scripted seller under ``fresh`` hears each reply before its next message,
rather than writing to every free buyer first.

Mailboxes are a deque plus one waiter future rather than anyio memory streams:
the protocol bounds each mailbox to one message in flight, and measured here a
memory stream costs about 3x an asyncio queue per message (see benchmarks/).
"""

from __future__ import annotations

import asyncio
from time import monotonic
from collections import deque
from dataclasses import dataclass

import anyio

from negotiate.protocol import Generated, Message, ParseFailure
from negotiate.regulator import EpisodeState

__all__ = ["Mailbox", "MailboxStatistics", "Bus", "YIELD_TURNS", "YIELD_SECONDS"]

YIELD_TURNS = 100
YIELD_SECONDS = 0.05
"""The longest the seller's loop runs scripted turns without yielding (``benchmarks/scale_markets.py``: SIGTERM
took 8 s at 200 x 200 when the yield came every 100 turns of 10-80 ms each)."""
"""Seller turns between yields to the event loop while the seller has inline (scripted) buyers to answer:
about 1.5 ms of work at the measured 15 us per turn, and one loop pass (a few us) per 100 turns."""


@dataclass(frozen=True, slots=True)
class MailboxStatistics:
    name: str
    queued: int
    """Items waiting to be read."""
    sent: int
    received: int
    waiting: bool
    """True while a reader is blocked on it."""
    closed: bool


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("mailbox wait timed out"))


class Mailbox:
    """A closable single-reader mailbox. ``put`` never blocks; ``get`` raises ``anyio.EndOfStream`` once closed and empty."""

    __slots__ = ("name", "_items", "_waiter", "_closed", "_sent", "_received")

    def __init__(self, name: str):
        self.name = name
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._closed = False
        self._sent = 0
        self._received = 0

    def put(self, item) -> None:
        if self._closed:
            raise anyio.ClosedResourceError(f"mailbox {self.name} is closed")
        self._items.append(item)
        self._sent += 1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self, timeout: float | None = None):
        """The next item; ``TimeoutError`` after ``timeout`` seconds without one.

        The deadline is a loop timer on the waiter (about a tenth of the cost of a
        cancel scope, and this wait happens once per reply).
        """
        while not self._items:
            if self._closed:
                raise anyio.EndOfStream
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, _expire, waiter) if timeout is not None else None
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        self._received += 1
        return self._items.popleft()

    def close(self) -> None:
        self._closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.get()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(self.name, len(self._items), self._sent, self._received, self._waiter is not None, self._closed)


def _unpack(decision) -> tuple[Message | ParseFailure | None, str | None, dict | None]:
    if type(decision) is Message:  # the common case, first
        return decision, None, None
    if isinstance(decision, Generated):
        return decision.result, decision.raw, decision.extra
    if decision is None or isinstance(decision, (Message, ParseFailure)):
        return decision, None, None
    return ParseFailure(f"agent returned {type(decision).__name__}, not a message", repr(decision)[:500]), None, None


class Bus:
    """Routes one episode's messages between the seller and its buyers."""

    def __init__(self, state: EpisodeState, seller, buyers: dict, *, seller_timeout: float, reply_timeout: float,
                 inline_instant: bool = True, fresh: bool = False):
        self.state = state
        self.seller = seller
        self.buyers = buyers
        self.seller_timeout = seller_timeout
        self.reply_timeout = reply_timeout
        self.inbox = Mailbox("seller")
        self._seller_instant = bool(getattr(seller, "instant", False))
        self._instant = {buyer_id: bool(getattr(agent, "instant", False)) for buyer_id, agent in buyers.items()}
        # Inline only when the seller is instant too: a seller that thinks (a model) must see
        # buyers answer while it thinks, as they would in real time.
        inline_instant = inline_instant and self._seller_instant
        self._inline = {buyer_id: inline_instant and instant for buyer_id, instant in self._instant.items()}
        self.tasked = [buyer_id for buyer_id, inline in self._inline.items() if not inline]
        """Buyers that run as tasks with a mailbox: those that can wait (models, people)."""
        self.mailboxes = {buyer_id: Mailbox(buyer_id) for buyer_id in self.tasked}
        self.fresh = fresh
        """Ask the seller only once every instant buyer has answered (see :meth:`_owed_instant`)."""
        self._tasked_instant = frozenset(buyer_id for buyer_id in self.tasked if self._instant[buyer_id])
        self._due: deque[tuple[str, Message]] = deque()
        """Messages to inline buyers, in the order their tasks would have been woken."""
        # Scripted agents' synchronous decide(), called directly: no coroutine per decision.
        self._seller_decide = getattr(seller, "decide", None) if self._seller_instant else None
        self._decide = {b: getattr(buyers[b], "decide", None) if self._instant[b] else None for b in buyers}
        self._thinking: anyio.CancelScope | None = None
        if not self._seller_instant:  # only a seller that thinks can be stopped
            state.on_finish.append(self._stop_thinking)
        # With only instant buyers the seller's wait cannot hang: no timer needed on it.
        self._wait_timeout = None if all(self._instant.values()) else reply_timeout * 2 + 5
        self._yield_at = YIELD_TURNS
        self._yield_by = monotonic() + YIELD_SECONDS
        """Seller turns after which the seller next yields to the event loop (with inline buyers due)."""

    @staticmethod
    async def _call(agent, instant: bool, obs, timeout: float):
        """Ask an agent for its decision; raises TimeoutError past the deadline."""
        if instant:  # never waits: no deadline needed, and a scripted decision is a plain call
            decide = getattr(agent, "decide", None)
            return decide(obs) if decide is not None else await agent.act(obs)
        # asyncio's own timeout: a fifth of anyio.fail_after's CPU, and this runs once per model call.
        # An outer anyio cancel scope (the market closing) still cancels through it.
        async with asyncio.timeout(timeout):
            return await agent.act(obs)

    async def run_seller(self) -> None:
        """The seller's loop; returns when the episode has ended or been truncated."""
        # The hot loop of every scripted episode: names bound once, and state.outcome read
        # directly rather than through the done property.
        state = self.state
        seller_decide = self._seller_decide
        due = self._due
        inline = self._inline
        fresh = self.fresh
        while state.outcome is None:
            ask = state.budget_left > 0 and state.any_free()
            if fresh and ask and (due or self._owed_instant()):
                ask = False  # a reply the seller will have read before it writes: let it land first
            if ask:
                try:
                    if seller_decide is not None:
                        decision = seller_decide(state.seller_observation())
                    else:
                        # A seller that thinks (a model, a person) is stopped if the market closes meanwhile.
                        try:
                            with anyio.CancelScope() as self._thinking:
                                decision = await self._call(self.seller, self._seller_instant, state.seller_observation(), self.seller_timeout)
                        finally:
                            self._thinking = None
                except TimeoutError:
                    if not state.done:
                        state.seller_timeout(self.seller_timeout)
                    continue
                if state.outcome is not None:
                    break  # the market closed while the seller was thinking (a buyer took the last unit)
                result, raw, extra = (decision, None, None) if type(decision) is Message else _unpack(decision)
                if result is not None:
                    to = state.seller_send(result, raw, extra)
                    if to is not None:
                        if inline[to]:
                            due.append((to, result))
                        else:
                            self.mailboxes[to].put(result)
                    if monotonic() >= self._yield_by:  # a message to each of 200 free buyers before any reply
                        await asyncio.sleep(0)
                        self._yield_by = monotonic() + YIELD_SECONDS
                    continue
                if not state.pending:
                    state.finish("terminated", "seller_idle")
                    break
            elif not state.pending:
                if state.budget_left <= 0:
                    state.finish("truncated", "budget")
                else:
                    state.finish("terminated", "no_buyers")
                break
            if due:
                if state.turns_used >= self._yield_at or monotonic() >= self._yield_by:
                    # Other episodes may run meanwhile (and this one's buyers that wait, if any).
                    self._yield_at = state.turns_used + YIELD_TURNS
                    await asyncio.sleep(0)
                    self._yield_by = monotonic() + YIELD_SECONDS
                await self._answer_due()
                continue
            # Every buyer's own deadline bounds this wait; the margin only guards against a stuck bus.
            await self.inbox.get(timeout=self._wait_timeout)

    def _owed_instant(self) -> bool:
        """Whether a buyer that answers at once, run as a task, owes the seller a reply (``fresh``)."""
        tasked = self._tasked_instant
        if tasked:
            for b in self.state.buyers:
                if b.awaiting and b.id in tasked:
                    return True
        return False

    def _stop_thinking(self) -> None:
        if self._thinking is not None:
            self._thinking.cancel()

    async def _answer_due(self) -> None:
        """Inline buyers answer what they were sent, first in first out: the order their tasks would run in."""
        state = self.state
        due = self._due
        while due and state.outcome is None:
            buyer_id, message = due.popleft()
            decide = self._decide[buyer_id]
            obs = state.buyer_observation(buyer_id, message)
            self._reply(buyer_id, decide(obs) if decide is not None else await self.buyers[buyer_id].act(obs))

    def _reply(self, buyer_id: str, decision) -> None:
        result, raw, extra = (decision, None, None) if type(decision) is Message else _unpack(decision)
        if result is None:
            result = ParseFailure("buyer gave no reply", "")
        self.state.buyer_reply(buyer_id, result, raw, extra)

    async def run_buyer(self, buyer_id: str) -> None:
        """One buyer's loop: answer each seller message, until the mailbox closes."""
        state = self.state
        agent = self.buyers[buyer_id]
        instant = self._instant[buyer_id]
        async for message in self.mailboxes[buyer_id]:
            if state.done:
                break  # the episode ended while this message waited: no reply is owed
            try:
                decision = await self._call(agent, instant, state.buyer_observation(buyer_id, message), self.reply_timeout)
            except TimeoutError:
                if not state.done:
                    state.buyer_timeout(buyer_id, self.reply_timeout)
            else:
                self._reply(buyer_id, decision)
            self.inbox.put(buyer_id)

    def close(self) -> None:
        # The state holds this bus through its callback: a cycle that only the garbage collector
        # could free, with the episode's whole trace inside it. Break it, so the trace goes when
        # its last reader drops it (measured: about a quarter of a scripted batch's CPU went to
        # collecting those cycles).
        if self._stop_thinking in self.state.on_finish:
            self.state.on_finish.remove(self._stop_thinking)
        self.inbox.close()
        for box in self.mailboxes.values():
            box.close()

    def statistics(self) -> list[MailboxStatistics]:
        return [self.inbox.statistics(), *(box.statistics() for box in self.mailboxes.values())]
