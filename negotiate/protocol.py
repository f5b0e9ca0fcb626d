"""The four-part message (thought, to, talk, action) and its two wire forms.

Messages are typed, frozen records. Model text becomes a record here and nowhere
else: :func:`parse` reads either wire form as written, and :func:`parse_lenient`
(the LLM agent's) reads the same text once, clamping what a model gets slightly
wrong (control characters, over-long talk, ``Buyer b3``, a ``<think>`` block) and
noting each clamp. Neither raises on model text: what does not parse comes back as
a :class:`ParseFailure` with the reason, and the runtime records it as an
``invalid`` message. Roles and buyer statuses are StrEnums (:class:`Role`,
:class:`BuyerStatus`), equal to the strings the trace holds; :data:`CONTROL` is
the one definition of a control character.

Tagged text form::

    Thought: b2 values the Pro model most; start high.
    To: b2
    Talk: The Pro is yours for $450.
    Action: [OFFER] p2 $450

JSON form (schema from :func:`json_schema`)::

    {"thought": "...", "to": "b2", "talk": "...", "action": {"kind": "offer", "product": "p2", "price": 450}}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal, NamedTuple, get_type_hints

import orjson
from pydantic import Field, TypeAdapter, create_model

__all__ = [
    "Action",
    "Message",
    "ParseFailure",
    "SELLER_ACTIONS",
    "BUYER_ACTIONS",
    "TALK_MAX",
    "SELLER",
    "BUYER",
    "Role",
    "BuyerStatus",
    "parse",
    "parse_tagged",
    "parse_json",
    "parse_object",
    "parse_lenient",
    "one_line",
    "CONTROL",
    "CONTROL_CHARS",
    "render_tagged",
    "json_schema",
    "Generated",
    "Notice",
]

class Role(StrEnum):
    """Who sends a message. A StrEnum: its members are the strings the trace holds (``"seller"``, ``"buyer"``),
    equal to them and written as them. One catch: orjson refuses a member as a dict *key* (a str subclass);
    key what it writes by ``role.value``."""

    SELLER = "seller"
    BUYER = "buyer"


class BuyerStatus(StrEnum):
    """Where a buyer stands in the market, as the seller sees it."""

    ACTIVE = "active"
    """May be written to (or owes a reply)."""
    SERVED = "served"
    """Has bought its one unit."""
    GONE = "gone"
    """Has quit."""


SELLER = Role.SELLER
"""The seller's address and role."""
BUYER = Role.BUYER
"""A buyer's role (a buyer's address is its id, ``b1``)."""
SELLER_ACTIONS = ("offer", "accept", "reject", "end")
BUYER_ACTIONS = ("bid", "accept", "reject", "quit")
PRICED = frozenset({"offer", "accept", "bid"})
"""Action kinds that carry a product and a price."""
TALK_MAX = 600
"""Longest public talk, in characters."""
THOUGHT_MAX = 4000

Kind = Literal["offer", "accept", "reject", "end", "bid", "quit"]


class Action(NamedTuple):
    """The binding part of a message: the only part that changes the market.

    Messages and actions are named tuples: immutable, typed, and built tens of
    thousands of times a second (a frozen dataclass costs about 5x more to build).
    """

    kind: Kind
    """offer / accept / reject / end (seller); bid / accept / reject / quit (buyer)."""
    product: Annotated[str | None, Field(pattern=r"^p[0-9]+$")] = None
    """Product id for offer, accept and bid; None otherwise."""
    price: Annotated[int | None, Field(ge=0)] = None
    """Whole currency units for offer, accept and bid; None otherwise."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, "product": self.product, "price": self.price}

    def __str__(self) -> str:
        if self.kind in PRICED:
            return f"[{self.kind.upper()}] {self.product} ${self.price}"
        return f"[{self.kind.upper()}]"


class Message(NamedTuple):
    """A four-part message, seller's or buyer's."""

    sender: str
    """``seller`` or a buyer id; set by the runtime, never taken from model text."""
    to: str
    """Addressee: a buyer id for the seller, ``seller`` for a buyer."""
    talk: Annotated[str, Field(max_length=TALK_MAX)]
    """Public natural-language text, delivered to the addressee."""
    action: Action
    """The binding decision."""
    thought: str = ""
    """Private reasoning, kept in the trace, never delivered."""

    def to_dict(self) -> dict:
        return {"sender": self.sender, "to": self.to, "thought": self.thought, "talk": self.talk, "action": self.action.to_dict()}


@dataclass(frozen=True, slots=True)
class ParseFailure:
    """Model text that is not a valid message, with the reason."""

    reason: str
    raw: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Generated:
    """What a model-backed agent returns: the parsed result plus what the trace keeps."""

    result: Message | ParseFailure | None
    """The parsed message, the parse failure, or None (a seller that waits)."""
    raw: str = ""
    """The model's text, verbatim."""
    extra: dict | None = None
    """Backend details for the trace: prompt, token ids, log-probs, latency, re-asks."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A runtime notice to one party: not a message, costs nothing, needs no reply."""

    to: str
    """``seller`` or a buyer id."""
    kind: str
    """``deal``, ``sold_out``, ``violation``, ``timeout``, ``ended``."""
    text: str
    """Human-readable line, shown to LLMs and people."""

    def to_dict(self) -> dict:
        return {"to": self.to, "kind": self.kind, "text": self.text}


CONTROL_CHARS = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
"""Control characters other than tab and line breaks, as a regex class body: C0, DEL and C1 (terminal
escapes start with one). The one definition: model text loses them before it is parsed, trace lines
holding them are binary, and the screen strips them (with carriage returns and bidi overrides)."""
CONTROL = re.compile(f"[{CONTROL_CHARS}]")
_SPACE = re.compile(r"\s+")

_TAG = re.compile(r"^\s*\**\s*(thought|to|talk|action)\s*\**\s*:\s*\**\s*", re.IGNORECASE | re.MULTILINE)
_ACTION = re.compile(
    r"^\[?\s*(?P<kind>[a-z]+)\s*\]?\s*(?:(?P<product>p\d+)\s*(?:(?:at|for|@)\s*)?\$?\s*(?P<price>-?[\d,]*\.?\d+))?\s*\.?\s*$",
    re.IGNORECASE,
)


def _allowed(role: str) -> tuple[str, ...]:
    return SELLER_ACTIONS if role == SELLER else BUYER_ACTIONS


def _build(role: str, sender: str, to: str | None, talk: str, thought: str, kind: str, product, price, raw: str):
    kind = kind.lower()
    allowed = _allowed(role)
    if kind not in allowed:
        return ParseFailure(f"action {kind!r} is not one of {', '.join(allowed)}", raw)
    if kind in PRICED:
        if not product or price is None:
            return ParseFailure(f"action {kind} needs a product and a price", raw)
        if not isinstance(product, str) or not re.fullmatch(r"p\d+", product.lower()):
            return ParseFailure(f"product {product!r} is not a product id like p1", raw)
        product = product.lower()
        if isinstance(price, str):
            try:
                price = float(price.replace(",", ""))
            except ValueError:
                return ParseFailure(f"price {price!r} is not a number", raw)
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price != price or abs(price) > 1e12:
            return ParseFailure(f"price {price!r} is not a number", raw)
        if price < 0:
            return ParseFailure(f"price {price} is negative", raw)
        price = int(round(price))
    else:
        product, price = None, None
    if role == SELLER:
        if kind == "end":
            to = to or ""
        elif not to:
            return ParseFailure("no addressee: the seller's message needs To: a buyer id", raw)
        to = to.strip().lower()
    else:
        to = SELLER
    if len(talk) > TALK_MAX:
        return ParseFailure(f"talk is {len(talk)} characters, more than {TALK_MAX}", raw)
    return Message(sender=sender, to=to, talk=talk, action=Action(kind, product, price), thought=thought[:THOUGHT_MAX])


def _sections(text: str) -> dict[str, str]:
    """The tagged form cut at its tags: ``{"thought": ..., "to": ..., "talk": ..., "action": ...}``, the first of each."""
    parts: dict[str, str] = {}
    matches = list(_TAG.finditer(text))
    for k, match in enumerate(matches):
        end = matches[k + 1].start() if k + 1 < len(matches) else len(text)
        parts.setdefault(match.group(1).lower(), text[match.end() : end].strip())
    return parts


def parse_tagged(text: str, role: str, sender: str | None = None) -> Message | ParseFailure:
    """Parse the tagged-text form. ``role`` is ``seller`` or ``buyer``."""
    return _from_sections(_sections(text), role, sender, text)


def _from_sections(parts: dict[str, str], role: str, sender: str | None, text: str) -> Message | ParseFailure:
    sender = sender or (SELLER if role == SELLER else BUYER)
    if "action" not in parts:
        return ParseFailure("no 'Action:' line", text)
    action_text = parts["action"].splitlines()[0].strip() if parts["action"] else ""
    found = _ACTION.match(action_text)
    if not found:
        return ParseFailure(f"action {action_text!r} is not like [OFFER] p1 $100", text)
    return _build(
        role, sender, parts.get("to"), parts.get("talk", ""), parts.get("thought", ""),
        found["kind"], found["product"], found["price"], text,
    )


def _unfenced(text: str) -> str:
    """``text`` without a Markdown code fence around it (```json ... ```)."""
    body = text.strip()
    return body.strip("`").removeprefix("json").strip() if body.startswith("```") else body


def parse_json(text: str, role: str, sender: str | None = None) -> Message | ParseFailure:
    """Parse the JSON form (an object, possibly inside a ```json fence)."""
    try:
        data = orjson.loads(_unfenced(text))
    except orjson.JSONDecodeError as error:
        return ParseFailure(f"not valid JSON ({error})", text)
    return parse_object(data, role, sender, text)


def parse_object(data, role: str, sender: str | None = None, raw: str = "") -> Message | ParseFailure:
    """Parse the JSON form once decoded: ``data`` is what the model's object decoded to; ``raw`` its text."""
    sender = sender or (SELLER if role == SELLER else BUYER)
    text = raw
    if not isinstance(data, dict):
        return ParseFailure("JSON is not an object", text)
    action = data.get("action")
    if not isinstance(action, dict):
        return ParseFailure("no 'action' object", text)
    for key in ("thought", "talk", "to"):
        if key in data and data[key] is not None and not isinstance(data[key], str):
            return ParseFailure(f"'{key}' is not a string", text)
    kind = action.get("kind", action.get("type"))
    if not isinstance(kind, str):
        return ParseFailure("action has no 'kind'", text)
    return _build(
        role, sender, data.get("to"), data.get("talk") or "", data.get("thought") or "",
        kind, action.get("product"), action.get("price"), text,
    )


def parse(text: str, role: str, sender: str | None = None) -> Message | ParseFailure:
    """Parse either form: JSON if the text starts with ``{`` or a code fence, else tagged text."""
    head = text.lstrip()[:1]
    if head in ("{", "`"):
        return parse_json(text, role, sender)
    return parse_tagged(text, role, sender)


# -- the lenient parser: model text, clamped where the model was slightly off --------------------

_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
_BUYER_ID = re.compile(r"\bb\d+\b")
_JSON = json.JSONDecoder(strict=False)


def _is_one_line(text: str, limit: int = TALK_MAX) -> bool:
    """Already one clean line (the common case: talk was cleaned when it was parsed): no regex pass needed."""
    return len(text) <= limit and text.isprintable() and "  " not in text and text.strip() == text


def one_line(text: str, limit: int = TALK_MAX) -> str:
    """Model text as one clean line: no control characters, whitespace collapsed, at most ``limit`` characters.

    >>> one_line("Hi\\x1b[31m there,\\u2028 friend  ", 14)
    'Hi[31m there,'
    """
    if _is_one_line(text, limit):
        return text
    return _SPACE.sub(" ", CONTROL.sub("", text)).strip()[:limit].rstrip()


def _clean_talk(talk: str, notes: list[str]) -> str:
    if _is_one_line(talk):
        return talk
    cleaned = _SPACE.sub(" ", CONTROL.sub("", talk)).strip()
    if len(cleaned) > TALK_MAX:
        notes.append(f"talk truncated from {len(cleaned)} to {TALK_MAX} characters")
        cleaned = cleaned[:TALK_MAX].rstrip()
    return cleaned


def _control_note(where: str, removed: list[str]) -> str:
    """The clamp note for control characters taken out of one part: how many, which (code points, first seen
    first), and where, e.g. ``removed 2 control characters from thought: U+001B, U+009B``."""
    codes = ", ".join(f"U+{ord(char):04X}" for char in dict.fromkeys(removed))
    return f"removed {len(removed)} control character{'s' if len(removed) > 1 else ''} from {where}: {codes}"


def _strip_control(value: str, where: str, notes: list[str]) -> str:
    """``value`` without control characters, noting the repair under ``where`` (a field's name)."""
    removed = CONTROL.findall(value)
    if not removed:
        return value
    notes.append(_control_note(where, removed))
    return CONTROL.sub("", value)


def _strip_control_tagged(body: str, notes: list[str]) -> str:
    """The tagged form without control characters, one note per part they were in (the tag each follows).

    They go before the text is cut at its tags (a control character can hide a tag); each is placed by
    where it stood in the cleaned text."""
    found = [(match.start(), match.group()) for match in CONTROL.finditer(body)]
    if not found:
        return body
    cleaned = CONTROL.sub("", body)
    tags = [(match.start(), match.group(1).lower()) for match in _TAG.finditer(cleaned)]
    by_part: dict[str, list[str]] = {}
    for before, (position, char) in enumerate(found):
        at, part = position - before, "the text before the first tag"
        for start, tag in tags:
            if start >= at:
                break
            part = tag
        by_part.setdefault(part, []).append(char)
    notes.extend(_control_note(part, chars) for part, chars in by_part.items())
    return cleaned


def _clean_to(to: str, notes: list[str]) -> str:
    ids = set(_BUYER_ID.findall(to.lower()))
    if len(ids) == 1:
        (found,) = ids
        if found != to.strip().lower():
            notes.append(f"addressee {to.strip()!r} read as {found}")
        return found
    return to


def _load_json(body: str):
    """What the JSON in ``body`` decodes to (a code fence around it allowed), or the reason it holds none."""
    body = _unfenced(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        reason = ParseFailure(f"not valid JSON ({error})", body)
    start = body.find("{")
    if start < 0:
        return reason
    try:  # lenient: raw control characters in strings, a code fence, text after the object
        return _JSON.raw_decode(body, start)[0]
    except ValueError:
        return reason


def parse_lenient(text: str, role: str, sender: str | None = None) -> tuple[Message | ParseFailure, list[str], str | None]:
    """Parse model text (JSON or tagged, whichever it is) for ``role``; returns (result, clamp notes, reasoning).

    What :func:`parse` reads, and beside it what a model gets slightly wrong without changing what it
    meant, clamped and noted: a ``<think>`` block set apart (the reasoning), control characters
    stripped (raw or JSON-escaped, the same way; each note says which and from which part), talk made one line and truncated to ``TALK_MAX``, an addressee like ``Buyer b3`` read as
    ``b3``, a ``$`` in a JSON price, a code fence or text around a JSON object, the format line's
    ``<...>`` brackets copied into a tagged value. Everything else is a :class:`ParseFailure` whose
    ``raw`` is ``text`` verbatim. The text is read once.

    >>> result, notes, reasoning = parse_lenient("<think>keen</think>To: Buyer b3\\nTalk: hi\\nAction: <[OFFER] p2 $1,200>", SELLER)
    >>> result.to, str(result.action), notes, reasoning
    ('b3', '[OFFER] p2 $1200', ["addressee 'Buyer b3' read as b3"], 'keen')
    """
    notes: list[str] = []
    reasoning = None
    body = text
    think = _THINK.match(body)
    if think:
        reasoning, body = _strip_control(think.group(1).strip(), "reasoning", notes), body[think.end():]
    if CONTROL.sub("", body).lstrip()[:1] in ("{", "`"):
        # Raw control characters inside JSON strings decode as they are (the lenient decoder allows them), and
        # escaped ones (\u001b) decode to the same characters: both are taken out of each decoded field below,
        # the same way. Only when they stand between the JSON's tokens is the text cleaned before decoding.
        data = _load_json(body)
        if isinstance(data, ParseFailure) and CONTROL.search(body):
            data = _load_json(_strip_control(body, "the reply, before its JSON was read", notes))
        if isinstance(data, dict):
            for key in ("thought", "to", "talk"):
                if isinstance(data.get(key), str):
                    data[key] = _strip_control(data[key], key, notes)
            action = data.get("action")
            if isinstance(action, dict):
                for key in ("kind", "type", "product", "price"):
                    if isinstance(action.get(key), str):
                        action[key] = _strip_control(action[key], f"action.{key}", notes)
                if isinstance(action.get("price"), str):
                    action["price"] = action["price"].strip().lstrip("$").strip()
            if isinstance(data.get("talk"), str):
                data["talk"] = _clean_talk(data["talk"], notes)
            if role == SELLER and isinstance(data.get("to"), str):
                data["to"] = _clean_to(data["to"], notes)
        result = data if isinstance(data, ParseFailure) else parse_object(data, role, sender, text)
    else:
        parts = _sections(_strip_control_tagged(body, notes))
        for tag, value in parts.items():
            if value.startswith("<") and value.endswith(">"):  # the format line's placeholder brackets, copied
                parts[tag] = value[1:-1].strip()
        if "talk" in parts:
            parts["talk"] = _clean_talk(parts["talk"], notes)
        if role == SELLER and parts.get("to"):
            parts["to"] = _clean_to(parts["to"], notes)
        result = _from_sections(parts, role, sender, text)
    if isinstance(result, ParseFailure):
        return ParseFailure(result.reason, text), notes, reasoning
    return result, notes, reasoning


def render_tagged(message: Message) -> str:
    """The tagged-text form of a message, as an LLM would write it."""
    lines = [f"Thought: {message.thought}"] if message.thought else []
    lines += [f"To: {message.to}", f"Talk: {message.talk}", f"Action: {message.action}"]
    return "\n".join(lines)


def _object_model(record: type, **overrides) -> type:
    """A pydantic model with the fields, types, defaults and docs of a named-tuple record."""
    hints = get_type_hints(record, include_extras=True)
    fields = {}
    for name in record._fields:
        kind = overrides.get(name, hints[name])
        default = record._field_defaults.get(name, ...)
        fields[name] = (kind, Field(default))
    return create_model(record.__name__, __doc__=record.__doc__.split("\n")[0], **fields)


_ACTION_MODEL = _object_model(Action)
_MESSAGE_ADAPTER = TypeAdapter(_object_model(Message, action=_ACTION_MODEL))


def json_schema(role: str) -> dict:
    """JSON Schema of the four-part message for ``role`` (structured outputs), generated from the records."""
    schema = _MESSAGE_ADAPTER.json_schema()
    defs = schema.get("$defs", {})
    defs["Action"]["properties"]["kind"]["enum"] = list(_allowed(role))
    defs["Action"]["properties"]["kind"].pop("type", None)
    defs["Action"]["properties"]["kind"]["type"] = "string"
    schema["properties"].pop("sender", None)
    schema["required"] = [name for name in ("thought", "to", "talk", "action")]
    if role != SELLER:
        schema["properties"]["to"]["enum"] = [SELLER]
    schema["title"] = f"{role.capitalize()}Message"
    return schema


def message_from_dict(data: dict) -> Message:
    """Rebuild a message from its trace form (trusted input)."""
    action = data["action"]
    return Message(
        sender=data["sender"], to=data["to"], talk=data.get("talk", ""),
        action=Action(action["kind"], action.get("product"), action.get("price")),
        thought=data.get("thought", ""),
    )

