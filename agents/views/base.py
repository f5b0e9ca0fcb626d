"""A prompt view: what the seller model is shown, and how its reply is read back.

One class per prompt mode (OpenSpiel's observer: one object decides what a player sees; a new view is a subclass).
A view renders a :class:`~negotiate.regulator.SellerObservation` into chat messages (:meth:`View.render`) and reads
the model's reply back into a message (:meth:`View.read`). What it needs besides the observation is declared, not
checked by name elsewhere: the scripted sellers whose next messages it shows (:attr:`View.tools`, walked beside the
episode by an :class:`~negotiate.agents.llm.Adviser`), whether it asks for tagged replies, and whether ``grounded=1``
can bind a reply's thought to the facts it states. Serving (``negotiate.agents.llm``) and training data
(``negotiate.training.dataset``) both render through the same view, so their prompts cannot differ.
"""

from __future__ import annotations

from typing import ClassVar

from negotiate.protocol import parse_lenient
from negotiate.regulator import SellerObservation

__all__ = ["View"]


class View:
    """The ``full`` prompt's contract, which every view keeps."""

    name: ClassVar[str] = ""
    """The prompt mode's name: the ``prompt=`` key of an agent spec, ``--prompt`` of train and loop."""
    tools: ClassVar[tuple[str, ...]] = ()
    """Scripted seller specs whose next message the prompt shows, in order (an Adviser walks the episode with them)."""
    tagged: ClassVar[bool] = True
    """The view asks for tagged replies (``format=tagged``); only the full prompt describes the JSON form too."""
    grounds: ClassVar[bool] = False
    """``grounded=1`` (under ``legal=1``) can bind the reply's thought to the facts this prompt states."""
    chooses: ClassVar[bool] = False
    """The model picks an option of a menu the runtime lays out (a letter, read from its log-probs), rather than writing
    a message (``negotiate.agents.menu_seller``)."""

    def render(self, obs: SellerObservation, fmt: str = "tagged", advice=None) -> list[dict]:
        """The seller's chat messages (system, user) for ``obs``; ``advice``: the tools' next messages (one per tool,
        or the one message where there is a single tool; None where the view shows none)."""
        raise NotImplementedError

    def read(self, text: str, sender: str):
        """The model's reply as (result, clamp notes, reasoning): :func:`negotiate.protocol.parse_lenient`."""
        return parse_lenient(text, "seller", sender)
