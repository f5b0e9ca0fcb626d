"""The menu's teacher: each option of each state a seller visited, valued by replaying the market.

At a seller decision of a recorded episode the teacher rebuilds the state, lays out the menu the seller saw
(``negotiate.agents.menu``), and for every option forks the episode there (``negotiate.rollout``): the option is sent,
then a continuation seller plays on to the end, and the option's value is the episode's profit over OPT. The buyers
are the trace's own, rebuilt from their seeds and walked through the episode (each reply they give on the way is
checked against the trace, so a replay starts from the buyers' true state), and the continuation has followed every
message the episode's seller sent. So a value is exact for that market: the profit that move, then the continuation,
makes there (AggreVaTe's cost-to-go of an expert, Ross and Bagnell 2014, arXiv 1406.5979; docs/engineering-notes.md).

**Privilege.** A replay reads the buyers' answers, so their values and strategies, which the seller never sees. That is
training-time privilege only: the labels (:class:`Labelled`) carry it; a policy reads its prompt (the state and the
menu), and every evaluation plays markets the teacher never replayed. The continuation may be chosen by the buyers'
kind (``continuation`` maps a buyer spec to a seller), a privilege of the same sort: it fixes whose moves the labels
improve on, one step each.

The labels feed the menu trainer (``negotiate.training.teach``; its losses are in ``negotiate.training.menu_model``):
cross-entropy toward the best option weighted by what the chosen one gives up (regret), and a policy-gradient step over
the options with the values as advantages.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass

from negotiate.agents.menu import TOOLS, Menu, Move, build_menu, render_menu
from negotiate.agents.registry import adviser, parse_agent
from negotiate.market import Market, MarketSpec
from negotiate.metrics import opt
from negotiate.protocol import SELLER, Action, Message, ParseFailure
from negotiate.regulator import EpisodeState, SellerObservation
from negotiate.rollout import play_out, profit
from negotiate.run import build_buyers, seller_seed
from negotiate.trace import EpisodeRecord, MessageEvent

__all__ = ["Labelled", "Point", "walk", "label_episode", "value_options", "CONTINUATION", "continuation_for"]

CONTINUATION = {"concession": "rule?tools=greedy|planner?reasons=1&accept=planner", "threshold": "planner"}
"""The continuation seller per buyer kind, by default: the best fixed rule over the tools on that kind's training
markets (docs/experiments/rule-baselines.md: greedy's message, the planner's where greedy would accept, against
conceding buyers; the planner against threshold buyers). Others: the planner."""


def continuation_for(buyers: str, table: Mapping[str, str] | None = None) -> str:
    """The continuation seller's spec for episodes against ``buyers`` (a buyer spec; its name picks the entry)."""
    table = CONTINUATION if table is None else table
    return table.get(buyers.split("?")[0], table.get("*", "planner"))


@dataclass(frozen=True)
class Labelled:
    """One seller decision, its menu, and each option's replayed value."""

    episode: str
    """The episode's id."""
    group: str
    """The market: ``<split>/<market seed>`` (decisions of one market are not independent)."""
    buyers: str
    """The buyer spec of the market (a training-time fact: the policy never reads it)."""
    turn: int
    """Seller turns spent before this decision."""
    prompt: list[dict]
    """What a menu policy reads here (:func:`~negotiate.agents.menu.render_menu`): the state and the options."""
    options: list[str]
    """The menu's lines, in order (``A: offer b1 p2 $640 (planner: offer)``)."""
    values: list[float | None]
    """Each option's profit/OPT when it is sent and the continuation plays on (None: not replayable, ``wait``)."""
    chosen: int | None
    """The option the episode's seller sent (None: its message was not on the menu, or timed out)."""
    planner: int | None
    """The option the planner proposed."""
    greedy: int | None
    """The option greedy proposed."""
    probs: list[float] | None = None
    """The policy's probability of each option when it chose, where its trace recorded them."""

    @property
    def best(self) -> int:
        """The option of the highest value (the first of equals: the menu's order)."""
        return max(range(len(self.values)), key=lambda i: -math.inf if self.values[i] is None else self.values[i])

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Labelled:
        return cls(**data)


@dataclass
class Point:
    """A seller decision of a walked episode: the state before it and everything a replay from there needs."""

    state: EpisodeState
    """A fork of the state at the decision (the seller's observation already read)."""
    obs: SellerObservation
    menu: Menu
    buyers: dict
    """The buyers as they stand (forks: the walk goes on with its own)."""
    continuation: object
    """The continuation seller, having followed every message sent before this decision (a fork)."""
    event: MessageEvent
    """The message the episode's seller sent here."""
    sent: Message | ParseFailure | None


def _message(event: MessageEvent) -> Message | ParseFailure | None:
    if event.timed_out:
        return None
    if event.action is None:
        return ParseFailure(event.error or "unparseable", event.raw or "")
    return Message(event.sender, event.to, event.talk or "", Action(event.kind, event.product, event.price), event.thought or "")


def _same_reply(reply: Message, event: MessageEvent) -> bool:
    action = reply.action if isinstance(reply, Message) else None
    return action is not None and event.action is not None and (action.kind, action.product, action.price) == (event.kind, event.product, event.price)


def walk(record: EpisodeRecord, continuation: str) -> Iterator[Point]:
    """Each seller decision of ``record``, in order, with what a replay from there needs. The buyers are rebuilt from
    the trace's buyer spec and the market's seed and asked each reply again: a reply that differs from the trace's is a
    ``ValueError`` (the buyers cannot be rebuilt: not scripted, or not these). ``continuation``: a seller spec that can
    follow an episode (``planner``, ``rule?...``, ``greedy``)."""
    start = record.start
    if not start.buyers:
        raise ValueError(f"episode {record.id}: its episode_start names no buyers")
    market = Market.from_dict(MarketSpec.model_validate(start.spec), start.market)
    buyers = build_buyers(market, parse_agent(start.buyers, "buyer"))
    if not all(getattr(agent, "instant", False) for agent in buyers.values()):
        raise ValueError(f"episode {record.id}: its buyers ({start.buyers}) are not scripted; a replay needs scripted buyers")
    seed = seller_seed(market.seed, start.repeat)
    tools = adviser(market, seed, TOOLS)
    follower = parse_agent(continuation, "seller").build(market, seed)
    if not hasattr(follower, "follow"):
        raise ValueError(f"continuation {continuation!r} cannot follow an episode")
    state = EpisodeState(market, clock=lambda: 0.0, episode=record.id)
    events = record.messages()
    k = 0
    while k < len(events):
        event = events[k]
        k += 1
        if event.sender != SELLER:
            raise ValueError(f"episode {record.id}: {event.sender} speaks where the seller should (a --fresh episode answers "
                             "each message before the next)")
        obs = state.seller_observation()
        said = tools.advise(obs)
        sent = _message(event)
        yield Point(state.fork(), obs, build_menu(obs, said), {b: copy.deepcopy(a) for b, a in buyers.items()},
                    copy.deepcopy(follower), event, sent)
        message = sent if isinstance(sent, Message) else None
        tools.follow(obs, message)
        follower.follow(obs, message)
        if event.timed_out:
            state.seller_timeout(event.timeout_s)
            continue
        to = state.seller_send(sent, raw=event.raw)
        if to is None:
            continue
        reply = buyers[to].decide(state.buyer_observation(to, sent))
        if k >= len(events) or events[k].sender != to or not _same_reply(reply, events[k]):
            shown = "nothing" if k >= len(events) else f"{events[k].sender} {events[k].kind} {events[k].product} {events[k].price}"
            raise ValueError(f"episode {record.id}, seller turn {state.turns_used}: the rebuilt buyer {to} answers "
                             f"{reply.action if isinstance(reply, Message) else reply}, the trace has {shown}: these are not "
                             f"the trace's buyers ({start.buyers})")
        k += 1
        state.buyer_reply(to, reply)


def value_options(point: Point, best: int) -> list[float | None]:
    """Each option's value at ``point``: profit/OPT (``best``: OPT) of sending it, then the continuation to the end."""
    values: list[float | None] = []
    for i, option in enumerate(point.menu.options):
        if option.move.kind == "wait":  # nothing to wait for in a replay: every reply has landed
            values.append(None)
            continue
        state = point.state.fork()
        seller = copy.deepcopy(point.continuation)
        buyers = {b: copy.deepcopy(a) for b, a in point.buyers.items()}
        message = point.menu.message(i)
        seller.follow(point.obs, message)
        play_out(state, seller, buyers, first=message)
        values.append(profit(state) / best if best > 0 else 0.0)
    return values


def _chosen(point: Point) -> int | None:
    sent = point.sent
    if not isinstance(sent, Message) or not point.event.valid:
        return None
    extra = point.event.extra or {}
    if "choice" in extra and extra.get("options") == point.menu.lines():
        return int(extra["choice"])
    action = sent.action
    if action.kind == "end":
        return point.menu.index(Move("end"))
    return point.menu.index(Move(action.kind, sent.to, action.product, action.price))


def label_episode(record: EpisodeRecord, continuation: str | Mapping[str, str] | None = None, *, value: bool = True) -> list[Labelled]:
    """Every seller decision of ``record`` with its menu valued (:func:`value_options`); ``continuation``: a seller spec,
    or a table from buyer kind to one (default :data:`CONTINUATION`). ``value=False``: the menus alone, no replay (every
    value None): what imitating the planner needs."""
    start = record.start
    spec = continuation if isinstance(continuation, str) else continuation_for(start.buyers or "", continuation)
    market = Market.from_dict(MarketSpec.model_validate(start.spec), start.market)
    best = opt(market)[0]
    out = []
    for point in walk(record, spec):
        extra = point.event.extra or {}
        if extra.get("options") is not None and extra["options"] != point.menu.lines():
            raise ValueError(f"episode {record.id}, seller turn {point.state.turns_used + 1}: the menu rebuilt here differs from "
                             "the one the trace records")
        out.append(Labelled(
            episode=record.id, group=f"{start.split}/{market.seed}", buyers=start.buyers or "", turn=point.state.turns_used,
            prompt=render_menu(point.obs, point.menu), options=point.menu.lines(),
            values=value_options(point, best) if value else [None] * len(point.menu),
            chosen=_chosen(point), planner=point.menu.tagged("planner"), greedy=point.menu.tagged("greedy"),
            probs=extra.get("probs"),
        ))
    return out
