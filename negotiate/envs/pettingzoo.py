"""The market as a PettingZoo AEC environment: the seller and the buyers as agents, over the episode runtime.

:class:`NegotiationEnv` builds each episode with :class:`negotiate.run.Run`, as ``negotiate serve`` builds its own (the
market, the seeds, the labels, the deadlines), and plays it with :func:`negotiate.episode.run_episode`, the function
``serve`` plays, with a :class:`~negotiate.envs.seats.Seat` in each agent's place: the bus, the turn budget and the
regulator decide who acts next and what a message does, so nothing of the rules is written twice. ``agent_selection``
is the agent the episode waits on; ``step`` answers it and runs the episode to the next question.

Observations and actions are text (:mod:`negotiate.envs.wire`), because that is what they are:

* observation space: ``Dict({"json": Text(printable ASCII)})``, the observer's record for that agent
  (:func:`negotiate.regulator.observe`, what every agent of the project decides on) as one line of JSON;
  :func:`negotiate.envs.wire.decode` turns it back into the record, so a scripted agent can decide on it. The
  agent asked now sees what it is asked on (the seller's ``new`` items are then consumed, as in an episode); any
  other agent's observation is a look that consumes nothing. The text sits in a Dict because PettingZoo's
  ``api_test`` compares a bare observation's numpy dtype, which a ``str`` does not have.
* action space: ``Text``, one four-part message (thought, addressee, talk, binding action) in either wire form of
  :mod:`negotiate.protocol`, parsed once with the LLM agents' lenient parser; what does not parse is recorded as
  an invalid message (the seller's turn is spent; a buyer's reply counts as a reject). The empty text sends
  nothing (the seller waits for a reply). ``step`` also takes a :class:`~negotiate.protocol.Message` as it is
  (what a scripted agent's ``decide`` returns), which is outside the space.

Rewards come once, when the episode ends: the seller's is a named reward of the trace (``reward=``, default
``profit-penalized`` from :mod:`negotiate.training.rewards`, profit / OPT minus a penalty per violation), a
buyer's its surplus (value - price, 0 without a deal). A finished market (``terminated``) ends every agent by
termination, a spent turn budget (``truncated``) by truncation, as the trace records them. Every agent of the
market stays in ``agents`` until the episode ends (a served buyer is simply never asked again).

Seeds: ``reset(seed=s)`` plays the market ``negotiate serve --seed s`` plays as its episode 0, and each later
``reset()`` the next index, so ``k`` resets play serve's first ``k`` markets. :attr:`NegotiationEnv.episode` is the
finished episode (its trace events, for a :class:`~negotiate.trace.TraceWriter`).

The environment is synchronous: it runs its episode on an event loop of its own, so it cannot be stepped from
inside a running event loop (async code drives :class:`~negotiate.envs.seats.Driver` directly, as the verifiers
environment does).
"""

from __future__ import annotations

import asyncio
import contextlib

try:
    from gymnasium import spaces
    from pettingzoo import AECEnv
except ModuleNotFoundError as error:  # pragma: no cover - the extra is there whenever the tests run this module
    raise ModuleNotFoundError(f"negotiate.envs.pettingzoo needs the envs extra ({error.name} is missing): "
                              "pip install 'negotiate[envs]'") from None

from negotiate.agents.registry import parse_agent
from negotiate.envs.seats import Desk, Driver, Question, Seats
from negotiate.envs.wire import decision, encode
from negotiate.episode import Episode
from negotiate.market import MarketSpec, resolve_spec
from negotiate.protocol import SELLER as _SELLER
from negotiate.protocol import TALK_MAX, THOUGHT_MAX, Action
from negotiate.regulator import EpisodeState, observe
from negotiate.run import Run, RunConfig
from negotiate.trace import Outcome
from negotiate.training.rewards import DEFAULT_REWARD, reward_fn

__all__ = ["NegotiationEnv", "env", "OBSERVATION_CHARSET", "ACTION_CHARSET", "ACTION_MAX"]

OBSERVATION_CHARSET = "".join(chr(c) for c in range(32, 127))
"""Printable ASCII: every character :func:`~negotiate.envs.wire.encode` writes (JSON escapes the rest)."""
ACTION_CHARSET = OBSERVATION_CHARSET + "\n"
"""Printable ASCII and the newline the tagged form needs; other characters are parsed all the same, outside the space."""
ACTION_MAX = THOUGHT_MAX + TALK_MAX + 200
"""The longest action in the space: the longest thought and talk the protocol keeps, and room for the rest."""
SELLER = str(_SELLER)
"""The seller's agent name, ``seller`` (a plain string, as PettingZoo's agent names are)."""
_ITEM_MAX = 6 * (THOUGHT_MAX + TALK_MAX) + 400
"""The longest one message or notice can be in the observation's JSON (an escaped character takes six)."""


def _count_max(value) -> int:
    return value[1] if isinstance(value, tuple) else value


def _observation_max(spec: MarketSpec, budget: int | None) -> int:
    """A bound on an observation's length: each seller turn adds at most four items (its message, a reply, and
    notices), each bounded by the protocol's lengths, and the seller sees them twice (``new`` and ``history``)."""
    buyers, products = _count_max(spec.buyers), _count_max(spec.products)
    turns = budget if budget is not None else int(spec.budget_per_pair * buyers * products) + 1
    return 2 * (4 * turns + 2 * buyers + products + 8) * _ITEM_MAX + 200 * (buyers + products) + 1000


class NegotiationEnv(AECEnv):
    """One seller and its buyers as PettingZoo agents; see the module's docstring."""

    metadata = {"name": "negotiate_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(self, split: str | MarketSpec = "train", *, buyers: str | None = None, seed: int = 0,
                 reward: str = DEFAULT_REWARD, render_mode: str | None = None):
        """``split``: a split name, a TOML spec file or a :class:`~negotiate.market.MarketSpec`. ``buyers``: None makes
        every buyer an agent of the environment; a buyer spec (``threshold``, ``concession``, a model...) has the
        runtime play them, seeded as ``serve`` seeds them, and leaves the seller as the one agent. ``seed``: the run
        seed until ``reset(seed=...)`` names another. ``reward``: the seller's reward, by name."""
        super().__init__()
        self.spec = split if isinstance(split, MarketSpec) else resolve_spec(split)
        self.split = split if isinstance(split, str) else self.spec.name
        self.buyer_spec = None if buyers is None else parse_agent(buyers, "buyer")
        self.reward_name = reward
        self._reward = reward_fn(reward)
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode {render_mode!r}: choose from {', '.join(self.metadata['render_modes'])} or None")
        self.render_mode = render_mode
        self.run_seed = seed
        self.index = -1
        """The index of the episode being played (its market is serve's episode ``index``)."""
        n = _count_max(self.spec.buyers)
        self.possible_agents = [SELLER] + ([] if self.buyer_spec is not None else [f"b{k}" for k in range(1, n + 1)])
        observation = spaces.Dict({"json": spaces.Text(_observation_max(self.spec, self.spec.budget), min_length=2,
                                                       charset=OBSERVATION_CHARSET)})
        action = spaces.Text(ACTION_MAX, min_length=0, charset=ACTION_CHARSET)
        self.observation_spaces = {agent: observation for agent in self.possible_agents}
        self.action_spaces = {agent: action for agent in self.possible_agents}
        self.agents: list[str] = []
        self.state_: EpisodeState | None = None
        """The running episode's state (the regulator's): what observations are read from."""
        self.episode: Episode | None = None
        """The last finished episode, with its trace events."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver: Driver | None = None
        self._question: Question | None = None

    def observation_space(self, agent: str):
        return self.observation_spaces[agent]

    def action_space(self, agent: str):
        return self.action_spaces[agent]

    # -- the episode ---------------------------------------------------------------------------------------------

    def _run(self, coroutine):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coroutine)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if self._driver is not None:
            self._run(self._driver.stop())
        if seed is not None:
            self.run_seed, self.index = seed, -1
        self.index += 1
        desk = Desk()
        described = {"kind": "external", "name": "pettingzoo"}
        # Episode `index` of the run `negotiate serve --seed run_seed` plays, built by Run as serve builds it: the market,
        # the buyers' seeds, the labels and the deadlines; seats where the environment's agents sit.
        buyers = self.buyer_spec or Seats(desk, "pettingzoo", described)
        run = Run(RunConfig(sellers=("pettingzoo",), buyers=buyers.text, split=self.split, seed=self.run_seed), spec=self.spec,
                  buyers=buyers)
        plan = run.episode(Seats(desk, "pettingzoo", described, who=SELLER), self.index, episode_id=f"pettingzoo-{self.index:06d}")
        market = plan.market
        self.state_ = EpisodeState(market, episode=plan.episode_id)
        self.episode = None
        self.agents = [SELLER] + ([] if self.buyer_spec is not None else [b.id for b in market.buyers])
        self.rewards = {agent: 0.0 for agent in self.agents}
        self._cumulative_rewards = {agent: 0.0 for agent in self.agents}
        self.terminations = {agent: False for agent in self.agents}
        self.truncations = {agent: False for agent in self.agents}
        self.infos = {agent: {} for agent in self.agents}
        self._skip_agent_selection = None
        self._driver = Driver(desk)
        self._settle(self._run(self._driver.start(self._play(run, plan))))

    async def _play(self, run: Run, plan) -> Episode:
        """The episode, inside its run (the run's model pools for scripted or model buyers, closed when it ends)."""
        async with run:
            return await plan.play(state=self.state_)

    def _settle(self, question: Question | None) -> None:
        """The episode stopped at ``question`` (the agent it waits on is selected), or ended (every agent is done)."""
        self._question = question
        if question is not None:
            self.agent_selection = question.who
            return
        self.episode = episode = self._driver.episode
        self._driver = None
        events = episode.events
        seller_reward = self._reward(events)
        surplus = {deal.buyer: deal.value - deal.price for deal in episode.deals()}
        for agent in self.agents:
            self.rewards[agent] = float(seller_reward or 0.0) if agent == SELLER else float(surplus.get(agent, 0))
            self.terminations[agent] = episode.outcome != Outcome.TRUNCATED
            self.truncations[agent] = episode.outcome == Outcome.TRUNCATED
            self.infos[agent] = {"outcome": str(episode.outcome), "reason": str(episode.reason)}
        self._accumulate_rewards()
        self.agent_selection = self.agents[0]

    def step(self, action) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        if self._question is None or self._question.who != agent:  # pragma: no cover - selection always follows the question
            raise RuntimeError(f"{agent} is not the agent the episode waits on")
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        self._settle(self._run(self._driver.answer(decision(action, agent))))

    def observe(self, agent: str) -> dict:
        question = self._question
        obs = question.obs if question is not None and question.who == agent else observe(self.state_, agent, consume=False)
        return {"json": encode(obs)}

    # -- showing it ----------------------------------------------------------------------------------------------

    def render(self) -> str | None:
        """``ansi``: the episode's messages, deals and violations so far, one line each."""
        if self.render_mode is None or self.state_ is None:
            return None
        lines = []
        for event in self.state_.trace():  # a long episode's older events are in its spill file
            if event.type == "message":
                what = str(Action(**event.action)) if event.action else f"invalid: {event.error}"
                lines.append(f"{event.sender} -> {event.to or '-'}: {what} {event.talk}".rstrip())
            elif event.type == "deal":
                lines.append(f"deal: {event.buyer} buys {event.product} at ${event.price}")
            elif event.type == "violation":
                lines.append(f"violation ({event.who}): {event.kind}: {event.detail}")
        return "\n".join(lines)

    def close(self) -> None:
        if self._driver is not None:
            self._run(self._driver.stop())
            self._driver = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def __del__(self) -> None:
        # An environment dropped without close() (PettingZoo's api_test does so): end its episode and its loop.
        with contextlib.suppress(Exception):
            self.close()


def env(**kwargs) -> NegotiationEnv:
    """PettingZoo's usual constructor name: ``negotiate.envs.pettingzoo.env(split="train")``."""
    return NegotiationEnv(**kwargs)
