"""The menu seller (``prompt=menu``): a model picks one of the menu's letters. With a local model the letter is read from
one forward pass over the letters' log-probs; with a server, decoded under a regex of the letters. Every move it makes
is on the menu, so every message is valid; the trace keeps what a trainer reads."""

from __future__ import annotations

import importlib.util
import math
import re

import pytest

from negotiate.agents.registry import parse_agent
from negotiate.errors import UserError
from negotiate.run import Run, RunConfig
from negotiate.training.teacher import label_episode
from fake_openai import FakeOpenAI

HAVE_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch and transformers (the hf extra)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-menu"))


async def _play(spec: str, buyers: str, n: int, split: str = "specs/compact.toml"):
    run = Run(RunConfig(sellers=(spec,), buyers=buyers, split=split, seed=5, fresh=True))
    async with run:
        return [await run.episode(parse_agent(spec, "seller"), i).play() for i in range(n)]


@needs_torch
@pytest.mark.parametrize("temperature", [0, 1])
async def test_a_local_model_picks_a_letter_and_every_message_is_valid(tiny, temperature):
    episodes = await _play(f"hf:{tiny}?prompt=menu&temperature={temperature}", "concession", 4)
    sent = 0
    for episode in episodes:
        assert episode.metrics["seller_invalid"] == 0 and episode.metrics["seller_messages"] >= 1
        for event in episode.seller_messages():
            extra = event.extra
            sent += 1
            letters = "".join(line[0] for line in extra["options"])
            assert extra["format"] == "menu" and event.raw == letters[extra["choice"]]
            chosen = extra["options"][extra["choice"]]
            assert event.thought == f"option {chosen[0]} of {len(letters)}: {chosen[3:]}"
            if extra.get("asked", True):
                assert math.isclose(sum(extra["probs"]), 1.0, abs_tol=1e-4) and len(extra["probs"]) == len(letters)
                assert math.isclose(math.exp(extra["logprob"]), extra["probs"][extra["choice"]], rel_tol=1e-4)
                if temperature == 0:  # greedy: the most likely option
                    assert extra["probs"][extra["choice"]] == max(extra["probs"])
        # The teacher rebuilds the menus the seller saw and reads its choices and probabilities back.
        for label, event in zip(label_episode(episode, "planner", value=False), episode.seller_messages()):
            assert label.options == event.extra["options"] and label.chosen == event.extra["choice"]
    assert sent >= 4


async def test_a_server_decodes_one_letter_under_the_menus_regex():
    asked = []

    def reply(body: dict) -> str:
        pattern = body["structured_outputs"]["regex"]
        asked.append((pattern, body["messages"][1]["content"]))
        return re.fullmatch(r"\[([A-Z]+)\]", pattern).group(1)[-1]  # the last option: end

    async with FakeOpenAI(reply) as server:
        episodes = await _play(f"openai:{server.model}@{server.url}?prompt=menu&server=vllm&temperature=0", "threshold", 2)
    for episode in episodes:
        (event,) = episode.seller_messages()  # the menu's last option is end: one message, and the market closes
        assert (event.kind, event.valid, episode.reason) == ("end", True, "seller_end")
        assert event.extra["choice"] == len(event.extra["options"]) - 1
    pattern, prompt = asked[0]
    assert pattern == "[" + "".join(line.split(" ")[0] for line in prompt.splitlines() if re.match(r"^[A-Z] ", line)) + "]"


async def test_a_reply_off_the_menu_is_an_invalid_message_not_a_crash():
    async with FakeOpenAI(lambda body: "Z") as server:
        (episode,) = await _play(f"openai:{server.model}@{server.url}?prompt=menu&server=vllm&temperature=0", "threshold", 1)
    first = episode.seller_messages()[0]
    assert not first.valid and "not one of the menu's letters" in first.error


def test_a_menu_needs_a_server_that_decodes_under_a_regex():
    with pytest.raises(UserError, match="prompt=menu reads a letter decoded under a regex"):
        parse_agent("openai:m@http://127.0.0.1:9/v1?prompt=menu&server=openai", "seller")
