"""The buyer's prompt: its own values and the public catalog (no costs), its thread with the seller."""

from __future__ import annotations

from negotiate.protocol import SELLER, Notice
from negotiate.regulator import BuyerObservation

from negotiate.agents.views.text import _buyer_system, _fill, _line, _one_line, _standing, _stock, _thread_lines

__all__ = ["render_buyer"]


def render_buyer(obs: BuyerObservation, fmt: str = "json") -> list[dict]:
    """One buyer's chat messages (system, user), from its observation alone: its own values, no costs."""
    catalog = "\n".join(f"- {p.id} {p.name}: worth ${value} to you, {_stock(p.stock)}" for p, value in zip(obs.products, obs.values))
    lines = []
    for item in obs.thread:
        if isinstance(item, Notice):
            lines.append(f"notice: {_one_line(item.text, 300)}")
        else:
            lines.append(_line(item, "seller" if item.sender == SELLER else "you"))
    if obs.message is not None and obs.message not in obs.thread:
        lines.append(_line(obs.message, "seller"))
    user = _fill(
        "buyer_state.md", catalog=catalog, thread="\n".join(_thread_lines(lines, "", "(nothing yet)", getattr(obs.thread, "dropped", 0))), offer=_standing(obs.offer), bid=_standing(obs.bid),
    )
    return [{"role": "system", "content": _buyer_system(obs.buyer, obs.persona, fmt)}, {"role": "user", "content": user}]
