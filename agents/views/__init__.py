"""Prompt views: one class per prompt mode, one module each, and the table of them.

A new mode is a new module with a :class:`~negotiate.agents.views.base.View` subclass and one line in :data:`VIEWS`;
the agent-spec key ``prompt=``, ``train --prompt``, ``loop --prompt``, the spec checks, the advisers and the training
data all read the view's declared attributes (its ``tools``, ``tagged``, ``grounds``), never the mode's name.
"""

from __future__ import annotations

from negotiate.regulator import SellerObservation

from negotiate.agents.views.advice import ADVISER, AdviceView, advice_line
from negotiate.agents.views.base import View
from negotiate.agents.views.buyer import render_buyer
from negotiate.agents.views.compact import CompactView, render_seller_compact
from negotiate.agents.views.facts import FactsView
from negotiate.agents.views.full import FullView
from negotiate.agents.views.menu import MenuView
from negotiate.agents.views.tools import TOOLS, ToolsView, tool_lines

__all__ = ["View", "VIEWS", "PROMPTS", "view", "render_seller", "render_buyer", "render_seller_compact", "ADVISER", "TOOLS",
           "advice_line", "tool_lines"]

VIEWS: dict[str, View] = {v.name: v for v in (FullView(), CompactView(), FactsView(), AdviceView(), ToolsView(), MenuView())}
"""Every prompt view by its mode's name, ``full`` first (the default)."""
PROMPTS = tuple(VIEWS)
"""The prompt modes' names."""


def view(name: str) -> View:
    """The view of the prompt mode ``name`` (a KeyError names it where it is unknown: specs refuse it when parsed)."""
    return VIEWS[name]


def render_seller(obs: SellerObservation, fmt: str = "json", prompt: str = "full", advice=None) -> list[dict]:
    """The seller's chat messages (system, user), from its observation alone, in the view ``prompt``; ``advice``: the
    next messages of the view's tools, from an :class:`~negotiate.agents.llm.Adviser` walking the episode."""
    return VIEWS[prompt].render(obs, fmt, advice)
