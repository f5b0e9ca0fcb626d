"""The ``menu`` prompt: the state in a few lines and the legal moves laid out by the runtime, one letter each
(``negotiate.agents.menu``); the reply is one letter, read from the model's log-probs over the menu's letters
(``negotiate.agents.menu_seller``), not parsed from text."""

from __future__ import annotations

from negotiate.regulator import SellerObservation

from negotiate.agents.menu import TOOLS, Menu, build_menu, render_menu
from negotiate.agents.views.base import View

__all__ = ["MenuView"]


class MenuView(View):
    """A choice among the menu's options: the model answers with a letter."""

    name = "menu"
    tools = TOOLS
    tagged = False
    chooses = True

    def menu(self, obs: SellerObservation, advice) -> Menu:
        """The state's menu, ``advice`` holding the tools' next messages (:data:`~negotiate.agents.menu.TOOLS`' order)."""
        return build_menu(obs, advice if advice is not None else (None,) * len(TOOLS))

    def render(self, obs: SellerObservation, fmt: str = "tagged", advice=None) -> list[dict]:
        return render_menu(obs, self.menu(obs, advice))

    def read(self, text: str, sender: str):
        raise TypeError("a menu policy answers with a letter, read by the menu seller (negotiate.agents.menu_seller), not parsed")
