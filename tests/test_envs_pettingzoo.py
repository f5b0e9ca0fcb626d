"""negotiate.envs.pettingzoo: PettingZoo's own API and seed tests, and scripted agents through the environment
playing the very episodes ``negotiate serve`` plays."""

from __future__ import annotations

import doctest
import importlib.util

import orjson
import pytest

from needs import missing

if importlib.util.find_spec("pettingzoo") is None or importlib.util.find_spec("gymnasium") is None:
    missing("the envs extra is not installed: pip install -e '.[envs]'", "NEGOTIATE_REQUIRE_ENVS")

from pettingzoo.test import api_test, seed_test  # noqa: E402

from negotiate.agents.registry import parse_agent  # noqa: E402
from negotiate.cli import main  # noqa: E402
from negotiate.envs import wire  # noqa: E402
from negotiate.envs.pettingzoo import NegotiationEnv  # noqa: E402
from negotiate.envs.wire import SENT_NOTHING, action_text, decision, decode, encode  # noqa: E402
from negotiate.market import MarketSpec, generate  # noqa: E402
from negotiate.protocol import Action, Message  # noqa: E402
from negotiate.regulator import observe  # noqa: E402
from negotiate.run import market_seed, seller_seed  # noqa: E402
from negotiate.trace import EpisodeRecord, read_episodes  # noqa: E402

SMALL = MarketSpec(name="small", buyers=(2, 3), products=2, budget=8)
"""A few turns per episode: api_test plays whole episodes of random text."""

# PettingZoo's api_test warns about what this environment is on purpose: observations are JSON text in a Dict and
# actions text (not numpy arrays, Box or Discrete), and the agents are named as the market names them (seller, b1).
pytestmark = [
    pytest.mark.filterwarnings("ignore:Observation is not a NumPy array:UserWarning"),
    pytest.mark.filterwarnings("ignore:Observation space for each agent probably should be:UserWarning"),
    pytest.mark.filterwarnings("ignore:Action space for each agent probably should be:UserWarning"),
    pytest.mark.filterwarnings("ignore:We recommend agents to be named in the format:UserWarning"),
]


@pytest.mark.parametrize("buyers", [None, "threshold"], ids=["every-buyer-an-agent", "scripted-buyers"])
def test_the_environment_passes_pettingzoos_api_test(buyers):
    api_test(NegotiationEnv(SMALL, buyers=buyers, seed=5), num_cycles=200)


def test_the_environment_passes_pettingzoos_seed_test():
    seed_test(lambda: NegotiationEnv(SMALL, seed=1), num_cycles=200)


def test_random_text_spends_the_sellers_turns_as_invalid_messages_and_truncates():
    env = NegotiationEnv(SMALL, seed=2)
    env.reset(seed=2)
    while env.agents:
        agent = env.agent_selection
        done = env.terminations[agent] or env.truncations[agent]
        env.step(None if done else "no message here")
    episode = env.episode
    seller = [e for e in episode.messages() if e.sender == "seller"]
    assert episode.outcome == "truncated" and episode.reason == "budget"
    assert len(seller) == env.state_.market.budget == 8 and not any(e.valid for e in seller)
    assert episode.metrics["violations"] == {"malformed": 8} and episode.metrics["deals"] == 0
    assert env.rewards == {}  # every agent has taken its last step and left


def test_the_seller_pays_for_each_invalid_message_when_the_episode_ends():
    env = NegotiationEnv(SMALL, seed=2)
    env.reset(seed=2)
    finals = {}
    while env.agents:
        agent = env.agent_selection
        _, reward, terminated, truncated, _ = env.last()
        if terminated or truncated:
            finals[agent] = reward
        env.step(None if terminated or truncated else "no message here")
    # profit 0, and 0.1 per violation: 8 malformed messages cost 0.8. Buyers made no deal: surplus 0.
    assert finals.pop("seller") == pytest.approx(-0.8)
    assert finals and set(finals.values()) == {0.0}


def _play_scripted(env: NegotiationEnv, seller_spec: str, buyer_spec: str, *, as_text: bool):
    """Play the episode ``env`` was reset to with scripted agents, each deciding on the decoded observation, seeded
    as serve seeds them (those of the environment's agents: the runtime may play the buyers); ``as_text`` sends each
    message as its JSON text (else the Message itself)."""
    market = env.state_.market
    agents = {"seller": parse_agent(seller_spec, "seller").build(market, seller_seed(market.seed)),
              **{b.id: parse_agent(buyer_spec, "buyer").build(market, [market.seed, 1, k]) for k, b in enumerate(market.buyers)}}
    for agent in env.agent_iter():
        observation, _, terminated, truncated, _ = env.last()
        if terminated or truncated:
            env.step(None)
            continue
        message = agents[agent].decide(decode(observation["json"]))
        env.step(SENT_NOTHING if message is None else action_text(message) if as_text else message)
    return env.episode


def _comparable(events) -> list[dict]:
    """The trace as serve writes it, less what differs between any two plays: clocks, the episode id, and who
    played (the environment's seats describe themselves as external)."""
    out = []
    for event in events:
        data = orjson.loads(orjson.dumps(event.json_data() if event.type == "episode_start" else event))
        for key in ("ts", "wall_s", "time", "episode"):
            data.pop(key, None)
        if data["type"] == "episode_start":
            data = {key: data[key] for key in ("seed", "run_seed", "index", "spec", "market", "split", "shape", "tier")}
        out.append(data)
    return out


@pytest.mark.parametrize("seller_spec,buyer_spec", [("greedy", "concession"), ("planner", "threshold"), ("random", "random")])
@pytest.mark.parametrize("as_text,runtime_buyers", [(True, False), (False, False), (True, True)],
                         ids=["text", "message", "seller-only"])
def test_scripted_agents_through_the_environment_play_serves_episodes(tmp_path, seller_spec, buyer_spec, as_text, runtime_buyers):
    seed, episodes = 11, 3
    out = tmp_path / "run"
    assert main(["serve", "--seller", seller_spec, "--buyers", buyer_spec, "--split", "train", "--episodes", str(episodes),
                 "--seed", str(seed), "--out", str(out), "--quiet"]) == 0
    served = sorted(map(EpisodeRecord.of, read_episodes(out / f"{seller_spec}.jsonl")), key=lambda e: e.start.index)
    # seller-only: the runtime plays the buyers (buyers=SPEC) and the seller is the environment's one agent.
    env = NegotiationEnv("train", seed=seed, buyers=buyer_spec if runtime_buyers else None)
    for index, expected in enumerate(served):
        env.reset(seed=seed) if index == 0 else env.reset()  # serve's next index at each reset
        episode = _play_scripted(env, seller_spec, buyer_spec, as_text=as_text)
        assert env.index == index and episode.start.seed == market_seed(seed, index)
        assert _comparable(episode.events) == _comparable(expected.events)
        assert len(episode.messages()) >= 2  # a played episode, not two empty ones compared
    env.close()


def test_an_observation_decodes_to_the_observers_record():
    env = NegotiationEnv("train", seed=4)
    env.reset()
    _scripted_steps(env, 5)
    for agent in env.agents:
        record = observe(env.state_, agent, consume=False)
        assert decode(encode(record)) == tuple(record)


def _scripted_steps(env, steps: int) -> None:
    market = env.state_.market
    agents = {"seller": parse_agent("greedy", "seller").build(market, seller_seed(market.seed)),
              **{b.id: parse_agent("concession", "buyer").build(market, [market.seed, 1, k]) for k, b in enumerate(market.buyers)}}
    for _ in range(steps):
        agent = env.agent_selection
        env.step(agents[agent].decide(decode(env.observe(agent)["json"])))


def test_the_seller_is_rewarded_profit_over_opt_and_buyers_their_surplus_when_the_episode_ends():
    env = NegotiationEnv(SMALL, buyers="threshold", seed=3)
    env.reset()
    market = env.state_.market
    seller = parse_agent("oracle", "seller").build(market, seller_seed(market.seed))
    rewards = []
    for agent in env.agent_iter():
        observation, reward, terminated, truncated, _ = env.last()
        rewards.append(reward)
        env.step(None if terminated or truncated else seller.decide(decode(observation["json"])))
    episode = env.episode
    metrics = episode.metrics
    # The oracle sells at each buyer's value: profit = welfare, and every reward before the last step is 0.
    assert metrics["deals"] >= 1 and rewards[:-1] == [0.0] * (len(rewards) - 1)
    assert rewards[-1] == pytest.approx(metrics["profit"] / metrics["opt"] - 0.1 * sum(metrics["violations"].values()))


def test_a_market_is_the_one_serve_plays_at_each_index():
    env = NegotiationEnv(SMALL, seed=9)
    env.reset()
    first = env.state_.market
    env.reset()
    second = env.state_.market
    env.reset(seed=9)
    assert env.state_.market == first == generate(SMALL, market_seed(9, 0))
    assert second == generate(SMALL, market_seed(9, 1)) != first


def test_a_message_object_and_its_text_are_the_same_action():
    message = Message("seller", "b1", "Yours for $450.", Action("offer", "p1", 450), "b1 wants it most")
    assert decision(action_text(message), "seller") == message
    assert decision(SENT_NOTHING, "seller") is None


def test_the_wire_forms_doctests_pass():
    result = doctest.testmod(wire, optionflags=doctest.ELLIPSIS, report=False)
    assert result.attempted >= 4 and result.failed == 0


def test_every_episode_is_built_by_run_as_serve_builds_it(monkeypatch):
    """The environment builds its episodes with Run.episode, the one place every player of the project builds them (it
    generated markets, buyers, labels and seeds by hand): episode `index` of the run seeded by reset(seed=...), its
    labels the run's, the seat's name in them."""
    from negotiate.run import Run

    built = []
    episode = Run.episode

    def spy(self, seller, index, *, episode_id=None):
        built.append((seller.text, self.buyers.text, self.config.seed, index, episode_id))
        return episode(self, seller, index, episode_id=episode_id)

    monkeypatch.setattr(Run, "episode", spy)
    env = NegotiationEnv(SMALL, buyers="threshold", seed=4)
    env.reset()
    env.reset()
    env.reset(seed=6)
    assert built == [("pettingzoo", "threshold", 4, 0, "pettingzoo-000000"), ("pettingzoo", "threshold", 4, 1, "pettingzoo-000001"),
                     ("pettingzoo", "threshold", 6, 0, "pettingzoo-000000")]
    while env.agents:  # the seller waits, then ends: the episode's start records what the run labels
        env.step(None if env.terminations[env.agent_selection] or env.truncations[env.agent_selection] else "Action: [END]")
    start = env.episode.events[0]
    assert (start.run_seed, start.index, start.seed, start.seller, start.buyers) == (6, 0, market_seed(6, 0), "pettingzoo", "threshold")
    env.close()
