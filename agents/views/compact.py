"""The ``compact`` prompt (and the facts the ``facts``, ``advice`` and ``tools`` prompts add to it): one line per
product and per buyer, the threads' actions without talk, about half the full prompt's tokens."""

from __future__ import annotations

from negotiate.protocol import Message
from negotiate.regulator import ACTIVE, GONE, SERVED, SellerObservation

from negotiate.agents.moves import units_left
from negotiate.agents.planner import bid_facts, bid_in_play, no_deal_facts, turn_facts
from negotiate.agents.views.base import View
from negotiate.agents.views.text import _file, _fill, _one_line, _seller_threads, _stock, _thread_lines

__all__ = ["CompactView", "render_seller_compact"]


def _bids_of(obs: SellerObservation) -> dict[str, list[tuple[str, int]]]:
    """Each buyer's bids in the seller's history, in order: (product, price). The history is the latest
    ``HISTORY_KEPT`` items (``negotiate.regulator``), so this reads at most that many, however long the episode."""
    bids: dict[str, list[tuple[str, int]]] = {b.id: [] for b in obs.buyers}
    for item in obs.history:
        if isinstance(item, Message) and item.sender in bids and item.action.kind == "bid" and item.action.product:
            bids[item.sender].append((item.action.product, int(item.action.price)))
    return bids


def _buyer_facts(obs: SellerObservation) -> dict[str, str]:
    """Per active buyer, the facts the planner's reasons name (``planner?reasons=1``): its last two bids for the
    product of its standing bid, whether they rise and whether the last covers that product's cost (``b2 bids $380,
    $410 (rising, covers cost)``); that the planner would not
    deal on that bid, its product promised or sold out or its cost out of reach (``b2 bids $223 for p2, no deal
    there``); or that it has no standing bid."""
    bids = _bids_of(obs)
    units = units_left(obs)
    out = {}
    for b in obs.buyers:
        if b.status != ACTIVE:
            continue
        if b.bid is None:
            out[b.id] = f"{b.id} has not bid"
        elif not bid_in_play(b.bid, units, obs.products):
            out[b.id] = no_deal_facts(b.id, b.bid)
        else:
            prices = [price for product, price in bids[b.id] if product == b.bid[0]][-2:] or [b.bid[1]]
            out[b.id] = bid_facts(b.id, prices, next(p.cost for p in obs.products if p.id == b.bid[0]))
    return out


def render_seller_compact(obs: SellerObservation, facts: bool = False, advice: str | None = None) -> list[dict]:
    """The seller's chat messages in the compact form (``prompt=compact``): a short system prompt, one line
    per product, and per buyer its state and its thread of actions, without talk or thoughts.

    The threads are the full prompt's (``you: [OFFER] p1 $818`` / ``b1: [REJECT]``, a refused message
    marked, the latest ``THREAD_SHOWN``); what goes is the talk, the long rules and example, product
    names, and every notice but the refusal of the seller's own last message. About half the full
    prompt's tokens, for small models trained on many decisions.

    ``facts=True`` (``prompt=facts``) adds the facts the planner's reasons turn on, read from the same
    observation: the turns left for the buyers still active and the turns each (``10 turns for 3 buyers:
    3 each``), and per active buyer its last bids, whether they rise and whether the last covers its product's cost
    (``b2 bids $380, $410 (rising, covers cost)``),
    that the planner would not deal on its bid (``b2 bids $223 for p2, no deal there``), or that it has not
    bid. A policy taught by ``planner?reasons=1`` then copies the facts of its thought from the prompt and is
    left the verdict. ``advice`` (``prompt=advice``: :func:`advice_line`) follows the turns line.
    """
    threads, _, notice = _seller_threads(obs, talk=False)
    known = _buyer_facts(obs) if facts else {}
    lines = []
    for b in obs.buyers:
        if b.status == SERVED:
            lines.append(f"{b.id}: bought")
        elif b.status == GONE:
            lines.append(f"{b.id}: left")
        else:
            lines.append(f"{b.id}: {'owes you a reply' if b.awaiting else 'free'}" + (f". {known[b.id]}" if facts else ""))
            lines.extend(_thread_lines(threads[b.id], "  "))
    free = [b.id for b in obs.buyers if b.status == ACTIVE and not b.awaiting]
    turns = ""
    if facts:
        active = sum(1 for b in obs.buyers if b.status == ACTIVE)
        turns = f"{turn_facts(obs.budget_left, active)}: {obs.budget_left // max(1, active)} each.\n"
    if advice:
        turns += f"{advice}\n"
    user = _fill(
        "seller_compact_state.md", budget_left=obs.budget_left, budget=obs.budget, price_low=obs.price_low, facts=turns,
        price_high=obs.price_high, catalog="\n".join(f"{p.id} cost ${p.cost}, {_stock(p.stock)}" for p in obs.products),
        buyers="\n".join(lines), notice=f"Your last message was refused: {_one_line(notice, 160)}\n" if notice else "",
        free=", ".join(free) or "nobody",
    )
    return [{"role": "system", "content": _file("seller_compact.md").rstrip("\n")}, {"role": "user", "content": user}]


class CompactView(View):
    """Actions without talk, for small models trained on many decisions."""

    name = "compact"
    facts: bool = False
    """Add the facts the planner's reasons turn on (the ``facts`` prompt and those built on it)."""

    def line(self, advice) -> str | None:
        """The line of the tools' next messages, after the turns line (None: the view shows none)."""
        return None

    def render(self, obs: SellerObservation, fmt: str = "tagged", advice=None) -> list[dict]:
        return render_seller_compact(obs, facts=self.facts, advice=self.line(advice))
