"""The seller policy (``negotiate.agents.policy``): one typed value, parsed once, checked once, passed by value."""

from __future__ import annotations

import re

import pytest

from negotiate.agents.policy import Policy
from negotiate.agents.registry import parse_agent
from negotiate.errors import UserError

URL = "openai:m@http://127.0.0.1:9/v1"


def test_a_spec_parses_into_its_policy_and_the_policy_writes_the_same_keys_back():
    spec = parse_agent(f"{URL}?format=tagged&prompt=advice&legal=1&grounded=1&temperature=1.5&max_tokens=48&reask=1", "seller")
    from negotiate.agents.backends import OpenAIOptions

    policy = Policy.of(OpenAIOptions(**spec.params))
    assert policy == Policy(prompt="advice", format="tagged", legal=True, grounded=True, temperature=1.5, max_tokens=48, reask=1)
    assert policy.tools == ("planner?reasons=1",) and policy.view.name == "advice"
    # the loop appends query() to its server's spec: parsed again, the same policy
    again = parse_agent(f"{URL}?{policy.query()}", "seller")
    assert Policy.of(OpenAIOptions(**again.params)) == policy
    assert Policy().query() == "format=json&temperature=0.7&max_tokens=96"  # the sampling always written, the rest's defaults not


def test_an_agent_built_from_a_spec_holds_its_policy_and_its_views_advisers():
    from pathlib import Path

    from negotiate.market import generate, load_spec

    market = generate(load_spec(Path(__file__).resolve().parent.parent / "specs" / "compact.toml"), 1)
    seller = parse_agent(f"{URL}?format=tagged&prompt=tools&temperature=0", "seller").build(market, 3)
    assert seller.policy == Policy(prompt="tools", format="tagged", temperature=0.0, max_tokens=512)
    assert [type(a).__name__ for a in seller.adviser.agents] == ["PlannerSeller", "GreedySeller"]  # the view's two tools
    plain = parse_agent(f"{URL}?format=tagged&prompt=facts", "seller").build(market, 3)
    assert plain.adviser is None and plain.view.name == "facts"


@pytest.mark.parametrize("values, field, message", [
    ({"prompt": "terse"}, "--prompt", "choose from full, compact, facts, advice, tools"),
    ({"format": "yaml"}, "--format", "choose from json, tagged"),
    ({"temperature": 2.5}, "--temperature", "must be from 0 to 2"),
    ({"max_tokens": 0}, "--max-tokens", "must be at least 1"),
    ({"prompt": "facts", "format": "json"}, "--format", "prompt=facts asks for tagged replies; add format=tagged"),
    ({"prompt": "facts", "format": "tagged", "grounded": True}, "--grounded",
     "grounded=1 binds the thought to the facts prompt under legal=1; add legal=1&prompt=facts (or prompt=advice)"),
    ({"legal": True}, "--legal", "legal=1 constrains the tagged form; add format=tagged"),
])
def test_bad_settings_are_one_line_naming_the_flag(values, field, message):
    with pytest.raises(UserError, match=re.escape(message)) as caught:
        Policy.from_mapping(values)
    assert caught.value.field == field


def test_in_a_config_file_the_error_names_the_file_and_the_key():
    with pytest.raises(UserError) as caught:
        Policy.from_mapping({"prompt": "tools", "format": "tagged", "legal": True, "grounded": True, "rounds": 3}, source="run.toml")
    assert caught.value.field == "grounded" and caught.value.source == "run.toml"  # other keys of the config are not the policy's
    assert Policy.from_mapping({"prompt": "facts", "format": "tagged", "rounds": 3}) == Policy(prompt="facts", format="tagged")
