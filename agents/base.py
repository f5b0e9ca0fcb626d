"""What an agent is: an object with an async ``act`` that turns an observation into a message.

Sellers return a :class:`~negotiate.protocol.Message`, a
:class:`~negotiate.protocol.ParseFailure`, a :class:`~negotiate.protocol.Generated`
(model-backed agents: the parse result plus raw text and backend details), or None
to wait for the next reply. Buyers answer every seller message they receive.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from negotiate.protocol import Generated, Message, ParseFailure
from negotiate.regulator import BuyerObservation, SellerObservation

__all__ = ["SellerAgent", "BuyerAgent", "ActResult", "ScriptedAgent"]

ActResult = Message | ParseFailure | Generated | None
"""What ``act`` returns: a message, a parse failure, a model's generation, or None (a seller that waits)."""
Decision = ActResult
"""The former name of :data:`ActResult`, kept for old imports; ``negotiate.training.Decision`` is a training sample."""


@runtime_checkable
class SellerAgent(Protocol):
    async def act(self, obs: SellerObservation) -> ActResult: ...

    def describe(self) -> dict: ...


@runtime_checkable
class BuyerAgent(Protocol):
    async def act(self, obs: BuyerObservation) -> ActResult: ...

    def describe(self) -> dict: ...


class ScriptedAgent:
    """Base of the scripted strategies: a synchronous ``decide`` wrapped as ``act``.

    ``instant`` tells the bus that ``act`` never waits, so it needs no deadline.
    """

    instant: ClassVar[bool] = True
    name: ClassVar[str] = "scripted"
    defaults: ClassVar[dict] = {}
    """The value each parameter takes when the spec leaves it out (one drawn per episode has none here)."""

    def __init__(self, spec: str, params: dict | None = None):
        self.spec = spec
        self.params = params or {}

    @classmethod
    def create(cls, spec: str, params: dict, *, market, seed):
        """Build one for an episode; subclasses that need the market or a Generator override this."""
        return cls(spec, params)

    def decide(self, obs):  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    async def act(self, obs) -> ActResult:
        return self.decide(obs)

    def describe(self) -> dict:
        return {"kind": "scripted", "name": self.name, "spec": self.spec, "params": self.params}


class _Seeded(ScriptedAgent):
    """A scripted agent that draws random numbers from its own Generator."""

    @classmethod
    def create(cls, spec, params, *, market, seed):
        return cls(spec, params, np.random.default_rng(seed))
