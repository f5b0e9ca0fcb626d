"""One episode a person plays: the market, the agents, the live state, the trace.

:class:`PlaySession` builds the market (``generate(spec, seed)``: ``--seed`` is the
market seed) and the agents through a :class:`~negotiate.run.Run` (``Run.agents``: the
other buyers and the seller seeded as ``negotiate serve`` seeds them, model agents on the
session's own pools, closed when the episode ends), puts a :class:`~negotiate.agents.human.HumanAgent` in the person's
seat, and runs the episode with :func:`~negotiate.episode.run_episode` on the
caller's event loop (the app runs it in a Textual worker). The UI reads the live
episode only through ``observe(state, <the person's id>)``.

Two things are added around the core, neither of which changes a rule:

* :class:`WatchedState` calls ``on_change`` after each regulator entry point, so the
  UI redraws exactly when the market moves (no polling needed).
* :class:`Watched` wraps each scripted agent: it marks the agent as thinking while it
  decides (the UI shows it) and, with a pace > 0, waits before deciding, so a
  person can follow the conversation and is not outrun by agents that answer in
  microseconds (``pace`` for the agents the person talks to, ``others_pace`` for
  the other buyers when the person is a buyer). It re-observes after the wait, so
  a paced agent never acts on a stale view. Tests pass 0 for both. Once a person
  playing a buyer has bought or left, there is nothing left for them to follow
  (a buyer sees only its own conversation), so the pacing stops and the market
  plays out at the agents' speed.
* **The market waits for a person playing a buyer.** While the person owes the seller
  a reply, every other agent holds its next decision until the person has answered
  (:meth:`PlaySession.wait_for_person`): the seller spends no turn on the other
  buyers and no other buyer takes a unit while the person reads. The turn budget is
  shared by all buyers, so without this a newcomer reading the first screen for 20 s
  found 1 of 6 turns left and ended the episode with their first bid. What the
  market does between the person's moves is what the agents do at their own pace,
  however long the person takes. An agent waits at most :attr:`PlaySession.patience`
  (half the agents' deadline), so it is never timed out by the bus for waiting. The
  person playing the seller needs no such wait: only the seller's own messages spend
  turns, and buyers only ever answer them.

A person playing a buyer also sees the seller's remaining turn budget
(:meth:`PlaySession.seller_turns`), which no agent's observation carries: without
it, an episode truncated by the budget right after the person's bid comes out
of nowhere. The budget is the market's, public in its spec; only how much of it
the seller has spent is extra, and it changes no rule.

A finished episode is appended to ``OUT/play.jsonl`` with the labels ``negotiate
serve`` writes (``seller``, ``buyers``, ``index``, ``seed``; ``play`` names the
person's role). Its index is one past the highest in the file, or the one given
(``negotiate play --web`` numbers its visitors' episodes itself, since they play at
once); the append holds an exclusive ``flock`` on the file, so the episodes of
people who finish together do not interleave. When the person is the seller, the
scripted oracle then plays the same market against identically seeded buyers, for
comparison (not traced).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

try:
    import fcntl
except ImportError:  # Windows: one person per trace folder there
    fcntl = None

from negotiate.agents.human import HumanAgent
from negotiate.agents.registry import AgentSpec, parse_agent
from negotiate.episode import Episode, run_episode
from negotiate.market import Market, MarketSpec, generate
from negotiate.metrics import opt
from negotiate.protocol import SELLER
from negotiate.regulator import EpisodeState, observe
from negotiate.run import HUMAN_TIMEOUT, Run, RunConfig
from negotiate.trace import TraceWriter, scan

__all__ = ["PlaySession", "PlayResult", "Watched", "WatchedState", "HUMAN_BUYER", "TRACE_NAME", "fresh_seed"]

HUMAN_BUYER = "b1"
"""The seat a person takes when playing a buyer."""
TRACE_NAME = "play.jsonl"
"""The trace file, under ``--out``, that every played episode is appended to."""


class WatchedState(EpisodeState):
    """The episode state, calling ``on_change`` after every step the regulator takes."""

    on_change: Callable[[], None] | None = None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def seller_send(self, *args, **kwargs):
        try:
            return super().seller_send(*args, **kwargs)
        finally:
            self._changed()

    def buyer_reply(self, *args, **kwargs):
        try:
            return super().buyer_reply(*args, **kwargs)
        finally:
            self._changed()

    def seller_timeout(self, *args, **kwargs):
        try:
            return super().seller_timeout(*args, **kwargs)
        finally:
            self._changed()

    def buyer_timeout(self, *args, **kwargs):
        try:
            return super().buyer_timeout(*args, **kwargs)
        finally:
            self._changed()

    def finish(self, *args, **kwargs):
        try:
            return super().finish(*args, **kwargs)
        finally:
            self._changed()


class Watched:
    """A scripted agent seen from the UI: marked as thinking while it decides, optionally paced."""

    instant = False  # it may sleep, so the bus gives it a deadline like any slow agent

    def __init__(self, agent, ident: str, session: PlaySession, pace: float):
        self.agent = agent
        self.ident = ident
        self.session = session
        self.pace = pace

    async def act(self, obs):
        session = self.session
        patience = anyio.current_time() + session.patience
        self._think(True)
        try:
            paced = self.pace > 0 and not session.person_out
            if paced:
                await anyio.sleep(self.pace)
            if session.person_owes:  # the person's turn began meanwhile: shown waiting, not thinking
                self._think(False)
                await session.wait_for_person(patience)
                self._think(True)
                paced = True
            if paced:
                obs = self._fresh(obs)
            return await self.agent.act(obs)
        finally:
            self._think(False)

    def _think(self, thinking: bool) -> None:
        thinking_now = self.session.thinking
        (thinking_now.add if thinking else thinking_now.discard)(self.ident)
        self.session.changed()

    def _fresh(self, obs):
        """The observation after the pause (what changed meanwhile included), built by observe()."""
        state = self.session.state
        if state.done:
            return obs
        if self.ident == SELLER:
            now = observe(state, SELLER)
            return now._replace(new=obs.new + now.new)  # what obs delivered is not lost to a learning seller
        return observe(state, self.ident, obs.message)

    def describe(self) -> dict:
        return self.agent.describe()


@dataclass(frozen=True)
class PlayResult:
    """A finished play: the person's episode and, for a seller, the oracle's on the same market."""

    episode: Episode
    oracle: Episode | None
    trace: Path
    """The trace file the episode was appended to."""


class PlaySession:
    """Everything about the one episode a person plays."""

    def __init__(self, role: str, spec: MarketSpec, seed: int, *, seller: AgentSpec | None = None,
                 buyers: AgentSpec | None = None, out: Path | str = Path("traces") / "play", pace: float = 0.5,
                 others_pace: float = 4.0, index: int | None = None):
        if role not in ("buyer", "seller"):
            raise ValueError(f"role is buyer or seller, not {role!r}")
        self.role = role
        self.spec = spec
        self.seed = seed
        self.seller_spec = seller or parse_agent("greedy", "seller")
        self.buyers_spec = buyers or parse_agent("concession", "buyer")
        self.out = Path(out)
        self.pace = pace
        self.market: Market = generate(spec, seed)
        self.episodes = Run(RunConfig(sellers=(self.seller_spec.text,), buyers=self.buyers_spec.text, split=spec.name, seed=seed,
                                 seller_timeout=HUMAN_TIMEOUT, reply_timeout=HUMAN_TIMEOUT), spec=spec, buyers=self.buyers_spec)
        """The episode's run: its agents' seeds, and their pools (``check_models`` loads models there before the UI opens)."""
        self.human_id = SELLER if role == "seller" else HUMAN_BUYER
        self.human = HumanAgent(self.human_id, on_turn=lambda _obs: self.changed())
        self.thinking: set[str] = set()
        """Ids of the scripted agents deciding right now."""
        self.patience = HUMAN_TIMEOUT / 2
        """The longest an agent holds a decision for the person (seconds from when it was asked): well inside the
        agents' own deadline, so the bus never times one out for waiting."""
        self._person_moved: asyncio.Event | None = None
        """Set, and dropped, once the person has answered; made by the first agent that waits for them."""
        self.on_change: Callable[[], None] | None = None
        """The UI's redraw hook; called after every change to the episode."""
        self.trace_path = self.out / TRACE_NAME
        done = scan(self.trace_path).complete  # a corrupt trace file is a UserError, before any play
        self.index = index if index is not None else max((e.index for e in done if e.index is not None), default=-1) + 1
        self.episode_id = f"play-{role}-{self.index:04d}"
        self.state = WatchedState(self.market, episode=self.episode_id)
        self.state.on_change = self.changed
        seller, buyers = self.episodes.agents(self.market, None if role == "seller" else self.seller_spec,
                                         skip=None if role == "seller" else HUMAN_BUYER)
        self.seller = self.human if role == "seller" else Watched(seller, SELLER, self, pace)
        self.buyers: dict = {}
        for buyer in self.market.buyers:
            if buyer.id == self.human_id:
                self.buyers[buyer.id] = self.human
            else:
                # When the person is a buyer, the other buyers answer at a person's (or a model's) speed,
                # so the units are not all gone before the person has read the first offer.
                self.buyers[buyer.id] = Watched(buyers[buyer.id], buyer.id, self, pace if role == "seller" else others_pace)
        self.opt = opt(self.market)
        self.result: PlayResult | None = None
        self._started = False

    @property
    def seller_label(self) -> str:
        return "human" if self.role == "seller" else self.seller_spec.text

    @property
    def buyers_label(self) -> str:
        return self.buyers_spec.text if self.role == "seller" else f"human+{self.buyers_spec.text}"

    @property
    def labels(self) -> dict:
        return {"run_seed": None, "index": self.index, "seed": self.seed, "seller": self.seller_label,
                "buyers": self.buyers_label, "play": self.role}

    @property
    def person_out(self) -> bool:
        """True once a person playing a buyer has bought or left (the seller's seat is never out)."""
        if self.role == "seller":
            return False
        return next(b for b in self.state.buyers if b.id == self.human_id).status != "active"

    @property
    def person_owes(self) -> bool:
        """True while the market waits for the person: a person playing a buyer owes the seller a reply (from the
        moment the seller's message is sent, before the person's screen has woken up)."""
        if self.role != "buyer" or self.state.done:
            return False
        return next(b for b in self.state.buyers if b.id == self.human_id).awaiting

    async def wait_for_person(self, deadline: float) -> None:
        """Until the person has answered (or the market has closed), or until ``deadline`` (anyio's clock)."""
        with anyio.move_on_after(deadline - anyio.current_time()):
            while self.person_owes:
                if self._person_moved is None:
                    self._person_moved = asyncio.Event()
                await self._person_moved.wait()

    def seller_turns(self) -> tuple[int, int]:
        """The seller's turns left and its budget, for a person playing a buyer."""
        return self.state.budget_left, self.market.budget

    def changed(self) -> None:
        if self.role == "seller" and self.state.done and self.human.waiting:
            # The market closed while the person was deciding (a buyer took the last unit): the bus
            # would otherwise wait out the person's deadline before it noticed.
            self.human.release()
        if self._person_moved is not None and not self.person_owes:
            self._person_moved.set()  # the agents holding their decisions for the person go on
            self._person_moved = None
        if self.on_change is not None:
            self.on_change()

    def view(self):
        """What the person may know now: ``observe(state, <the person's id>)``."""
        return observe(self.state, self.human_id, consume=False)

    async def run(self) -> PlayResult:
        """Play the episode to its end, append it to the trace, and (for a seller) run the oracle."""
        if self._started:
            raise RuntimeError("a play session runs once")
        self._started = True
        episode = await run_episode(
            self.market, self.seller, self.buyers, episode_id=self.episode_id, labels=self.labels,
            seller_timeout=HUMAN_TIMEOUT, reply_timeout=HUMAN_TIMEOUT, opt_value=self.opt, state=self.state,
        )
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.trace_path, "ab") as lock, TraceWriter(self.trace_path) as writer:
            if fcntl is not None:  # held until the episode is appended; another process's flock waits for it
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            writer.write(episode.events)
        await self.episodes.pools.aclose()  # model agents played: close this loop's HTTP clients
        oracle = await self._oracle() if self.role == "seller" else None
        self.result = PlayResult(episode, oracle, self.trace_path)
        self.changed()
        return self.result

    async def _oracle(self) -> Episode:
        """The full-information oracle on the same market, facing buyers seeded as the person's were."""
        seller, buyers = self.episodes.agents(self.market, parse_agent("oracle", "seller"))
        try:
            return await run_episode(self.market, seller, buyers, episode_id=f"oracle-{self.episode_id}", opt_value=self.opt)
        finally:
            await self.episodes.pools.aclose()

    def abandon_note(self) -> str:
        return f"the episode was not finished, so it was not saved to {self.trace_path}"


def fresh_seed() -> int:
    """A new market seed for ``negotiate play`` without ``--seed`` (shown, so the market can be replayed)."""
    return secrets.randbelow(1_000_000)
