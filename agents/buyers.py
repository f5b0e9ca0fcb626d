"""The scripted buyers: ``threshold`` (accepts any offer at or below its value), ``concession`` (bids low and concedes
toward its value), ``mixed`` (either, drawn per buyer), ``stubborn`` (one anchor price, never moves) and ``random``
(anything, including rule breaking). Every buyer gets its own seeded numpy ``Generator``; each is a function of what it
observes and its parameters, so a market replays exactly (``negotiate.rollout``)."""

from __future__ import annotations

import numpy as np

from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import BuyerObservation

from negotiate.agents.base import ScriptedAgent, _Seeded
from negotiate.agents.moves import _make

__all__ = ["ThresholdBuyer", "ConcessionBuyer", "MixedBuyer", "StubbornBuyer", "RandomBuyer", "_reply"]


def _reply(obs: BuyerObservation, kind: str, product: str | None = None, price: int | None = None, talk: str = "") -> Message:
    return _make(Message, (obs.buyer, SELLER, talk, _make(Action, (kind, product, price)), ""))


class ThresholdBuyer(ScriptedAgent):
    """Accepts any offer at or below its valuation of the offered product; rejects the rest."""

    name = "threshold"

    def decide(self, obs: BuyerObservation) -> Message:
        offer = obs.offer
        if offer is not None:
            j = int(offer[0][1:]) - 1
            if 0 <= j < len(obs.values) and offer[1] <= obs.values[j]:
                return _reply(obs, "accept", offer[0], offer[1], "Deal.")
        return _reply(obs, "reject", talk="Too expensive for me.")


class ConcessionBuyer(_Seeded):
    """Bids low and concedes toward its value over ``patience`` rounds.

    Its target for product j after r seller messages is
    ``v_j * (start + (1 - start) * min(1, (r - 1) / (patience - 1)))``. It accepts an
    offer at or below the target, else bids the target for the offered product (or
    for its favourite, when it values the offered one much less).
    """

    name = "concession"

    def __init__(self, spec: str, params: dict | None, rng: np.random.Generator):
        super().__init__(spec, params)
        self.start = float(self.params.get("start", rng.uniform(0.4, 0.6)))
        self.patience = int(self.params.get("patience", rng.integers(3, 7)))

    def _target(self, value: int, rounds: int) -> int:
        progress = min(1.0, (rounds - 1) / max(1, self.patience - 1))
        return int(value * (self.start + (1 - self.start) * progress))

    def decide(self, obs: BuyerObservation) -> Message:
        values = obs.values
        in_stock = [j for j, p in enumerate(obs.products) if p.stock > 0] or list(range(len(values)))
        favourite = max(in_stock, key=lambda j: values[j])
        offer = obs.offer
        j = favourite
        if offer is not None:
            k = int(offer[0][1:]) - 1
            if 0 <= k < len(values):
                target = self._target(values[k], obs.rounds)
                if offer[1] <= target:
                    return _reply(obs, "accept", offer[0], offer[1], "You have a deal.")
                if values[k] >= 0.9 * values[favourite]:
                    j = k
        price = self._target(values[j], obs.rounds)
        return _reply(obs, "bid", f"p{j + 1}", price, f"I could do ${price} for p{j + 1}.")


class MixedBuyer(_Seeded):
    """Both kinds in one market: each buyer concedes (and bids) with probability ``conceding`` (default 0.5),
    else it is a threshold one.

    The kind is drawn from the buyer's own seed, so every seller and repeat meets the same mix. A seller trained
    against one kind gains against that kind alone (docs/experiments/grounded-dagger-threshold.md); this
    population asks it to sell to both.
    """

    name = "mixed"

    def __init__(self, spec: str, params: dict | None, rng: np.random.Generator):
        super().__init__(spec, params)
        conceding = rng.random() < float(self.params.get("conceding", 0.5))
        self.kind: ScriptedAgent = ConcessionBuyer(spec, {}, rng) if conceding else ThresholdBuyer(spec, {})

    def decide(self, obs: BuyerObservation) -> Message:
        return self.kind.decide(obs)

    def describe(self) -> dict:
        return super().describe() | {"as": self.kind.name}


class StubbornBuyer(_Seeded):
    """One anchor price per product, a fixed share of its value; it never moves."""

    name = "stubborn"

    def __init__(self, spec: str, params: dict | None, rng: np.random.Generator):
        super().__init__(spec, params)
        self.share = float(self.params.get("share", rng.uniform(0.7, 0.9)))

    def decide(self, obs: BuyerObservation) -> Message:
        anchors = [int(v * self.share) for v in obs.values]
        offer = obs.offer
        if offer is not None:
            j = int(offer[0][1:]) - 1
            if 0 <= j < len(anchors) and offer[1] <= anchors[j]:
                return _reply(obs, "accept", offer[0], offer[1], "Fine.")
        in_stock = [j for j, p in enumerate(obs.products) if p.stock > 0] or list(range(len(anchors)))
        j = max(in_stock, key=lambda j: anchors[j])
        return _reply(obs, "bid", f"p{j + 1}", anchors[j], f"${anchors[j]} for p{j + 1}, not a cent more.")


class RandomBuyer(_Seeded):
    """Anything at all: random actions, unknown products, prices above its value."""

    name = "random"

    def __init__(self, spec: str, params: dict | None, rng: np.random.Generator):
        super().__init__(spec, params)
        self.rng = rng

    def decide(self, obs: BuyerObservation) -> Message:
        rng = self.rng
        roll = rng.random()
        top = max(obs.values) * 3 // 2 + 1
        if roll < 0.05:
            return _reply(obs, "quit", talk="Bye.")
        if roll < 0.35 and obs.offer is not None:
            return _reply(obs, "accept", *obs.offer)
        if roll < 0.5:
            return _reply(obs, "accept", f"p{int(rng.integers(1, len(obs.values) + 2))}", int(rng.integers(0, top)))
        if roll < 0.7:
            return _reply(obs, "reject")
        return _reply(obs, "bid", f"p{int(rng.integers(1, len(obs.values) + 2))}", int(rng.integers(0, top)))
