"""The ``tools`` prompt: the advice prompt with a second tool's line, greedy's message in the same state."""

from __future__ import annotations

from negotiate.protocol import Action, Message  # noqa: F401  (Action: the doctests build messages)

from negotiate.agents.views.advice import ADVISER, advice_line
from negotiate.agents.views.facts import FactsView

__all__ = ["ToolsView", "TOOLS", "tool_lines"]

TOOLS = (ADVISER, "greedy")
"""The sellers whose next messages the ``tools`` prompt shows, in its order: the planner (its line is the ``advice``
prompt's) and greedy, which takes a covering bid at once and otherwise asks a buyer's best price."""


def tool_lines(messages: tuple[Message | None, ...] | None) -> str:
    """The ``tools`` prompt's lines: :func:`advice_line` of the planner's message, then greedy's.

    >>> print(tool_lines((Message("seller", "b2", "", Action("offer", "p1", 450), "b2 bids $380 (first bid, covers cost); 9 turns for 3 buyers: hold out"),
    ...                   Message("seller", "b2", "", Action("accept", "p1", 380), "take the bid"))))
    Advice: to b2, [OFFER] p1 $450 (hold out)
    Greedy: to b2, [ACCEPT] p1 $380
    """
    planner, greedy = messages if messages is not None else (None, None)
    second = "Greedy: wait for a reply" if greedy is None else f"Greedy: {f'to {greedy.to}, ' if greedy.to else ''}{greedy.action}"
    return f"{advice_line(planner)}\n{second}"


class ToolsView(FactsView):
    """Two scripted moves in every state; which to follow is the model's choice."""

    name = "tools"
    tools = TOOLS
    grounds = False

    def line(self, advice) -> str:
        return tool_lines(advice)
