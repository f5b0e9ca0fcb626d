"""The market's rules for a well-formed message, as pure functions: one check, two callers.

The regulator (:mod:`negotiate.regulator`) calls :func:`seller_violation` and
:func:`buyer_violation` on every parsed message before applying it; the person's
composer (:meth:`negotiate.agents.human.HumanAgent.draft`) calls the same functions on
the live observation, so a person is told before sending exactly what the regulator
would refuse. Each takes only facts an observation holds (the addressed buyer's
status, whether it owes a reply, its standing offer and bid, the product's stock and
cost for the seller, the buyer's own value) and returns ``(kind, detail)`` or None.
They never mutate anything and never raise on a message.

What is not a rule lives elsewhere: a buyer's accept or bid for a unit sold while it
was deciding is the race for the last unit (a notice, not a violation), and the
composer's own refusals (a price above the public range) are advice to a person.
"""

from __future__ import annotations

from typing import Protocol

from negotiate.protocol import Action, BuyerStatus

__all__ = [
    "seller_violation",
    "buyer_violation",
    "VIOLATIONS",
    "MALFORMED",
    "TIMEOUT",
    "UNKNOWN_BUYER",
    "BUYER_SERVED",
    "BUYER_GONE",
    "AWAITING_REPLY",
    "UNKNOWN_PRODUCT",
    "SOLD_OUT",
    "BELOW_COST",
    "NO_STANDING",
    "OVERPAY",
]

# Violation kinds. Each is counted by type in the metrics. Plain strings, not an enum: metrics key dicts
# by them, and orjson writes no str subclass as a key.
MALFORMED = "malformed"
TIMEOUT = "timeout"
UNKNOWN_BUYER = "unknown_buyer"
BUYER_SERVED = "buyer_served"
BUYER_GONE = "buyer_gone"
AWAITING_REPLY = "awaiting_reply"
UNKNOWN_PRODUCT = "unknown_product"
SOLD_OUT = "sold_out"
BELOW_COST = "below_cost"
NO_STANDING = "no_standing"
OVERPAY = "overpay"
VIOLATIONS = (
    MALFORMED, TIMEOUT, UNKNOWN_BUYER, BUYER_SERVED, BUYER_GONE, AWAITING_REPLY,
    UNKNOWN_PRODUCT, SOLD_OUT, BELOW_COST, NO_STANDING, OVERPAY,
)
"""Every violation kind, seller's and buyer's."""


class BuyerFacts(Protocol):
    """What the seller knows of one buyer: a :class:`~negotiate.regulator.BuyerView` (or the regulator's own state)."""

    id: str
    status: str
    awaiting: bool
    bid: tuple[str, int] | None


class ProductFacts(Protocol):
    """What the seller knows of one product: a :class:`~negotiate.regulator.ProductView`."""

    stock: int
    cost: int | None


_SERVED, _GONE = BuyerStatus.SERVED, BuyerStatus.GONE  # module names: an enum attribute costs ~40 ns a lookup, on every message


def _standing(pair: tuple[str, int] | None) -> str:
    return f"{pair[0]} ${pair[1]}" if pair else "none"


def seller_violation(action: Action, to: str, buyer: BuyerFacts | None, product: ProductFacts | None) -> tuple[str, str] | None:
    """The rule a seller message to ``to`` breaks, as ``(kind, detail)``, or None.

    ``buyer`` is the addressee (None: no such buyer); ``product`` the product an offer or accept
    names (None: no such product). An ``end`` breaks nothing and is not checked here.

    >>> from negotiate.regulator import BuyerView, ProductView
    >>> b1, p1 = BuyerView("b1", "active", False, None, ("p1", 300)), ProductView("p1", "Pro", 200, 1)
    >>> seller_violation(Action("offer", "p1", 150), "b1", b1, p1)
    ('below_cost', 'offer of p1 at $150 is below its cost $200')
    >>> seller_violation(Action("accept", "p1", 320), "b1", b1, p1)
    ('no_standing', 'accept p1 $320 matches no standing bid of b1 (standing: p1 $300)')
    >>> seller_violation(Action("accept", "p1", 300), "b1", b1, p1) is None
    True
    """
    if buyer is None:
        return UNKNOWN_BUYER, f"no buyer {to!r}"
    if buyer.status == _SERVED:
        return BUYER_SERVED, f"{buyer.id} has already bought"
    if buyer.status == _GONE:
        return BUYER_GONE, f"{buyer.id} has left"
    if buyer.awaiting:
        return AWAITING_REPLY, f"{buyer.id} has not answered the last message yet"
    if action.kind in ("offer", "accept"):
        if product is None:
            return UNKNOWN_PRODUCT, f"no product {action.product!r}"
        if product.stock == 0:
            return SOLD_OUT, f"{action.product} is sold out"
        if action.price < product.cost:
            return BELOW_COST, f"{action.kind} of {action.product} at ${action.price} is below its cost ${product.cost}"
        if action.kind == "accept" and buyer.bid != (action.product, action.price):
            return NO_STANDING, (f"accept {action.product} ${action.price} matches no standing bid of {buyer.id} "
                                 f"(standing: {_standing(buyer.bid)})")
    return None


def buyer_violation(action: Action, value: int | None, offer: tuple[str, int] | None) -> tuple[str, str] | None:
    """The rule a buyer's priced reply (``accept`` or ``bid``) breaks, as ``(kind, detail)``, or None.

    ``value`` is the buyer's own value of the named product (None: no such product); ``offer``
    the seller's standing offer to this buyer. A reject or a quit breaks nothing.

    >>> buyer_violation(Action("bid", "p1", 500), 450, None)
    ('overpay', "bid of p1 at $500 is above the buyer's valuation")
    >>> buyer_violation(Action("accept", "p1", 400), 450, ("p1", 420))
    ('no_standing', 'accept p1 $400 matches no standing offer (standing: p1 $420)')
    """
    if action.kind not in ("accept", "bid"):
        return None
    if value is None:
        return UNKNOWN_PRODUCT, f"no product {action.product!r}"
    if action.price > value:
        return OVERPAY, f"{action.kind} of {action.product} at ${action.price} is above the buyer's valuation"
    if action.kind == "accept" and offer != (action.product, action.price):
        return NO_STANDING, f"accept {action.product} ${action.price} matches no standing offer (standing: {_standing(offer)})"
    return None
