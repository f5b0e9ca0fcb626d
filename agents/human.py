"""A person as an agent: ``act`` waits for the message the terminal UI hands it.

:class:`HumanAgent` plays the seller or one buyer. The bus calls ``act(obs)`` as it
does for any agent; the call parks until the UI calls :meth:`HumanAgent.send`.
Before sending, the UI builds the message with :meth:`HumanAgent.draft`, which
checks what a person can get wrong by typing (a product that does not exist, a
price that is not a whole number or is negative, an accept that does not match
the standing offer or bid, a message to a buyer that owes a reply, a price below
one's own cost, above one's own valuation, or, for the seller, above the top of
the public price range, where no buyer's value ever lies) and raises
:class:`DraftError` with a sentence to show. The price is read as typed, never
repaired: ``-5`` and ``12.5`` are refused, not read as 5 and 125. The regulator
still judges every message that is sent.

People are slow: ``instant`` is False, so the bus puts a deadline on every call
(``negotiate play`` gives an hour). A person's episodes are traced like any other.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import ClassVar

from negotiate.protocol import BUYER_ACTIONS, PRICED, SELLER, SELLER_ACTIONS, TALK_MAX, Action, Message
from negotiate.regulator import BuyerObservation, SellerObservation

__all__ = ["HumanAgent", "DraftError", "parse_price"]


class DraftError(ValueError):
    """A message the UI refuses to send; ``str(error)`` is the sentence to show the person."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field
        """The composer field at fault (``price``, ``product``, ``talk``), or None."""


_WHOLE = re.compile(r"-?[0-9]{1,15}")
"""A whole number as typed (ASCII digits; 15 at most, far above any market's prices)."""


def parse_price(text: str | int | None) -> int:
    """A price as a person types it: a whole number of currency units, ``$`` and ``,`` allowed.

    >>> parse_price(" $1,250 ")
    1250
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
        cleaned = typed.replace("$", "", 1).replace(",", "").strip()
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
        self.role = SELLER if ident == SELLER else "buyer"
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
            raise ValueError(f"message from {message.sender!r}, but this agent is {self.id!r}")
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
        price = parse_price(price)
        if kind == "accept":
            if obs.offer is None:
                raise DraftError("there is no standing offer to accept")
            if obs.offer != (view.id, price):
                raise DraftError(f"the standing offer is {obs.offer[0]} ${obs.offer[1]}; accept exactly that", "price")
        if view.stock == 0:
            raise DraftError(f"{view.id} is sold out", "product")
        if price > value:
            raise DraftError(f"${price} is above your value of {view.id} (${value}); the market refuses that", "price")
        return Message(self.id, SELLER, talk, Action(kind, view.id, price))

    def _draft_seller(self, obs: SellerObservation, kind: str, product, price, talk: str, to) -> Message:
        if kind not in SELLER_ACTIONS:
            raise DraftError(f"the seller can {', '.join(SELLER_ACTIONS)}; not {kind!r}")
        if kind == "end":
            return Message(self.id, "", talk, Action("end"))
        buyer = next((b for b in obs.buyers if b.id == to), None)
        if buyer is None:
            raise DraftError(f"there is no buyer {to!r}" if to else "choose a buyer")
        if buyer.status != "active":
            raise DraftError(f"{buyer.id} has {'already bought' if buyer.status == 'served' else 'left'}")
        if buyer.awaiting:
            raise DraftError(f"{buyer.id} has not answered your last message yet")
        if kind == "reject":
            return Message(self.id, buyer.id, talk, Action("reject"))
        view = _product(obs, product)
        price = parse_price(price)
        if kind == "accept":
            if buyer.bid is None:
                raise DraftError(f"{buyer.id} has no standing bid to accept")
            if buyer.bid != (view.id, price):
                raise DraftError(f"{buyer.id}'s standing bid is {buyer.bid[0]} ${buyer.bid[1]}; accept exactly that", "price")
        if view.stock == 0:
            raise DraftError(f"{view.id} is sold out", "product")
        if view.cost is not None and price < view.cost:
            raise DraftError(f"${price} is below the cost of {view.id} (${view.cost}); the market refuses that", "price")
        if price > obs.price_high:
            raise DraftError(f"${price} is above every buyer's value (the range is ${obs.price_low}-${obs.price_high})", "price")
        return Message(self.id, buyer.id, talk, Action(kind, view.id, price))

    def describe(self) -> dict:
        return {"kind": "human", "name": "human", "spec": "human", "params": {}, "role": self.role, "id": self.id}
