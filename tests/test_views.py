"""Prompt views (``negotiate.agents.views``): one class per prompt mode, and serving and training render alike.

The trainer renders a scripted or a logged episode's states through the same view the served model saw; here a
model plays a whole episode through a fake server in every view, its trace keeps each prompt it was sent, and the
training data rendered again from that trace, with the logged prompts taken out, must be the same prompts, message
for message. The views declare what they need (their tools, tagged replies, grounding) and the spec checks read
those declarations.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

pytest.importorskip("aiohttp")  # the fake OpenAI server

from fake_openai import FakeOpenAI  # noqa: E402

from negotiate.agents.registry import parse_agent  # noqa: E402
from negotiate.agents.views import PROMPTS, VIEWS, View, render_seller, view  # noqa: E402
from negotiate.agents.views.base import View as BaseView  # noqa: E402
from negotiate.episode import run_episode  # noqa: E402
from negotiate.errors import UserError  # noqa: E402
from negotiate.market import generate, load_spec  # noqa: E402
from negotiate.regulator import EpisodeState, observe  # noqa: E402
from negotiate.run import seller_seed  # noqa: E402
from negotiate.training.dataset import decisions  # noqa: E402

SPECS = Path(__file__).resolve().parent.parent / "specs"
_FREE = re.compile(r"(?:Free|Write your next message to one of): (b\d+)")
_COST = re.compile(r"\b(p\d+)[^\n$]*cost \$(\d+)")


def offer_above_cost(body: dict) -> str:
    """A model that offers the first product 50 above its cost to the first free buyer, in the tagged form; ends
    when nobody is free. It reads only the prompt, in any view."""
    user = body["messages"][1]["content"]
    free, cost = _FREE.search(user), _COST.search(user)
    if free is None or cost is None:
        return "Thought: done\nTo: \nTalk: Bye.\nAction: [END]"
    product, price = cost.group(1), int(cost.group(2)) + 50
    return f"Thought: try\nTo: {free.group(1)}\nTalk: For you.\nAction: [OFFER] {product} ${price}"


def test_the_table_names_every_view_once_and_each_declares_what_it_needs():
    assert PROMPTS == tuple(VIEWS) == ("full", "compact", "facts", "advice", "tools", "menu")
    assert all(isinstance(v, BaseView) and v.name == name and view(name) is v for name, v in VIEWS.items())
    assert View is BaseView
    # only the full prompt describes the JSON form; the advisers are declared, as the prompts show them
    assert [name for name, v in VIEWS.items() if not v.tagged] == ["full", "menu"]  # the menu's reply is a letter
    assert {name: v.tools for name, v in VIEWS.items() if v.tools} == {"advice": ("planner?reasons=1",),
                                                                      "tools": ("planner?reasons=1", "greedy"),
                                                                      "menu": ("planner?reasons=1", "greedy")}
    assert [name for name, v in VIEWS.items() if v.chooses] == ["menu"]
    assert [name for name, v in VIEWS.items() if v.grounds] == ["facts", "advice"]
    for v in VIEWS.values():  # every tool is a scripted seller the registry builds
        assert all(parse_agent(tool, "seller").backend == "scripted" for tool in v.tools)


def test_the_spec_checks_read_the_views_declarations():
    url = "openai:m@http://127.0.0.1:9/v1"
    with pytest.raises(UserError, match="prompt=facts asks for tagged replies; add format=tagged"):
        parse_agent(f"{url}?prompt=facts", "seller")
    with pytest.raises(UserError, match="prompt=compact is a seller's prompt"):
        parse_agent(f"{url}?prompt=compact&format=tagged", "buyer")
    with pytest.raises(UserError, match="grounded=1 binds the thought"):  # tools shows two moves: no facts-only reason
        parse_agent(f"{url}?prompt=tools&format=tagged&legal=1&grounded=1", "seller")
    assert parse_agent(f"{url}?prompt=advice&format=tagged&legal=1&grounded=1", "seller").params["grounded"] is True


def test_compact_views_differ_only_in_the_lines_they_add():
    market = generate(load_spec(SPECS / "compact.toml"), 3)
    obs = observe(EpisodeState(market), "seller")
    compact, facts = (render_seller(obs, "tagged", name)[1]["content"] for name in ("compact", "facts"))
    added = [line for line in facts.splitlines() if line not in compact.splitlines()]
    assert added and added[0].endswith(" each.") and "turns for" in added[0]  # the turns line, then each buyer's facts
    assert render_seller(obs, "tagged", "compact")[0] == render_seller(obs, "tagged", "facts")[0]  # one system prompt


@pytest.mark.parametrize("name", PROMPTS)
async def test_training_renders_the_prompt_the_served_model_saw_in_every_view(name):
    market = generate(load_spec(SPECS / "compact.toml"), 11)
    buyers = {b.id: parse_agent("concession", "buyer").build(market, [market.seed, k]) for k, b in enumerate(market.buyers)}
    async with FakeOpenAI(offer_above_cost) as server:
        seller = parse_agent(f"openai:{server.model}@{server.url}?format=tagged&prompt={name}&retries=1&timeout=5",
                             "seller").build(market, seller_seed(market.seed))
        with anyio.fail_after(60):
            played = await run_episode(market, seller, buyers, fresh=True, seller_timeout=10, reply_timeout=10)
    served = [d.prompt for d in decisions(played.events, 0.0, "g", fmt="tagged", prompt=name)]  # the logged prompts
    assert len(served) >= 3 and all(p[0]["role"] == "system" for p in served)
    # The same trace without its logged prompts: the data is rendered again through the view, with its advisers.
    bare = [{**e, "extra": {k: v for k, v in e["extra"].items() if k != "prompt"}} if e.get("extra") else e for e in played.events]
    assert not any("prompt" in (e.get("extra") or {}) for e in bare)
    rendered = [d.prompt for d in decisions(bare, 0.0, "g", fmt="tagged", prompt=name)]
    assert rendered == served
