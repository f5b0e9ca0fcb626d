"""The planning seller: a belief over every buyer's values, and offers chosen by looking ahead.

``planner`` is the strongest seller here that sees no private information. Its only
inputs are its :class:`~negotiate.regulator.SellerObservation` and the market's public
generating process (the :class:`~negotiate.market.MarketSpec`: value range, cost range,
valuation model); :meth:`PlannerSeller.create` keeps ``market.spec`` and nothing else.

Belief. For every buyer i and product j, bounds ``lo <= v_ij <= hi`` from what it has
seen (a threshold buyer's reject of price p: ``v < p``; a bid q: ``v >= q``), on top of
the split's prior. Independent uniform splits: v_ij uniform on the bounds. Correlated
splits: ``v = L + S * Phi(a (q_j + t_i) + b e_ij)``; the product factor q_j is read back
from the product's cost (costs are drawn from the same q_j), and each buyer's factor t_i
has a posterior on a grid, updated from the bounds on all of its products, so a reject
of one product lowers the belief about the others.

Planning. Each pair's belief becomes a discrete distribution over value cells; a
dynamic programme gives the optimal descending ladder of k offers on that distribution
(k = the budget share of each active buyer) and its expected profit. The pairs are then
assigned to units jointly (``linear_sum_assignment``), and the best assigned pair is offered
the first price of a ladder of ``PRICE_TRIES`` x the turns left per possible deal
(interpolated between whole lengths): one message at a time while buyers only accept or
reject, to every free buyer before the replies once they bid. Measured beside greedy
(benchmarks/planner_dev.py, benchmarks/bench_planner.py, docs/experiments/planner-*.md; Monte Carlo rollouts of
greedy's ladder over sampled values were measured there and dropped: choosing among pairs
by a few dozen rollouts picks sampling noise). On 2x2 markets it comes within 0.005
profit/OPT of the exact best seller (benchmarks/planner_exact.py).

Counter-bids. A bid is a lower bound on value. A buyer whose bids on a product rise (a
conceding buyer) is held at a high price while the budget allows, so its bids climb
toward its value; when the budget runs short it is asked just below where its next bid
would land (bids climb by a step a round) rather than held to its last bid. A buyer whose
bid does not move (a stubborn buyer) has its bid accepted: waiting gains nothing, and it
bids its highest anchor, so no product sells to it above that bid. A bid for another
product than the one offered bounds the offered one.
"""

from __future__ import annotations

import math

import numpy as np

from scipy.special import ndtr, ndtri

from negotiate.market import MarketSpec
from negotiate.protocol import Message
from negotiate.regulator import SellerObservation

from negotiate.agents.moves import _accept_bid, _end, _Follower, _offer, best_assigned, standing

__all__ = ["PlannerSeller", "read_reason", "reason_action", "bid_facts", "bid_in_play", "no_deal_facts", "turn_facts",
           "REASON_ACTIONS"]

CELLS = 24
"""Value cells per pair in the ladder programme (finer costs time, gains < 0.005 profit/OPT)."""
TASTE = np.linspace(-3.0, 3.0, 25)
"""Grid of a buyer's common factor (correlated splits)."""
MAX_TRIES = 8
"""Longest ladder planned per pair; longer ones change the first price by under a cell."""
CHUNK = 1024
"""Pairs planned in one piece (:meth:`PlannerSeller._refresh`)."""
LONGEST = 2 * MAX_TRIES + 1
"""Longest ladder a decision reads: its price comes from ladders of up to 2 x MAX_TRIES offers and the next."""
PATIENCE = (3, 4, 5, 6)
"""Rounds a conceding buyer may take to reach its value (``ConcessionBuyer``'s range): how
likely bids still climb at the next round."""
PRICE_TRIES = 0.7
"""Length of the ladder whose first price is asked, per turn left for each possible deal
(+0.008 profit/OPT on train with threshold buyers over 3,000 development markets, 3 seeds,
against pricing by the valuing ladder; 0.75-0.9: +0.001 to +0.003, or less)."""


REASON_ACTIONS = {"hold out": "offer", "ask one step up": "offer", "below cost: ask more": "offer", "take it": "accept",
                  "end": "end"}
"""The action kind each verdict of a ``reasons=1`` thought leads to (``offer pN`` too leads to an offer)."""


def read_reason(thought: str) -> tuple[str, str, str] | None:
    """(facts, turns and buyers, verdict) of a ``reasons=1`` thought, None where it is not one: how a policy trained
    on the planner's reasons is checked against them (``negotiate report --teacher 'planner?reasons=1'``).

    >>> read_reason("b2 bids $380, $410 (rising, covers cost); 10 turns for 3 buyers: hold out")
    ('b2 bids $380, $410 (rising, covers cost)', '10 turns for 3 buyers', 'hold out')
    >>> read_reason("b1 bids $493 (first bid, below cost); 3 turns for 2 buyers: below cost: ask more")[2]
    'below cost: ask more'
    >>> read_reason(" b1 bids $400 (first bid, covers cost); 1 turn for 1 buyer: take it. ")[2]
    'take it'
    >>> read_reason("nothing left to sell: end"), read_reason("I like p1")
    (('nothing left to sell', '', 'end'), None)
    """
    thought = thought.strip().rstrip(".")  # a JSON reply's thought is not stripped; "take it." is the same verdict
    facts, sep, rest = thought.partition("; ")
    if sep:
        counts, sep, verdict = rest.partition(": ")
    else:
        counts, (facts, sep, verdict) = "", thought.rpartition(": ")
    if not sep or not facts or reason_action(verdict) is None:
        return None
    return facts, counts, verdict


def bid_facts(buyer: str, prices: list[int], cost: int) -> str:
    """The facts of a ``reasons=1`` thought about a bidder: its last bids (at most two, oldest first) for the
    product it bids on now, whether they rise, and whether the last covers that product's ``cost`` (which a verdict
    of ``take it`` needs, and ``below cost: ask more`` denies). The ``facts`` prompt shows the same line per bidder.

    >>> bid_facts("b2", [380, 410], 300), bid_facts("b1", [493], 493), bid_facts("b3", [400, 400], 450)
    ('b2 bids $380, $410 (rising, covers cost)', 'b1 bids $493 (first bid, covers cost)', 'b3 bids $400, $400 (not rising, below cost)')
    """
    trend = "first bid" if len(prices) < 2 else "rising" if prices[-1] > prices[-2] else "not rising"
    return f"{buyer} bids {', '.join(f'${p}' for p in prices)} ({trend}, {'covers' if prices[-1] >= cost else 'below'} cost)"


def no_deal_facts(buyer: str, bid: tuple[str, int]) -> str:
    """The facts of a ``reasons=1`` thought about a bidder whose bid is not in play (:func:`bid_in_play`)."""
    return f"{buyer} bids ${bid[1]} for {bid[0]}, no deal there"


def bid_in_play(bid: tuple[str, int], units: list[int], products) -> bool:
    """Whether the planner deals on a standing bid: a unit of its product is left (``units``, from
    :func:`~negotiate.agents.scripted.units_left`) and the bid could still climb to the product's cost (a first
    bid is at least 0.4 of the value)."""
    j = int(bid[0][1:]) - 1
    return units[j] > 0 and (bid[1] + 1) / 0.4 >= products[j].cost


def turn_facts(left: int, active: int) -> str:
    """The turns part of a ``reasons=1`` thought: ``10 turns for 3 buyers``."""
    return f"{left} turn{'s' * (left != 1)} for {active} buyer{'s' * (active != 1)}"


def reason_action(verdict: str) -> str | None:
    """The action kind a verdict leads to (:data:`REASON_ACTIONS`), None for text that is no verdict."""
    if verdict.startswith("offer p") and verdict[7:].isdigit():
        return "offer"
    return REASON_ACTIONS.get(verdict)


class PlannerSeller(_Follower):
    """Plans offers on a belief over each buyer's values; see the module docstring."""

    name = "planner"
    defaults = {"patience": 1, "reasons": 0}
    _STATE = ("lo", "hi", "last", "bids", "sent", "rejected", "stubborn", "_seen_lo", "_seen_hi", "_depth", "_worth", "_first",
              "_prices")
    """What a decision changes (``_Follower.__deepcopy__``); the prior, costs and correlation factors are set once, the
    ladder programme's scratch (``_firsts``, ``_rest``), the buyers active (``_active``) and the ladders kept per buyer
    (``_planned``) are replaced, never changed, and the generator is never drawn from (it is kept for the spec's
    sake)."""

    def __init__(self, spec: str, params: dict | None, market_spec: MarketSpec, rng: np.random.Generator):
        super().__init__(spec, params)
        self.prior = market_spec
        self.rng = rng
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None
        self.last: dict[int, tuple[int, int]] = {}
        """Each buyer's unanswered offer: (product, price)."""
        self.bids: list[list[tuple[int, int, int]]] = []
        """Each buyer's bids, in order: (product, price, offers it had heard by then)."""
        self.rejected: list[bool] = []
        """Whether the buyer has ever rejected outright (it does not bid: a threshold buyer)."""
        self._seen_lo: np.ndarray | None = None
        """The bounds each buyer's kept ladders were planned on (:meth:`_refresh`)."""
        self._active: list[int] | None = None
        """The buyers active at the last decision (a new list each decision: never changed in place, so shared by a
        copy)."""
        self._planned: list[int] | None = None
        """The shortest ladder kept on any pair of each buyer, -1 where the buyer has spoken since its ladders were
        planned (its bounds may have moved: :meth:`_learn`); :meth:`_refresh` looks at the buyers below the length
        it needs. A new list at each change, never changed in place: a copy of the seller shares it (a copy of n
        items at each change costs less than one at every ``deepcopy``, which the menu and the rollouts make at
        every decision)."""
        self.reasons = bool((params or {}).get("reasons", self.defaults["reasons"]))
        """``reasons=1``: each message carries, as its thought, the facts its choice turned on (:meth:`_why`)."""

    @classmethod
    def create(cls, spec, params, *, market, seed):
        # The public generating process only: never the drawn values or anything else of the market.
        return cls(spec, params, market.spec, np.random.default_rng(seed))

    # -- belief ------------------------------------------------------------------

    def _setup(self, obs: SellerObservation) -> None:
        n, m = len(obs.buyers), len(obs.products)
        self.lo = np.full((n, m), float(obs.price_low))
        self.hi = np.full((n, m), float(obs.price_high))
        self.bids = [[] for _ in range(n)]
        self.sent = [0] * n
        self.rejected = [False] * n
        self.stubborn = [False] * n
        self.costs = np.array([p.cost for p in obs.products], dtype=float)
        self.span = float(obs.price_high - obs.price_low)
        spec = self.prior
        self.correlated = spec.valuation == "correlated"
        if self.correlated:
            rho = spec.correlation
            width = spec.cost_high - spec.cost_low
            if width > 1e-9:
                u = ((self.costs - obs.price_low) / self.span - spec.cost_low) / width
                self.quality = ndtri(np.clip(u, 1e-4, 1 - 1e-4))
                noise = 1 - rho
            else:  # costs carry no trace of quality: fold it into the noise
                self.quality = np.zeros(m)
                noise = 1 - rho / 2
            self.a = math.sqrt(rho / 2)
            self.b = max(math.sqrt(noise), 1e-3)
            self.log_taste_prior = -0.5 * TASTE**2

    def _learn(self, obs: SellerObservation) -> None:
        if self.lo is None:
            self._setup(obs)
        lo, hi = self.lo, self.hi
        planned = None
        for item in obs.new:
            if not isinstance(item, Message):
                continue
            i = int(item.sender[1:]) - 1
            if self._planned is not None:
                if planned is None:
                    self._planned = planned = self._planned.copy()
                planned[i] = -1
            last = self.last.pop(i, None)
            action = item.action
            if action.kind == "reject" and last is not None:
                j, price = last
                hi[i, j] = min(hi[i, j], price - 1)
                self.rejected[i] = True
            elif action.kind == "bid" and action.product is not None:
                j = int(action.product[1:]) - 1
                if 0 <= j < lo.shape[1]:
                    price = int(action.price)
                    if last is not None and last[0] != j:
                        # It turned the offer down for another product: it will not pay that price for this one now.
                        hi[i, last[0]] = min(hi[i, last[0]], max(last[1] - 1, lo[i, last[0]]))
                    if self.bids[i] and self.bids[i][-1][:2] == (j, price) and last is not None and last[1] > price:
                        self.stubborn[i] = True  # the same bid again after a higher ask: it will not move
                    lo[i, j] = max(lo[i, j], float(price))
                    hi[i, j] = max(hi[i, j], lo[i, j])
                    self.bids[i].append((j, price, self.sent[i]))
                    if self.stubborn[i]:
                        # A stubborn buyer bids its highest anchor: no product sells to it above that bid.
                        hi[i] = np.maximum(np.minimum(hi[i], price), lo[i])

    def _cell_masses(self, rows: list[int], floor: np.ndarray, top: np.ndarray) -> np.ndarray:
        """Probability of each value cell between ``floor`` and ``top`` for the pairs of ``rows``.

        Shape (len(rows), m, CELLS); masses are conditional on the pair's bounds, so a row
        sums to P(v >= floor | belief).
        """
        return self._masses(self.lo[rows], self.hi[rows], floor, top)

    def _masses(self, lo: np.ndarray, hi: np.ndarray, floor: np.ndarray, top: np.ndarray) -> np.ndarray:
        """:meth:`_cell_masses` of pairs with bounds ``lo`` and ``hi`` (whole rows of buyers where values are
        correlated: a buyer's taste is read from all its bounds)."""
        frac = np.linspace(0.0, 1.0, CELLS + 1)
        edges = floor[..., None] + (top - floor)[..., None] * frac  # (r, m, CELLS+1)
        if not self.correlated:
            width = np.maximum(hi - lo + 1.0, 1.0)
            return np.diff(edges, axis=-1) / width[..., None]
        L, S = float(self.lo_price), self.span
        z = lambda x: ndtri(np.clip((x - L) / S, 1e-6, 1 - 1e-6))
        mu = self.a * (self.quality[None, :, None] + TASTE[None, None, :])  # (1, m, T)
        b = self.b
        like = ndtr((z(hi + 0.5)[..., None] - mu) / b) - ndtr((z(lo - 0.5)[..., None] - mu) / b)  # (r, m, T)
        log_like = np.log(np.maximum(like, 1e-300))
        # The taste posterior from every other product of the buyer, then this pair's own bounds.
        others = self.log_taste_prior + log_like.sum(axis=1, keepdims=True) - log_like
        weight = np.exp(others - others.max(axis=-1, keepdims=True))  # (r, m, T)
        cdf = ndtr((z(edges)[..., None, :] - mu[..., None]) / b)  # (r, m, T, CELLS+1)
        cells = np.einsum("rmt,rmtc->rmc", weight, np.diff(cdf, axis=-1))
        total = np.einsum("rmt,rmt->rm", weight, like)
        return cells / np.maximum(total, 1e-300)[..., None]

    # -- planning ----------------------------------------------------------------

    def _ladders(self, rows: list[int], keep: tuple[int, ...]) -> dict:
        """The best descending ladder of t offers on every pair of ``rows``, by dynamic programming.

        Returns, for each t in ``keep``, ``value[t]``: shape (r, m, CELLS + 1), the expected
        profit of t offers when the value is known to lie below edge u (unnormalised: weighted
        by the probability of that); ``mass`` below each edge (``below``); the price of each
        edge (``prices``) and the probability of a sale at each price (``sale``).
        """
        lo, hi = self.lo[rows], self.hi[rows]
        floor = np.maximum(lo, self.costs[None, :])
        top = np.maximum(hi + 1.0, floor)
        return self._programme(floor, top, self.costs[None, :], self._masses(lo, hi, floor, top), keep)

    def _pair_ladders(self, rows: np.ndarray, cols: np.ndarray, keep: tuple[int, ...]) -> dict:
        """:meth:`_ladders` of single pairs (uniform values: a pair's belief reads its own bounds alone), each
        pair a row of one column."""
        lo, hi, costs = self.lo[rows, cols][:, None], self.hi[rows, cols][:, None], self.costs[cols][:, None]
        floor = np.maximum(lo, costs)
        top = np.maximum(hi + 1.0, floor)
        return self._programme(floor, top, costs, self._masses(lo, hi, floor, top), keep)

    def _programme(self, floor: np.ndarray, top: np.ndarray, costs: np.ndarray, mass: np.ndarray, keep: tuple[int, ...]) -> dict:
        """The ladder programme of :meth:`_ladders` on pairs with these floors, tops, costs (broadcast) and cell masses."""
        r, m = floor.shape
        edges = floor[..., None] + (top - floor)[..., None] * np.linspace(0.0, 1.0, CELLS + 1)
        prices = np.ceil(edges[..., :CELLS])
        margin = prices - costs[..., None]  # (r, m, CELLS)
        cum = np.concatenate([np.zeros((r, m, 1)), np.cumsum(mass, axis=-1)], axis=-1)  # (r, m, CELLS+1)
        q = np.arange(CELLS)[:, None]
        u = np.arange(CELLS + 1)[None, :]
        valid = q < u
        # sold[q, u]: P(price q accepted and value below edge u) = cum[u] - cum[q], for q < u.
        sold = np.where(valid, cum[..., None, :] - cum[..., :CELLS, None], 0.0)  # (r, m, CELLS, CELLS+1)
        gain = sold * margin[..., None]
        value = np.zeros((r, m, CELLS + 1))
        tables = {}
        self._firsts = {}
        for t in range(1, max(keep) + 1):
            self._rest = value[..., :CELLS]  # the last step's continuation below each price
            total = np.where(valid, gain + value[..., :CELLS, None], -np.inf)
            self._firsts[t] = total[..., CELLS]  # the value of each first price, the rest of the ladder included
            value = np.maximum(total.max(axis=-2), 0.0)
            if t in keep:
                tables[t] = np.where((top > floor)[..., None], value, 0.0)
        below = (1.0 - cum[..., CELLS:]) + cum  # P(v < edge u), the part below the floor included
        sale = cum[..., CELLS:] - cum[..., :CELLS]  # P(v >= price q)
        return {"value": tables, "below": below, "prices": prices, "sale": sale}

    def decide(self, obs: SellerObservation) -> Message | None:
        self._learn(obs)
        self.lo_price = obs.price_low
        buyers = obs.buyers
        # The buyers are looked for among those active at the last decision (a walk over every buyer at each decision
        # was most of a turn once the plans were kept); only an active buyer owes a reply.
        self._active, free, units = standing(obs, self._active)
        waiting = len(free) < len(self._active)
        # While buyers only accept or reject, one message at a time: each reply (a sale, or a lower
        # bound) is in the belief before the next offer is chosen (+0.017 profit/OPT on train, 600
        # markets). Once buyers counter-bid, every free buyer hears an offer before the replies,
        # so all bids are on the table before a contested unit goes to one of them (sequential
        # there: -0.010 with stubborn buyers on shapes).
        if not free or (not any(self.bids) and waiting):
            return None
        cols = [j for j, k in enumerate(units) if k > 0]
        if not cols:
            return None if waiting else self._ended("nothing left to sell")
        active = len(self._active)
        tries = min(MAX_TRIES, max(1, obs.budget_left // max(1, active)))
        # The first price comes from a ladder of PRICE_TRIES x the turns per deal still possible
        # (per buyer, or per unit where units are fewer), not per buyer: where buyers outnumber
        # units, a unit hears several buyers' offers, not one buyer's ladder. That length is seldom
        # whole: the price is interpolated between the ladders either side (+0.003 on train, 4,000
        # markets, against rounding it).
        deals = min(active, sum(units[j] for j in cols))
        length = min(2.0 * MAX_TRIES, max(1.0, PRICE_TRIES * obs.budget_left / max(1, deals)))
        short, weight = int(length), length - int(length)
        self._refresh(free, max(tries, short + 1))
        worth = self._worth[tries][np.ix_(free, cols)]
        value = np.where(worth > 0, worth, 0.0)
        plan: dict[tuple[int, int], Message] = {}
        column = None
        for r, i in enumerate(free):
            bid = buyers[i].bid
            # A bidder names the product it wants: deal on that one while it is in stock and
            # the bid could still climb to its cost (a first bid is at least 0.4 of the value).
            if bid is None or not bid_in_play(bid, units, obs.products):
                continue
            value[r] = 0.0
            if column is None:
                column = {j: c for c, j in enumerate(cols)}
            c = column.get(int(bid[0][1:]) - 1)
            if c is not None:
                j = cols[c]
                plan[r, c], value[r, c] = self._on_bid(i, buyers[i].id, j, bid[1], obs.products[j].cost, tries, obs.budget_left, active)
        best = best_assigned(value, cols, units, len(free))
        if best is None:
            return None if waiting else self._ended("no sale is worth its cost")
        if best in plan:
            return self._record(plan[best])
        i, j = free[best[0]], cols[best[1]]
        buyer, product = buyers[i], obs.products[j]
        # A ladder's first price: the one whose sale plus the rest of the ladder is worth most (the chosen pair's only;
        # the same arithmetic, element for element, as pricing every pair).
        prices = self._prices[i, j]
        price = (1 - weight) * prices[self._first[short][i, j]]
        price += weight * prices[self._first[short + 1][i, j]]
        why = ""
        if self.reasons:
            facts = f"{buyer.id} has not bid" if buyer.bid is None else no_deal_facts(buyer.id, buyer.bid)
            why = self._why(facts, obs.budget_left, active, f"offer {product.id}")
        return self._record(_offer(buyer.id, product.id, max(int(price), product.cost), thought=why))

    def _refresh(self, rows: list[int], need: int) -> None:
        """Keep each pair's ladders (every length up to ``need``, at the least) until its bounds move: a reply moves
        one pair's (one buyer's, where values are correlated), so a decision plans that, not every free buyer's
        every pair (at 200 x 200, 40,000 times the work). A pair's programme reads its own bounds alone (its row's,
        where correlated), so what is kept is what planning it again would give.

        Only the buyers that spoke since they were planned, or keep a ladder shorter than ``need``, are looked at
        (``_planned``): comparing every free buyer's bounds at each decision cost O(n^2) a turn. The pairs planned are
        those comparing them all would find."""
        if self._seen_lo is None:
            n, m = self.lo.shape
            self._seen_lo, self._seen_hi = np.full((n, m), np.nan), np.full((n, m), np.nan)
            self._depth = np.zeros((n, m), dtype=np.intp)
            self._worth = np.zeros((LONGEST + 1, n, m))
            self._first = np.zeros((LONGEST + 1, n, m), dtype=np.intp)
            self._prices = np.zeros((n, m, CELLS))
            self._planned = [-1] * n
        rows = [i for i in rows if self._planned[i] < need]
        if not rows:
            return
        moved = (self.lo[rows] != self._seen_lo[rows]) | (self.hi[rows] != self._seen_hi[rows]) | (self._depth[rows] < need)
        keep = tuple(range(1, need + 1))
        if self.correlated:  # a buyer's taste is read from all its bounds: a row moves whole
            stale = [i for i, m in zip(rows, moved.any(axis=1)) if m]
            step = max(1, CHUNK // self.lo.shape[1])
            parts = [(stale[k:k + step],) for k in range(0, len(stale), step)]
        else:  # values drawn pair by pair: only the pairs whose bounds moved (one a reply, mostly)
            r, cols = np.nonzero(moved)
            r = np.asarray(rows)[r]
            parts = [(r[k:k + CHUNK], cols[k:k + CHUNK]) for k in range(0, len(r), CHUNK)]
        for at in parts:  # a few thousand pairs at a time: a 200 x 200 market's first plan took GBs in one piece
            ladder = self._ladders(at[0], keep) if self.correlated else self._pair_ladders(*at, keep)
            lengths = (slice(1, need + 1), *at)  # every length at once: one copy, not one per length
            shape = self._worth[lengths].shape
            self._worth[lengths] = np.stack([ladder["value"][t][..., CELLS] for t in keep]).reshape(shape)
            self._first[lengths] = np.argmax(np.stack([self._firsts[t] for t in keep]), axis=-1).reshape(shape)
            self._prices[at] = ladder["prices"].reshape(self._prices[at].shape)
            self._seen_lo[at], self._seen_hi[at] = self.lo[at], self.hi[at]
            self._depth[at] = need
        self._planned = planned = self._planned.copy()
        for i, depth in zip(rows, self._depth[rows].min(axis=1).tolist()):
            planned[i] = depth

    def _why(self, facts: str, left: int, active: int, verdict: str) -> str:
        """The thought of a message under ``reasons=1`` ("" otherwise): what the choice turned on, in words a
        model can copy from its prompt (the bids in the thread, the turns left, the buyers still active)
        before it writes the action: ``b2 bids $380, $410 (rising, covers cost); 10 turns for 3 buyers: hold out``."""
        if not self.reasons:
            return ""
        return f"{facts}; {turn_facts(left, active)}: {verdict}"

    def _ended(self, why: str) -> Message:
        message = _end()
        return message._replace(thought=f"{why}: end") if self.reasons else message

    def _record(self, message: Message) -> Message:
        if message.action.kind == "offer":
            i = int(message.to[1:]) - 1
            self.last[i] = (int(message.action.product[1:]) - 1, message.action.price)
            self.sent[i] += 1
        return message

    def _on_bid(
        self, i: int, buyer_id: str, j: int, bid: int, cost: int, tries: int, left: int, active: int
    ) -> tuple[Message, float]:
        """Accept a standing bid, hold out for more, or close one step above it; with the pair's
        value for the assignment. ``left``: turns left in the budget; ``active``: buyers still active."""
        # The last two bids for j, oldest first, found from the end: a scan of every past bid cost
        # 319, 521 and 746 us a turn at 2,000, 4,000 and 8,000 turns against a stubborn buyer.
        bids: list[tuple[int, int]] = []
        for product, price, r in reversed(self.bids[i]):
            if product == j:
                bids.insert(0, (price, r))
                if len(bids) == 2:
                    break
        rising = len(bids) >= 2 and bids[-1][0] > bids[-2][0]
        facts = ""
        if self.reasons:
            facts = bid_facts(buyer_id, [p for p, _ in bids], cost)
        step = (bids[-1][0] - bids[-2][0]) / max(1, bids[-1][1] - bids[-2][1]) if rising else bid * 0.25
        # Holding out costs turns the other buyers could use: only while each active buyer still has
        # more than ``patience`` turns (1 measured best: 0 and 2 lose 0.36 and 0.09 on conceding buyers).
        hold = tries > int(self.params.get("patience", self.defaults["patience"])) and (len(bids) < 2 or rising)
        if not hold and rising:
            # Bids that climb by a step a round reach the next target one step up: ask just below it
            # rather than take the bid, unless the buyer may have stopped climbing and no turn is left.
            nxt = self.sent[i] + 1
            sure = sum(1 for p in PATIENCE if p >= nxt) / max(1, sum(1 for p in PATIENCE if p >= bids[-1][1]))
            ask = int(min(self.hi[i, j], bid + step * (nxt - bids[-1][1]) - 1))
            # Turned down, the bid can still be taken next round if every active buyer has a turn left
            # (the others hear offers meanwhile; "a turn left" alone: -0.015 on conceding buyers).
            taken = bid - cost if bid >= cost else 0.0
            worth = sure * (ask - cost) + (1 - sure) * (taken if left > active else 0.0)
            if ask > bid and ask >= cost and (worth > taken or bid < cost):
                why = self._why(facts, left, active, "ask one step up")
                return _offer(buyer_id, f"p{j + 1}", ask, thought=why), worth + 1e-6
        if not hold and bid >= cost:
            message = _accept_bid(buyer_id, f"p{j + 1}", bid)
            if self.reasons:
                message = message._replace(thought=self._why(facts, left, active, "take it"))
            return message, bid - cost + 1e-6
        # One bid so far, or bids that climb: ask above where the next bid should land.
        ask = int(max(cost, min(self.hi[i, j], bid + 2 * step), bid + 1))
        verdict = "hold out" if hold else "below cost: ask more"
        return _offer(buyer_id, f"p{j + 1}", ask, thought=self._why(facts, left, active, verdict)), max(bid + 0.5 * step - cost, 0.0) + 1e-6
