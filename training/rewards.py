"""Rewards: named, pure functions of one episode's trace (its list of events: records, or dicts as read).

A reward is what the trainer optimizes; everything else in the trace's ``metrics`` is
logged only. Each function reads the events alone (the metrics are recomputed from
them, never trusted from the ``episode_end`` line) and returns a float, or None for an
episode that cannot be scored (a ``failed`` episode: its end has no metrics, and a
crash is nobody's strategy).

The default, ``profit-penalized``, is the seller's profit / OPT minus ``PENALTY`` per
seller violation, with the total penalty capped at 1: the reward lies in [-1, 1].
profit / OPT cannot blow up on thin margins: every deal is at or above cost (a sale
below cost is refused), so 0 <= profit <= welfare <= OPT, and a market with nothing to
gain (OPT = 0) scores 0 rather than dividing by zero.

Choose one by name (``negotiate train --reward NAME``); :data:`REWARDS` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from negotiate.metrics import metrics_from_events
from negotiate.trace import EpisodeRecord, Event

__all__ = ["REWARDS", "DEFAULT_REWARD", "PENALTY", "reward_fn", "profit_penalized", "profit_share", "welfare_share", "adherence"]

PENALTY = 0.1
"""Cost of one seller violation in the default reward (a malformed message, an offer below cost...)."""


def _metrics(events: Sequence[Event | dict]) -> dict | None:
    episode = EpisodeRecord.of(events)
    if not episode.complete or episode.failed:
        return None
    return metrics_from_events(episode.events)


def _share(numerator: float, opt: float) -> float:
    return numerator / opt if opt > 0 else 0.0


def profit_share(events: Sequence[Event | dict]) -> float | None:
    """Seller profit / OPT, in [0, 1]; 0 when OPT is 0.

    >>> from negotiate.training.rewards import _doctest_episode
    >>> profit_share(_doctest_episode(price=400, invalid=0))  # (400 - 100) / (700 - 100)
    0.5
    """
    m = _metrics(events)
    return None if m is None else _share(m["profit"], m["opt"])


def profit_penalized(events: Sequence[dict], penalty: float = PENALTY) -> float | None:
    """profit / OPT minus ``penalty`` per seller violation (total penalty capped at 1); the default reward.

    >>> from negotiate.training.rewards import _doctest_episode
    >>> round(profit_penalized(_doctest_episode(price=400, invalid=2)), 6)  # 0.5 - 2 * 0.1
    0.3
    >>> profit_penalized(_doctest_episode(price=None, invalid=30))  # no deal, penalty capped at 1
    -1.0
    """
    m = _metrics(events)
    if m is None:
        return None
    seller_violations = sum(m["violations"].values())
    return _share(m["profit"], m["opt"]) - min(1.0, penalty * seller_violations)


def welfare_share(events: Sequence[Event | dict]) -> float | None:
    """Welfare (sum of value - cost over deals) / OPT: allocation quality, whoever gets the surplus.

    >>> from negotiate.training.rewards import _doctest_episode
    >>> welfare_share(_doctest_episode(price=400, invalid=0))  # (700 - 100) / 600
    1.0
    """
    m = _metrics(events)
    return None if m is None else _share(m["welfare"], m["opt"])


def adherence(events: Sequence[Event | dict]) -> float | None:
    """Share of the seller's messages that were valid (format and rules); 1 when it sent none.

    >>> from negotiate.training.rewards import _doctest_episode
    >>> adherence(_doctest_episode(price=400, invalid=1))  # 1 valid offer of 2 messages
    0.5
    """
    m = _metrics(events)
    if m is None:
        return None
    return m["valid_rate"] if m["valid_rate"] is not None else 1.0


REWARDS: dict[str, Callable[[Sequence[Event | dict]], float | None]] = {
    "profit-penalized": profit_penalized,
    "profit": profit_share,
    "welfare": welfare_share,
    "adherence": adherence,
}
"""Rewards by name."""
DEFAULT_REWARD = "profit-penalized"


def reward_fn(name: str) -> Callable[[Sequence[Event | dict]], float | None]:
    """The reward called ``name``; a ValueError lists the choices."""
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; choose from {', '.join(REWARDS)}") from None


def _doctest_episode(price: int | None, invalid: int) -> list[dict]:
    """A one-buyer, one-product episode for the doctests: cost 100, value 700 (OPT 600).

    The seller sends ``invalid`` malformed messages, then (when ``price`` is given) an offer
    the buyer accepts.
    """
    spec = {"name": "doc", "buyers": 1, "products": 1}
    market = {"seed": 0, "budget": 40, "price_low": 100, "price_high": 1000,
              "products": [{"id": "p1", "name": "Tent", "cost": 100, "stock": 1}],
              "buyers": [{"id": "b1", "values": [700], "persona": "neutral"}]}
    events: list[dict] = [{"type": "episode_start", "episode": "doc", "schema": 1, "spec": spec, "market": market}]
    turn = 0
    for _ in range(invalid):
        turn += 1
        events.append({"type": "message", "turn": turn, "sender": "seller", "to": None, "action": None, "valid": False, "error": "no action"})
        events.append({"type": "violation", "turn": turn, "who": "seller", "kind": "malformed", "detail": "no action"})
    if price is not None:
        turn += 1
        events.append({"type": "message", "turn": turn, "sender": "seller", "to": "b1", "valid": True,
                       "action": {"kind": "offer", "product": "p1", "price": price}})
        events.append({"type": "message", "turn": None, "sender": "b1", "to": "seller", "valid": True,
                       "action": {"kind": "accept", "product": "p1", "price": price}})
        events.append({"type": "deal", "turn": turn, "buyer": "b1", "product": "p1", "price": price, "cost": 100, "value": 700, "by": "b1"})
    events.append({"type": "episode_end", "outcome": "terminated" if price else "truncated", "turns_used": turn, "budget": 40})
    return events
