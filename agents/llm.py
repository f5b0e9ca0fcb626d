"""LLM agents: prompts rendered from an observation, a backend call, the reply parsed at the edge.

:class:`LLMSeller` and :class:`LLMBuyer` render their prompt from the observation
alone (:func:`render_seller`, :func:`render_buyer`; the text lives in data files
under ``agents/prompts/``), ask their backend (``negotiate.agents.backends``) for a
completion, and turn the model's text into a message with :func:`parse_reply`,
which validates and clamps on our side (control characters stripped, over-long
talk truncated to ``TALK_MAX``, prices rounded, a ``<think>`` block set apart)
and otherwise yields a :class:`~negotiate.protocol.ParseFailure` with the reason.
``act`` returns a :class:`~negotiate.protocol.Generated`: the result, the model's
raw text, and what the trace keeps (the prompt, latency, model, finish reason,
usage, token ids, log-probs, re-asks).

An unparseable reply is the model's fault: it is returned, and the regulator
records an invalid message (the seller's turn is spent; a buyer's reply counts as a
reject). With ``reask=N`` the agent first asks again, at most N times, with the
error appended. Failures that are not the model's fault raise from ``act``
(``LLMError``: the episode is recorded as failed with the reason; ``LLMTimeout``:
the bus records the agent's silence).

Prompts never hold another party's private information: a buyer's prompt has its
own values and the public catalog (no costs); the seller's has its costs and what
buyers said, never a valuation (tests/test_llm_prompts.py checks this).
"""

from __future__ import annotations

import copy
import re
import string
import tomllib
from functools import lru_cache
from importlib import resources
from typing import ClassVar

import numpy as np
import orjson

from negotiate.market import KNOWN_PERSONAS
from negotiate.protocol import (
    BUYER, SELLER, TALK_MAX, Action, Generated, Message, Notice, ParseFailure, one_line, parse_lenient, render_tagged,
)
from negotiate.regulator import ACTIVE, GONE, MALFORMED, SERVED, TIMEOUT, BuyerObservation, SellerObservation

from negotiate.agents.backends import Completion, openai_backend, openai_options
from negotiate.agents.planner import bid_facts, bid_in_play, no_deal_facts, read_reason, turn_facts
from negotiate.agents.moves import units_left
from negotiate.agents.pools import current_pools

__all__ = [
    "LLMAgent",
    "LLMSeller",
    "LLMBuyer",
    "render_seller",
    "render_seller_compact",
    "ADVISER",
    "TOOLS",
    "Adviser",
    "advice_line",
    "tool_lines",
    "render_buyer",
    "parse_reply",
    "PromptTemplate",
    "PERSONAS",
]

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


def _thread_lines(items: list[str], indent: str, empty: str | None = None) -> list[str]:
    if not items:
        return [indent + empty] if empty else []
    hidden = len(items) - THREAD_SHOWN
    shown = items[-THREAD_SHOWN:]
    return ([f"{indent}({hidden} earlier messages)"] if hidden > 0 else []) + [indent + item for item in shown]


def _stock(units: int) -> str:
    return "sold out" if units <= 0 else "in stock" if units == 1 else f"{units} in stock"


def _seller_threads(obs: SellerObservation, *, talk: bool) -> tuple[dict[str, list[str]], list[str], str]:
    """What the seller's history holds, per buyer: its thread of lines (with the talk or without), a message the
    regulator refused marked where it happened; the other notices, as lines; and the text of the latest
    violation notice since the seller's last message ("" when there is none)."""
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


def render_seller(obs: SellerObservation, fmt: str = "json", prompt: str = "full",
                  advice: Message | tuple[Message | None, ...] | None = None) -> list[dict]:
    """The seller's chat messages (system, user), from its observation alone: the full prompt, or the compact one
    (``prompt=compact``, or ``prompt=facts``: :func:`render_seller_compact`); ``prompt=advice`` adds to the facts
    the message :data:`ADVISER` would send there (``advice``, from an :class:`Adviser` walking the episode), and
    ``prompt=tools`` the message of each of :data:`TOOLS` (``advice``: one per tool, :func:`tool_lines`)."""
    if prompt in ("compact", "facts", "advice", "tools"):
        line = advice_line(advice) if prompt == "advice" else tool_lines(advice) if prompt == "tools" else None
        return render_seller_compact(obs, facts=prompt != "compact", advice=line)
    catalog = "\n".join(f"- {p.id} {p.name}: cost ${p.cost}, {_stock(p.stock)}" for p in obs.products)
    threads, notices, _ = _seller_threads(obs, talk=True)
    blocks = []
    for b in obs.buyers:
        if b.status == SERVED:
            blocks.append(f"- {b.id}: has bought; nothing more to do.")
            continue
        if b.status == GONE:
            blocks.append(f"- {b.id}: has left the market.")
            continue
        state = "owes you a reply; wait for it" if b.awaiting else f"you may write to {b.id} now"
        blocks.append(f"- {b.id}: {state}. Your standing offer: {_standing(b.offer)}. Its standing bid: {_standing(b.bid)}.")
        blocks.extend(_thread_lines(threads[b.id], "    "))
    free = [b.id for b in obs.buyers if b.status == ACTIVE and not b.awaiting]
    shown = notices[-NOTICES_SHOWN:]
    notice_text = ("\nNotices (latest last):\n" + "\n".join(shown) + "\n") if shown else ""
    user = _fill(
        "seller_state.md", budget_left=obs.budget_left, budget=obs.budget, price_low=obs.price_low, price_high=obs.price_high,
        catalog=catalog, buyers="\n".join(blocks), notices=notice_text, free=", ".join(free) or "nobody (every buyer owes you a reply)",
    )
    return [{"role": "system", "content": _seller_system(fmt)}, {"role": "user", "content": user}]


def _bids_of(obs: SellerObservation) -> dict[str, list[tuple[str, int]]]:
    """Each buyer's bids in the seller's history, in order: (product, price)."""
    bids: dict[str, list[tuple[str, int]]] = {b.id: [] for b in obs.buyers}
    for item in obs.history:
        if isinstance(item, Message) and item.sender in bids and item.action.kind == "bid" and item.action.product:
            bids[item.sender].append((item.action.product, int(item.action.price)))
    return bids


def _buyer_facts(obs: SellerObservation) -> dict[str, str]:
    """Per active buyer, the facts the planner's reasons name (``planner?reasons=1``): its last two bids for the
    product of its standing bid, whether they rise and whether the last covers that product's cost (``b2 bids $380,
    $410 (rising, covers cost)``); that the planner would not
    deal on that bid, its product promised or sold out or its cost out of reach (``b2 bids $223 for p2, no deal
    there``); or that it has no standing bid."""
    bids = _bids_of(obs)
    units = units_left(obs)
    out = {}
    for b in obs.buyers:
        if b.status != ACTIVE:
            continue
        if b.bid is None:
            out[b.id] = f"{b.id} has not bid"
        elif not bid_in_play(b.bid, units, obs.products):
            out[b.id] = no_deal_facts(b.id, b.bid)
        else:
            prices = [price for product, price in bids[b.id] if product == b.bid[0]][-2:] or [b.bid[1]]
            out[b.id] = bid_facts(b.id, prices, next(p.cost for p in obs.products if p.id == b.bid[0]))
    return out


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


class Adviser:
    """:data:`ADVISER` walking an LLM seller's episode beside it, as a teacher walks a trace
    (``negotiate.training.dataset``): before each decision a copy of it decides (:meth:`advise`, its
    choice leaves no trace), then it takes the seller's message as if it had sent it (:meth:`follow`).
    It sees what the seller sees: the market's public spec, never its drawn values. Like the teacher walk,
    it takes only the messages the regulator accepted: whether it did shows in the next observation (a
    violation notice), so each message is taken then."""

    def __init__(self, agents):
        self.agents = list(agents)
        """The tools: scripted sellers built for this episode (``negotiate.agents.registry.adviser`` builds them from specs)."""
        self._pending: tuple[SellerObservation, Message | None] | None = None

    @property
    def agent(self):
        """The first tool: the planner."""
        return self.agents[0]

    def advise(self, obs: SellerObservation) -> Message | None | tuple[Message | None, ...]:
        """The message the tool would send on ``obs`` (with more tools, a tuple of them, in their order)."""
        self._settle(obs)
        said = tuple(copy.deepcopy(agent).decide(obs) for agent in self.agents)
        return said[0] if len(said) == 1 else said

    def follow(self, obs: SellerObservation, message: Message | None) -> None:
        """``message``: what the seller sent on ``obs`` (None: nothing, or nothing that parsed)."""
        self._settle(obs)
        self._pending = (obs, message)

    def _settle(self, obs: SellerObservation) -> None:
        """Follow the last observation and message, the message only if ``obs`` (a later observation) shows
        no violation notice since."""
        if self._pending is None or self._pending[0] is obs:
            return
        before, message = self._pending
        refused = any(isinstance(item, Notice) and item.kind == "violation" for item in obs.new)
        for agent in self.agents:
            agent.follow(before, None if refused else message)
        self._pending = None


def render_seller_compact(obs: SellerObservation, facts: bool = False, advice: str | None = None) -> list[dict]:
    """The seller's chat messages in the compact form (``prompt=compact``): a short system prompt, one line
    per product, and per buyer its state and its thread of actions, without talk or thoughts.

    The threads are the full prompt's (``you: [OFFER] p1 $818`` / ``b1: [REJECT]``, a refused message
    marked, the latest ``THREAD_SHOWN``); what goes is the talk, the long rules and example, product
    names, and every notice but the refusal of the seller's own last message. About half the full
    prompt's tokens, for small models trained on many decisions.

    ``facts=True`` (``prompt=facts``) adds the facts the planner's reasons turn on, read from the same
    observation: the turns left for the buyers still active and the turns each (``10 turns for 3 buyers:
    3 each``), and per active buyer its last bids, whether they rise and whether the last covers its product's cost
    (``b2 bids $380, $410 (rising, covers cost)``),
    that the planner would not deal on its bid (``b2 bids $223 for p2, no deal there``), or that it has not
    bid. A policy taught by ``planner?reasons=1`` then copies the facts of its thought from the prompt and is
    left the verdict. ``advice`` (``prompt=advice``: :func:`advice_line`) follows the turns line.
    """
    threads, _, notice = _seller_threads(obs, talk=False)
    known = _buyer_facts(obs) if facts else {}
    lines = []
    for b in obs.buyers:
        if b.status == SERVED:
            lines.append(f"{b.id}: bought")
        elif b.status == GONE:
            lines.append(f"{b.id}: left")
        else:
            lines.append(f"{b.id}: {'owes you a reply' if b.awaiting else 'free'}" + (f". {known[b.id]}" if facts else ""))
            lines.extend(_thread_lines(threads[b.id], "  "))
    free = [b.id for b in obs.buyers if b.status == ACTIVE and not b.awaiting]
    turns = ""
    if facts:
        active = sum(1 for b in obs.buyers if b.status == ACTIVE)
        turns = f"{turn_facts(obs.budget_left, active)}: {obs.budget_left // max(1, active)} each.\n"
    if advice:
        turns += f"{advice}\n"
    user = _fill(
        "seller_compact_state.md", budget_left=obs.budget_left, budget=obs.budget, price_low=obs.price_low, facts=turns,
        price_high=obs.price_high, catalog="\n".join(f"{p.id} cost ${p.cost}, {_stock(p.stock)}" for p in obs.products),
        buyers="\n".join(lines), notice=f"Your last message was refused: {_one_line(notice, 160)}\n" if notice else "",
        free=", ".join(free) or "nobody",
    )
    return [{"role": "system", "content": _file("seller_compact.md").rstrip("\n")}, {"role": "user", "content": user}]


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
        "buyer_state.md", catalog=catalog, thread="\n".join(_thread_lines(lines, "", "(nothing yet)")), offer=_standing(obs.offer), bid=_standing(obs.bid),
    )
    return [{"role": "system", "content": _buyer_system(obs.buyer, obs.persona, fmt)}, {"role": "user", "content": user}]


# -- legal replies ---------------------------------------------------------------------------

LEGAL_TALK = 80
"""The longest talk line (characters) the ``legal=1`` regexes allow. Every scripted seller's talk is under 60;
unbounded (``[^\n]*``), a model sampled hot ran its talk line to ``max_tokens`` and the reply did not parse."""
LEGAL_THOUGHT = 160
"""The longest free thought (characters) :func:`legal_pattern` allows; the planner's reasons are under 100."""
_TALK = rf"\nTalk: [^\n]{{0,{LEGAL_TALK}}}\nAction: "

def number_range(low: int, high: int) -> str:
    """A regex of the whole numbers from ``low`` to ``high`` (0 <= low <= high), written without leading zeros.

    >>> import re
    >>> [k for k in range(0, 1500) if re.fullmatch(number_range(466, 1000), str(k))] == list(range(466, 1001))
    True
    >>> number_range(100, 999)
    '([1-9][0-9]{2})'
    """
    options = []
    for width in range(len(str(low)), len(str(high)) + 1):
        a = max(low, 10 ** (width - 1) if width > 1 else 0)
        b = min(high, 10**width - 1)
        if a <= b:
            options.append(_same_width(str(a), str(b)))
    return "(" + "|".join(options) + ")"


def _same_width(a: str, b: str) -> str:
    """A regex of the numbers from ``a`` to ``b``, two strings of one width with ``a <= b``."""
    if not a:
        return ""
    rest = len(a) - 1
    tail = f"[0-9]{{{rest}}}" if rest > 1 else "[0-9]" if rest else ""
    if a[0] == b[0]:
        return a[0] + _wrap(_same_width(a[1:], b[1:]))
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return f"[{a[0]}-{b[0]}]{tail}"
    options = [a[0] + _wrap(_same_width(a[1:], "9" * rest))]
    if int(a[0]) + 1 <= int(b[0]) - 1:
        options.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]{tail}")
    options.append(b[0] + _wrap(_same_width("0" * rest, b[1:])))
    return "|".join(options)


def _wrap(pattern: str) -> str:
    return f"({pattern})" if "|" in pattern else pattern


def legal_pattern(obs: SellerObservation) -> str | None:
    """A regex of the tagged replies the regulator accepts from the seller now; None when no buyer may be written to.

    A reply writes to a buyer that is active and owes no reply. It offers an in-stock product at a price
    from its cost to the top of the public value range (no buyer takes more), accepts that buyer's standing
    bid (when its product is in stock and the bid covers the cost), rejects, or ends. Decoding under it
    (``legal=1``) leaves the model every choice the rules leave, but for offers no buyer can take; the
    price is still the model's. The thought is at most :data:`LEGAL_THOUGHT` characters and the talk
    :data:`LEGAL_TALK`, so that a model sampled hot cannot run a line to ``max_tokens``. One race stays: a
    buyer's accept that lands while the reply is being written can sell the unit first, and the regulator
    records that reply as refused.
    """
    stocked = {p.id: p.cost for p in obs.products if p.stock > 0}
    offers = "|".join(rf"{product} \${number_range(cost, obs.price_high)}" for product, cost in stocked.items()
                      if cost <= obs.price_high)
    branches = []
    for buyer in obs.buyers:
        if buyer.status != ACTIVE or buyer.awaiting:
            continue
        actions = [rf"\[OFFER\] ({offers})"] if offers else []
        if buyer.bid is not None and buyer.bid[0] in stocked and buyer.bid[1] >= stocked[buyer.bid[0]]:
            actions.append(rf"\[ACCEPT\] {buyer.bid[0]} \${buyer.bid[1]}")
        actions += [r"\[REJECT\]", r"\[END\]"]
        branches.append(rf"To: {buyer.id}{_TALK}({'|'.join(actions)})")
    if not branches:
        return None
    return rf"(Thought: [^\n]{{0,{LEGAL_THOUGHT}}}\n)?({'|'.join(branches)})"


def _literal(text: str) -> str:
    """``text`` as a regex of itself, escaping only what regex engines read as syntax (not spaces, which
    Python's ``re.escape`` escapes and some engines refuse)."""
    return re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\1", text)


def grounded_pattern(obs: SellerObservation) -> str | None:
    """A regex of the tagged replies whose thought is a reason in the planner's words with the facts of the
    ``facts`` prompt (``grounded=1``); None when no buyer may be written to.

    Per free buyer, the thought states that buyer's facts and the turns for the buyers still active, as the
    ``facts`` prompt writes them, then a verdict, and the action is the one the verdict names: to a bidder the
    planner would deal with (:func:`~negotiate.agents.planner.bid_in_play`), ``hold out`` or ``ask one step up``
    (``below cost: ask more`` for a bid under cost) offers the bid's product above the bid, and ``take it``
    accepts the bid; to any other buyer, ``offer pN`` offers pN, a product with a unit no other buyer is being
    offered (any in stock where none is: the model cannot wait). ``no sale is worth its cost: end`` ends.
    Every reply it allows is one :func:`legal_pattern` allows, but for reject, which no reason names. The
    facts are the prompt's, so the model cannot misstate them; whom to write to, the verdict and the price
    stay the model's.
    """
    stocked = {p.id: p.cost for p in obs.products if p.stock > 0 and p.cost <= obs.price_high}
    facts = _buyer_facts(obs)
    units = units_left(obs)
    open_ = {product: cost for product, cost in stocked.items() if units[int(product[1:]) - 1] > 0} or stocked
    turns = turn_facts(obs.budget_left, sum(1 for b in obs.buyers if b.status == ACTIVE))
    branches = []
    for buyer in obs.buyers:
        if buyer.status != ACTIVE or buyer.awaiting:
            continue
        head, tail = rf"Thought: {_literal(facts[buyer.id])}; {turns}: ", rf"\nTo: {buyer.id}{_TALK}"
        bid = buyer.bid
        if bid is not None and bid_in_play(bid, units, obs.products):
            product, price = bid
            cost = next(p.cost for p in obs.products if p.id == product)
            if product in stocked and max(cost, price + 1) <= obs.price_high:
                verdicts = "hold out|ask one step up" + ("|below cost: ask more" if price < cost else "")
                branches.append(rf"{head}({verdicts}){tail}\[OFFER\] {product} \${number_range(max(cost, price + 1), obs.price_high)}")
            if product in stocked and price >= cost:
                branches.append(rf"{head}take it{tail}\[ACCEPT\] {product} \${price}")
        else:
            branches += [rf"{head}offer {product}{tail}\[OFFER\] {product} \${number_range(cost, obs.price_high)}"
                         for product, cost in open_.items()]
        branches.append(rf"Thought: no sale is worth its cost: end{tail}\[END\]")
    return f"({'|'.join(branches)})" if branches else None


# -- parsing -------------------------------------------------------------------------------

parse_reply = parse_lenient
"""Model text (JSON or tagged) -> (result, clamp notes, reasoning): :func:`negotiate.protocol.parse_lenient`."""


# -- the agent -----------------------------------------------------------------------------

def request_seed(seed) -> int | None:
    """The first sampling seed an agent sends with its requests, from what seeds its episode (a numpy
    Generator, or the ints that seed one); None leaves sampling to the server."""
    if seed is None:
        return None
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, 2**31 - 1))
    return int(np.random.SeedSequence(seed).generate_state(1)[0]) % (2**31 - 1)  # a third of a Generator's cost


async def preflight(spec, pools=None) -> None:
    """Ask the server of a parsed ``openai:`` spec for its models before a run; raises
    :class:`LLMError` when it is down, refuses the key or lacks the model."""
    pools = pools or current_pools()
    await openai_backend(pools, openai_options(pools, spec.params)).preflight()


class LLMAgent:
    """A seller or a buyer played by a language model behind a backend (anything with ``complete``)."""

    instant: ClassVar[bool] = False
    """A model takes time: the bus puts a deadline on every call."""
    role: ClassVar[str] = ""

    def __init__(self, backend, *, fmt: str = "json", reask: int = 0, seed: int | None = None, legal: bool = False,
                 prompt: str = "full", grounded: bool = False, adviser: Adviser | None = None):
        self.backend = backend
        """The model boundary: ``await backend.complete(messages, role=..., seed=...)`` -> Completion."""
        self.format = fmt
        self.prompt = prompt
        """``full``, ``compact``, ``facts`` or ``advice`` (the seller only: :func:`render_seller_compact`)."""
        if prompt in ("advice", "tools") and adviser is None:
            raise ValueError(f"prompt={prompt} needs an Adviser walking the episode (adviser=)")
        self.adviser = adviser
        """``prompt=advice``: the planner beside the seller, whose next message the prompt shows."""
        self.legal = legal
        """Decode each reply under :func:`legal_pattern` (the backend takes ``constraint=``)."""
        self.grounded = grounded
        """Decode each reply under :func:`grounded_pattern` instead: a reason with the prompt's facts as its thought."""
        self.reask = reask
        self._seed = seed
        self._calls = 0

    def describe(self) -> dict:
        out = {"kind": "llm", **self.backend.describe(), "format": self.format}
        if self.prompt != "full":
            out["prompt"] = self.prompt
        options = getattr(self.backend, "options", None)
        if options is not None:
            out["params"] = {k: getattr(options, k) for k in ("temperature", "top_p", "max_tokens", "timeout", "retries", "reask", "max_inflight", "logprobs", "think", "legal", "grounded")}
        return out

    def render(self, obs) -> list[dict]:
        if self.role != SELLER:
            return render_buyer(obs, self.format)
        return render_seller(obs, self.format, self.prompt, self.adviser.advise(obs) if self.adviser else None)

    async def act(self, obs) -> Generated:
        if self.adviser is None:
            return await self._act(obs)
        sent = None
        try:  # a timeout or a closing market cancels the call: the adviser still reads what this observation held
            generated = await self._act(obs)
            sent = generated.result if isinstance(generated.result, Message) else None
            return generated
        finally:
            self.adviser.follow(obs, sent)

    async def _act(self, obs) -> Generated:
        messages = self.render(obs)
        sender = SELLER if self.role == SELLER else obs.buyer
        constraint = grounded_pattern(obs) if self.grounded else legal_pattern(obs) if self.legal else None
        ask = {} if constraint is None else {"constraint": constraint}
        attempts: list[dict] = []
        waited = 0.0
        while True:
            seed = None if self._seed is None else (self._seed + self._calls) % (2**31 - 1)
            self._calls += 1
            completion: Completion = await self.backend.complete(messages, role=self.role, seed=seed, **ask)
            waited += completion.latency_s
            result, notes, reasoning = parse_reply(completion.text, self.role, sender)
            if isinstance(result, ParseFailure) and completion.finish_reason == "length":
                result = ParseFailure(f"the reply was cut off at max_tokens (finish_reason length): {result.reason}", result.raw)
            if isinstance(result, Message) or len(attempts) >= self.reask:
                break
            attempts.append({"raw": completion.text, "error": result.reason, "finish_reason": completion.finish_reason,
                             "latency_s": round(completion.latency_s, 6), "usage": completion.usage})
            messages = [*messages, {"role": "assistant", "content": completion.text},
                        {"role": "user", "content": _template("reask.md").substitute(reason=result.reason)}]
        extra = {"backend": self.backend.name, "format": self.format, "prompt": messages, **completion.trace(),
                 "reasks": len(attempts)}
        if seed is not None:
            extra["seed"] = seed
        if attempts:
            extra["attempts"] = attempts
            extra["latency_total_s"] = round(waited, 6)
        if notes:
            extra["clamped"] = notes
        if reasoning and "reasoning" not in extra:
            extra["reasoning"] = reasoning
        return Generated(result, completion.text, extra)


class LLMSeller(LLMAgent):
    """The seller, played by a model."""

    role = SELLER


class LLMBuyer(LLMAgent):
    """A buyer, played by a model; the regulator's buyer guard still judges every reply."""

    role = BUYER
