"""The ``advice`` prompt: the facts prompt with the message the planner would send in this state and its verdict."""

from __future__ import annotations

from negotiate.protocol import Action, Message  # noqa: F401  (Action: the doctests build messages)

from negotiate.agents.planner import read_reason
from negotiate.agents.views.facts import FactsView

__all__ = ["AdviceView", "ADVISER", "advice_line"]

ADVISER = "planner?reasons=1"
"""The seller whose next message the ``advice`` prompt shows: the planner, with the verdict its reason names."""


def advice_line(message: Message | None) -> str:
    """The ``advice`` prompt's line: the message :data:`ADVISER` would send (None: it would wait for a reply).

    >>> advice_line(Message("seller", "b2", "", Action("offer", "p1", 450), "b2 bids $380, $410 (rising, covers cost); 9 turns for 3 buyers: hold out"))
    'Advice: to b2, [OFFER] p1 $450 (hold out)'
    >>> advice_line(Message("seller", "", "", Action("end"), "nothing left to sell: end")), advice_line(None)
    ('Advice: [END] (nothing left to sell)', 'Advice: wait for a reply')
    """
    if message is None:
        return "Advice: wait for a reply"
    reason = read_reason(message.thought)
    why = "" if reason is None else f" ({reason[2] if reason[2] != 'end' else reason[0]})"
    to = f"to {message.to}, " if message.to else ""
    return f"Advice: {to}{message.action}{why}"


class AdviceView(FactsView):
    """The planner's move beside the facts; what to make of it is the model's."""

    name = "advice"
    tools = (ADVISER,)

    def line(self, advice) -> str:
        return advice_line(advice if advice is None or isinstance(advice, Message) else advice[0])  # a Message is a tuple too
