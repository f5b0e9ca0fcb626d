"""negotiate.agents.registry and .backends: the ``openai:`` agent spec, its errors, and the agents it builds."""

from __future__ import annotations

import pytest

from negotiate.agents.backends import OpenAIBackend, OpenAIOptions
from negotiate.agents.llm import LLMBuyer, LLMSeller
from negotiate.agents.registry import parse_agent
from negotiate.errors import UserError
from negotiate.market import Buyer, Market, MarketSpec, Product

MARKET = Market(MarketSpec(), 0, (Product("p1", "A", 100, 1),), (Buyer("b1", (400,)),), 4, 0, 1000)


def test_the_full_example_spec():
    text = "openai:Qwen/Qwen3-8B@http://127.0.0.1:8000/v1?format=json&server=vllm&temperature=0.7&max_tokens=256&timeout=60&reask=1"
    spec = parse_agent(text, "seller")
    assert (spec.backend, spec.name, spec.role, spec.text) == ("openai", "Qwen/Qwen3-8B", "seller", text)
    options = OpenAIOptions(**spec.params)
    assert options == OpenAIOptions(model="Qwen/Qwen3-8B", base_url="http://127.0.0.1:8000/v1", format="json", server="vllm",
                                    temperature=0.7, max_tokens=256, timeout=60.0, reask=1)


def test_defaults_and_every_key():
    options = OpenAIOptions(**parse_agent("openai:m@http://host:8000/v1/", "buyer").params)
    assert (options.base_url, options.format, options.server, options.retries, options.reask, options.logprobs) == (
        "http://host:8000/v1", "json", "auto", 2, 0, True)
    assert OpenAIOptions(**parse_agent("openai:gpt-4o-mini@https://api.openai.com/v1", "seller").params).server == "openai"
    text = ("openai:m@http://h/v1?format=tagged&server=llamacpp&temperature=0&top_p=0.9&max_tokens=64&timeout=1.5"
            "&retries=0&reask=3&max_inflight=8&logprobs=0&think=false&key_env=PATH")
    options = OpenAIOptions(**parse_agent(text, "seller").params)
    assert options == OpenAIOptions("m", "http://h/v1", "tagged", "llamacpp", 0.0, 0.9, 64, 1.5, 0, 3, 8, False, False, "PATH")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("openai:gpt-4o", "openai:MODEL@BASE_URL"),
        ("openai:@http://h/v1", "openai:MODEL@BASE_URL"),
        ("openai:m@ftp://h/v1", "not an http"),
        ("openai:m@http://user:pw@h/v1", "no credentials"),
        ("openai:m@http://h/v1?foo=1", "unknown key 'foo'"),
        ("openai:m@http://h/v1?temperature=hot", "temperature='hot' is not a number"),
        ("openai:m@http://h/v1?temperature=5", r"temperature=5 is outside \[0.0, 2.0\]"),
        ("openai:m@http://h/v1?max_tokens=1.5", "max_tokens='1.5' is not a whole number"),
        ("openai:m@http://h/v1?timeout=0", r"outside \(0.0"),
        ("openai:m@http://h/v1?timeout=inf", "not a finite number"),
        ("openai:m@http://h/v1?reask=-1", r"reask=-1 is outside \[0, 10\]"),
        ("openai:m@http://h/v1?format=xml", "format='xml' is not one of json, tagged"),
        ("openai:m@http://h/v1?server=tgi", "server='tgi' is not one of auto, vllm, openai, llamacpp, generic"),
        ("openai:m@http://h/v1?logprobs=maybe", "not 0 or 1"),
        ("openai:m@http://h/v1?format=json&format=tagged", "given twice"),
        ("openai:m@http://h/v1?key=sk-123", "never goes in a spec"),
        ("openai:m@http://h/v1?key_env=NEGOTIATE_SURELY_UNSET", "not set"),
        ("openai:m@http://h/v1?key_env=1BAD", "not an environment variable name"),
        # issue 51: what urllib cannot read was a 34-line traceback
        ("openai:m@http://[::1/v1", r"base URL 'http://\[::1/v1' is not a valid URL \(Invalid IPv6 URL\); write it like "
                                    r"http://127.0.0.1:8000/v1, an IPv6 address in brackets: http://\[::1\]:8000/v1"),
        ("openai:m@http://[zz]/v1", r"base URL 'http://\[zz\]/v1' is not a valid URL \('zz' does not appear to be an IPv4"),
        ("openai:m@http://h:99999/v1", r"base URL 'http://h:99999/v1' is not a valid URL \(Port out of range 0-65535\)"),
        ("openai:m@http://h:port/v1", r"base URL 'http://h:port/v1' is not a valid URL \(Port could not be cast"),
        ("openai:m@http://:8000/v1", "base URL 'http://:8000/v1' is not an http"),
    ],
)
@pytest.mark.parametrize("role", ["seller", "buyer"])
def test_bad_specs_name_the_flag_the_value_and_the_problem(text, match, role):
    with pytest.raises(UserError, match=match) as caught:
        parse_agent(text, role)
    assert ("--seller" if role == "seller" else "--buyers") in str(caught.value)
    assert repr(text) in str(caught.value)


def test_scripted_specs_are_unchanged():
    assert parse_agent("greedy", "seller").backend == "scripted"
    assert parse_agent("scripted:concession?beta=2", "seller").params == {"beta": 2}
    with pytest.raises(UserError, match="unknown agent backend 'nope'"):
        parse_agent("nope:x", "seller")


def test_build_makes_llm_agents_that_describe_themselves_without_the_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    spec = parse_agent("openai:m@http://127.0.0.1:9/v1?format=tagged&server=generic", "seller")
    seller = spec.build(MARKET, [0, 2])
    assert isinstance(seller, LLMSeller) and seller.instant is False
    description = seller.describe()
    assert {k: description[k] for k in ("kind", "backend", "model", "base_url", "format", "server")} == {
        "kind": "llm", "backend": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", "format": "tagged", "server": "generic"}
    assert "sk-very-secret" not in repr(description)
    buyer = parse_agent("openai:m@http://127.0.0.1:9/v1", "buyer").build(MARKET, [0, 1, 0])
    assert isinstance(buyer, LLMBuyer) and buyer.format == "json"
    # One backend object per spec: building an agent per episode costs almost nothing.
    assert parse_agent("openai:m@http://127.0.0.1:9/v1", "buyer").build(MARKET, [1, 1, 0]).backend is buyer.backend
    assert isinstance(buyer.backend, OpenAIBackend)


@pytest.mark.parametrize("module", ["negotiate.agents.llm", "negotiate.agents.backends", "negotiate.agents.contract",
                                    "negotiate.agents.openai_server", "negotiate.agents.clients", "negotiate.agents.hf",
                                    "negotiate.agents.vllm_engine", "negotiate.agents.devices", "negotiate.agents.local"])
def test_module_all_names_exist(module):
    import importlib

    mod = importlib.import_module(module)
    assert [name for name in mod.__all__ if not hasattr(mod, name)] == []


def test_legal_and_the_compact_prompt_are_read_from_a_sellers_spec():
    options = OpenAIOptions(**parse_agent("openai:m@http://h/v1?format=tagged&legal=1", "seller").params)
    assert options.legal is True and OpenAIOptions(**parse_agent("openai:m@http://h/v1", "seller").params).legal is False
    assert OpenAIOptions(**parse_agent("openai:m@http://h/v1?format=tagged&prompt=compact", "seller").params).prompt == "compact"
    assert OpenAIOptions(**parse_agent("openai:m@http://h/v1", "seller").params).prompt == "full"
    grounded = parse_agent("openai:m@http://h/v1?format=tagged&prompt=facts&legal=1&grounded=1", "seller")
    assert OpenAIOptions(**grounded.params).grounded is True


@pytest.mark.parametrize("text, role, match", [
    ("openai:m@http://h/v1?format=tagged&legal=1", "buyer", "legal=1 constrains the seller's replies"),
    ("openai:m@http://h/v1?legal=1", "seller", "legal=1 constrains the tagged form; add format=tagged"),
    ("openai:m@http://h/v1?format=tagged&server=llamacpp&legal=1", "seller", "legal=1 needs a vLLM server.*server=llamacpp"),
    ("openai:m@http://h/v1?format=tagged&prompt=compact", "buyer", "prompt=compact is a seller's prompt"),
    ("openai:m@http://h/v1?prompt=compact", "seller", "prompt=compact asks for tagged replies; add format=tagged"),
    ("openai:m@http://h/v1?format=tagged&prompt=short", "seller", "prompt='short' is not one of full, compact"),
    ("openai:m@http://h/v1?format=tagged&prompt=facts&grounded=1", "seller", "grounded=1 binds .* add legal=1&prompt=facts"),
    ("openai:m@http://h/v1?format=tagged&prompt=compact&legal=1&grounded=1", "seller", "grounded=1 binds"),
    ("vllm:/m?format=tagged&prompt=facts&legal=1&grounded=1", "seller", "grounded"),
])
def test_seller_only_keys_are_refused_in_one_line_naming_the_spec(text, role, match):
    with pytest.raises(UserError, match=match) as caught:
        parse_agent(text, role)
    assert repr(text) in str(caught.value)


def test_the_grammar_is_written_once_and_names_every_key_and_value():
    # registry.GRAMMAR is the one description (negotiate agents prints it): every backend's keys, every server kind
    # (auto included) and every prompt view are in it, each line fits 100 columns, and the backends point to it.
    import importlib
    import re

    from negotiate.agents.backends import BACKENDS, SERVERS
    from negotiate.agents.hf import HF_KEYS
    from negotiate.agents.openai_server import OPENAI_KEYS
    from negotiate.agents.registry import GRAMMAR
    from negotiate.agents.views import PROMPTS
    from negotiate.agents.vllm_engine import VLLM_KEYS

    words = set(re.findall(r"[\w.]+", GRAMMAR))
    assert [key for key in (*OPENAI_KEYS, *HF_KEYS, *VLLM_KEYS, *SERVERS, *PROMPTS) if key not in words] == []
    assert "auto" in SERVERS and all(f"{name}:" in GRAMMAR for name in BACKENDS)
    assert max(len(line) for line in GRAMMAR.splitlines()) <= 100
    for module in ("openai_server", "hf", "vllm_engine", "backends", "contract"):
        assert "negotiate.agents.registry.GRAMMAR" in importlib.import_module(f"negotiate.agents.{module}").__doc__, module


def test_the_table_chooses_each_backend_from_the_parsed_spec():
    from negotiate.agents.backends import BACKENDS, backend_of, options_of
    from negotiate.agents.replicas import ReplicaBackend

    assert set(BACKENDS) == {"openai", "hf", "vllm"}
    single = parse_agent("openai:m@http://127.0.0.1:9/v1", "buyer")
    assert isinstance(backend_of(single), OpenAIBackend) and backend_of(single) is backend_of(single)
    assert options_of(single) == OpenAIOptions(**single.params)
    several = parse_agent("openai:m@http://127.0.0.1:9/v1|http://127.0.0.1:10/v1", "buyer")
    assert isinstance(backend_of(several), ReplicaBackend)
