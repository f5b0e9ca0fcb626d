"""Scripted strategies: the sellers of the ladder, and the tables of every scripted seller and buyer.

Sellers here: ``oracle`` (sees every valuation), ``greedy`` (matches buyers to products
by expected profit under what it has learned, then descends), ``concession``
(time-dependent, Boulware or Conceder, per buyer), ``posted`` (one
take-it-or-leave-it price per product), ``dutch`` (a descending clock over all
products) and ``random``; the planner, the rules over tools, the menu's rules and the
rollout seller have modules of their own, as do the buyers (``negotiate.agents.buyers``).
Every agent gets its own seeded numpy ``Generator``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from negotiate.market import Market
from negotiate.protocol import SELLER, Action, Message
from negotiate.regulator import ACTIVE, SellerObservation

from negotiate.agents.base import ScriptedAgent, _Seeded
from negotiate.agents.buyers import ConcessionBuyer, MixedBuyer, RandomBuyer, StubbornBuyer, ThresholdBuyer
from negotiate.agents.moves import _Follower, _accept_bid, _end, _offer, best_assigned, standing, units_left
from negotiate.agents.menu import MenuRule
from negotiate.agents.planner import PlannerSeller
from negotiate.agents.rollout import RolloutSeller
from negotiate.agents.rule import RuleSeller

__all__ = ["SELLERS", "BUYERS"]


def _tries_value(low: float, high: float, cost: float, tries: int) -> tuple[float, int]:
    """Expected margin and first price of a descending ladder of ``tries`` offers.

    The buyer's value is uniform on [low, high] and it accepts any price at or below
    it. With the cost at or below ``low``'s floor, the optimal first price of a k-offer
    ladder is ``floor + (high - floor) * k / (k + 1)`` and the expected margin
    ``k / (2 (k + 1)) * (high - floor)^2 / (high - low)``, where ``floor = max(low, cost)``
    (worked out by backward induction: W_k(u) = max_p (u - p) p + W_{k-1}(p)).
    """
    if high <= cost:
        return 0.0, int(cost)
    tries = max(1, tries)
    frac = tries / (tries + 1)
    if low >= cost:
        price = low + (high - low) * frac
        return (low - cost) + frac / 2 * (high - low), int(round(price))
    price = cost + (high - cost) * frac
    return frac / 2 * (high - cost) ** 2 / (high - low), int(round(price))


def _tries_values(low: np.ndarray, high: np.ndarray, cost: np.ndarray, tries: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_tries_value` of every pair at once (``cost`` broadcast over rows): the same float operations in the
    same order, so the same expected margins, and first prices rounded half to even as ``round`` does."""
    frac = max(1, tries) / (max(1, tries) + 1)
    above = low >= cost
    with np.errstate(divide="ignore", invalid="ignore"):  # the other branch's cells: chosen away below
        worth = np.where(above, (low - cost) + frac / 2 * (high - low), frac / 2 * (high - cost) ** 2 / (high - low))
        price = np.where(above, low + (high - low) * frac, cost + (high - cost) * frac)
    none = high <= cost
    worth = np.where(none, 0.0, worth)
    price = np.where(none, np.trunc(np.broadcast_to(cost, price.shape)), np.rint(price))
    return worth, price.astype(np.int64)


_MOVED = object()
"""What greedy keeps, in place of the standing bid a row was valued with, for a row to value again."""

VECTOR_PAIRS = 64
"""Free buyers times products in stock from which greedy values its pairs as arrays: below it, a Python loop over
plain lists is faster (markets of 2-4 buyers and products); above, the loop built a message for every pair at every
turn (18.6 million at 100 x 100). Both give the same message (``tests/test_scale_markets.py``)."""


class _Learner(_Follower):
    """A seller that keeps, for every buyer-product pair, bounds on the buyer's value."""

    _STATE = ("low", "high", "last", "offers", "offered")

    def _setup(self, obs: SellerObservation) -> None:
        n, m = len(obs.buyers), len(obs.products)
        if n * m >= VECTOR_PAIRS:  # rows of arrays: learning below indexes them as it does the lists
            self.low = np.full((n, m), float(obs.price_low))
            self.high = np.full((n, m), float(obs.price_high))
        else:  # plain lists: element-wise access to tiny numpy arrays costs more than it saves
            self.low = [[float(obs.price_low)] * m for _ in range(n)]
            self.high = [[float(obs.price_high)] * m for _ in range(n)]
        self.last: dict[int, tuple[int, int]] = {}
        self.offers = [[0] * m for _ in range(n)]
        self.offered = [0] * n
        """Offers made to each buyer."""

    def _learn(self, obs: SellerObservation) -> None:
        if not hasattr(self, "low"):
            self._setup(obs)
        valued = self.__dict__.get("_valued_with")  # greedy on a large market: its rows kept, to value again
        for item in obs.new:
            if not isinstance(item, Message):
                continue
            i = int(item.sender[1:]) - 1
            if valued is not None:
                valued[i] = _MOVED
            last = self.last.pop(i, None)
            action = item.action
            low, high = self.low[i], self.high[i]
            if last is not None and action.kind in ("reject", "bid"):
                j, price = last
                high[j] = min(high[j], price - 1)
            if action.kind == "bid" and action.product is not None:
                j = int(action.product[1:]) - 1
                if 0 <= j < len(low):
                    low[j] = max(low[j], float(action.price))
                    high[j] = max(high[j], low[j])

    def _record(self, message: Message) -> Message:
        if message.action.kind == "offer":
            i, j = int(message.to[1:]) - 1, int(message.action.product[1:]) - 1
            self.last[i] = (j, message.action.price)
            self.offers[i][j] += 1
            self.offered[i] += 1
        return message


class GreedySeller(_Learner):
    """Match free buyers to products by expected profit, then descend on each pair.

    For every pair it keeps [low, high] bounds on the buyer's value (a rejection of
    price p: value < p; a bid q: value >= q). Each decision spreads the remaining
    budget over the active buyers (k offers each), values every pair by the optimal
    k-offer descending ladder, solves the assignment of free buyers to unpromised
    units, and sends the best pair's next message: accept a standing bid when the
    ladder would gain little over it, else offer the ladder's price.
    """

    name = "greedy"
    _STATE = _Learner._STATE + ("_value", "_price", "_bidcol", "_valued_with")
    """What a decision changes: the learner's bounds and counts, and on large markets the values kept per buyer
    (:meth:`_revalue`)."""

    def decide(self, obs: SellerObservation) -> Message | None:
        self._learn(obs)
        if isinstance(self.low, np.ndarray):
            return self._decide_arrays(obs)
        free = [i for i, b in enumerate(obs.buyers) if b.status == ACTIVE and not b.awaiting]
        if not free:
            return None
        units = units_left(obs)
        cols = [j for j, u in enumerate(units) if u > 0]
        active = sum(1 for b in obs.buyers if b.status == ACTIVE)
        tries = max(1, obs.budget_left // max(1, active))
        if not cols:
            return None if any(b.awaiting for b in obs.buyers) else _end()
        value = np.zeros((len(free), len(cols)))
        plan: dict[tuple[int, int], Message] = {}
        for r, i in enumerate(free):
            buyer = obs.buyers[i]
            for c, j in enumerate(cols):
                product = obs.products[j]
                cost = product.cost
                worth, price = _tries_value(self.low[i][j], self.high[i][j], cost, tries)
                bid = buyer.bid
                if bid is not None and bid[0] == product.id and bid[1] >= cost:
                    sure = bid[1] - cost
                    # A standing bid is a sure thing; keep pushing only while the ladder is clearly better.
                    if tries <= 1 or sure >= 0.8 * worth or price - bid[1] <= 0.03 * (obs.price_high - obs.price_low):
                        value[r, c] = sure + 1e-6
                        plan[r, c] = _accept_bid(buyer.id, product.id, bid[1])
                        continue
                if worth <= 0:
                    continue
                value[r, c] = worth
                plan[r, c] = _offer(buyer.id, product.id, max(price, cost))
        best = best_assigned(value, cols, units, len(free))
        if best is None:
            return None if any(b.awaiting for b in obs.buyers) else _end()
        return self._record(plan[best])

    def _decide_arrays(self, obs: SellerObservation) -> Message | None:
        """:meth:`decide` on a large market: every pair valued as arrays, one message built (the chosen pair's).

        Each buyer's row of values is kept (:meth:`_revalue`) until the buyer speaks (a reply moves its bounds or its
        bid) or the turns each buyer may still hear (``tries``) change, which moves every pair's ladder: a reply moves
        one row, where valuing every free buyer's every pair at each decision cost O(n^2) a turn. The buyers are
        looked for among those active at the last decision (:func:`standing`)."""
        self._active, free, units = standing(obs, self.__dict__.get("_active"))
        if not free:
            return None
        cols = [j for j, u in enumerate(units) if u > 0]
        if not cols:
            return None if len(free) < len(self._active) else _end()
        tries = max(1, obs.budget_left // max(1, len(self._active)))
        self._revalue(obs, free, tries)
        best = best_assigned(self._value[np.ix_(free, cols)], cols, units, len(free))
        if best is None:
            return None if len(free) < len(self._active) else _end()
        i, j = free[best[0]], cols[best[1]]
        buyer, product = obs.buyers[i], obs.products[j]
        if self._bidcol[i] == j:
            return self._record(_accept_bid(buyer.id, product.id, buyer.bid[1]))
        return self._record(_offer(buyer.id, product.id, max(int(self._price[i, j]), product.cost)))

    def _revalue(self, obs: SellerObservation, free: list[int], tries: int) -> None:
        """Value again the rows of ``free`` that moved since they were valued (all of them when ``tries`` changed): each
        pair's ladder (:func:`_tries_values`), and a standing bid's pair its sure margin where the ladder is not clearly
        better. What a decision reads is what valuing every pair afresh gives: a buyer's bounds move only with a
        message of its own, which marks its row (:meth:`_learn`), and its bid is compared with the one it was valued
        with."""
        if self.__dict__.get("_value") is None:
            n, m = self.low.shape
            self._value, self._price = np.zeros((n, m)), np.zeros((n, m), dtype=np.int64)
            self._bidcol = np.full(n, -1, dtype=np.intp)
            """Each buyer's standing bid's product where the seller would take it (-1: none)."""
            self._valued_with: list = [_MOVED] * n
            """The standing bid each buyer's row was valued with (None: none), or ``_MOVED``: its bounds may have moved
            since, or the turns each buyer may hear have changed."""
            self._costs = np.array([p.cost for p in obs.products], dtype=float)
            self._valued_at = None
        if tries != self._valued_at:
            self._valued_at = tries
            self._valued_with = [_MOVED] * len(self._valued_with)
        bids, buyers = self._valued_with, obs.buyers
        rows = [i for i in free if buyers[i].bid != bids[i]]
        if not rows:
            return
        worth, price = _tries_values(self.low[rows], self.high[rows], self._costs, tries)
        value = np.where(worth > 0, worth, 0.0)
        spread = 0.03 * (obs.price_high - obs.price_low)
        self._bidcol[rows] = -1
        for r, i in enumerate(rows):  # a standing bid is a sure thing; keep pushing only while the ladder is clearly better
            bid = bids[i] = buyers[i].bid
            if bid is None:
                continue
            j = int(bid[0][1:]) - 1
            if not 0 <= j < len(self._costs) or obs.products[j].id != bid[0] or bid[1] < self._costs[j]:
                continue
            sure = bid[1] - int(self._costs[j])
            if tries <= 1 or sure >= 0.8 * worth[r, j] or price[r, j] - bid[1] <= spread:
                value[r, j] = sure + 1e-6
                self._bidcol[i] = j
        self._value[rows], self._price[rows] = value, price


class PostedSeller(_Learner):
    """One take-it-or-leave-it price per product: the single-offer optimum for a uniform prior.

    Each free buyer is offered, in order of expected margin, the products it has not
    yet refused at the posted price; a bid at or above the posted price is accepted.
    """

    name = "posted"

    def decide(self, obs: SellerObservation) -> Message | None:
        self._learn(obs)
        lo, hi = obs.price_low, obs.price_high
        prices = [int(round(max(lo, (hi + p.cost) / 2))) for p in obs.products]
        units = units_left(obs)
        for i, buyer in enumerate(obs.buyers):
            if buyer.status != ACTIVE or buyer.awaiting:
                continue
            if buyer.bid is not None:
                j = int(buyer.bid[0][1:]) - 1
                if 0 <= j < len(prices) and units[j] > 0 and buyer.bid[1] >= prices[j]:
                    return _accept_bid(buyer.id, buyer.bid[0], buyer.bid[1])
            order = sorted(range(len(prices)), key=lambda j: -(hi - prices[j]) * (prices[j] - obs.products[j].cost))
            for j in order:
                if units[j] > 0 and self.offers[i][j] == 0 and prices[j] >= obs.products[j].cost:
                    return self._record(_offer(buyer.id, obs.products[j].id, prices[j], f"{obs.products[j].name}: ${prices[j]}, take it or leave it."))
        return None if any(b.awaiting for b in obs.buyers) else _end()


class ConcessionSeller(_Learner):
    """Time-dependent concession per buyer: price falls from the top of the range to cost.

    ``p(t) = cost + (high - cost) * (1 - (t / T) ** (1 / beta))`` with t the offers made
    to that buyer and T its share of the budget. ``beta < 1`` is Boulware (holds firm,
    concedes late; the default 0.5), ``beta > 1`` is Conceder. A bid at or above the
    next price is accepted.
    """

    name = "concession"
    defaults = {"beta": 0.5}

    def decide(self, obs: SellerObservation) -> Message | None:
        self._learn(obs)
        beta = float(self.params.get("beta", self.defaults["beta"]))
        share = max(1, obs.budget // max(1, len(obs.buyers)))
        units = units_left(obs)
        hi = obs.price_high
        for i, buyer in enumerate(obs.buyers):
            if buyer.status != ACTIVE or buyer.awaiting:
                continue
            choices = [j for j, u in enumerate(units) if u > 0 and obs.products[j].cost < hi]
            if not choices:
                break
            # Stay on the product the buyer last bid on, else the one with the widest margin.
            j = next((int(buyer.bid[0][1:]) - 1 for _ in [0] if buyer.bid and int(buyer.bid[0][1:]) - 1 in choices), None)
            if j is None:
                j = min(choices, key=lambda j: obs.products[j].cost)
            product = obs.products[j]
            t = min(self.offered[i], share)
            price = int(round(product.cost + (hi - product.cost) * (1 - (t / share) ** (1 / beta))))
            if buyer.bid is not None and buyer.bid[0] == product.id and buyer.bid[1] >= max(price, product.cost):
                return _accept_bid(buyer.id, product.id, buyer.bid[1])
            return self._record(_offer(buyer.id, product.id, max(price, product.cost)))
        return None if any(b.awaiting for b in obs.buyers) else _end()


class DutchSeller(_Learner):
    """A descending clock over all products: each tick, every active buyer hears the clock price.

    The clock falls from the top of the range to cost in as many ticks as the budget
    allows for all active buyers; buyer i is offered product ``(i + tick) mod m`` among
    those in stock, so every buyer hears every product as the clock falls.
    """

    name = "dutch"

    def decide(self, obs: SellerObservation) -> Message | None:
        offered = self.__dict__.get("offered")
        if offered is None:
            self._setup(obs)  # the clock needs no value bounds: no _learn
            offered = self.offered
        buyers = obs.buyers
        for i, buyer in enumerate(buyers):
            if buyer.awaiting or buyer.status != ACTIVE:
                continue
            # The first free buyer hears the clock: stock and clock are worked out for it alone.
            in_stock = [j for j, u in enumerate(units_left(obs)) if u > 0]
            if not in_stock:
                break
            tick = offered[i]
            j = in_stock[(i + tick) % len(in_stock)]
            product = obs.products[j]
            cost = product.cost
            bid = buyer.bid
            if bid is not None and bid[0] == product.id and bid[1] >= cost:
                return _accept_bid(buyer.id, product.id, bid[1])
            ticks = obs.budget // len(buyers)
            clock = 1 - min(tick, ticks - 1) / (ticks - 1) if ticks > 1 else 0.5
            price = int(round(cost + (obs.price_high - cost) * clock))
            offered[i] = tick + 1  # the clock only counts ticks per buyer
            return _offer(buyer.id, product.id, price if price > cost else cost)
        return None if any(b.awaiting for b in buyers) else _end()


class OracleSeller(ScriptedAgent):
    """The full-information reference: it is given the market, valuations included.

    It re-solves the optimal assignment of active buyers to units in stock at each
    decision and offers every matched buyer its full valuation. A buyer that counters
    is held to that price while turns allow; when the budget left no longer covers
    the unsettled buyers, it accepts their bids.
    """

    name = "oracle"

    def __init__(self, spec: str, params: dict | None, market: Market):
        super().__init__(spec, params)
        self.market = market

    @classmethod
    def create(cls, spec, params, *, market, seed):
        return cls(spec, params, market)

    def decide(self, obs: SellerObservation) -> Message | None:
        market = self.market
        active = [i for i, b in enumerate(obs.buyers) if b.status == ACTIVE]
        units = [p.stock for p in obs.products]
        for b in obs.buyers:
            if b.awaiting and b.offer is not None:
                units[int(b.offer[0][1:]) - 1] -= 1
        free = [i for i in active if not obs.buyers[i].awaiting]
        if not free:
            return None
        cols = [j for j, u in enumerate(units) for _ in range(min(max(u, 0), len(free)))]
        if not cols:
            return None if len(free) < len(active) else _end()
        margin = np.array([[market.buyers[i].values[j] - market.products[j].cost for j in cols] for i in free], dtype=float)
        rows, picks = linear_sum_assignment(np.maximum(margin, 0), maximize=True)
        matched = [(free[r], cols[k]) for r, k in zip(rows, picks) if margin[r, k] > 0]
        if not matched:
            return None if len(free) < len(active) else _end()
        i, j = max(matched, key=lambda pair: margin[free.index(pair[0]), cols.index(pair[1])])
        buyer, product = obs.buyers[i], obs.products[j]
        value = market.buyers[i].values[j]
        if buyer.bid is not None and buyer.bid[1] >= product.cost and obs.budget_left <= len(active):
            k = int(buyer.bid[0][1:]) - 1
            if 0 <= k < len(units) and units[k] > 0:
                return _accept_bid(buyer.id, buyer.bid[0], buyer.bid[1])
        return _offer(buyer.id, product.id, value, thought=f"{buyer.id} values {product.id} at {value}")


class RandomSeller(_Seeded):
    """Uniformly random messages, rule breaking included (prices from 0, any product id)."""

    name = "random"

    def __init__(self, spec: str, params: dict | None, rng: np.random.Generator):
        super().__init__(spec, params)
        self.rng = rng

    def decide(self, obs: SellerObservation) -> Message | None:
        rng = self.rng
        if rng.random() < 0.01:
            return _end()
        buyer = obs.buyers[int(rng.integers(len(obs.buyers)))]
        roll = rng.random()
        if roll < 0.1 and buyer.bid is not None:
            return _accept_bid(buyer.id, *buyer.bid)
        if roll < 0.2:
            return Message(SELLER, buyer.id, "No.", Action("reject"))
        product = f"p{int(rng.integers(1, len(obs.products) + 2))}"
        return _offer(buyer.id, product, int(rng.integers(0, obs.price_high + 1)))


SELLERS = {
    "oracle": OracleSeller,
    "planner": PlannerSeller,
    "greedy": GreedySeller,
    "concession": ConcessionSeller,
    "posted": PostedSeller,
    "dutch": DutchSeller,
    "random": RandomSeller,
    "rule": RuleSeller,
    "menu": MenuRule,
    "rollout": RolloutSeller,
}
"""Scripted sellers, best first (the oracle is the full-information reference)."""
BUYERS = {"threshold": ThresholdBuyer, "concession": ConcessionBuyer, "mixed": MixedBuyer, "stubborn": StubbornBuyer,
          "random": RandomBuyer}
