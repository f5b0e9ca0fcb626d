"""Model backends: the one boundary between an agent and whatever serves its model, and the table that picks one.

Every backend keeps one contract (:mod:`negotiate.agents.contract`): ``await backend.complete(messages, role=...,
seed=...)`` -> :class:`~negotiate.agents.contract.Completion`; a failure that is not the model's fault raises
:class:`~negotiate.agents.contract.LLMError`. Each backend is one module:

``openai``  an OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, OpenAI): :mod:`negotiate.agents.openai_server`,
            its HTTP clients in :mod:`negotiate.agents.clients`; several servers of one model (``URL|URL``):
            :mod:`negotiate.agents.replicas`
``hf``      a transformers model in this process: :mod:`negotiate.agents.hf`
``vllm``    vLLM's engine in this process: :mod:`negotiate.agents.vllm_engine`

:data:`BACKENDS` is the one place a spec's backend is looked up: how its spec is parsed, how its options are had
again from a parsed spec, and how its one backend in a run is made. The spec grammar is described once, in
``negotiate.agents.registry.GRAMMAR``.

The names other modules imported from here before the backends had modules of their own (``Completion``,
``LLMError``, ``OpenAIBackend``, ``aclose_clients``, ...) are still importable from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from negotiate.agents.clients import aclose_clients, set_max_inflight, shared_clients
from negotiate.agents.contract import FORMATS, Completion, LLMError, LLMTimeout, parse_query
from negotiate.agents.hf import HFBackend, HFOptions, hf_backend, parse_hf_spec
from negotiate.agents.openai_server import (CLIENTS, DOWN_AFTER, OPENAI_KEYS, REPLY_MAX, SERVER_BY_OWNER, SERVERS,
                                            OpenAIBackend, OpenAIOptions, openai_options, parse_openai_spec)
from negotiate.agents.pools import current_pools
from negotiate.agents.replicas import openai_backend  # one server's backend, or its replicas' (URL|URL)
from negotiate.agents.views import PROMPTS
from negotiate.agents.vllm_engine import VLLMBackend, VLLMOptions, parse_vllm_spec, vllm_backend

__all__ = [
    "Kind",
    "BACKENDS",
    "options_of",
    "backend_of",
    "preload",
    "openai_options",
    "Completion",
    "LLMError",
    "LLMTimeout",
    "parse_query",
    "FORMATS",
    "OpenAIOptions",
    "OpenAIBackend",
    "HFBackend",
    "VLLMBackend",
    "parse_openai_spec",
    "CLIENTS",
    "SERVERS",
    "SERVER_BY_OWNER",
    "OPENAI_KEYS",
    "DOWN_AFTER",
    "REPLY_MAX",
    "PROMPTS",
    "aclose_clients",
    "set_max_inflight",
    "shared_clients",
]

log = structlog.get_logger("negotiate.llm")


@dataclass(frozen=True)
class Kind:
    """One kind of model backend, as an agent spec names it (``openai:``, ``hf:``, ``vllm:``)."""

    parse: Callable
    """Reads what follows ``NAME:`` in a spec, ``parse(rest, field=FLAG, text=SPEC)``, into its options; a
    :class:`~negotiate.errors.UserError` naming the flag where it cannot."""
    options: type
    """The options' class: ``options(**spec.params)`` is a parsed spec's options again."""
    backend: Callable
    """``backend(pools, options)``: the one backend of these options in a run's pools (made on first use)."""
    loop_bound: bool = False
    """Its backend serves only the event loop that first used it (vLLM's engine): it is not checked ahead on a loop
    of its own (``negotiate play``)."""
    local: bool = False
    """Its model loads in this process (transformers, vLLM's engine): :func:`preload` loads it before a run's first
    episode, and a run refuses it where every worker process or Ray task would load a copy
    (``negotiate.workers.check_workers``). A backend that is not local is a server, asked for its models first."""


BACKENDS: dict[str, Kind] = {
    "openai": Kind(parse_openai_spec, OpenAIOptions, openai_backend),
    "hf": Kind(parse_hf_spec, HFOptions, hf_backend, local=True),
    "vllm": Kind(parse_vllm_spec, VLLMOptions, vllm_backend, loop_bound=True, local=True),
}
"""Every model backend by the name a spec gives it: the one table that chooses a backend."""


def options_of(spec, pools=None):
    """The options of a parsed model spec (``spec.backend`` in :data:`BACKENDS`), made once per distinct spec in
    ``pools``' run (by default the current context's)."""
    pools = pools or current_pools()
    params = spec.params
    return pools.memo((f"{spec.backend}-options", *params.items()), lambda: BACKENDS[spec.backend].options(**params))


def backend_of(spec, pools=None):
    """The one backend of a parsed model spec in ``pools``' run (by default the current context's)."""
    pools = pools or current_pools()
    return BACKENDS[spec.backend].backend(pools, options_of(spec, pools))


async def preload(spec, pools=None) -> None:
    """Ready the backend of a parsed model spec before any episode's clock runs: a local model (``hf:``, ``vllm:``;
    :attr:`Kind.local`) is loaded now (a load takes seconds to minutes), a server (``openai:``) is asked for its
    models (down, a bad key, a wrong model name; ``server=auto`` learns its kind). Raises :class:`LLMError` where it
    cannot."""
    backend = backend_of(spec, pools)
    if not BACKENDS[spec.backend].local:
        await backend.preflight()
        return
    log.info("loading model", spec=spec.text)
    await backend.warm()
