"""A person as an agent: ``act`` waits for the message the terminal UI hands it.

:class:`HumanAgent` plays the seller or one buyer. The bus calls ``act(obs)`` as it
does for any agent; the call parks until the UI calls :meth:`HumanAgent.send`.
Before sending, the UI builds the message with :meth:`HumanAgent.draft`, which
checks what a person can get wrong by typing and raises :class:`DraftError` with a
sentence to show. The market's rules (a message to a buyer that has bought, left or
owes a reply, a sold-out product, a price below one's own cost or above one's own
valuation, an accept that does not match the standing offer or bid) are the
regulator's own check, :mod:`negotiate.rules`, run on the observation; beside them
the draft refuses what only a person types (a product that does not exist, a price
that is not a whole number or is negative, a seller's price above the top of the
public range, where no buyer's value ever lies, a bid for a sold-out product). The
price is read as typed, never repaired: ``-5`` and ``12.5`` are refused, not read
as 5 and 125. The regulator still judges every message that is sent.

People are slow: ``instant`` is False, so the bus puts a deadline on every call
(``negotiate play`` gives an hour). A person's episodes are traced like any other.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import ClassVar

from negotiate.protocol import BUYER, BUYER_ACTIONS, PRICED, SELLER, SELLER_ACTIONS, TALK_MAX, Action, Message
from negotiate.regulator import BuyerObservation, SellerObservation
from negotiate.rules import AWAITING_REPLY, BELOW_COST, BUYER_GONE, BUYER_SERVED, OVERPAY, SOLD_OUT, UNKNOWN_BUYER, buyer_violation, seller_violation

__all__ = ["HumanAgent", "DraftError", "parse_price"]


class DraftError(ValueError):
    """A message the UI refuses to send; ``str(error)`` is the sentence to show the person."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field
        """The composer field at fault (``price``, ``product``, ``talk``), or None."""


_WHOLE = re.compile(r"-?[0-9]{1,15}")
"""A whole number as typed (ASCII digits; 15 at most, far above any market's prices)."""
_GROUPED = re.compile(r"-?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]*)?")
"""Digits with commas between groups of three (``1,250``), as a price is written."""
_NO_CENTS = re.compile(r"\.0*$")
"""A whole number's zero cents (``250.00``, ``250.``)."""


def parse_price(text: str | int | None) -> int:
    """A price as a person types it: a whole number of currency units, with ``$``, commas between groups of three
    digits and zero cents allowed.

    >>> parse_price(" $1,250 "), parse_price("250.00"), parse_price("$1,250.0")
    (1250, 250, 1250)
    >>> parse_price("1,2,5,0")
    Traceback (most recent call last):
    ...
    negotiate.agents.human.DraftError: price '1,2,5,0': commas go between groups of three digits, as in 1,250
    >>> parse_price("12.5")
    Traceback (most recent call last):
    ...
    negotiate.agents.human.DraftError: price '12.5' is not a whole number of dollars
    >>> parse_price("-5")
    Traceback (most recent call last):
    ...
    negotiate.agents.human.DraftError: price -5 is negative
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        typed = (text or "").strip()
        cleaned = typed.replace("$", "", 1).strip()
        if "," in cleaned:
            if not _GROUPED.fullmatch(cleaned):
                raise DraftError(f"price {typed!r}: commas go between groups of three digits, as in 1,250", "price")
            cleaned = cleaned.replace(",", "")
        if not cleaned.startswith("."):  # ".0" is no number at all
            cleaned = _NO_CENTS.sub("", cleaned)
        if not cleaned:
            raise DraftError("give a price", "price")
        if not _WHOLE.fullmatch(cleaned):
            if re.fullmatch(r"-?[0-9]{16,}", cleaned):
                raise DraftError(f"price {cleaned[:6]}... ({len(cleaned.lstrip('-'))} digits) is far too large", "price")
            raise DraftError(f"price {typed!r} is not a whole number of dollars", "price")
        value = int(cleaned)
    if value < 0:
        raise DraftError(f"price {value} is negative", "price")
    return value


def _seller_sentence(violation: str, to: str | None, buyer, action: Action, view) -> tuple[str, str | None]:
    """What to tell a person whose message would break the rule ``violation``, and the field at fault."""
    if violation == UNKNOWN_BUYER:
        return (f"there is no buyer {to!r}" if to else "choose a buyer"), None
    if violation == BUYER_SERVED:
        return f"{buyer.id} has already bought", None
    if violation == BUYER_GONE:
        return f"{buyer.id} has left", None
    if violation == AWAITING_REPLY:
        return f"{buyer.id} has not answered your last message yet", None
    if violation == SOLD_OUT:
        return f"{view.id} is sold out", "product"
    if violation == BELOW_COST:
        return f"${action.price} is below the cost of {view.id} (${view.cost}); the market refuses that", "price"
    if buyer.bid is None:  # NO_STANDING
        return f"{buyer.id} has no standing bid to accept", None
    return f"{buyer.id}'s standing bid is {buyer.bid[0]} ${buyer.bid[1]}; accept exactly that", "price"


def _product(obs, product: str | None):
    """The catalog line of ``product``, or a DraftError."""
    if not product:
        raise DraftError("choose a product", "product")
    for view in obs.products:
        if view.id == product:
            return view
    raise DraftError(f"there is no product {product!r}", "product")


class HumanAgent:
    """The seller or one buyer, played by a person through the terminal UI."""

    instant: ClassVar[bool] = False
    """A person takes time: the bus gives every call a deadline."""

    def __init__(self, ident: str, *, on_turn: Callable[[object], None] | None = None):
        self.id = ident
        """``seller`` or the buyer id this person plays (``b1``)."""
        self.role = SELLER if ident == SELLER else BUYER
        self.on_turn = on_turn
        """Called with the observation when a decision is awaited (the UI wakes up)."""
        self.observation: SellerObservation | BuyerObservation | None = None
        """The observation of the decision being awaited; None while it is not this person's turn."""
        self.decisions = 0
        """Messages sent so far."""
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue()

    @property
    def waiting(self) -> bool:
        """True while the bus waits for this person's message."""
        return self.observation is not None

    async def act(self, obs) -> Message | None:
        while not self._queue.empty():  # nothing sent before this turn may answer it
            self._queue.get_nowait()
        self.observation = obs
        if self.on_turn is not None:
            self.on_turn(obs)
        try:
            return await self._queue.get()
        finally:
            self.observation = None

    def send(self, message: Message) -> None:
        """Hand the bus this person's message (build it with :meth:`draft`)."""
        if not self.waiting:
            raise RuntimeError(f"{self.id} sent a message while no decision was awaited")
        if message.sender != self.id:
            raise ValueError(f"message from {str(message.sender)!r}, but this agent is {str(self.id)!r}")
        self.observation = None  # a second send before the bus resumes must fail, not queue up
        self.decisions += 1
        self._queue.put_nowait(message)

    def release(self) -> None:
        """End the wait without a message (``act`` returns None): the episode ended while this person was deciding."""
        if self.waiting:
            self.observation = None
            self._queue.put_nowait(None)

    def draft(self, obs, kind: str, *, product: str | None = None, price: str | int | None = None,
              talk: str = "", to: str | None = None) -> Message:
        """Build this person's message, checked against ``obs`` (the live observation).

        Raises :class:`DraftError` for what the person should fix before sending.
        """
        if len(talk) > TALK_MAX:
            raise DraftError(f"talk is {len(talk)} characters; at most {TALK_MAX}", "talk")
        if self.role == SELLER:
            return self._draft_seller(obs, kind, product, price, talk.strip(), to)
        return self._draft_buyer(obs, kind, product, price, talk.strip())

    def _draft_buyer(self, obs: BuyerObservation, kind: str, product, price, talk: str) -> Message:
        if kind not in BUYER_ACTIONS:
            raise DraftError(f"a buyer can {', '.join(BUYER_ACTIONS)}; not {kind!r}")
        if kind not in PRICED:
            return Message(self.id, SELLER, talk, Action(kind))
        view = _product(obs, product)
        value = obs.values[obs.products.index(view)]
        action = Action(kind, view.id, parse_price(price))
        problem = buyer_violation(action, value, obs.offer)  # the regulator's own rule check
        if problem is not None:
            violation, _ = problem
            if violation == OVERPAY:
                raise DraftError(f"${action.price} is above your value of {view.id} (${value}); the market refuses that", "price")
            if obs.offer is None:  # NO_STANDING
                raise DraftError("there is no standing offer to accept")
            raise DraftError(f"the standing offer is {obs.offer[0]} ${obs.offer[1]}; accept exactly that", "price")
        if view.stock == 0:  # not a rule (the race for the last unit is a notice), but nothing a person should send
            raise DraftError(f"{view.id} is sold out", "product")
        return Message(self.id, SELLER, talk, action)

    def _draft_seller(self, obs: SellerObservation, kind: str, product, price, talk: str, to) -> Message:
        if kind not in SELLER_ACTIONS:
            raise DraftError(f"the seller can {', '.join(SELLER_ACTIONS)}; not {kind!r}")
        if kind == "end":
            return Message(self.id, "", talk, Action("end"))
        buyer = next((b for b in obs.buyers if b.id == to), None)
        # The addressee's rules first (a reject checks only those), then the product's and the price's.
        action, view = Action("reject"), None
        problem = seller_violation(action, to or "", buyer, None)
        if problem is None and kind != "reject":
            view = _product(obs, product)
            action = Action(kind, view.id, parse_price(price))
            problem = seller_violation(action, buyer.id, buyer, view)
        if problem is not None:
            raise DraftError(*_seller_sentence(problem[0], to, buyer, action, view))
        if action.price is not None and action.price > obs.price_high:
            raise DraftError(f"${action.price} is above every buyer's value (the range is ${obs.price_low}-${obs.price_high})", "price")
        return Message(self.id, buyer.id, talk, action)

    def describe(self) -> dict:
        return {"kind": "human", "name": "human", "spec": "human", "params": {}, "role": self.role, "id": self.id}
