"""What every prompt view is written with: the prompt files under ``agents/prompts/`` and the lines a thread is shown in.

A prompt file holds ``{{name}}`` placeholders (:class:`PromptTemplate`); :func:`_fill` fills one by a join over its
parts, cut once. The seller's and the buyer's system prompts (format block, example, persona) are built once per
format and cached. The line helpers render a message as ``b1: [BID] p2 $410 "talk"`` and a thread as its latest
``THREAD_SHOWN`` lines, a refused message marked where it happened.
"""

from __future__ import annotations

import string
import tomllib
from functools import lru_cache
from importlib import resources

import orjson

from negotiate.market import KNOWN_PERSONAS
from negotiate.protocol import BUYER, SELLER, TALK_MAX, Action, Message, Notice, one_line, render_tagged
from negotiate.regulator import MALFORMED, TIMEOUT, SellerObservation

__all__ = ["PromptTemplate", "PERSONAS", "THREAD_SHOWN", "NOTICES_SHOWN"]


PERSONAS = KNOWN_PERSONAS
"""Personas with a prompt file under ``agents/prompts/personas/``; any other name is described in one line."""
THREAD_SHOWN = 8
"""Latest messages shown per thread; older ones are counted, not shown (small models, short context)."""
NOTICES_SHOWN = 6


# -- prompt files --------------------------------------------------------------------------


class PromptTemplate(string.Template):
    """``{{name}}`` placeholders: prompt files hold ``$`` prices and JSON braces without escaping."""

    delimiter = "{{"
    pattern = r"""
    \{\{(?:
      (?P<escaped>\{\{) |
      \s*(?P<named>[a-z_][a-z0-9_]*)\s*\}\} |
      (?P<braced>(?!)) |
      (?P<invalid>)
    )"""


@lru_cache(maxsize=None)
def _file(name: str) -> str:
    return resources.files("negotiate.agents").joinpath("prompts", name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def _template(name: str) -> PromptTemplate:
    return PromptTemplate(_file(name).rstrip("\n"))


@lru_cache(maxsize=None)
def _parts(name: str) -> tuple[tuple[str, str | None], ...]:
    """A prompt file cut once into (literal, placeholder) pairs: filling it is a join, not a regex pass."""
    template = _template(name)
    text, parts, at = template.template, [], 0
    for match in template.pattern.finditer(text):
        if match["invalid"] is not None:
            template.substitute({})  # raises ValueError naming the line, as string.Template does
        literal = text[at:match.start()]
        if match["escaped"] is not None:
            parts.append((literal + match["escaped"], None))
        else:
            parts.append((literal, match["named"]))
        at = match.end()
    parts.append((text[at:], None))
    return tuple(parts)


def _fill(name: str, **values) -> str:
    """The prompt file ``name`` with its ``{{placeholders}}`` filled (a missing one raises KeyError)."""
    return "".join([literal if key is None else f"{literal}{values[key]}" for literal, key in _parts(name)])


@lru_cache(maxsize=None)
def _persona(name: str) -> str:
    """The persona's prompt file (its name in any case: ``Begging`` is ``begging``), or any other words in one line.

    >>> _persona("Begging") == _persona("begging") != _persona("a haggler from the market")
    True
    >>> _persona("a haggler from the market")
    'Persona: a haggler from the market.'
    """
    if name.strip().lower() in PERSONAS:
        return _file(f"personas/{name.strip().lower()}.md").strip()
    return f"Persona: {_one_line(name, 80)}."


@lru_cache(maxsize=None)
def _example(role: str, fmt: str) -> str:
    data = tomllib.loads(_file("examples.toml"))[role]
    action = Action(data["kind"], data.get("product"), data.get("price"))
    if fmt == "json":
        return orjson.dumps({"thought": data["thought"], "to": data["to"], "talk": data["talk"], "action": action.to_dict()}).decode()
    return render_tagged(Message(SELLER if role == SELLER else "b1", data["to"], data["talk"], action, data["thought"]))


@lru_cache(maxsize=None)
def _format_block(role: str, fmt: str) -> str:
    seller = role == SELLER
    values = {
        "to": "a buyer id, like b1" if seller else "seller",
        "talk_max": str(TALK_MAX),
        "example": _example(role, fmt),
    }
    if fmt == "json":
        kinds = ("offer", "accept", "reject", "end") if seller else ("accept", "bid", "reject", "quit")
        values["kinds"] = ", ".join(f'"{kind}"' for kind in kinds)
        return _template("format_json.md").substitute(values)
    values["actions"] = ("[OFFER] p1 $450, [ACCEPT] p1 $450, [REJECT], [END]" if seller
                         else "[ACCEPT] p1 $450, [BID] p1 $450, [REJECT], [QUIT]")
    return _template("format_tagged.md").substitute(values)


@lru_cache(maxsize=None)
def _seller_system(fmt: str) -> str:
    return _template("seller.md").substitute(format=_format_block(SELLER, fmt))


@lru_cache(maxsize=4096)
def _buyer_system(buyer: str, persona: str, fmt: str) -> str:
    return _template("buyer.md").substitute(buyer=buyer, persona=_persona(persona), format=_format_block(BUYER, fmt))


# -- rendering -----------------------------------------------------------------------------

_one_line = one_line
"""Model text as one clean line (negotiate.protocol.one_line: the parser cleans talk the same way)."""


def _standing(pair: tuple[str, int] | None) -> str:
    return f"{pair[0]} ${pair[1]}" if pair else "none"


def _line(message: Message, who: str) -> str:
    return _line_of(message.action, message.talk, who)


@lru_cache(maxsize=1 << 16)  # a thread's lines are rendered again at every turn: render each once (thoughts not kept)
def _line_of(action: Action, talk: str, who: str) -> str:
    talk = _one_line(talk)
    return f"{who}: {action}" + (f' "{talk}"' if talk else "")


def _thread_lines(items: list[str], indent: str, empty: str | None = None, earlier: int = 0) -> list[str]:
    """A thread's latest ``THREAD_SHOWN`` lines, after a count of the rest: those in ``items`` and ``earlier`` more
    before them (a long episode's thread keeps only its latest items: ``History.dropped``)."""
    if not items:
        return [indent + empty] if empty else []
    hidden = len(items) + earlier - THREAD_SHOWN
    shown = items[-THREAD_SHOWN:]
    return ([f"{indent}({hidden} earlier messages)"] if hidden > 0 else []) + [indent + item for item in shown]


def _stock(units: int) -> str:
    return "sold out" if units <= 0 else "in stock" if units == 1 else f"{units} in stock"


def _seller_threads(obs: SellerObservation, *, talk: bool) -> tuple[dict[str, list[str]], list[str], str]:
    """What the seller's history holds, per buyer: its thread of lines (with the talk or without), a message the
    regulator refused marked where it happened; the other notices, as lines; and the text of the latest
    violation notice since the seller's last message ("" when there is none). The history is the latest
    ``HISTORY_KEPT`` (2,048) items of every buyer together (``negotiate.regulator``), so in a long episode a thread
    is what of it they hold, and its count of earlier messages counts those."""
    threads: dict[str, list[str]] = {b.id: [] for b in obs.buyers}
    notices: list[str] = []
    latest = ""
    last_sent: list[str] | None = None
    """The thread holding the seller's latest message, while a violation notice may still follow it."""
    for item in obs.history:
        if isinstance(item, Notice):
            if item.kind == "violation":
                latest = item.text
            if item.kind == "violation" and last_sent and not item.text.startswith((MALFORMED, TIMEOUT)):
                # The regulator notes a refused message right after it: say so in the thread, where it happened.
                last_sent[-1] += f" (refused: {_one_line(item.text, 300)})" if talk else " (refused)"
            else:
                notices.append(f"- {_one_line(item.text, 300)}")
            last_sent = None
            continue
        last_sent = None
        if item.sender == SELLER:
            latest = ""
            if item.to in threads:
                last_sent = threads[item.to]
                last_sent.append(_line_of(item.action, item.talk if talk else "", "you"))
        elif item.sender in threads:
            threads[item.sender].append(_line_of(item.action, item.talk if talk else "", item.sender))
    return threads, notices, latest
