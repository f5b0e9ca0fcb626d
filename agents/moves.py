"""The pieces every scripted seller is built from: messages, units still free, the joint assignment, following.

The sellers in :mod:`negotiate.agents.scripted` and the planner (:mod:`negotiate.agents.planner`) both build on
these; keeping them here, below both, is what lets the seller table in ``scripted`` name the planner without an
import cycle.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

import copy

from negotiate.protocol import SELLER, Action, Message, Notice
from negotiate.regulator import ACTIVE, SellerObservation

from negotiate.agents.base import ScriptedAgent

__all__ = ["best_assigned", "units_left", "standing", "_offer", "_accept_bid", "_end", "_Follower", "_make", "Adviser"]


def best_assigned(value: np.ndarray, cols: list[int], units, free: int) -> tuple[int, int] | None:
    """The (row, column) of the most valuable pair in the joint assignment of buyers (rows) to products
    (columns of ``value``; ``cols`` maps each to its product index, ``units`` its stock). Units are scarce:
    a product with k units appears k times (at most ``free``). None when no assigned pair is worth anything.

    Ties between assignments of the same worth go as scipy's solver breaks them (the order it augments rows in and
    the rounding of its duals pick the buyer, in about half the decisions of a 50 x 50 market): the solver runs on
    every decision with two or more buyers and units. One buyer, or one unit, is its first best pair, found here
    as the solver finds it (``tests/test_scale_markets.py``)."""
    if max(units) <= 1 or free <= 1:  # one unit of each product in stock: the columns as they are
        expanded, matrix = None, value
    else:
        expanded = [c for c, j in enumerate(cols) for _ in range(min(units[j], free))]
        matrix = value[:, expanded]
    rows, picks = _assignment(matrix)
    if len(rows) > 8:
        worth = matrix[rows, picks]
        k = int(worth.argmax())
        if not worth[k] > 0:
            return None
        return int(rows[k]), int(picks[k] if expanded is None else expanded[picks[k]])
    best = None
    for r, k in zip(rows, picks):
        c = k if expanded is None else expanded[k]
        if value[r, c] > 0 and (best is None or value[r, c] > value[best]):
            best = (r, c)
    return best


def _assignment(matrix: np.ndarray) -> tuple:
    """``linear_sum_assignment(matrix, maximize=True)``, without the call for one row or one column: scipy's solver
    (the shortest augmenting path, scanning columns from the last) gives that row the first of its most valuable
    columns, or that column the first of its most valuable rows."""
    nr, nc = matrix.shape
    if nr == 1 and nc:
        return (0,), (int(matrix[0].argmax()),)
    if nc == 1 and nr:
        return (int(matrix[:, 0].argmax()),), (0,)
    return linear_sum_assignment(matrix, maximize=True)


_make = tuple.__new__
"""Builds a named tuple from its fields in order: a third of the cost of ``Message(...)``, whose
``__new__`` is a Python call. Scripted agents build one message per decision, tens of thousands
a second; the fields are (sender, to, talk, action, thought) and (kind, product, price)."""


def _offer(to: str, product: str, price: int, talk: str = "", thought: str = "") -> Message:
    return _make(Message, (SELLER, to, talk or f"I can let you have {product} for ${price}.", _make(Action, ("offer", product, price)), thought))


def units_left(obs: SellerObservation) -> list[int]:
    """Each product's units not yet promised: its stock less the offers of it that buyers are still answering."""
    units = [p.stock for p in obs.products]
    for b in obs.buyers:
        if b.awaiting and b.offer is not None:
            units[int(b.offer[0][1:]) - 1] -= 1
    return units


def standing(obs: SellerObservation, active: list[int] | None = None) -> tuple[list[int], list[int], list[int]]:
    """(the buyers still active, those of them free to hear a message, :func:`units_left`) of ``obs``, the active
    ones looked for among ``active`` (the active buyers of an earlier observation of the episode: a buyer served or
    gone never comes back, and only an active buyer owes a reply). A large market's sellers pass the list they found
    last: most buyers are served long before the budget is spent, and a walk over every buyer at each decision was
    most of a turn's cost once the rest was kept between decisions."""
    buyers = obs.buyers
    if active is None:
        active = [i for i, b in enumerate(buyers) if b.status == ACTIVE]
    else:
        active = [i for i in active if buyers[i].status == ACTIVE]
    free = []
    units = [p.stock for p in obs.products]
    for i in active:
        b = buyers[i]
        if not b.awaiting:
            free.append(i)
        elif b.offer is not None:
            units[int(b.offer[0][1:]) - 1] -= 1
    return active, free, units


def _copied(value):
    """A copy of a follower's state: arrays and containers copied down to their (immutable) items."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list):
        return [_copied(item) if isinstance(item, (list, dict, np.ndarray)) else item for item in value]
    if isinstance(value, dict):
        return {key: _copied(item) if isinstance(item, (list, dict, np.ndarray)) else item for key, item in value.items()}
    return value


def _accept_bid(to: str, product: str, price: int) -> Message:
    return _make(Message, (SELLER, to, f"Deal: {product} at ${price}.", _make(Action, ("accept", product, price)), ""))


def _end() -> Message:
    return Message(SELLER, "", "That is all for today.", Action("end"))


class _Follower(ScriptedAgent):
    """A seller that learns from what it observes (``_learn``) and from what it sent (``_record``), and so
    can follow another seller's episode.

    Followers are copied before every decision they advise on and at every replay of a market (the tools prompt's
    advisers, the menu's, the teacher's forks): ``copy.deepcopy`` copies only the attributes named in ``_STATE`` (what
    learning and recording change: arrays, lists of lists, dicts) and shares the rest, which never changes after the
    first decision (the prior spec, costs, parameters). A generic deepcopy spent half the teacher's time walking the
    frozen market spec and numpy's generator state."""

    _STATE: tuple[str, ...] = ()
    """The attributes a decision may change, copied by ``deepcopy``; every other attribute is set once and shared."""

    def __deepcopy__(self, memo):
        new = object.__new__(type(self))
        state = self.__dict__
        new.__dict__.update(state)
        for name in self._STATE:
            value = state.get(name)
            if value is not None:
                new.__dict__[name] = _copied(value)
        return new

    def follow(self, obs: SellerObservation, message: Message | None) -> None:
        """Learn from ``obs`` as :meth:`decide` would, then take ``message`` (None: nothing) as the message
        sent, though another seller chose it: how a teacher walks a policy's episode to label its states."""
        self._learn(obs)
        if message is not None:
            self._record(message)


class Adviser:
    """Scripted sellers (tools: the ``advice`` prompt's planner, the menu's planner and greedy) walking a seller's
    episode beside it, as a teacher walks a trace (``negotiate.training.dataset``): before each decision a copy of
    each decides (:meth:`advise`, its choice leaves no trace), then each takes the seller's message as if it had sent
    it (:meth:`follow`).
    It sees what the seller sees: the market's public spec, never its drawn values. Like the teacher walk,
    it takes only the messages the regulator accepted: whether it did shows in the next observation (a
    violation notice), so each message is taken then."""

    def __init__(self, agents):
        self.agents = list(agents)
        """The tools: scripted sellers built for this episode (``negotiate.agents.registry.adviser`` builds them from specs)."""
        self._pending: tuple[SellerObservation, Message | None] | None = None

    @property
    def agent(self):
        """The first tool: the planner."""
        return self.agents[0]

    def advise(self, obs: SellerObservation) -> Message | None | tuple[Message | None, ...]:
        """The message the tool would send on ``obs`` (with more tools, a tuple of them, in their order)."""
        self._settle(obs)
        said = tuple(copy.deepcopy(agent).decide(obs) for agent in self.agents)
        return said[0] if len(said) == 1 else said

    def follow(self, obs: SellerObservation, message: Message | None) -> None:
        """``message``: what the seller sent on ``obs`` (None: nothing, or nothing that parsed)."""
        self._settle(obs)
        self._pending = (obs, message)

    def _settle(self, obs: SellerObservation) -> None:
        """Follow the last observation and message, the message only if ``obs`` (a later observation) shows
        no violation notice since."""
        if self._pending is None or self._pending[0] is obs:
            return
        before, message = self._pending
        refused = any(isinstance(item, Notice) and item.kind == "violation" for item in obs.new)
        for agent in self.agents:
            agent.follow(before, None if refused else message)
        self._pending = None
