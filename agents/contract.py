"""The contract every model backend keeps: what a backend returns, what it raises, how a spec's keys are read.

A backend (``negotiate.agents.backends.BACKENDS`` names each: an OpenAI-compatible server, ``hf``, ``vllm``, a set
of replicas) turns chat messages into a :class:`Completion` with ``await backend.complete(messages, role=...,
seed=...)``; a failure that is not the model's fault raises :class:`LLMError`, a request past its deadline
:class:`LLMTimeout`. Every backend's spec keys are read by :func:`parse_query`, so ``format=``, ``temperature=`` and
the rest are checked one way whichever backend a spec names (the grammar: ``negotiate.agents.registry.GRAMMAR``).
This module imports no backend: each imports it.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qsl

__all__ = ["Backend", "Completion", "LLMError", "LLMTimeout", "FORMATS", "parse_query", "installed"]

FORMATS = ("json", "tagged")
"""How a model writes its message: a JSON object under the four-part schema, or tagged text (a spec's ``format=``,
a :class:`~negotiate.agents.policy.Policy`'s ``format``)."""


class LLMError(RuntimeError):
    """A failure that is not the model's fault: server down, bad key, unknown model, bad request."""

    def __init__(self, message: str, *, status: int | None = None, unreachable: bool = False):
        super().__init__(message)
        self.status = status
        """The HTTP status the server answered with (after the retries), where it answered; None otherwise."""
        self.unreachable = unreachable
        """The server is not there: it could not be reached, went away mid-answer (after the retries), or is taken
        for down (:data:`~negotiate.agents.openai_server.DOWN_AFTER` timeouts in a row). Of several replicas, this one is drained
        (``negotiate.agents.replicas``)."""


class LLMTimeout(TimeoutError):
    """No reply within the request timeout, retries included: the bus takes it as the agent's silence."""


@dataclass(frozen=True, slots=True)
class Completion:
    """One model reply and what the trace keeps of it."""

    text: str
    finish_reason: str | None
    """``stop``, ``length`` (cut off at max_tokens), ...; None if the server gave none."""
    model: str
    """The model name the server reported."""
    latency_s: float
    """Wall time of the request, retries included, queueing for a slot excluded."""
    retries: int = 0
    usage: dict | None = None
    token_ids: list[int] | None = None
    """Completion token ids (vLLM ``return_token_ids``)."""
    prompt_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    """Log-prob of each completion token."""
    reasoning: str | None = None
    """Reasoning text a server split off (vLLM ``reasoning_content``)."""
    clamped: tuple[str, ...] = ()
    """Repairs made to the answer before anyone read it (text past :data:`~negotiate.agents.openai_server.REPLY_MAX` cut), for ``extra.clamped``."""

    def trace(self) -> dict:
        """The fields worth keeping in a trace event's ``extra`` (absent ones left out)."""
        out: dict = {"model": self.model, "finish_reason": self.finish_reason, "latency_s": round(self.latency_s, 6), "retries": self.retries}
        for name in ("usage", "token_ids", "prompt_token_ids", "logprobs", "reasoning"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


class Backend(Protocol):
    """What an agent asks of a model backend (``negotiate.agents.llm.LLMAgent`` and the menu seller use no more)."""

    name: str
    """The backend's name in a spec and a trace (``openai``, ``hf``, ``vllm``)."""

    def describe(self) -> dict:
        """What the trace's header keeps of the backend: its name, model and settings."""
        ...

    async def complete(self, messages: list[dict], *, role: str, seed: int | None = None) -> Completion:
        """One reply to ``messages`` for ``role``; raises :class:`LLMError` or :class:`LLMTimeout`."""
        ...


def parse_query(query: str, numbers: dict, choices: dict, flags, *, what: str, fail, special=None, keys=None) -> dict:
    """Typed values of a spec's ``key=value`` pairs, each checked: numbers are (type, low, low
    allowed, high), choices a tuple of words, flags 0/1. ``special(key, value)`` may claim a key
    (return True; the raw value is kept) or refuse it by raising ``fail(...)``."""
    values: dict = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in values:
            raise fail(f"key {key!r} is given twice")
        if special is not None and special(key, value):
            values[key] = value
        elif key in choices:
            if value not in choices[key]:
                raise fail(f"{key}={value!r} is not one of {', '.join(choices[key])}")
            values[key] = value
        elif key in numbers:
            kind, low, inclusive, high = numbers[key]
            try:
                number = float(value)
            except ValueError:
                raise fail(f"{key}={value!r} is not a number") from None
            if not math.isfinite(number):
                raise fail(f"{key}={value!r} is not a finite number")
            if kind is int and number != int(number):
                raise fail(f"{key}={value!r} is not a whole number")
            if not ((number >= low) if inclusive else (number > low)) or number > high:
                raise fail(f"{key}={value} is outside {'[' if inclusive else '('}{low}, {high}]")
            values[key] = kind(number)
        elif key in flags:
            if value.lower() not in ("0", "1", "true", "false"):
                raise fail(f"{key}={value!r} is not 0 or 1")
            values[key] = value.lower() in ("1", "true")
        else:
            raise fail(f"unknown key {key!r}; {what} takes {', '.join(keys or (*choices, *numbers, *flags))}")
    return values


def installed(name: str) -> bool:
    """Whether the package ``name`` can be imported, without importing it (one a test stood in for counts)."""
    if name in sys.modules:  # imported already (or stood in for by a test)
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
