"""``prompt=advice``: the facts prompt with the message the planner would send there.

The planner walks the LLM seller's episode beside it (:class:`~negotiate.agents.llm.Adviser`), as a
teacher walks a trace; the trainer renders the same line for a scripted seller's episode. A model
that copies the advice plays the planner's game: checked here with a fake server that copies it.
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

pytest.importorskip("aiohttp")  # the fake OpenAI server

from fake_openai import FakeOpenAI  # noqa: E402

from negotiate.agents.backends import aclose_clients  # noqa: E402
from negotiate.agents.llm import ADVISER, TOOLS, LLMSeller, advice_line, render_seller, tool_lines  # noqa: E402
from negotiate.agents.policy import Policy  # noqa: E402
from negotiate.agents.registry import adviser as make_adviser, parse_agent  # noqa: E402
from negotiate.episode import run_episode  # noqa: E402
from negotiate.errors import UserError  # noqa: E402
from negotiate.market import SPLITS, generate, load_spec  # noqa: E402
from negotiate.protocol import SELLER, Action, Message  # noqa: E402
from negotiate.regulator import EpisodeState, observe  # noqa: E402
from negotiate.run import seller_seed  # noqa: E402
from negotiate.training.dataset import decisions, teacher_decisions  # noqa: E402

SPECS = Path(__file__).resolve().parent.parent / "specs"
_ADVICE = re.compile(r"^Advice: (?:to (b\d+), )?(\[[A-Z]+\][^(\n]*?)(?: \((.+)\))?$", re.M)


def copy_the_advice(body: dict) -> str:
    """A model that writes, in the tagged form, the message its prompt's advice names."""
    found = _ADVICE.search(body["messages"][1]["content"])
    assert found and found.group(2) != "wait for a reply", body["messages"][1]["content"]
    to, action, verdict = found.groups()
    return f"Thought: {verdict or ''}\nTo: {to or ''}\nTalk: As advised.\nAction: {action.strip()}"


def deals(events) -> list[tuple]:
    return [(e["buyer"], e["product"], e["price"]) for e in events if e["type"] == "deal"]


def conceding(market):
    spec = parse_agent("concession", "buyer")
    return {b.id: spec.build(market, [market.seed, k]) for k, b in enumerate(market.buyers)}


async def plays_as(copy, prompt: str, seller: str, split: str, first_seed: int) -> None:
    """A fake model that answers each ``prompt`` by ``copy`` makes, on six markets, the deals ``seller`` makes."""
    spec = load_spec(SPECS / f"{split}.toml")
    async with FakeOpenAI(copy) as server:
        try:
            checked = 0
            for seed in range(6):
                market = generate(spec, first_seed + seed)
                tool = parse_agent(seller, "seller").build(market, seller_seed(market.seed))
                model = parse_agent(f"openai:{server.model}@{server.url}?format=tagged&prompt={prompt}&retries=1&timeout=5",
                                    "seller").build(market, seller_seed(market.seed))
                assert isinstance(model, LLMSeller) and len(model.adviser.agents) == (2 if prompt == "tools" else 1)
                with anyio.fail_after(30):
                    theirs = await run_episode(market, tool, conceding(market), fresh=True)
                    ours = await run_episode(market, model, conceding(market), fresh=True, seller_timeout=10, reply_timeout=10)
                assert deals(ours.events) == deals(theirs.events)
                assert ours.metrics["profit"] == theirs.metrics["profit"] and ours.metrics["valid_rate"] == 1.0
                checked += bool(deals(theirs.events))
            assert checked >= 3  # most of these markets end in deals: the equality is not of two empty lists
        finally:
            await aclose_clients()


@pytest.mark.parametrize("split", ["compact", "compact-shapes"])
async def test_a_seller_that_copies_the_advice_makes_the_planners_deals(split):
    await plays_as(copy_the_advice, "advice", ADVISER, split, 9000)


def test_the_advice_line_names_the_planners_message_and_its_verdict():
    offer = Message(SELLER, "b2", "", Action("offer", "p1", 450), "b2 bids $380, $410 (rising, covers cost); 9 turns for 3 buyers: hold out")
    assert advice_line(offer) == "Advice: to b2, [OFFER] p1 $450 (hold out)"
    take = Message(SELLER, "b1", "", Action("accept", "p2", 321), "b1 bids $321 (first bid, covers cost); 3 turns for 2 buyers: take it")
    assert advice_line(take) == "Advice: to b1, [ACCEPT] p2 $321 (take it)"
    assert advice_line(Message(SELLER, "b1", "", Action("offer", "p1", 700))) == "Advice: to b1, [OFFER] p1 $700"  # no reason given
    assert advice_line(None) == "Advice: wait for a reply"


def test_the_advice_follows_the_turns_line_of_the_facts_prompt():
    market = generate(SPLITS["train"], 5)
    obs = observe(EpisodeState(market), SELLER)
    adviser = make_adviser(market, seller_seed(market.seed))
    advice = adviser.advise(obs)
    facts = render_seller(obs, "tagged", "facts")[1]["content"].splitlines()
    advised = render_seller(obs, "tagged", "advice", advice)[1]["content"].splitlines()
    turns = next(k for k, line in enumerate(facts) if " each." in line)
    assert advised == facts[:turns + 1] + [advice_line(advice)] + facts[turns + 1:]
    assert advice is not None and advice.action.kind == "offer" and advised[turns + 1].startswith(f"Advice: to {advice.to}, [OFFER] ")
    # Advising leaves no trace: the adviser is asked again on the same observation and says the same.
    assert adviser.advise(obs) == advice


def test_an_advice_prompt_needs_an_adviser():
    with pytest.raises(ValueError, match="adviser"):
        LLMSeller(object(), Policy(prompt="advice", format="tagged"))


def test_the_advice_prompt_asks_for_tagged_replies_and_is_the_sellers():
    with pytest.raises(UserError, match="format=tagged"):
        parse_agent("openai:m@http://127.0.0.1:1/v1?prompt=advice", "seller")
    with pytest.raises(UserError, match="seller's prompt"):
        parse_agent("openai:m@http://127.0.0.1:1/v1?format=tagged&prompt=advice", "buyer")
    # grounded decoding binds the thought to the facts, which the advice prompt has too
    parse_agent("openai:m@http://127.0.0.1:1/v1?format=tagged&prompt=advice&legal=1&grounded=1", "seller")


async def test_sft_data_from_a_scripted_episode_shows_the_planners_advice(tmp_path):
    """A scripted seller's episode is rendered with the advice the planner would have given in each state:
    for the planner's own episode that is its own message, for greedy's the planner's other choice."""
    market = generate(load_spec(SPECS / "compact.toml"), 77)
    for seller, same in ((ADVISER, True), ("greedy", False)):
        agent = parse_agent(seller, "seller").build(market, seller_seed(market.seed))
        ep = await run_episode(market, agent, conceding(market), fresh=True)
        made = decisions(ep.events, 0.0, "g", prompt="advice")
        assert made
        copied = 0
        for decision in made:
            (line,) = [x for x in decision.prompt[1]["content"].splitlines() if x.startswith("Advice: ")]
            action = decision.completion.rsplit("Action: ", 1)[1]
            copied += action in line
        assert (copied == len(made)) if same else (copied < len(made))
        # dagger labels on the same episode carry the same prompts: the advice of the state, whatever the label
        labelled = teacher_decisions(ep.events, "greedy", 0.0, "g", prompt="advice")
        assert labelled and all(d.prompt == next(m.prompt for m in made if m.turn == d.turn) for d in labelled)


async def test_the_adviser_takes_only_the_messages_the_regulator_accepted():
    """A model that, every other time, offers the advised buyer a product at $1, under its cost (refused), and
    else copies the advice. The advice its prompts showed is the advice the trainer renders for the same
    episode, whose teacher walk takes only accepted messages: had the adviser taken the refused offers, it
    would count offers nobody received (the planner's ``sent``, which times its ask above a rising bid)."""
    from negotiate.episode import EpisodeRecord
    from negotiate.training.dataset import _teacher_walk

    calls = []

    def refuse_sometimes(body: dict) -> str:
        calls.append(body)
        found = _ADVICE.search(body["messages"][1]["content"])
        if len(calls) % 2 == 1 and found and found.group(1):
            return f"To: {found.group(1)}\nTalk: A bargain.\nAction: [OFFER] p1 $1"
        return copy_the_advice(body)

    spec = load_spec(SPECS / "compact.toml")
    async with FakeOpenAI(refuse_sometimes) as server:
        try:
            refused = 0
            for seed in (9114, 9116, 9119, 9129):  # of 9100-9129, where an adviser taking the refused offers departs
                market = generate(spec, seed)
                model = parse_agent(f"openai:{server.model}@{server.url}?format=tagged&prompt=advice&retries=1&timeout=5",
                                    "seller").build(market, seller_seed(market.seed))
                with anyio.fail_after(30):
                    ep = await run_episode(market, model, conceding(market), fresh=True, seller_timeout=10, reply_timeout=10)
                record = EpisodeRecord.of(ep.events)
                shown = [next(x for x in e.extra["prompt"][1]["content"].splitlines() if x.startswith("Advice: "))
                         for e in record.seller_messages()]
                walked = [advice_line(advice) for _, _, advice in _teacher_walk(record, ADVISER)]
                assert shown == walked
                refused += sum(not e.valid for e in record.seller_messages())
            assert refused >= 3  # the refusals happened
        finally:
            await aclose_clients()


_GREEDY = re.compile(r"^Greedy: (?:to (b\d+), )?(\[[A-Z]+\].*)$", re.M)


def copy_greedy(body: dict) -> str:
    """A model that writes the message its ``tools`` prompt's second line (greedy's) names."""
    found = _GREEDY.search(body["messages"][1]["content"])
    assert found and _ADVICE.search(body["messages"][1]["content"]), body["messages"][1]["content"]
    to, action = found.groups()
    return f"Thought: greedy\nTo: {to or ''}\nTalk: As greedy would.\nAction: {action.strip()}"


@pytest.mark.parametrize("copy, seller", [(copy_the_advice, ADVISER), (copy_greedy, "greedy")])
async def test_a_seller_that_copies_either_tool_of_the_tools_prompt_makes_that_tools_deals(copy, seller):
    """``prompt=tools`` shows the planner's message and greedy's, both walking the model's own episode: a model that
    always copies one of them plays that seller's game, deal for deal."""
    await plays_as(copy, "tools", seller, "compact", 9100)


def test_the_tools_prompt_is_the_advice_prompt_with_greedys_message_after_the_advice():
    market = generate(SPLITS["train"], 5)
    obs = observe(EpisodeState(market), SELLER)
    adviser = make_adviser(market, seller_seed(market.seed), TOOLS)
    planner, greedy = adviser.advise(obs)
    advised = render_seller(obs, "tagged", "advice", planner)[1]["content"].splitlines()
    tools = render_seller(obs, "tagged", "tools", (planner, greedy))[1]["content"].splitlines()
    at = advised.index(advice_line(planner))
    assert tools == advised[:at + 1] + [f"Greedy: to {greedy.to}, {greedy.action}"] + advised[at + 1:]
    assert planner.action.kind == greedy.action.kind == "offer" and planner != greedy  # two opening offers, not one
    assert tool_lines((planner, None)).endswith("\nGreedy: wait for a reply") and tool_lines(None).startswith("Advice: wait")
    assert adviser.advise(obs) == (planner, greedy)  # asking leaves no trace
    with pytest.raises(ValueError, match="prompt=tools needs an Adviser"):
        LLMSeller(object(), Policy(prompt="tools", format="tagged"))
    with pytest.raises(UserError, match="grounded=1 binds"):  # the thought of greedy's move is no planner's reason
        parse_agent("openai:m@http://127.0.0.1:1/v1?format=tagged&prompt=tools&legal=1&grounded=1", "seller")


async def test_sft_data_under_the_tools_prompt_shows_what_each_tool_would_send_in_the_episodes_states():
    """For greedy's own episode the Greedy line is its message in every state; the Advice line is the planner's
    answer in the same states (a teacher walk), so it is the advice prompt's line, state for state."""
    market = generate(load_spec(SPECS / "compact.toml"), 78)
    agent = parse_agent("greedy", "seller").build(market, seller_seed(market.seed))
    ep = await run_episode(market, agent, conceding(market), fresh=True)
    tools, advice = decisions(ep.events, 0.0, "g", prompt="tools"), decisions(ep.events, 0.0, "g", prompt="advice")
    assert len(tools) == len(advice) >= 3
    for mine, theirs in zip(tools, advice):
        lines = mine.prompt[1]["content"].splitlines()
        (greedy,) = [line for line in lines if line.startswith("Greedy: ")]
        to, action = mine.completion.split("To: ", 1)[1].split("\n", 1)[0], mine.completion.rsplit("Action: ", 1)[1]
        assert greedy == f"Greedy: to {to}, {action}"
        assert [line for line in lines if not line.startswith("Greedy: ")] == theirs.prompt[1]["content"].splitlines()
