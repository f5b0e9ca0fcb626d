"""Episode state and the regulator: every rule of the market, enforced in one place.

:class:`EpisodeState` is the mutable state of one episode. Its two entry points,
:meth:`EpisodeState.seller_send` and :meth:`EpisodeState.buyer_reply`, check a
message against the rules (the pure checks of :mod:`negotiate.rules`), record it (and any violation, deal or notice) as trace
events, and apply its effect. A message that breaks a rule is a typed, counted
:class:`Violation` and changes nothing. :func:`observe` is the only way private
information reaches an agent. Nothing here awaits: the async bus and a plain
synchronous loop drive the same state.

What a state holds does not grow with its turns (issue 51: an episode held about 3 KB a turn,
2.8 GB at the 10**6-turn cap). Every :data:`~negotiate.trace.SPILL_EVENTS` events a seller turn
spills the trace events to the episode's own temporary file (:meth:`EpisodeState.trace` reads
them all back), and cuts the seller's history to its latest :data:`HISTORY_KEPT` items and each
buyer's thread to its latest :data:`THREAD_KEPT`: the windows observations show. Violations are
counted by role and kind; the latest :data:`VIOLATIONS_KEPT` are kept. The rules themselves need
none of what is cut: standing offers and bids, stock, statuses and the counts are kept exactly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

from negotiate.market import Market
from negotiate.protocol import BUYER, SELLER, Action, BuyerStatus, Message, Notice, ParseFailure
from negotiate.rules import MALFORMED, TIMEOUT, VIOLATIONS, buyer_violation, seller_violation  # the rules, and their kinds
from negotiate.trace import SPILL_EVENTS, DealEvent, EndReason, MessageEvent, NoticeEvent, Outcome, Spill, StoredEvents, ViolationEvent

__all__ = [
    "EpisodeState",
    "Violation",
    "Deal",
    "SellerObservation",
    "BuyerObservation",
    "ProductView",
    "BuyerView",
    "History",
    "observe",
    "VIOLATIONS",
    "BudgetExceeded",
    "HISTORY_KEPT",
    "THREAD_KEPT",
    "VIOLATIONS_KEPT",
]

ACTIVE, SERVED, GONE = BuyerStatus.ACTIVE, BuyerStatus.SERVED, BuyerStatus.GONE

HISTORY_KEPT = 2048
"""The most items a seller's ``history`` shows: its latest messages and notices, every buyer's together (about 680
turns of a 1x1 market; the prompt views show the latest 8 of each buyer's and 6 notices). An episode keeps no more
than this and the items since its last :meth:`EpisodeState._bound`, so what it holds does not grow with its turns."""
THREAD_KEPT = 256
"""The most items a buyer's ``thread`` shows: its latest messages and notices (128 rounds of offer and reply)."""
VIOLATIONS_KEPT = 100
"""The latest violations :attr:`EpisodeState.violations` keeps; every one is counted, by kind and by role."""


class BudgetExceeded(RuntimeError):
    """A seller message was sent with no turn left: a runtime bug, never a user error."""


@dataclass(frozen=True, slots=True)
class Violation:
    who: str
    """``seller`` or a buyer id."""
    kind: str
    """One of :data:`VIOLATIONS`."""
    detail: str
    turn: int
    """Seller turns used when it happened."""


@dataclass(frozen=True, slots=True)
class Deal:
    buyer: str
    product: str
    price: int
    cost: int
    value: int
    """The buyer's valuation of the product (private; for metrics)."""
    turn: int
    by: str
    """Who accepted: ``seller`` (accepted a bid) or the buyer (accepted an offer)."""


@dataclass(slots=True)
class _BuyerState:
    id: str
    index: int
    status: BuyerStatus = ACTIVE
    awaiting: bool = False
    offer: tuple[str, int] | None = None
    """The seller's standing offer to this buyer."""
    bid: tuple[str, int] | None = None
    """This buyer's standing bid."""
    thread: list = field(default_factory=list)
    """Messages and notices this buyer can see (seller thoughts removed), the latest of them: append-only, and cut to
    the latest :data:`THREAD_KEPT` by replacing the list (observations hold views of the old one)."""
    messages_received: int = 0
    dropped: int = 0
    """Items of the thread cut off before ``thread[0]``."""


class ProductView(NamedTuple):
    """One catalog line as an agent sees it (a named tuple: built on every decision, so cheap)."""

    id: str
    name: str
    cost: int | None
    """Unit cost: seller's view only (None in a buyer's view)."""
    stock: int
    """Units left."""


class BuyerView(NamedTuple):
    """One buyer as the seller sees it."""

    id: str
    status: BuyerStatus
    """active, served or gone."""
    awaiting: bool
    """True while this buyer owes the seller a reply."""
    offer: tuple[str, int] | None
    """The seller's standing offer to this buyer."""
    bid: tuple[str, int] | None
    """This buyer's standing bid."""


_make = tuple.__new__
"""Builds a named tuple from its fields in order, without the Python-level ``__new__``."""


class History(Sequence):
    """An append-only list seen up to the length it had when the view was taken: the latest items of a history.

    Observations carry the seller's history and a buyer's thread as views, not copies: a
    copy per decision made an episode cost the square of its turns (90 us per decision at
    20,000 turns; benchmarks/bench_long.py). The regulator only ever appends, so a view
    fixed at a length always shows the same items, however long the episode goes on. It
    supports ``len``, indexing, slicing (a slice is a tuple), iteration and ``in``, and
    compares equal to a tuple of the same items.

    A view shows at most the latest :data:`HISTORY_KEPT` items of the seller's history, or :data:`THREAD_KEPT` of a
    buyer's thread: a long episode does not keep the rest (``History(items)`` itself shows all it is given). ``dropped``
    counts the items of the history before the view's first, which it does not show.
    """

    __slots__ = ("_items", "_start", "_stop", "dropped")

    def __init__(self, items: list, length: int | None = None, dropped: int = 0):
        self._items = items
        self._start = 0
        self._stop = len(items) if length is None else length
        self.dropped = dropped
        """Items of the history before this view's first: not shown, and not kept."""

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, index):
        start = self._start
        if isinstance(index, slice):
            shown = range(*index.indices(self._stop - start))
            return tuple(map(self._items.__getitem__, range(shown.start + start, shown.stop + start, shown.step)))
        if index < 0:
            index += self._stop - start
        if not 0 <= index < self._stop - start:
            raise IndexError("history index out of range")
        return self._items[start + index]

    def __iter__(self):
        return islice(self._items, self._start, self._stop)

    def __reversed__(self):
        return map(self._items.__getitem__, range(self._stop - 1, self._start - 1, -1))

    def __eq__(self, other) -> bool:
        if isinstance(other, (History, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other):
        return tuple(self) + tuple(other)

    def __radd__(self, other):
        return tuple(other) + tuple(self)

    def __repr__(self) -> str:
        return f"History({list(self)!r})"

    def __reduce__(self):
        return History, (self._items[self._start:self._stop], None, self.dropped)


_history = object.__new__


def _latest(items: list, keep: int, dropped: int) -> History:
    """A view of the latest ``keep`` items of ``items`` (of a history that had ``dropped`` items before ``items[0]``);
    built without ``__init__``: one is made per decision."""
    view = _history(History)
    stop = len(items)
    start = stop - keep if stop > keep else 0
    view._items, view._start, view._stop, view.dropped = items, start, stop, dropped + start
    return view


class SellerObservation(NamedTuple):
    """Everything the seller may know, and nothing more (a named tuple: one is built per decision)."""

    turns_used: int
    budget: int
    price_low: int
    price_high: int
    """Public range from which valuations are drawn."""
    products: tuple[ProductView, ...]
    buyers: tuple[BuyerView, ...]
    new: tuple[Message | Notice, ...]
    """Replies and notices since the seller last acted."""
    history: History
    """The messages and notices the seller has seen (buyers' thoughts removed), oldest first, the latest
    :data:`HISTORY_KEPT` of them: a view, not a copy (``history.dropped`` counts those before)."""

    @property
    def budget_left(self) -> int:
        return self.budget - self.turns_used


class BuyerObservation(NamedTuple):
    """Everything one buyer may know: its own values, never costs or others' values."""

    buyer: str
    persona: str
    values: tuple[int, ...]
    """Own valuation of each product, in catalog order."""
    products: tuple[ProductView, ...]
    offer: tuple[str, int] | None
    """The seller's standing offer to this buyer."""
    bid: tuple[str, int] | None
    """This buyer's own standing bid."""
    message: Message | None
    """The seller message this buyer must answer (None for a notice-only view)."""
    rounds: int
    """Seller messages this buyer has received, this one included."""
    thread: History
    """The messages and notices of this buyer's conversation (seller thoughts removed), oldest first, the latest
    :data:`THREAD_KEPT` of them: a view, not a copy (``thread.dropped`` counts those before)."""


def _public(message: Message) -> Message:
    if not message.thought:
        return message
    return Message(message.sender, message.to, message.talk, message.action, "")


class EpisodeState:
    """Mutable state of one episode, with the regulator's rules."""

    # What only a long episode changes is a class attribute until then: a short episode's state (and each fork of
    # it, thousands a second in replays) has four fewer entries to fill and copy.
    spill_dir: str | None = None
    """Where a long episode spills its events (None: the system's temporary folder); see :meth:`_bound`."""
    _spill: Spill | None = None
    _bound_at: int = SPILL_EVENTS
    """The length of ``events`` at which a seller turn next calls :meth:`_bound`."""
    _seller_dropped: int = 0
    """Items of the seller's history cut off before ``_seller_history[0]``."""

    def __init__(self, market: Market, clock=time.perf_counter, *, episode: str = "", spill_dir: str | None = None):
        self.market = market
        self.episode = episode
        """Episode id stamped on every event."""
        self._product_index = {p.id: j for j, p in enumerate(market.products)}
        self.stock = [p.stock for p in market.products]
        self.units_left = sum(self.stock)
        self.buyers = [_BuyerState(b.id, i) for i, b in enumerate(market.buyers)]
        self._buyer_by_id = {b.id: b for b in self.buyers}
        self.turns_used = 0
        self.deals: list[Deal] = []
        self.violations: list[Violation] = []
        """The latest :data:`VIOLATIONS_KEPT` violations (the counts below have every one)."""
        self.violations_by: dict[tuple[str, str], int] = {}
        """Violations by (role, kind): role ``seller`` or ``buyer`` (:attr:`violation_counts` sums the roles)."""
        self.invalid_by = {SELLER: 0, BUYER: 0}
        """Invalid messages per sender role (``seller``, ``buyer``)."""
        self.messages_by = {SELLER: 0, BUYER: 0}
        self.outcome: str | None = None
        """None while running; then ``terminated``, ``truncated`` or ``failed``."""
        self.reason: str | None = None
        self.events: list = []
        """The episode's trace events (``negotiate.trace`` records), in order, since its last spill: :meth:`trace` has
        them all."""
        if spill_dir is not None:
            self.spill_dir = spill_dir
        self._clock = clock
        self._t0 = clock()
        self._products_view: tuple[ProductView, ...] | None = None
        """Seller's catalog view, rebuilt only when stock changes."""
        self._products_public: tuple[ProductView, ...] | None = None
        """The same without costs, for buyers."""
        self._seller_new: list[Message | Notice] = []
        self._seller_history: list[Message | Notice] = []
        """Append-only, and cut to the latest :data:`HISTORY_KEPT` by replacing the list: observations hold views of it
        (:class:`History`)."""
        self.on_finish: list = []
        """Callbacks run once when the outcome is set (the bus stops a seller still thinking)."""

    def fork(self) -> EpisodeState:
        """A copy to play on from here, this state untouched: a replay of the market from this point
        (``negotiate.rollout``). Market, catalog views and clock are shared (immutable); everything a message
        changes is copied: stock, buyers and their threads, deals, violations, counts, the seller's history and
        what it has not yet read. The copy's ``events`` start empty (its own, from the fork on, spilled to a file of
        its own if it goes on long) and it has no ``on_finish`` callbacks (no bus drives it yet). Cost: linear in the
        histories kept (:data:`HISTORY_KEPT`, :data:`THREAD_KEPT`), not in the turns so far."""
        new = object.__new__(EpisodeState)
        new.__dict__.update(self.__dict__)
        new.stock = list(self.stock)
        new.buyers = [_BuyerState(b.id, b.index, b.status, b.awaiting, b.offer, b.bid, list(b.thread), b.messages_received, b.dropped)
                      for b in self.buyers]
        new._buyer_by_id = {b.id: b for b in new.buyers}
        new.deals = list(self.deals)
        new.violations = list(self.violations)
        new.violations_by = dict(self.violations_by)
        new.invalid_by = dict(self.invalid_by)
        new.messages_by = dict(self.messages_by)
        new.events = []
        if self._spill is not None:
            new._spill = None  # the copy's events are its own: it spills (if ever) to a file of its own
        new._seller_new = list(self._seller_new)
        new._seller_history = list(self._seller_history)
        new.on_finish = []
        return new

    def trace(self) -> list | StoredEvents:
        """Every event of the episode so far, in order: ``events`` itself, or, once the episode has spilled (a long
        one), a :class:`~negotiate.trace.StoredEvents` reading the older ones back from its file."""
        return self.events if self._spill is None else StoredEvents(self._spill, self.events)

    def _bound(self) -> None:
        """Keep what a long episode holds flat in its turns: spill its events to its file (where the file cannot be
        made or written, a full disk or no file handles left, they stay here, and the next try is
        :data:`~negotiate.trace.SPILL_EVENTS` events on), and cut the seller's history and each buyer's thread to the
        items their views show. A seller turn calls it once ``events`` holds ``SPILL_EVENTS`` (checked once a turn:
        a list's length against a number), so each list holds at most its bound and the items of those events."""
        events = self.events
        try:
            if self._spill is None:
                self._spill = Spill(self.spill_dir)
            self._spill.write(events)
        except OSError:
            self._bound_at = len(events) + SPILL_EVENTS
        else:
            events.clear()
            self._bound_at = SPILL_EVENTS
        history = self._seller_history
        if len(history) > HISTORY_KEPT:
            self._seller_dropped += len(history) - HISTORY_KEPT
            self._seller_history = history[-HISTORY_KEPT:]  # a new list: views of the old one keep what they show
        for buyer in self.buyers:
            if len(buyer.thread) > THREAD_KEPT:
                buyer.dropped += len(buyer.thread) - THREAD_KEPT
                buyer.thread = buyer.thread[-THREAD_KEPT:]

    # -- bookkeeping -------------------------------------------------------------

    @property
    def violation_counts(self) -> dict[str, int]:
        """Violations by kind, both roles."""
        counts: dict[str, int] = {}
        for (_, kind), count in self.violations_by.items():
            counts[kind] = counts.get(kind, 0) + count
        return counts

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def budget_left(self) -> int:
        return self.market.budget - self.turns_used

    @property
    def pending(self) -> int:
        """Buyers that owe the seller a reply."""
        count = 0
        for b in self.buyers:  # a plain loop: half the cost of sum() over a generator, and the bus asks often
            if b.awaiting:
                count += 1
        return count

    def free_buyers(self) -> list[str]:
        """Active buyers the seller may message now."""
        return [b.id for b in self.buyers if b.status == ACTIVE and not b.awaiting]

    def any_free(self) -> bool:
        """Whether the seller may message some buyer now."""
        for b in self.buyers:
            if b.status == ACTIVE and not b.awaiting:
                return True
        return False

    def _ts(self) -> float:
        return self._clock() - self._t0

    def _violate(self, who: str, kind: str, detail: str) -> None:
        violations = self.violations
        violations.append(Violation(who, kind, detail, self.turns_used))
        if len(violations) > VIOLATIONS_KEPT:
            del violations[0]
        key = (SELLER if who == SELLER else BUYER, kind)
        self.violations_by[key] = self.violations_by.get(key, 0) + 1
        self.events.append(ViolationEvent(self.episode, self._ts(), self.turns_used, who, kind, detail))
        self._notify(who, "violation", f"{kind}: {detail}")

    def _notify(self, to: str, kind: str, text: str) -> None:
        notice = Notice(to, kind, text)
        self.events.append(NoticeEvent(self.episode, self._ts(), to, kind, text))
        if to == SELLER:
            self._seller_new.append(notice)
            self._seller_history.append(notice)
        else:
            self._buyer_by_id[to].thread.append(notice)

    def _record_message(self, sender: str, result, raw: str | None, extra: dict | None, turn: int | None,
                        invalid: tuple[str, str] | None = None) -> MessageEvent:
        """The message's event; ``invalid`` is the (violation kind, detail) of a message that broke a rule.

        Records are built with positional arguments here (half the cost of keywords): episode, ts, turn,
        sender, to, thought, talk, action, valid, error, error_kind, timeout_s, raw, extra."""
        if isinstance(result, Message):
            action = result.action
            data = {"kind": action.kind, "product": action.product, "price": action.price}
            if invalid is None:
                event = MessageEvent(self.episode, self._ts(), turn, sender, result.to, result.thought, result.talk, data, True,
                                     None, None, None, raw, extra or None)
            else:
                event = MessageEvent(self.episode, self._ts(), turn, sender, result.to, result.thought, result.talk, data, False,
                                     f"{invalid[0]}: {invalid[1]}", invalid[0], None, raw, extra or None)
        else:
            event = MessageEvent(self.episode, self._ts(), turn, sender, None, "", "", None, False,
                                 result.reason, MALFORMED, None, result.raw if raw is None else raw, extra or None)
        self.events.append(event)
        self.messages_by[SELLER if sender == SELLER else BUYER] += 1
        return event

    def finish(self, outcome: str, reason: str) -> None:
        """Record the outcome; the first one stands."""
        if self.outcome is None:
            self.outcome, self.reason = outcome, reason
            for callback in self.on_finish:
                callback()

    def fail(self, reason: str) -> None:
        """An error, even after the end: it overrides any outcome, so no error goes unrecorded."""
        if self.outcome is not None and self.outcome != Outcome.FAILED:
            reason = f"{reason} (after the episode had {self.outcome}: {self.reason})"
        self.outcome, self.reason = Outcome.FAILED, reason

    def _check_terminal(self) -> None:
        if self.units_left == 0:
            self.finish(Outcome.TERMINATED, EndReason.SOLD_OUT)
        elif all(b.status != ACTIVE for b in self.buyers):
            self.finish(Outcome.TERMINATED, EndReason.NO_BUYERS)

    def _deal(self, buyer: _BuyerState, j: int, price: int, by: str) -> None:
        product = self.market.products[j]
        value = self.market.buyers[buyer.index].values[j]
        self.stock[j] -= 1
        self.units_left -= 1
        self._products_view = self._products_public = None
        buyer.status = SERVED
        buyer.offer = buyer.bid = None
        deal = Deal(buyer.id, product.id, price, product.cost, value, self.turns_used, by)
        self.deals.append(deal)
        self.events.append(DealEvent(self.episode, self._ts(), self.turns_used, buyer.id, product.id, price, product.cost, value, by))
        text = f"deal: {buyer.id} buys {product.id} at ${price}"
        self._notify(buyer.id, "deal", text)
        self._notify(SELLER, "deal", text)
        if self.stock[j] == 0:
            self._notify(SELLER, "sold_out", f"{product.id} is sold out")
        self._check_terminal()
        if self.done:
            # The market closed on this deal: buyers still answering an offer for the unit learn it is gone.
            for other in self.buyers:
                if other.awaiting and other.offer is not None and other.offer[0] == product.id:
                    self._notify(other.id, "sold_out", f"{product.id} is sold out")

    # -- the seller --------------------------------------------------------------

    def seller_send(self, result: Message | ParseFailure, raw: str | None = None, extra: dict | None = None) -> str | None:
        """Spend one turn on a seller message. Returns the buyer id that now owes a reply, if any."""
        if self.done:
            raise RuntimeError("seller_send after the episode ended")
        if self.turns_used >= self.market.budget:
            raise BudgetExceeded(f"turn {self.turns_used + 1} exceeds the budget of {self.market.budget}")
        if len(self.events) >= self._bound_at:
            self._bound()
        self.turns_used += 1
        invalid = self._check_seller(result) if isinstance(result, Message) and result.action.kind != "end" else None
        self._record_message(SELLER, result, raw, extra, self.turns_used, invalid)
        if isinstance(result, ParseFailure):
            self.invalid_by[SELLER] += 1
            self._violate(SELLER, MALFORMED, result.reason)
            return None
        self._seller_history.append(result)
        action = result.action
        if action.kind == "end":
            self.finish(Outcome.TERMINATED, EndReason.SELLER_END)
            return None
        if invalid is not None:
            self.invalid_by[SELLER] += 1
            self._violate(SELLER, *invalid)
            return None
        buyer = self._buyer_by_id[result.to]
        public = _public(result)
        buyer.thread.append(public)
        if action.kind == "accept":
            self._deal(buyer, self._product_index.get(action.product), action.price, SELLER)
            return None
        if action.kind == "offer":
            buyer.offer = (action.product, action.price)
        else:  # reject: the buyer's standing bid is refused
            buyer.bid = None
        buyer.awaiting = True
        buyer.messages_received += 1
        return buyer.id

    def _check_seller(self, message: Message) -> tuple[str, str] | None:
        action = message.action
        j = self._product_index.get(action.product)
        products = self._products_view or self._seller_products()
        problem = seller_violation(action, message.to, self._buyer_by_id.get(message.to), None if j is None else products[j])
        return problem

    def seller_timeout(self, seconds: float) -> None:
        """The seller said nothing in time: the turn is spent, a violation counted."""
        if len(self.events) >= self._bound_at:
            self._bound()
        self.turns_used += 1
        self.invalid_by[SELLER] += 1
        self.messages_by[SELLER] += 1
        self.events.append(MessageEvent(episode=self.episode, ts=self._ts(), turn=self.turns_used, sender=SELLER, to=None, thought="", talk="",
                                        action=None, valid=False, error=f"timeout after {seconds}s", error_kind=TIMEOUT, timeout_s=seconds))
        self._violate(SELLER, TIMEOUT, f"no message within {seconds}s")

    # -- the buyers --------------------------------------------------------------

    def buyer_reply(self, buyer_id: str, result: Message | ParseFailure, raw: str | None = None, extra: dict | None = None) -> None:
        """Apply a buyer's reply to the seller's last message. Invalid replies count as a reject."""
        buyer = self._buyer_by_id[buyer_id]
        if not buyer.awaiting:
            raise RuntimeError(f"{buyer_id} replied without a message to answer")
        buyer.awaiting = False
        problem = self._check_buyer(buyer, result) if isinstance(result, Message) and not self.done else None
        self._record_message(buyer_id, result, raw, extra, None, problem)
        if isinstance(result, ParseFailure):
            self.invalid_by[BUYER] += 1
            buyer.offer = None  # taken as a reject
            self._violate(buyer_id, MALFORMED, result.reason)
            self._seller_sees(Message(buyer_id, SELLER, "", Action("reject")))
            return
        buyer.thread.append(result)
        action = result.action
        if self.done:
            return
        if action.kind == "quit":
            buyer.status = GONE
            buyer.offer = buyer.bid = None
            self._seller_sees(result)
            self._check_terminal()
            return
        if action.kind == "reject":
            buyer.offer = None
            self._seller_sees(result)
            return
        if problem is not None:
            self.invalid_by[BUYER] += 1
            buyer.offer = None  # taken as a reject
            self._violate(buyer_id, *problem)
            self._seller_sees(Message(buyer_id, SELLER, result.talk, Action("reject")))
            return
        j = self._product_index[action.product]
        if self.stock[j] == 0:
            # The race for the last unit: not this buyer's fault, a notice, and its reply counts as a reject.
            buyer.offer = None
            self._notify(buyer_id, "sold_out", f"{action.product} is sold out")
            self._seller_sees(Message(buyer_id, SELLER, result.talk, Action("reject")))
            return
        if action.kind == "accept":
            self._seller_sees(result)
            self._deal(buyer, j, action.price, buyer_id)
        else:
            buyer.bid = (action.product, action.price)
            self._seller_sees(result)

    def _check_buyer(self, buyer: _BuyerState, message: Message) -> tuple[str, str] | None:
        """The rule a buyer's bid or accept breaks, as (violation kind, detail); None when it keeps them."""
        action = message.action
        j = self._product_index.get(action.product)
        return buyer_violation(action, None if j is None else self.market.buyers[buyer.index].values[j], buyer.offer)

    def _seller_sees(self, message: Message) -> None:
        public = _public(message)
        self._seller_new.append(public)
        self._seller_history.append(public)

    def buyer_timeout(self, buyer_id: str, seconds: float) -> None:
        buyer = self._buyer_by_id[buyer_id]
        buyer.awaiting = False
        buyer.offer = None  # silence is a reject
        self.invalid_by[BUYER] += 1
        self.messages_by[BUYER] += 1
        self.events.append(MessageEvent(episode=self.episode, ts=self._ts(), turn=None, sender=buyer_id, to=SELLER, thought="", talk="",
                                        action=None, valid=False, error=f"timeout after {seconds}s", error_kind=TIMEOUT, timeout_s=seconds))
        self._violate(buyer_id, TIMEOUT, f"no reply within {seconds}s (taken as a reject)")
        self._seller_sees(Message(buyer_id, SELLER, "", Action("reject")))

    # -- observation ---------------------------------------------------------------

    def seller_observation(self, *, consume: bool = True) -> SellerObservation:
        """The seller's view. ``new`` holds what arrived since the last consuming call; a
        display that only looks (``consume=False``) leaves it for the seller's next decision."""
        market = self.market
        new = tuple(self._seller_new)
        if consume:
            self._seller_new.clear()
        # Built positionally, in field order, with tuple.__new__: a named tuple's own __new__ is a
        # Python call, and this runs once per decision (as does buyer_observation).
        return _make(SellerObservation, (
            self.turns_used,
            market.budget,
            market.price_low,
            market.price_high,
            self._products_view or self._seller_products(),
            tuple([_make(BuyerView, (b.id, b.status, b.awaiting, b.offer, b.bid)) for b in self.buyers]),
            new,
            _latest(self._seller_history, HISTORY_KEPT, self._seller_dropped),
        ))

    def _seller_products(self) -> tuple[ProductView, ...]:
        if self._products_view is None:
            stock = self.stock
            self._products_view = tuple([ProductView(p.id, p.name, p.cost, stock[j]) for j, p in enumerate(self.market.products)])
        return self._products_view

    def _buyer_products(self) -> tuple[ProductView, ...]:
        if self._products_public is None:
            self._products_public = tuple([ProductView(v.id, v.name, None, v.stock) for v in self._seller_products()])
        return self._products_public

    def buyer_observation(self, buyer_id: str, message: Message | None) -> BuyerObservation:
        buyer = self._buyer_by_id[buyer_id]
        info = self.market.buyers[buyer.index]
        return _make(BuyerObservation, (
            buyer_id,
            info.persona,
            info.values,
            self._products_public or self._buyer_products(),
            buyer.offer,
            buyer.bid,
            _public(message) if message is not None else None,
            buyer.messages_received,
            _latest(buyer.thread, THREAD_KEPT, buyer.dropped),
        ))


def observe(state: EpisodeState, role: str, message: Message | None = None, *, consume: bool = True):
    """The one way private information reaches an agent: ``role`` is ``seller`` or a buyer id.

    ``consume=False`` is for displays: the seller's ``new`` items stay for its next decision.
    """
    if role == SELLER:
        return state.seller_observation(consume=consume)
    return state.buyer_observation(role, message)
