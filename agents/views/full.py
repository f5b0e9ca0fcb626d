"""The ``full`` prompt: the rules and an example in the system prompt, and per buyer its state, standing offer and
bid, and its thread with the talk; notices; JSON or tagged replies. The default, and the only buyer-facing form."""

from __future__ import annotations

from negotiate.regulator import ACTIVE, GONE, SERVED, SellerObservation

from negotiate.agents.views.base import View
from negotiate.agents.views.text import NOTICES_SHOWN, _fill, _seller_system, _seller_threads, _standing, _stock, _thread_lines

__all__ = ["FullView"]


class FullView(View):
    """The whole state in words, for models that read instructions."""

    name = "full"
    tagged = False

    def render(self, obs: SellerObservation, fmt: str = "json", advice=None) -> list[dict]:
        catalog = "\n".join(f"- {p.id} {p.name}: cost ${p.cost}, {_stock(p.stock)}" for p in obs.products)
        threads, notices, _ = _seller_threads(obs, talk=True)
        blocks = []
        for b in obs.buyers:
            if b.status == SERVED:
                blocks.append(f"- {b.id}: has bought; nothing more to do.")
                continue
            if b.status == GONE:
                blocks.append(f"- {b.id}: has left the market.")
                continue
            state = "owes you a reply; wait for it" if b.awaiting else f"you may write to {b.id} now"
            blocks.append(f"- {b.id}: {state}. Your standing offer: {_standing(b.offer)}. Its standing bid: {_standing(b.bid)}.")
            blocks.extend(_thread_lines(threads[b.id], "    "))
        free = [b.id for b in obs.buyers if b.status == ACTIVE and not b.awaiting]
        shown = notices[-NOTICES_SHOWN:]
        notice_text = ("\nNotices (latest last):\n" + "\n".join(shown) + "\n") if shown else ""
        user = _fill(
            "seller_state.md", budget_left=obs.budget_left, budget=obs.budget, price_low=obs.price_low, price_high=obs.price_high,
            catalog=catalog, buyers="\n".join(blocks), notices=notice_text, free=", ".join(free) or "nobody (every buyer owes you a reply)",
        )
        return [{"role": "system", "content": _seller_system(fmt)}, {"role": "user", "content": user}]
