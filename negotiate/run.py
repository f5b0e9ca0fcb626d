"""A run: what one run holds, and the one way to build episode *i* of it.

Every place that plays episodes (``negotiate serve``/``collect``/``eval`` through
:mod:`negotiate.runner`, the trainer's rollouts and evaluations, the terminal UI's play
session, the screenshot script, and the PettingZoo and verifiers environments) builds them
here, so the seed conventions exist once:

* episode ``i`` of a run seeded ``s`` plays the market ``generate(spec, market_seed(s, i // group))``:
  every seller of the run meets the same markets (a paired comparison), and ``group``
  consecutive episodes share one (training groups);
* the seller is seeded ``[market seed, 2]``, or ``[market seed, 2, repeat]`` for repeat
  ``i % group`` of a group (:func:`seller_seed`);
* buyer ``k`` is seeded ``[market seed, 1, k]``: every seller and every repeat faces identically
  seeded buyers (:func:`build_buyers`);
* the trace labels name the run, its seed, the index, the market seed and both agents
  (:meth:`Run.labels`); the episode id is ``<seller slug>-<index:06d>``.

A :class:`Run` also owns the model pools its agents use (HTTP clients, shared backends, loaded
models and the request log: :class:`~negotiate.agents.pools.Pools`) and the trace writers of its
sellers. It is an async context manager: inside ``async with run:`` agents built anywhere in the
task take the run's pools, and on leaving it the run closes its trace files and the event loop's
HTTP clients. Nothing about a run lives in module globals.

:class:`RunConfig` (what a run is, saved as ``run.json``) and :class:`RunOptions` (how it is
played) are the settings of ``negotiate serve``, ``collect`` and ``eval`` (their flags, ``--config`` and ``--set``
keys and help, by :mod:`negotiate.settings`, as ``TrainConfig`` is ``train``'s): each flag's help, spelling and each
command's default are written once, on the field (:class:`~negotiate.settings.Flag`), and so are the agents' deadline
defaults.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from negotiate.agents.pools import Pools, use_pools
from negotiate.agents.registry import AgentSpec, parse_agent
from negotiate.agents.scripted import BUYERS, SELLERS
from negotiate.episode import Episode, run_episode
from negotiate.errors import UserError
from negotiate.market import SPLITS, Market, MarketSpec, generate, resolve_spec
from negotiate.settings import read_shard, read_value, setting
from negotiate.trace import TraceWriter

__all__ = [
    "Run", "RunConfig", "RunOptions", "EpisodePlan", "RUN_SETTINGS",
    "market_seed", "seller_seed", "build_buyers", "slug", "check_timeout",
    "DEFAULT_TIMEOUT", "COLLECT_TIMEOUT", "LOCAL_TIMEOUT", "HUMAN_TIMEOUT", "default_timeout",
]


_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def market_seed(run_seed: int, index: int) -> int:
    """The market seed of episode ``index`` in a run seeded ``run_seed`` (SplitMix64 of both; 63 bits).

    >>> market_seed(0, 0) != market_seed(0, 1) != market_seed(1, 0)
    True
    """
    return _splitmix64(_splitmix64(run_seed & _MASK) ^ (index & _MASK)) >> 1


def seller_seed(market: int, repeat: int | None = None) -> list[int]:
    """What seeds the seller on the market seeded ``market``: ``[market, 2]``, with the repeat appended
    when the seller plays the market several times (a group). NumPy's ``SeedSequence`` ignores trailing
    zeros, so repeat 0 samples as a lone episode does (the trainer's rollouts always named it).

    >>> seller_seed(7), seller_seed(7, 1)
    ([7, 2], [7, 2, 1])
    """
    return [market, 2] if repeat is None else [market, 2, repeat]


def build_buyers(market: Market, buyers: AgentSpec, *, pools: Pools | None = None, skip: str | None = None) -> dict:
    """The buyers of a market, buyer ``k`` seeded ``[market seed, 1, k]`` (every seller and repeat meets the
    same ones); ``skip`` leaves one seat out (a person takes it)."""
    return {b.id: buyers.build(market, [market.seed, 1, k], pools) for k, b in enumerate(market.buyers) if b.id != skip}


def slug(text: str) -> str:
    """A file-name-safe form of an agent spec: ``concession?beta=2`` -> ``concession-beta-2``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "agent"


def check_timeout(value: float, flag: str) -> float:
    """An agent deadline: a positive, finite number of seconds."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UserError("must be a positive number of seconds", field=flag, value=value)
    return float(value)


DEFAULT_TIMEOUT = 120.0
"""Seconds an agent may think (seller) or stay silent (buyer) in ``serve`` and ``eval`` runs."""
COLLECT_TIMEOUT = 600.0
"""The same for ``negotiate collect``."""
LOCAL_TIMEOUT = 3600.0
"""The deadline when a local model (``hf:``, ``vllm:``) plays, or the policy in training: on a CPU a reply can
wait minutes for its batch."""
HUMAN_TIMEOUT = 3600.0
"""Seconds a person may think about one message (``negotiate play``), and the agents beside them."""


def default_timeout(base: float, specs) -> float:
    """An agent deadline left unset: ``base``, or :data:`LOCAL_TIMEOUT` when a local model plays (specs as written)."""
    local = any(spec.strip().startswith(("hf:", "vllm:")) for spec in specs)
    return max(base, LOCAL_TIMEOUT) if local else base


_LOCAL_NOTE = f"or {LOCAL_TIMEOUT:g} when an hf: or vllm: model plays"


def _flag(initial, help: str, **options):
    """A setting of the commands that play, whose default is ``initial`` (:func:`~negotiate.settings.setting`)."""
    return setting(help, default=initial, **options)


def _timeout_flag(help: str):
    return _flag(DEFAULT_TIMEOUT, help, metavar="SECONDS", kind="seconds", shown=f"{DEFAULT_TIMEOUT:g}, {_LOCAL_NOTE}",
                 per=(("collect", {"command_default": COLLECT_TIMEOUT, "shown": f"{COLLECT_TIMEOUT:g}, {_LOCAL_NOTE}"}),))


LADDER = tuple(name for name in SELLERS if name not in ("rule", "menu", "rollout"))
"""The scripted sellers a run plays by default: every one but ``rule`` and ``menu``, which with no keys play as the planner,
and ``rollout``, which plays every move out in eight drawn worlds (seconds an episode)."""
_SELLERS_HELP = "comma-separated seller specs, [scripted:]NAME[?k=v], openai:..., hf:..., vllm:... (negotiate agents lists them)"


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run; saved as ``run.json`` so ``--resume`` can finish it. Each field is a setting of
    ``serve``, ``collect`` and ``eval`` (a flag, ``--seller-timeout`` for ``seller_timeout``, and a key of ``--config``
    and ``--set``): its help, spelling and each command's default are written once, here."""

    sellers: tuple[str, ...] = _flag(
        (), _SELLERS_HELP, name="--seller", aliases=("--sellers",), metavar="SPECS", kind="list", command_default=LADDER,
        shown=f"all of {','.join(LADDER)}", per=(("collect", {"command_default": (), "shown": ""}),))
    """Seller specs; each plays every episode index of the run."""
    buyers: str = _flag("threshold", f"buyer spec for every buyer: {', '.join(BUYERS)}, or a model")
    """The buyer spec every buyer of every market plays."""
    split: str = _flag(
        "train", f"split ({', '.join(SPLITS)}) or a TOML market spec file", shown="train; negotiate splits lists them",
        per=(("eval", {"help": "comma-separated splits or TOML spec files", "aliases": ("--splits",), "metavar": "SPLITS",
                       "command_default": ",".join(SPLITS), "shown": None, "listed": True}),))
    """A split name or a TOML spec path (for ``eval``, the template of its runs: the splits, comma-separated)."""
    episodes: int = _flag(200, "episodes per seller", kind="count",
                          per=(("collect", {"name": "--markets", "help": "market instances", "command_default": 32, "scaled_by": "group"}),
                               ("eval", {"help": "markets per split"})))
    """Episodes per seller (before sharding); ``collect`` gives markets, each played ``group`` times."""
    group: int = _flag(1, "episodes per market instance: the seller plays each market this many times, sampling afresh",
                       commands=("serve", "collect"), kind="count",
                       per=(("collect", {"help": "episodes per market", "command_default": 8}),))
    """Episodes per market instance: episodes ``i`` with the same ``i // group`` play one market,
    the seller sampling with a different seed each time (``negotiate collect``; training groups)."""
    seed: int = _flag(0, "run seed: market i is seeded from (seed, i)", kind="seed")
    """Run seed: market ``i`` is seeded from (seed, i // group)."""
    shard: tuple[int, int] = _flag((1, 1), "run the K-th of N disjoint slices of the episodes", commands=("serve", "collect"),
                                   metavar="K/N", kind="shard", shown="1/1, all of them")
    """(K, N): this run plays the K-th of N disjoint slices."""
    seller_timeout: float = _timeout_flag("seconds a seller may think before losing the turn")
    """Seconds a seller may think before losing the turn."""
    reply_timeout: float = _timeout_flag("seconds a buyer may think before its silence counts as a reject")
    """Seconds a buyer may think before its silence counts as a reject."""
    fresh: bool = _flag(False, "ask the seller only once every scripted buyer has answered it: a model then decides on the "
                               "state its message lands in, and plays the game a scripted seller plays", kind="switch", shown="")
    """``--fresh``: the seller is asked for a message only once every scripted buyer has answered (see
    :mod:`negotiate.bus`); recorded as ``fresh`` in each ``episode_start``."""
    run_id: str = _flag("", "the run's id, made by the command that starts it (no command takes it)", commands=())
    """Names the run in every episode it writes (``run`` in ``episode_start``), so a report tells
    separate runs of the same seeds apart (``serve``, then ``eval``) while a run's shards merge.
    Runs written before run ids have none."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict, source: str) -> RunConfig:
        try:
            data = dict(data)
            data["sellers"] = tuple(data["sellers"])
            data["shard"] = tuple(data["shard"])
            config = cls(**data)
        except (KeyError, TypeError, ValueError) as error:
            raise UserError(f"not a run config ({error})", source=source) from None
        config.check_counts(source)
        return config

    def check_counts(self, source: str) -> None:
        """The counts a run is made of, each a whole number its flag would take (a ``run.json`` edited by hand, say):
        episodes and group from 1 to :data:`~negotiate.settings.COUNT_MOST`, the seed a 64-bit one, the shard K/N with
        1 <= K <= N <= ``COUNT_MOST``; one line naming ``source``, the key and the value otherwise (``episodes`` of
        2**63 was an ``OverflowError`` traceback on ``--resume``)."""
        for name in ("episodes", "group", "seed"):
            value = getattr(self, name)
            try:
                read_value(_FLAGS[name], value)
            except ValueError as error:
                raise UserError(str(error), source=source, field=name, value=value) from None
        try:
            read_shard("/".join(map(str, self.shard)) if len(self.shard) == 2 and all(type(v) is int for v in self.shard) else "")
        except ValueError as error:
            raise UserError(str(error), source=source, field="shard", value=list(self.shard)) from None

    def trace_name(self, seller: str) -> str:
        k, n = self.shard
        return f"{slug(seller)}.jsonl" if n == 1 else f"{slug(seller)}.shard-{k}-of-{n}.jsonl"

    def indices(self) -> range:
        k, n = self.shard
        return range(k - 1, self.episodes, n)


@dataclass(frozen=True)
class RunOptions:
    """How a run is played, not what it is (not saved: a resumed run may change them). Each field is a setting of
    ``serve``, ``collect`` and ``eval``, like :class:`RunConfig`'s."""

    concurrency: int = _flag(256, "episodes in flight at once", kind="count")
    workers: int = _flag(1, "worker processes (default: {default}): each plays a share of the episodes on its own core, with its "
                            "share of --concurrency and --max-inflight; one process tops out near 1,500 model requests/s; with --executor ray, "
                            "Ray tasks", kind="count")
    executor: str = _flag("local", "where the workers play: local (processes on this machine) or ray (tasks on the Ray cluster "
                                   "at --address; the ray extra)", metavar="local|ray")
    address: str = _flag("", "the Ray cluster of --executor ray: auto (one started by ray start), ray://HOST:10001, or local "
                             "(a new one for this run); default: Ray's own, RAY_ADDRESS or a cluster on this machine, else a new one",
                         metavar="ADDR", shown="")
    max_inflight: int | None = _flag(None, "model requests in flight per server (openai: specs), overriding their max_inflight; "
                                           "the agents' timeouts include the wait for a slot", metavar="N", kind="count", shown="")
    fsync: bool = _flag(False, "fsync after every episode (survives power loss, slower)", commands=("serve", "collect"),
                        kind="switch", shown="")


_FLAGS = {item.name: item.metadata["flag"] for item in fields(RunConfig)}
"""Each :class:`RunConfig` field's :class:`~negotiate.settings.Flag`: how its value is read."""

RUN_SETTINGS = (RunConfig, RunOptions)
"""The settings of ``serve``, ``collect`` and ``eval``: what a run is, and how it is played."""


@dataclass(frozen=True)
class EpisodePlan:
    """Episode ``index`` of a run, built and not yet played: its market, agents, labels and deadlines."""

    index: int
    market: Market
    seller: object
    """The seller agent (anything with ``act``)."""
    buyers: dict
    """Buyer id -> agent."""
    episode_id: str
    labels: dict
    """What ``episode_start`` records about the run (``run``, ``run_seed``, ``index``, ``seed``, ``seller``, ...)."""
    seller_timeout: float
    reply_timeout: float
    fresh: bool = False
    """The seller is asked only once every scripted buyer has answered (``--fresh``)."""

    async def play(self, *, opt_value=None, state=None) -> Episode:
        """Play the episode to its end (``run_episode``); ``state`` is a caller's own ``EpisodeState`` (the UI's)."""
        return await run_episode(self.market, self.seller, self.buyers, episode_id=self.episode_id, labels=self.labels,
                                 seller_timeout=self.seller_timeout, reply_timeout=self.reply_timeout, opt_value=opt_value,
                                 state=state, fresh=self.fresh)


@dataclass
class Run:
    """One run: its config, market spec and buyers, the model pools and trace writers it owns, and
    :meth:`episode`, the one way to build its episode ``i``.

    ``async with Run(config) as run:`` installs the run's pools for the task (agents built inside
    take them) and closes the trace files and this loop's HTTP clients on the way out. Pools given
    by the caller (``pools=``) may serve several runs (an evaluation's splits share loaded models);
    the run still closes the clients it opened on its loop.
    """

    config: RunConfig
    spec: MarketSpec | None = None
    """The market spec; by default ``resolve_spec(config.split)``."""
    buyers: AgentSpec | None = None
    """The parsed buyer spec; by default ``parse_agent(config.buyers, "buyer")``."""
    pools: Pools = field(default_factory=Pools)
    out: Path | None = None
    """Trace folder: :meth:`write` appends each seller's episodes to ``out / config.trace_name(seller)``."""
    fsync: bool = False
    _writers: dict = field(default_factory=dict, init=False, repr=False)
    _scope: object = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.spec is None:
            self.spec = resolve_spec(self.config.split)
        if self.buyers is None:
            self.buyers = parse_agent(self.config.buyers, "buyer")

    # -- the one way to build an episode ------------------------------------------------------------

    def market(self, index: int) -> Market:
        """The market of episode ``index`` (shared by the ``group`` episodes of its group)."""
        return generate(self.spec, market_seed(self.config.seed, index // self.config.group))

    def repeat(self, index: int) -> int | None:
        """Episode ``index``'s repeat within its group; None outside groups."""
        return index % self.config.group if self.config.group > 1 else None

    def labels(self, seller: str, index: int, market: Market) -> dict:
        """The labels ``episode_start`` records for episode ``index`` played by ``seller``."""
        config = self.config
        labels = {"run": config.run_id} if config.run_id else {}
        labels |= {"run_seed": config.seed, "index": index, "seed": market.seed, "seller": seller, "buyers": self.buyers.text}
        if config.group > 1:
            labels["group"], labels["repeat"] = config.group, index % config.group
        if config.fresh:
            labels["fresh"] = True
        return labels

    def episode(self, seller, index: int, *, episode_id: str | None = None) -> EpisodePlan:
        """Episode ``index`` played by ``seller``: an :class:`AgentSpec`, or anything with ``text`` and
        ``build(market, seed, pools)`` (the trainer's in-memory policy). ``episode_id`` replaces the
        usual ``<seller slug>-<index:06d>`` (the trainer names its rollouts by market and repeat)."""
        market = self.market(index)
        seller_agent, buyers = self.agents(market, seller, repeat=self.repeat(index))
        return EpisodePlan(
            index=index, market=market, seller=seller_agent, buyers=buyers,
            episode_id=episode_id or f"{slug(seller.text)}-{index:06d}",
            labels=self.labels(seller.text, index, market),
            seller_timeout=self.config.seller_timeout, reply_timeout=self.config.reply_timeout, fresh=self.config.fresh,
        )

    def agents(self, market: Market, seller=None, *, repeat: int | None = None, skip: str | None = None) -> tuple[object, dict]:
        """The seller (None when ``seller`` is None: a person takes the seat) and the buyers of ``market``,
        seeded by the run's conventions, with the run's pools; ``skip`` leaves a buyer's seat to a person.
        :meth:`episode` uses it for the run's own markets; a play session for the market a person chose."""
        seller_agent = None if seller is None else seller.build(market, seller_seed(market.seed, repeat), self.pools)
        return seller_agent, build_buyers(market, self.buyers, pools=self.pools, skip=skip)

    # -- what the run writes ------------------------------------------------------------------------

    def trace(self, seller: str) -> TraceWriter:
        """``seller``'s trace writer, ``out / config.trace_name(seller)`` (opened on first use, closed with the run)."""
        writer = self._writers.get(seller)
        if writer is None:
            self.out.mkdir(parents=True, exist_ok=True)
            writer = self._writers[seller] = TraceWriter(self.out / self.config.trace_name(seller), fsync=self.fsync)
        return writer

    def write(self, seller: str, events: list[dict]) -> None:
        """Append one finished episode to ``seller``'s trace file."""
        self.trace(seller).write(events)

    async def __aenter__(self) -> Run:
        self._scope = use_pools(self.pools)
        self._scope.__enter__()
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()
            await self.pools.aclose()
        finally:
            self._scope.__exit__(*exc)
            self._scope = None
