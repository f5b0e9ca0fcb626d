"""The rollout seller: each move chosen by playing the menu's options out in worlds drawn from what the seller knows.

``rollout`` is the strongest seller here that needs no learning and sees no private information. At each decision it
lays out the menu (``negotiate.agents.menu``: the planner's and greedy's moves, the planner's offer up and down the
price grid, every bid accepted, end), draws ``worlds`` possible markets consistent with its observation, and in each
plays every option out (``negotiate.rollout.play_out``): the option, then the planner to the end. It sends the option
of the highest mean profit over the worlds (the same worlds for every option, so the comparison is paired; ties go to
the planner's option).

A world is the public catalog and stock, the turns left and every buyer's standing offer and bid as observed, with
each active buyer's private side drawn:

- its kind: conceding (it bids) or threshold (it accepts or rejects; it never bids), told by what it has done, else
  drawn from the population the seller is told it faces (``buyers``: ``concession``, ``threshold`` or ``mixed``,
  half and half), as the planner is built for the buyers' known strategies (its ``PATIENCE`` is the conceding
  buyers' range);
- its values: uniform within the planner's bounds for each product (a refused price bounds a value from above, a bid
  from below; the value model of the spec's prior within them);
- a conceding buyer's start and patience: drawn from their priors (``ConcessionBuyer``: U(0.4, 0.6) and 3..6 rounds),
  256 candidates weighed by how closely they give the bids it made to the offers it heard (a Gaussian kernel of width
  :data:`KERNEL` of the value range), with its values for the products it bid on read back from its last bid.

It never reads the market's drawn values: :meth:`RolloutSeller.create` keeps the spec (the prior) and nothing else of
the market, as the planner does. It is slow by design: ``worlds`` x options x the turns left, per decision (about 50 ms
a decision on the compact splits at 8 worlds).
"""

from __future__ import annotations

import copy
import math

import numpy as np

from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Message
from negotiate.regulator import ACTIVE, EpisodeState, SellerObservation
from negotiate.rollout import play_out, profit

from negotiate.agents.base import ScriptedAgent
from negotiate.agents.buyers import ConcessionBuyer, ThresholdBuyer
from negotiate.agents.menu import TOOLS, build_menu
from negotiate.agents.moves import Adviser

__all__ = ["RolloutSeller", "KERNEL"]

KERNEL = 0.01
"""Width of the kernel that weighs a conceding buyer's drawn start and patience by the bids they would have made, as a
share of the value range (a bid off by 1% of the range weighs e^-1/2 of one that matches). With :data:`CANDIDATES` 256,
the draws give two observed bids back within $6 in half the draws and $29 at worst (200 draws, a $900 range); 64
candidates and 2% gave $14 and $54."""
CANDIDATES = 256
"""Draws of a conceding buyer's start and patience weighed per world."""


class RolloutSeller(ScriptedAgent):
    """Plays every option of the menu out in worlds drawn from its observation and the spec's prior; sends the best."""

    name = "rollout"
    defaults = {"worlds": 8, "buyers": "mixed"}

    def __init__(self, spec: str, params: dict, prior: MarketSpec, tools: list, continuation, rng: np.random.Generator):
        super().__init__(spec, params)
        self.prior = prior
        self.adviser = Adviser(tools)
        self.continuation = continuation
        """The planner, following the episode: the worlds' continuation, and its bounds are the worlds' value bounds."""
        self.rng = rng
        self.worlds = int(params.get("worlds", self.defaults["worlds"]))
        self.population = params.get("buyers", self.defaults["buyers"])

    @classmethod
    def parse_params(cls, params: dict, parse, sellers: dict) -> dict:
        population = params.get("buyers", cls.defaults["buyers"])
        if population not in ("concession", "threshold", "mixed"):
            raise ValueError(f"parameter buyers={population!r}: choose from concession, threshold, mixed")
        return {**params, "tools": tuple(parse(tool) for tool in TOOLS), "continuation": parse("planner")}

    @classmethod
    def create(cls, spec, params, *, market, seed):
        if "tools" not in params:
            raise ValueError("a rollout seller's tools come from its spec: build it with negotiate.agents.parse_agent")
        # The public generating process only (as the planner keeps): never the drawn values.
        return cls(spec, params, market.spec, [tool.build(market, seed) for tool in params["tools"]],
                   params["continuation"].build(market, seed), np.random.default_rng(seed))

    def describe(self) -> dict:
        return {"kind": "scripted", "name": self.name, "spec": self.spec,
                "params": {"worlds": self.worlds, "buyers": self.population}}

    def follow(self, obs: SellerObservation, message: Message | None) -> None:
        self.adviser.follow(obs, message)
        self.continuation.follow(obs, message)

    def decide(self, obs: SellerObservation) -> Message | None:
        menu = build_menu(obs, self.adviser.advise(obs))
        best = menu.tagged("planner")
        if len(menu) > 1:
            planner = copy.deepcopy(self.continuation)
            planner._learn(obs)  # the bounds as of this observation
            worlds = [self._world(obs, planner) for _ in range(self.worlds)]
            totals = []
            for i in range(len(menu)):
                message = menu.message(i)
                if menu.options[i].move.kind == "wait":
                    totals.append(-math.inf)
                    continue
                total = 0.0
                for state, buyers in worlds:
                    total += _play(state, buyers, self.continuation, obs, message)
                totals.append(total)
            top = max(totals)
            tied = [i for i, t in enumerate(totals) if t >= top - 1e-9]
            best = best if best in tied else tied[0]
        message = menu.message(best if best is not None else len(menu) - 1)
        self.follow(obs, message)
        return message

    # -- worlds ---------------------------------------------------------------------------------------------------

    def _world(self, obs: SellerObservation, planner) -> tuple[EpisodeState, dict]:
        """One world: a market with drawn values, its state as observed, and its buyers."""
        rng = self.rng
        n, m = len(obs.buyers), len(obs.products)
        lo, hi = planner.lo, planner.hi
        values = np.floor(lo + (hi - lo + 1) * rng.random((n, m))).astype(int)
        kinds, history = _behaviour(obs)
        agents = {}
        for i, b in enumerate(obs.buyers):
            if b.status != ACTIVE:
                agents[b.id] = ThresholdBuyer("threshold")
                continue
            kind = kinds[i]
            if kind is None:
                kind = self.population if self.population != "mixed" else ("concession" if rng.random() < 0.5 else "threshold")
            if kind == "threshold":
                agents[b.id] = ThresholdBuyer("threshold")
                continue
            start, patience, bid_values = _conceding(history[i], lo[i], hi[i], obs.price_high - obs.price_low, rng)
            for j, v in bid_values.items():
                values[i, j] = v
            agents[b.id] = ConcessionBuyer("concession", {"start": start, "patience": patience}, rng)
        products = tuple(Product(p.id, p.name, int(p.cost or 0), p.stock) for p in obs.products)
        market = Market(self.prior, 0, products, tuple(Buyer(b.id, tuple(int(x) for x in values[i])) for i, b in enumerate(obs.buyers)),
                        obs.budget, obs.price_low, obs.price_high)
        return _observed_state(obs, market, history), agents


def _behaviour(obs: SellerObservation) -> tuple[list[str | None], list[list[tuple]]]:
    """Each buyer's kind as its replies tell it (a bid: conceding; a reject: threshold; None: no reply yet), and its
    exchange: (round, offered product index, offered price, its bid's product index or None, its bid's price)."""
    index = {b.id: i for i, b in enumerate(obs.buyers)}
    kinds: list[str | None] = [None] * len(obs.buyers)
    history: list[list[tuple]] = [[] for _ in obs.buyers]
    rounds = [0] * len(obs.buyers)
    last: list[tuple[int, int] | None] = [None] * len(obs.buyers)
    for item in obs.history:
        if not isinstance(item, Message):
            continue
        if item.sender == SELLER:
            i = index.get(item.to)
            if i is None or item.action.kind not in ("offer", "reject"):
                continue
            rounds[i] += 1
            last[i] = (int(item.action.product[1:]) - 1, int(item.action.price)) if item.action.kind == "offer" else None
            continue
        i = index.get(item.sender)
        if i is None:
            continue
        kind = item.action.kind
        if kind == "bid" and item.action.product:
            kinds[i] = "concession"
            offered = last[i] if last[i] is not None else (None, None)
            history[i].append((rounds[i], *offered, int(item.action.product[1:]) - 1, int(item.action.price)))
        elif kind == "reject" and kinds[i] is None:
            kinds[i] = "threshold"
    return kinds, history


def _conceding(history: list[tuple], lo: np.ndarray, hi: np.ndarray, span: float, rng: np.random.Generator) -> tuple[float, int, dict]:
    """A conceding buyer's start and patience, drawn from their priors and weighed by the bids they give (see the module
    docstring), and its values for the products it bid on, read back from its last bid there."""
    starts = rng.uniform(0.4, 0.6, CANDIDATES)
    patience = rng.integers(3, 7, CANDIDATES)

    def fraction(r):
        return starts + (1 - starts) * np.minimum(1.0, (r - 1) / np.maximum(1, patience - 1))

    if not history:
        k = int(rng.integers(CANDIDATES))
        return float(starts[k]), int(patience[k]), {}
    # The value of each product it bid on, per candidate: from its last bid there.
    last_bid = {}
    for r, _, _, j, price in history:
        last_bid[j] = (r, price)
    implied = {j: np.clip((price + 0.5) / fraction(r), lo[j], max(hi[j], lo[j])) for j, (r, price) in last_bid.items()}
    error = np.zeros(CANDIDATES)
    for r, _, _, j, price in history:
        error += ((implied[j] * fraction(r) - price) / (KERNEL * span)) ** 2
    weight = np.exp(-0.5 * (error - error.min()))
    k = int(rng.choice(CANDIDATES, p=weight / weight.sum()))
    return float(starts[k]), int(patience[k]), {j: int(round(float(v[k]))) for j, v in implied.items()}


def _observed_state(obs: SellerObservation, market: Market, history: list[list[tuple]]) -> EpisodeState:
    """The state of ``market`` (drawn values) as the seller observes it: stock, turns used, and every buyer's status,
    standing offer and bid, and the seller messages it has heard (a conceding buyer's round)."""
    state = EpisodeState(market, clock=lambda: 0.0)
    state.stock = [p.stock for p in obs.products]
    state.units_left = sum(state.stock)
    state.turns_used = obs.turns_used
    heard = {b.id: 0 for b in obs.buyers}
    for item in obs.history:
        if isinstance(item, Message) and item.sender == SELLER and item.to in heard and item.action.kind in ("offer", "reject"):
            heard[item.to] += 1
    for mine, seen in zip(state.buyers, obs.buyers):
        mine.status, mine.offer, mine.bid = seen.status, seen.offer, seen.bid
        mine.messages_received = heard[seen.id]
        mine.awaiting = False  # a reply still owed is not waited for in a world: its offer stands unanswered
    return state


def _play(state: EpisodeState, buyers: dict, continuation, obs: SellerObservation, message: Message | None) -> float:
    """The profit a world makes from here: ``message``, then the continuation to the end (forks; the world is reused)."""
    fork = state.fork()
    seller = copy.deepcopy(continuation)
    seller.follow(obs, message)
    play_out(fork, seller, {b: copy.deepcopy(a) for b, a in buyers.items()}, first=message)
    return profit(fork)
