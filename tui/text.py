"""Showing untrusted text: model talk, thoughts and trace fields, always literally.

Anything an agent wrote (or any string read from a trace) goes through :func:`clean`
before it reaches the screen or stdout: control characters (terminal escape
sequences included) and bidirectional overrides are removed, newlines kept, tabs
become spaces. The UI then shows it as :class:`rich.text.Text`, never as markup, so
``[bold]`` or ``[link=...]`` in a buyer's talk is just text. :func:`esc` is for the
few places that take a markup string (titles, tab labels, notifications).

Those places parse Textual's content markup, not Rich's: a tag opens at any ``[``
not preceded by a backslash (``[ @click=app.quit]``, ``[B]`` and ``[$accent]``
included), and ``\\[`` is a literal bracket. ``rich.markup.escape`` only escapes
brackets followed by ``a-z#/@``, which leaves those tags live, so :func:`esc`
escapes every ``[``.
"""

from __future__ import annotations

import re

from rich.text import Text

from negotiate.protocol import CONTROL_CHARS

__all__ = ["clean", "esc", "literal", "money", "ratio", "action_label"]

# The protocol's control characters, carriage returns (a lone one moves the cursor), and the bidi
# embedding/override/isolate characters.
_CONTROL = re.compile(f"[{CONTROL_CHARS}\r\u202a-\u202e\u2066-\u2069]")


def clean(value: object) -> str:
    """``value`` as printable text: control characters removed, tabs as spaces, newlines kept.

    >>> clean("[bold red]x[/] \\x1b[31mred\\x1b[0m\\tok\\r\\n")
    '[bold red]x[/] [31mred[0m ok\\n'
    """
    text = value if isinstance(value, str) else "" if value is None else str(value)
    return _CONTROL.sub("", text.replace("\t", " ").replace("\r\n", "\n"))


def esc(value: object) -> str:
    """``value`` cleaned and markup-escaped, for widgets that read Textual markup (titles, labels, toasts).

    Every ``[`` gets a backslash: Textual's parser reads ``\\[`` as a bracket and
    leaves any other backslash alone, so the text comes back exactly as :func:`clean` gave it.

    >>> print(esc("[@click=app.quit]go[/] [ b]x"))
    \\[@click=app.quit]go\\[/] \\[ b]x
    """
    return clean(value).replace("[", "\\[")


def literal(value: object, style: str = "") -> Text:
    """``value`` cleaned, as a Text that is never parsed as markup."""
    return Text(clean(value), style=style)


def money(price: object) -> str:
    """``$450``; ``-`` for a missing price."""
    return "-" if price is None else f"${price}"


def ratio(value: object, digits: int = 2) -> str:
    """A ratio such as profit/OPT, ``-`` when undefined."""
    return "-" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"


def action_label(action) -> str:
    """``OFFER p1 $450`` from an Action or its trace dict; ``(no action)`` when there is none."""
    if action is None:
        return "(no action)"
    if isinstance(action, dict):
        kind, product, price = action.get("kind"), action.get("product"), action.get("price")
    else:
        kind, product, price = action.kind, action.product, action.price
    label = clean(str(kind or "?").upper())
    if product is not None or price is not None:
        label += f" {clean(product)} {money(clean(price) if price is not None else None)}"
    return label
