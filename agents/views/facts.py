"""The ``facts`` prompt: the compact prompt with the facts the planner's reasons turn on, read from the same
observation (the turns per active buyer; per buyer its last bids, rising or not, covering its cost or not)."""

from __future__ import annotations

from negotiate.agents.views.compact import CompactView

__all__ = ["FactsView"]


class FactsView(CompactView):
    """A policy taught by ``planner?reasons=1`` copies the facts of its thought from the prompt: it is left the verdict."""

    name = "facts"
    facts = True
    grounds = True
