"""Agent specs: the strings that name an agent on the command line and in config files.

Grammar::

    [scripted:]NAME[?KEY=VALUE[&KEY=VALUE...]]

``greedy``, ``scripted:concession?beta=2`` and ``stubborn?share=0.8`` are scripted
agents. Model-backed backends (``openai:``, ``hf:``, ``vllm:``) plug in here too.
A spec is parsed once, up front (a bad name is a clear error before anything runs),
then :meth:`AgentSpec.build` makes a fresh agent per episode with its own seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

import numpy as np

from negotiate.errors import UserError
from negotiate.market import Market

from negotiate.agents.scripted import BUYERS, SELLERS

__all__ = ["AgentSpec", "parse_agent"]


_PARAMS = {
    ("seller", "concession"): {"beta": (0.0, False, 100.0)},
    ("buyer", "concession"): {"start": (0.0, False, 1.0), "patience": (1, True, 1000)},
    ("buyer", "stubborn"): {"share": (0.0, False, 1.0)},
}
"""Numeric parameters each scripted agent accepts: name -> (low, low allowed, high)."""


@dataclass(frozen=True)
class AgentSpec:
    """A parsed agent spec for one role."""

    text: str
    """The spec as the user wrote it."""
    role: str
    """``seller`` or ``buyer``."""
    backend: str
    """``scripted`` (model backends plug in beside it)."""
    name: str
    params: dict = field(default_factory=dict)

    def build(self, market: Market, seed: np.random.Generator | Sequence[int] | int):
        """A fresh agent for one episode. ``seed`` is a numpy Generator or what seeds one;
        agents that draw random numbers make their Generator from it, the rest skip the cost."""
        table = SELLERS if self.role == "seller" else BUYERS
        return table[self.name].create(self.text, self.params, market=market, seed=seed)

    @property
    def label(self) -> str:
        return self.text


def parse_agent(text: str, role: str, *, field_name: str | None = None) -> AgentSpec:
    """Parse ``text`` as an agent for ``role``; raise a :class:`UserError` naming the problem."""
    field_name = field_name or ("--seller" if role == "seller" else "--buyers")
    raw = text.strip()
    backend, _, rest = raw.partition(":") if ":" in raw else ("scripted", "", raw)
    if backend != "scripted":
        raise UserError(
            f"unknown agent backend {backend!r}; this build knows scripted agents ({', '.join(SELLERS if role == 'seller' else BUYERS)})",
            field=field_name, value=text,
        )
    name, _, query = rest.partition("?")
    table = SELLERS if role == "seller" else BUYERS
    if name not in table:
        raise UserError(f"unknown {role} agent {name!r}; choose from {', '.join(table)}", field=field_name, value=text)
    params: dict = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        try:
            params[key] = float(value) if "." in value or "e" in value.lower() else int(value)
        except ValueError:
            raise UserError(f"parameter {key}={value!r} is not a number", field=field_name, value=text) from None
    allowed = _PARAMS.get((role, name), set())
    unknown = set(params) - set(allowed)
    if unknown:
        hint = f"; it takes {', '.join(sorted(allowed))}" if allowed else "; it takes none"
        raise UserError(f"unknown parameter {sorted(unknown)[0]!r} for {name}{hint}", field=field_name, value=text)
    for key, value in params.items():
        low, inclusive, high = allowed[key]
        if not ((value >= low) if inclusive else (value > low)) or value > high:
            bound = "[" if inclusive else "("
            raise UserError(f"parameter {key}={value} is outside {bound}{low}, {high}]", field=field_name, value=text)
    return AgentSpec(text=raw, role=role, backend="scripted", name=name, params=params)
