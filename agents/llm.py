"""LLM agents: prompts rendered from an observation, a backend call, the reply parsed at the edge.

:class:`LLMSeller` and :class:`LLMBuyer` render their prompt from the observation
alone (the seller through its prompt view, ``negotiate.agents.views``; the buyer with :func:`render_buyer`; the
text lives in data files under ``agents/prompts/``), ask their backend (``negotiate.agents.contract``; the table of
backends is ``negotiate.agents.backends``) for a completion, and turn the model's text into a message with :func:`parse_reply`,
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

import re
from typing import ClassVar

import numpy as np

from negotiate.protocol import BUYER, SELLER, Generated, Message, ParseFailure, parse_lenient
from negotiate.regulator import ACTIVE, SellerObservation

from negotiate.agents.backends import backend_of  # one server's backend, or its replicas' (URL|URL)
from negotiate.agents.contract import Completion
from negotiate.agents.moves import Adviser, units_left
from negotiate.agents.planner import bid_in_play, turn_facts
from negotiate.agents.policy import Policy
from negotiate.agents.views import ADVISER, TOOLS, advice_line, render_buyer, render_seller, render_seller_compact, tool_lines
from negotiate.agents.views.compact import _buyer_facts
from negotiate.agents.views.text import PERSONAS, PromptTemplate, _template

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
    await backend_of(spec, pools).preflight()


class LLMAgent:
    """A seller or a buyer played by a language model behind a backend (anything with ``complete``)."""

    instant: ClassVar[bool] = False
    """A model takes time: the bus puts a deadline on every call."""
    role: ClassVar[str] = ""

    def __init__(self, backend, policy: Policy | None = None, *, seed: int | None = None, adviser: Adviser | None = None):
        self.backend = backend
        """The model boundary: ``await backend.complete(messages, role=..., seed=...)`` -> Completion."""
        self.policy = policy or Policy()
        """What the model is shown and how its reply is decoded (``negotiate.agents.policy``)."""
        self.view = self.policy.view
        """The prompt view (``negotiate.agents.views``): what the model is shown."""
        if self.view.tools and adviser is None:
            raise ValueError(f"prompt={self.policy.prompt} needs an Adviser walking the episode (adviser=)")
        self.adviser = adviser
        """The view's tools (``advice``: the planner) beside the seller, whose next messages the prompt shows."""
        self._seed = seed
        self._calls = 0

    @property
    def format(self) -> str:
        return self.policy.format

    @property
    def prompt(self) -> str:
        return self.policy.prompt

    @property
    def legal(self) -> bool:
        """Decode each reply under :func:`legal_pattern` (the backend takes ``constraint=``)."""
        return self.policy.legal

    @property
    def grounded(self) -> bool:
        """Decode each reply under :func:`grounded_pattern` instead: a reason with the prompt's facts as its thought."""
        return self.policy.grounded

    @property
    def reask(self) -> int:
        return self.policy.reask

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
        return self.view.render(obs, self.format, self.adviser.advise(obs) if self.adviser else None)

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
            result, notes, reasoning = (self.view.read(completion.text, sender) if self.role == SELLER
                                        else parse_reply(completion.text, self.role, sender))
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
        if completion.clamped:  # the backend's repairs (a reply past its length cut) come first
            notes = [*completion.clamped, *notes]
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
