"""Training data from traces: every seller decision, its episode's reward, and its group.

A :class:`Decision` is one seller message: the prompt exactly as the model saw it (chat
messages), the completion (the model's raw text), and, where the trace logged them, the
prompt's and completion's token ids and the completion's log-probs.

Sellers that do not log a prompt (scripted sellers, people at the TUI) are replayed: the
episode's events are fed back through the regulator (:func:`replay`), and before each
seller message the seller's observation is rendered with the LLM prompt
(``render_seller``), and its message written in the four-part tagged form an LLM would
write (``render_tagged``). A parse failure keeps its raw text.

A **group** is the set of episodes played on one market instance (same spec and seed),
e.g. ``negotiate collect --group 8``; group-relative advantages (:func:`advantages`)
compare strategies on the same market, not luck of the draw.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from negotiate.agents.planner import read_reason, reason_action
from negotiate.errors import UserError
from negotiate.market import Market, MarketSpec
from negotiate.protocol import SELLER, SELLER_ACTIONS, Action, Message, ParseFailure, render_tagged
from negotiate.regulator import EpisodeState, SellerObservation
from negotiate.trace import EpisodeRecord, EpisodeStart, Event, EventType, MessageEvent, parse_event, read_records, trace_files

from negotiate.training.rewards import DEFAULT_REWARD, reward_fn

__all__ = ["Decision", "ScoredEpisode", "load_episodes", "decisions", "teacher_decisions", "teacher_agreement", "Agreement", "check_teacher", "parse_action_weights", "format_action_weights", "replay", "group_key", "advantages", "DataFilter"]


@dataclass(frozen=True)
class Decision:
    """One seller message, as a training example."""

    episode: str
    """The episode id (``greedy-000042``), unique within a trace folder."""
    group: str
    """The market instance: a hash of the spec and the market seed."""
    turn: int
    """The seller turn this message spent (1-based)."""
    prompt: list[dict]
    """The chat messages the seller saw (system, user)."""
    completion: str
    """What the seller wrote: a model's raw text, or a scripted message rendered as tagged text."""
    reward: float
    """The episode's reward."""
    valid: bool
    """Whether the message parsed and kept the rules."""
    prompt_ids: list[int] | None = None
    """Token ids of the prompt as the model saw it (model sellers that logged them)."""
    completion_ids: list[int] | None = None
    """Token ids of the completion, stop token included."""
    logprobs: list[float] | None = None
    """Log-prob of each completion token under the policy that sampled it."""
    action: str | None = None
    """The kind of the message's action (offer, accept, reject, end); None where it did not parse."""


@dataclass
class ScoredEpisode:
    """An episode as training data: its labels, reward and decisions, and the episode itself."""

    id: str
    group: str
    """The market instance (:func:`group_key`)."""
    seller: str
    split: str
    reward: float
    metrics: dict
    """The live metrics the trace recorded."""
    decisions: list[Decision] = field(default_factory=list)
    record: EpisodeRecord | None = None
    """The episode's trace (None for one written by hand, as in :func:`advantages`' doctest)."""

    @classmethod
    def scored(cls, record: EpisodeRecord, group: str, reward: float, decisions: list[Decision]) -> ScoredEpisode:
        start = record.start
        return cls(record.id, group, start.seller or "", start.split or "", reward, record.metrics or {}, decisions, record)


Episode = ScoredEpisode
"""The former name of :class:`ScoredEpisode`, kept for old imports (``negotiate.Episode`` is an episode's trace)."""


@dataclass(frozen=True)
class DataFilter:
    """Which episodes become training data."""

    split: str | None = None
    """Keep this split only (``train``...)."""
    seller: str | None = None
    """Keep episodes of this seller spec only (as written in the trace, e.g. ``greedy``)."""
    min_group: int = 1
    """Drop groups with fewer complete episodes."""

    def keep(self, start: EpisodeStart) -> bool:
        return (self.split is None or start.split == self.split) and (self.seller is None or start.seller == self.seller)


def group_key(start: EpisodeStart | dict) -> str:
    """The market instance of an episode: spec and market seed (episodes of one group share it).

    >>> a = EpisodeStart(spec={"name": "train", "buyers": 2}, seed=7)
    >>> group_key(a) == group_key({"spec": {"name": "train", "buyers": 2}, "seed": 7}) != group_key(EpisodeStart(spec=a.spec, seed=8))
    True
    """
    if not isinstance(start, EpisodeStart):
        start = parse_event({**start, "type": EventType.EPISODE_START})
    blob = orjson.dumps({"spec": start.spec, "seed": start.seed}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha1(blob).hexdigest()[:16]


def _message(event: MessageEvent) -> Message | ParseFailure:
    if event.action is None:
        return ParseFailure(event.error or "unparseable", event.raw or "")
    return Message(event.sender, event.to, event.talk or "", Action(event.kind, event.product, event.price), event.thought or "")


def replay(events: Sequence[Event | dict] | EpisodeRecord) -> tuple[list[tuple[SellerObservation, MessageEvent]], EpisodeState]:
    """Feed an episode's messages back through the regulator: (the seller's observation before
    each seller message, that message's event) in order, and the final state. The regulator is
    deterministic, so the replay reaches the recorded states (the tests check that the replayed
    events equal the trace's). A timeout is replayed from its ``timeout_s`` (schema 1: from its text)."""
    episode = events if isinstance(events, EpisodeRecord) else EpisodeRecord.of(events)
    start = episode.start
    market = Market.from_dict(MarketSpec.model_validate(start.spec), start.market)
    state = EpisodeState(market, clock=lambda: 0.0, episode=start.episode)
    seen: list[tuple[SellerObservation, MessageEvent]] = []
    for event in episode.messages():
        if event.sender == SELLER:
            seen.append((state.seller_observation(consume=True), event))
            if event.timed_out:
                state.seller_timeout(event.timeout_s)
            else:
                state.seller_send(_message(event), raw=event.raw)
        elif event.timed_out:
            state.buyer_timeout(event.sender, event.timeout_s)
        else:
            state.buyer_reply(event.sender, _message(event), raw=event.raw)
    return seen, state


def _completion(event: MessageEvent) -> str:
    if event.raw is not None:
        return event.raw
    if event.action is None:
        return ""
    return render_tagged(_message(event))


def _advised(episode: EpisodeRecord, prompt: str):
    """(observation, the seller's message event, the advice there) for each seller message of ``episode``: the
    messages the prompt view's tools would send there, each walking the episode as a teacher does (one tool: its
    message, as the ``advice`` prompt's planner; several: a tuple, as under ``tools``), None for a view that shows none."""
    from negotiate.agents.views import view

    tools = view(prompt).tools
    if not tools:
        return ((obs, event, None) for obs, event in replay(episode)[0])
    if len(tools) == 1:
        return _teacher_walk(episode, tools[0])
    walks = [_teacher_walk(episode, tool) for tool in tools]  # each tool walks the episode; the prompt shows what each would send
    return ((steps[0][0], steps[0][1], tuple(label for _, _, label in steps)) for steps in zip(*walks))


def decisions(events: Sequence[Event | dict] | EpisodeRecord, reward: float, group: str, *, fmt: str = "tagged",
              prompt: str = "full") -> list[Decision]:
    """The seller decisions of one episode (timeouts skipped: the seller wrote nothing). A model's decisions keep
    the prompt it saw; a scripted seller's are rendered with the ``full``, ``compact``, ``facts``, ``advice`` or ``tools`` prompt."""
    from negotiate.agents.views import render_seller  # prompt files: loaded only when building data

    episode = events if isinstance(events, EpisodeRecord) else EpisodeRecord.of(events)
    out: list[Decision] = []
    sent = episode.seller_messages()
    logged = any((e.extra or {}).get("prompt") for e in sent)
    source = ((None, e, None) for e in sent) if logged else _advised(episode, prompt)
    for obs, event, advice in source:
        if event.timed_out:
            continue
        extra = event.extra or {}
        messages = extra.get("prompt") if logged else render_seller(obs, fmt, prompt, advice)
        if not messages:
            continue
        tokens = {"prompt_ids": extra.get("prompt_token_ids"), "completion_ids": extra.get("token_ids"), "logprobs": extra.get("logprobs")}
        if logged and extra.get("reasks"):
            # The final reply answered the re-ask conversation: learn it as the answer to the original
            # prompt (re-tokenized), without log-probs that belong to another context.
            messages = messages[:2]
            tokens = {}
        out.append(Decision(
            episode=episode.id, group=group, turn=int(event.turn or 0), prompt=list(messages),
            completion=_completion(event), reward=reward, valid=bool(event.valid),
            action=event.kind if event.action is not None else None, **tokens,
        ))
    return out


def parse_action_weights(text: str, *, flag: str = "--action-weights") -> dict[str, float]:
    """``accept=4,end=2`` as ``{kind: weight}``: the loss weight of an imitated seller decision by the kind of
    its action (a kind not named weighs 1). A one-line :class:`UserError` naming ``flag`` for anything else.

    >>> parse_action_weights("accept=4, end=0.5")
    {'accept': 4.0, 'end': 0.5}
    >>> parse_action_weights("")
    {}
    """
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, value = (x.strip() for x in part.partition("="))
        if not sep:
            raise UserError(f"{part!r} is not kind=weight (e.g. accept=4)", field=flag, value=text)
        if kind not in SELLER_ACTIONS:
            raise UserError(f"{kind!r} is not a seller action; choose from {', '.join(SELLER_ACTIONS)}", field=flag, value=text)
        if kind in weights:
            raise UserError(f"{kind!r} is given twice", field=flag, value=text)
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not (0 < weight < math.inf):
            raise UserError(f"the weight of {kind!r} must be a number above 0, not {value!r}", field=flag, value=text)
        weights[kind] = weight
    return weights


def format_action_weights(weights: dict[str, float]) -> str:
    """The one spelling of ``weights``: kinds in the protocol's order, weights of 1 left out (so ``accept=4.0``,
    ``accept=4,offer=1`` and ``accept=4`` are one setting).

    >>> format_action_weights(parse_action_weights("end=2, offer=1, accept=4.0"))
    'accept=4,end=2'
    """
    return ",".join(f"{kind}={weights[kind]:g}" for kind in SELLER_ACTIONS if weights.get(kind, 1.0) != 1.0)


def check_teacher(teacher: str):
    """The parsed spec of a scripted seller that can label another seller's states (it has ``follow``);
    a one-line :class:`UserError` naming ``--teacher`` otherwise."""
    from negotiate.agents.registry import parse_agent
    from negotiate.agents.scripted import SELLERS

    if ":" in teacher.split("?")[0]:  # a model backend (hf:, vllm:, openai:): refused before its extras are looked for
        raise UserError("a teacher is a scripted seller", field="--teacher", value=teacher)
    spec = parse_agent(teacher, "seller", field_name="--teacher")
    if not hasattr(SELLERS[spec.name], "follow"):
        able = ", ".join(name for name, cls in SELLERS.items() if hasattr(cls, "follow"))
        raise UserError(f"this seller cannot follow another seller's episode; choose from {able}", field="--teacher", value=teacher)
    return spec


def _teacher_walk(episode: EpisodeRecord, teacher: str):
    """(observation, the seller's message event, the teacher's reply there or None where it would wait) for each
    seller message of ``episode``. The teacher walks the episode: before each seller message a copy of it decides
    (so its own choice leaves no trace), then it learns from that message as if it had sent it."""
    import copy

    from negotiate.run import seller_seed

    start = episode.start
    market = Market.from_dict(MarketSpec.model_validate(start.spec), start.market)
    agent = check_teacher(teacher).build(market, seller_seed(market.seed))
    for obs, event in replay(episode)[0]:
        label = copy.deepcopy(agent).decide(obs)
        agent.follow(obs, _message(event) if event.valid and event.action is not None and not event.timed_out else None)
        yield obs, event, label


def teacher_decisions(events: Sequence[Event | dict] | EpisodeRecord, teacher: str, reward: float, group: str, *,
                      fmt: str = "tagged", prompt: str = "full") -> list[Decision]:
    """The seller decisions of one episode, each answered by a scripted ``teacher`` (a seller spec such as
    ``greedy``) instead of by the seller that played it: on-policy states, the teacher's labels (DAgger).

    The teacher walks the episode (:func:`_teacher_walk`). The prompt is the one the seller saw where the
    trace logged it, else rendered (``render_seller``); the completion is the teacher's message as tagged
    text. States where the teacher would wait (it returns nothing) give no decision. ``valid`` is True: a
    scripted seller keeps the rules."""
    from negotiate.agents.views import render_seller

    episode = events if isinstance(events, EpisodeRecord) else EpisodeRecord.of(events)
    out: list[Decision] = []
    logged = any((e.extra or {}).get("prompt") for e in episode.seller_messages())
    # The advice prompt of a state nobody logged: the adviser walks the episode too (a policy's episodes log theirs)
    from negotiate.agents.views import view

    rendered = bool(view(prompt).tools) and not logged
    advised = (advice for _, _, advice in _advised(episode, prompt)) if rendered else itertools.repeat(None)
    for obs, event, label in _teacher_walk(episode, teacher):
        advice = next(advised)
        if label is None or event.timed_out:
            continue
        extra = event.extra or {}
        messages = list(extra["prompt"][:2]) if extra.get("prompt") else render_seller(obs, fmt, prompt, advice)
        out.append(Decision(episode=episode.id, group=group, turn=int(event.turn or 0), prompt=messages,
                            completion=render_tagged(label), reward=reward, valid=True, action=label.action.kind))
    return out


WAIT = "wait"
"""The teacher's row where it would have sent nothing."""


@dataclass
class Agreement:
    """A seller's messages against what a scripted teacher would have sent in the same states (:func:`teacher_agreement`)."""

    kinds: Counter = field(default_factory=Counter)
    """(the teacher's action kind or ``wait``, the seller's action kind, ``invalid`` or ``timeout``): states."""
    both_offered: int = 0
    """States where both offered."""
    same_offer: int = 0
    """Of those, the states where both offered the same product to the same buyer."""
    price_gap: int = 0
    """Sum of |seller's price - teacher's price| over those."""
    reasons: Counter = field(default_factory=Counter)
    """Against a teacher that gives its reasons (``planner?reasons=1``), over the states where it would have spoken
    and the seller sent a valid message (``states``): ``is_reason`` (the seller's thought is a reason, of those),
    ``facts``, ``turns`` (turns left and buyers) and ``verdict`` (the same as the teacher's), ``buyer`` (the seller
    wrote to the buyer the teacher would have), ``buyer_reason`` (of those, its thought is a reason), ``buyer_facts``
    (of those, its facts are the teacher's: where they differ, a misreading, not another choice of buyer), and
    ``follows`` (the seller's action is the kind its own verdict leads to, of ``is_reason``)."""

    @property
    def states(self) -> int:
        return sum(self.kinds.values())

    @property
    def same_kind(self) -> int:
        return sum(n for (teacher, seller), n in self.kinds.items() if teacher == seller)

    @property
    def spoken(self) -> int:
        """The states where the teacher would have sent a message (not ``wait``): the share of the same kind is of these."""
        return sum(n for (teacher, _), n in self.kinds.items() if teacher != WAIT)


def tool_choices(paths: Iterable[str | Path], *, allow_partial: bool = False) -> dict[str, Counter]:
    """Each seller's messages in the complete episodes under ``paths``, against the two messages the ``tools`` prompt
    shows in each state (:data:`~negotiate.agents.llm.TOOLS` walking the episode): per seller, a count of ``both`` (the
    tools agreed and it sent that), ``("planner", kind)`` (it sent the planner's message where greedy's differed and was
    of ``kind``, or ``wait``), ``("greedy", kind)`` (it sent greedy's, of ``kind``, where the planner's differed),
    ``neither``, and ``invalid`` (or ``timeout``). What a policy trained under the tools prompt learned to follow."""
    out: dict[str, Counter] = {}
    for path in trace_files(paths):
        for record in read_records(path, allow_partial=allow_partial):
            if not record.complete or record.failed:
                continue
            tally = out.setdefault(record.start.seller or "", Counter())
            try:
                walked = list(_advised(record, "tools"))
            except (RuntimeError, ValueError, KeyError, TypeError) as error:  # the regulator cannot replay what the trace says
                raise UserError(f"episode {record.id} cannot be replayed ({error})", source=str(path)) from None
            for _, event, (planner, greedy) in walked:
                if event.timed_out or not event.valid or event.action is None:
                    tally["timeout" if event.timed_out else "invalid"] += 1
                    continue
                sent = (event.to, Action(event.kind, event.product, event.price))
                same = [tool is not None and (tool.to, tool.action) == sent for tool in (planner, greedy)]
                tally["both" if all(same) else ("planner", WAIT if greedy is None else greedy.action.kind) if same[0]
                      else ("greedy", greedy.action.kind) if same[1] else "neither"] += 1
    return out


def teacher_agreement(paths: Iterable[str | Path], teacher: str, *, allow_partial: bool = False) -> dict[str, Agreement]:
    """Each seller's messages in the complete episodes under ``paths`` (by the seller label the trace gives), against
    the reply a scripted ``teacher`` would have sent in each of those states (:func:`_teacher_walk`): which action
    kind it would have chosen, and where both offered, whether to the same buyer and product and at what price gap.
    This is the measure of imitation on the policy's own states: where a trained seller departs from its teacher.
    Failed episodes are left out, as the metrics tables leave them; an episode the regulator cannot replay is
    a one-line :class:`UserError` naming the file."""
    check_teacher(teacher)
    out: dict[str, Agreement] = {}
    for path in trace_files(paths):
        for record in read_records(path, allow_partial=allow_partial):
            if not record.complete or record.failed:  # as the metrics tables: a failed episode is not scored
                continue
            tally = out.setdefault(record.start.seller or "", Agreement())
            try:
                walked = list(_teacher_walk(record, teacher))
            except (RuntimeError, ValueError, KeyError, TypeError) as error:  # the regulator cannot replay what the trace says
                raise UserError(f"episode {record.id} cannot be replayed ({error})", source=str(path)) from None
            for _, event, label in walked:
                mine = "timeout" if event.timed_out else "invalid" if not event.valid or event.action is None else str(event.kind)
                theirs = WAIT if label is None else label.action.kind
                tally.kinds[(theirs, mine)] += 1
                if label is not None and label.thought and mine not in ("timeout", "invalid"):
                    _tally_reasons(tally.reasons, read_reason(label.thought), read_reason(event.thought or ""), mine,
                                   event.to == label.to)
                if theirs == mine == "offer":
                    tally.both_offered += 1
                    if label.to == event.to and label.action.product == event.product:
                        tally.same_offer += 1
                        tally.price_gap += abs(int(event.price) - int(label.action.price))
    return out


def _tally_reasons(tally: Counter, theirs: tuple | None, mine: tuple | None, kind: str, same_buyer: bool) -> None:
    if theirs is None:
        return
    tally["states"] += 1
    tally["buyer"] += same_buyer
    if mine is None:
        return
    tally["is_reason"] += 1
    for k, name in enumerate(("facts", "turns", "verdict")):
        tally[name] += mine[k] == theirs[k]
    tally["buyer_reason"] += same_buyer
    tally["buyer_facts"] += same_buyer and mine[0] == theirs[0]
    tally["follows"] += reason_action(mine[2]) == kind


def load_episodes(paths: Iterable[str | Path], *, reward: str = DEFAULT_REWARD, where: DataFilter = DataFilter(),
                  fmt: str = "tagged", prompt: str = "full", teacher: str | None = None) -> list[ScoredEpisode]:
    """Every complete, scorable episode under ``paths`` (files or folders) that passes ``where``, with its decisions
    (with a ``teacher``, the teacher's answers in the episode's states: :func:`teacher_decisions`)."""
    score = reward_fn(reward)
    episodes: list[ScoredEpisode] = []
    seen: set[tuple] = set()
    for path in trace_files(paths):
        for record in read_records(path, allow_partial=True):
            start = record.start
            if not record.complete or not where.keep(start):
                continue
            value = score(record.events)
            if value is None:
                continue
            # an episode is its run's, seller's, run seed's and split's index (as report reads runs): an eval's splits
            # number their episodes alike, and are different episodes
            key = (start.run or "", start.seller or "", start.run_seed, start.split,
                   record.id if start.index is None else start.index)
            if key in seen:
                raise UserError("the same episode appears twice (a trace folder merged with itself?)", source=str(path),
                                field="episode", value=record.id)
            seen.add(key)
            group = group_key(start)
            made = (decisions(record, value, group, fmt=fmt, prompt=prompt) if teacher is None
                    else teacher_decisions(record, teacher, value, group, fmt=fmt, prompt=prompt))
            episodes.append(ScoredEpisode.scored(record, group, value, made))
    sizes = defaultdict(int)
    for ep in episodes:
        sizes[ep.group] += 1
    return [ep for ep in episodes if sizes[ep.group] >= where.min_group]


def by_group(episodes: Sequence[ScoredEpisode]) -> dict[str, list[ScoredEpisode]]:
    """The episodes of each group (one market instance), in their order."""
    groups: dict[str, list[ScoredEpisode]] = defaultdict(list)
    for ep in episodes:
        groups[ep.group].append(ep)
    return groups


def advantages(episodes: Sequence[ScoredEpisode], *, scale: bool = True, eps: float = 1e-6) -> dict[str, float]:
    """Group-relative advantage of each episode: its reward minus its group's mean, divided by
    the group's standard deviation (population) when ``scale``. A group of one, or one whose
    rewards are all equal, gives 0 to each of its episodes.

    >>> eps = [ScoredEpisode("a", "g", "s", "t", 1.0, {}), ScoredEpisode("b", "g", "s", "t", 0.0, {}), ScoredEpisode("c", "h", "s", "t", 0.5, {})]
    >>> advantages(eps)  # group g: mean 0.5, sd 0.5
    {'a': 1.0, 'b': -1.0, 'c': 0.0}
    """
    out: dict[str, float] = {}
    for members in by_group(episodes).values():
        rewards = [ep.reward for ep in members]
        mean = sum(rewards) / len(rewards)
        sd = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        for ep in members:
            gap = ep.reward - mean
            out[ep.id] = 0.0 if sd < eps else (gap / sd if scale else gap)
    return {k: round(v, 6) for k, v in out.items()}
