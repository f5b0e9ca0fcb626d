"""The trace schema (``traces/README.md``): every event a typed record, and one episode as their list.

The events are :class:`EpisodeStart`, :class:`MessageEvent`, :class:`ViolationEvent`, :class:`DealEvent`,
:class:`NoticeEvent` and :class:`EpisodeEnd` (:class:`OtherEvent` keeps a newer writer's unknown type);
:class:`EpisodeRecord` is one episode, the one object every reader (metrics, report, training data, the replay)
and the engine share. The regulator builds the records; :mod:`negotiate.trace_store` writes them and
:mod:`negotiate.trace_read` reads them back. Schema 2 keeps schema 1's fields and records a timeout as data
(``error_kind``, ``timeout_s``); :func:`parse_event` still reads schema 1, where a timeout was only English text.

Import these names from :mod:`negotiate.trace`, which re-exports them; this module holds them apart from the
writers and readers so that each part of the trace fits in one read (it was 1,097 lines together).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar

from negotiate.rules import MALFORMED, TIMEOUT  # a message's error_kind is its violation's kind: TIMEOUT, one that never came

__all__ = [
    "SCHEMA_VERSION", "EventType", "Outcome", "EndReason",
    "EpisodeStart", "MessageEvent", "ViolationEvent", "DealEvent", "NoticeEvent", "EpisodeEnd", "OtherEvent", "Event",
    "EpisodeRecord", "parse_event", "as_events", "iter_events",
]

SCHEMA_VERSION = 2
"""Version of the trace schema written by this package. 1: the first; 2: every field written, timeouts as data."""


class EventType(StrEnum):
    """The ``type`` of a trace event (a str: the JSON is the plain name)."""

    EPISODE_START = "episode_start"
    MESSAGE = "message"
    VIOLATION = "violation"
    DEAL = "deal"
    NOTICE = "notice"
    EPISODE_END = "episode_end"


class Outcome(StrEnum):
    """How an episode ended: termination is not truncation, and a failure is neither."""

    TERMINATED = "terminated"
    """The market finished (sold out, no buyers left, the seller ended or went idle)."""
    TRUNCATED = "truncated"
    """The turn budget ran out."""
    FAILED = "failed"
    """An agent raised; the reason says why, and the episode has no metrics."""


class EndReason(StrEnum):
    """Why an episode that did not fail ended (a failed episode's reason is its error's text)."""

    SOLD_OUT = "sold_out"
    NO_BUYERS = "no_buyers"
    SELLER_END = "seller_end"
    SELLER_IDLE = "seller_idle"
    """The seller chose to wait with no reply pending."""
    BUDGET = "budget"




class _Record:
    """Shared by the event records: dict-style access for code written against schema 1's dicts.

    ``event["sender"]``, ``event.get("extra")``, ``"error" in event``, ``dict(event)`` and
    ``event | {...}`` keep working (a field that is None counts as absent, as schema 1 left it
    out); new code reads attributes. Outside this module, nothing in the package uses it.
    """

    type: Any

    def __getitem__(self, key: str):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value) -> None:
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        setattr(self, key, value)

    def get(self, key: str, default=None):
        value = getattr(self, key, None)
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        return getattr(self, key, None) is not None

    def keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def items(self) -> list[tuple[str, Any]]:
        return [(key, getattr(self, key)) for key in self.keys()]

    def __or__(self, other: dict) -> dict:
        """``event | {...}``: the event as a dict, with some fields replaced."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | other


# The records are plain dataclasses, not frozen: a frozen dataclass's __init__ costs 1.2 us more
# per event (measured, 13 fields), on the engine's hot path; nothing changes a record once its
# episode has ended. The four the engine builds per message write their own __init__ (below).
# ``type`` holds the enum's plain string: orjson writes an enum member through its ``.value``, 0.3 us
# more per event (measured), and the string compares equal to the member all the same. Every field
# has a default so that a reader can fill what an older or odd trace lacks (:func:`parse_event`).


@dataclass(kw_only=True, eq=True)
class EpisodeStart(_Record):
    """The first event of an episode: who played which market, with its full private information."""

    type: EventType = EventType.EPISODE_START.value
    episode: str = ""
    """Episode id, ``SELLER-INDEX`` (``greedy-000042``)."""
    schema: int = SCHEMA_VERSION
    """Trace schema version the episode was written with."""
    run: str | None = None
    """The run's id; None in traces before run ids and in ``negotiate play`` episodes."""
    run_seed: int | None = None
    """The run's seed (None when a person played)."""
    index: int | None = None
    """This episode's index in the run."""
    seed: int | None = None
    """The market seed."""
    group: int | None = None
    """Episodes per market (``--group G``); None without groups."""
    repeat: int | None = None
    """This episode's place in its group (``index % group``)."""
    seller: str | None = None
    """The seller's agent spec as given on the command line."""
    buyers: str | None = None
    """The buyers' agent spec."""
    play: str | None = None
    """``buyer`` or ``seller`` when a person played that seat (``negotiate play``)."""
    fresh: bool | None = None
    """True when the seller was asked only once every scripted buyer had answered it (``--fresh``); None otherwise."""
    split: str | None = None
    """The market spec's name."""
    shape: str | None = None
    """``BxP``: buyers x products."""
    tier: str | None = None
    """The price range, ``LOW-HIGH``."""
    spec: dict | None = None
    """The full market spec (``MarketSpec.model_dump``)."""
    market: dict | None = None
    """Full private information (``Market.to_dict``): budget, price range, products, buyers' values."""
    agents: dict | None = None
    """Each agent's own description: ``{"seller": {...}, "buyers": {id: {...}}}``."""
    time: float | None = None
    """Wall-clock start, Unix seconds."""

    OMITTED: ClassVar[tuple[str, ...]] = ("run", "group", "repeat", "play", "fresh")
    """Labels written only where they apply (as schema 1 did): a run without groups has no ``repeat`` key."""

    def json_data(self) -> dict:
        """What :func:`~negotiate.trace.encode` writes: every field, less the :data:`OMITTED` labels that are None."""
        return {k: v for k, v in vars(self).items() if v is not None or k not in self.OMITTED}


@dataclass(init=False, eq=True)
class MessageEvent(_Record):
    """A message as sent, valid or not. ``error``, ``error_kind``, ``timeout_s``, ``raw`` and ``extra``
    are written only when set (as schema 1 did); read, an absent one is None."""

    type: EventType = EventType.MESSAGE.value
    episode: str = ""
    """The episode id."""
    ts: float | None = None
    """Seconds since the episode started."""
    turn: int | None = None
    """The seller turn the message spent (1-based); None for a buyer's reply."""
    sender: str | None = None
    """``seller`` or a buyer id."""
    to: str | None = None
    """The addressee; None when the message did not parse."""
    thought: str | None = ""
    """Private reasoning, never delivered."""
    talk: str | None = ""
    """Public text."""
    action: dict | None = None
    """``{"kind", "product", "price"}``; None when the message did not parse (or never came)."""
    valid: bool | None = True
    """False when the message did not parse, broke a rule or never came: then it had no effect."""
    error: str | None = None
    """Why it is invalid, in words (``KIND: detail``, a parse failure, ``timeout after Ns``)."""
    error_kind: str | None = None
    """Why it is invalid, as data: the violation kind (``malformed``, ``below_cost``...) or ``timeout``."""
    timeout_s: float | None = None
    """For a timeout: the seconds the agent was given."""
    raw: str | None = None
    """The model's text, verbatim (model-backed agents, and every parse failure)."""
    extra: dict | None = None
    """LLM agents: prompt, model, latency, usage, token ids, log-probs... (traces/README.md)."""

    def __init__(self, episode: str = "", ts: float | None = None, turn: int | None = None, sender: str | None = None,
                 to: str | None = None, thought: str | None = "", talk: str | None = "", action: dict | None = None,
                 valid: bool | None = True, error: str | None = None, error_kind: str | None = None,
                 timeout_s: float | None = None, raw: str | None = None, extra: dict | None = None):
        # Written out rather than generated, and called with positional arguments on the engine's path
        # (0.7 against 1.35 us with keywords, measured). The optional fields stay out of the instance
        # when None (their class defaults answer), so orjson, which writes a dataclass's __dict__,
        # leaves them out of the JSON, as schema 1 did: five nulls per message doubled its cost.
        self.type = "message"  # EventType.MESSAGE (a literal: the enum's .value costs 0.15 us a call)
        self.episode, self.ts, self.turn, self.sender, self.to = episode, ts, turn, sender, to
        self.thought, self.talk, self.action, self.valid = thought, talk, action, valid
        if error is not None:
            self.error = error
        if error_kind is not None:
            self.error_kind = error_kind
        if timeout_s is not None:
            self.timeout_s = timeout_s
        if raw is not None:
            self.raw = raw
        if extra is not None:
            self.extra = extra

    @property
    def kind(self) -> str | None:
        """The action's kind (``offer``, ``bid``...), None without an action."""
        return self.action.get("kind") if isinstance(self.action, dict) else None

    @property
    def product(self) -> str | None:
        return self.action.get("product") if isinstance(self.action, dict) else None

    @property
    def price(self) -> int | None:
        return self.action.get("price") if isinstance(self.action, dict) else None

    @property
    def timed_out(self) -> bool:
        return self.error_kind == TIMEOUT


@dataclass(init=False, eq=True)
class ViolationEvent(_Record):
    """A broken rule: the action had no effect (a seller's still cost the turn)."""

    type: EventType = EventType.VIOLATION.value
    episode: str = ""
    ts: float | None = None
    turn: int | None = None
    """Seller turns used when it happened."""
    who: str | None = None
    """``seller`` or a buyer id."""
    kind: str | None = None
    """The violation kind (``negotiate.regulator.VIOLATIONS``)."""
    detail: str | None = None
    """What was wrong, in words."""

    def __init__(self, episode: str = "", ts: float | None = None, turn: int | None = None, who: str | None = None,
                 kind: str | None = None, detail: str | None = None):
        # Written out, and called with positional arguments on the engine's path: a generated keyword
        # __init__ cost 0.3-0.6 us more per event (measured).
        self.type = "violation"
        self.episode, self.ts, self.turn, self.who, self.kind, self.detail = episode, ts, turn, who, kind, detail


@dataclass(init=False, eq=True)
class DealEvent(_Record):
    """A unit sold."""

    type: EventType = EventType.DEAL.value
    episode: str = ""
    ts: float | None = None
    turn: int | None = None
    """Seller turns used when it happened."""
    buyer: str | None = None
    product: str | None = None
    price: int | None = None
    cost: int | None = None
    """The product's unit cost."""
    value: int | None = None
    """The buyer's valuation of the product."""
    by: str | None = None
    """Who accepted: ``seller`` (a bid) or the buyer id (an offer)."""

    def __init__(self, episode: str = "", ts: float | None = None, turn: int | None = None, buyer: str | None = None,
                 product: str | None = None, price: int | None = None, cost: int | None = None, value: int | None = None,
                 by: str | None = None):
        self.type = "deal"
        self.episode, self.ts, self.turn, self.buyer, self.product = episode, ts, turn, buyer, product
        self.price, self.cost, self.value, self.by = price, cost, value, by


@dataclass(init=False, eq=True)
class NoticeEvent(_Record):
    """A runtime notice to one party."""

    type: EventType = EventType.NOTICE.value
    episode: str = ""
    ts: float | None = None
    to: str | None = None
    """``seller`` or a buyer id."""
    kind: str | None = None
    """``deal``, ``sold_out`` or ``violation``."""
    text: str | None = None

    def __init__(self, episode: str = "", ts: float | None = None, to: str | None = None, kind: str | None = None,
                 text: str | None = None):
        self.type = "notice"
        self.episode, self.ts, self.to, self.kind, self.text = episode, ts, to, kind, text


@dataclass(kw_only=True, eq=True)
class EpisodeEnd(_Record):
    """The last event of an episode."""

    type: EventType = EventType.EPISODE_END.value
    episode: str = ""
    outcome: Outcome | str | None = None
    """``terminated``, ``truncated`` or ``failed``."""
    reason: EndReason | str | None = None
    """An :class:`EndReason`, or a failed episode's error."""
    turns_used: int | None = None
    budget: int | None = None
    wall_s: float | None = None
    """Seconds the episode took."""
    metrics: dict | None = None
    """The live metrics (``negotiate.metrics.episode_metrics``); None for a failed episode."""


@dataclass(kw_only=True, eq=True)
class OtherEvent(_Record):
    """An event of a type this reader does not know (a newer writer's): kept, shown, never interpreted."""

    type: str = ""
    data: dict = field(default_factory=dict)
    """The event as read."""

    def get(self, key: str, default=None):
        value = self.data.get(key) if key != "type" else self.type
        return default if value is None else value


Event = EpisodeStart | MessageEvent | ViolationEvent | DealEvent | NoticeEvent | EpisodeEnd | OtherEvent
"""Any trace event."""

_RECORDS: dict[str, type] = {cls.type: cls for cls in (EpisodeStart, MessageEvent, ViolationEvent, DealEvent, NoticeEvent, EpisodeEnd)}
_FIELDS: dict[str, tuple[str, ...]] = {kind: tuple(f.name for f in fields(cls) if f.name != "type") for kind, cls in _RECORDS.items()}
_KIND_PREFIX = re.compile(r"^([a-z_]+): ")


def _upgrade_message(data: dict, event: MessageEvent) -> None:
    """Schema 1 wrote why a message was invalid in words only: recover the kind and a timeout's seconds."""
    error = event.error or ""
    if event.action is None and error.startswith("timeout after "):
        event.error_kind = TIMEOUT
        try:
            event.timeout_s = float(error.removeprefix("timeout after ").rstrip("s"))
        except ValueError:
            pass
    elif event.valid is False and event.action is None:
        event.error_kind = MALFORMED
    elif event.valid is False and (match := _KIND_PREFIX.match(error)):
        event.error_kind = match.group(1)


def parse_event(data: dict) -> Event:
    """One event of a schema 1 or 2 trace as its record. Fields the event lacks are None (the
    engine writes them all; older and hand-made traces may not), unknown fields are dropped, and
    an unknown ``type`` becomes an :class:`OtherEvent`.

    >>> parse_event({"type": "message", "sender": "b1", "action": None, "valid": False, "error": "timeout after 2.5s"}).timeout_s
    2.5
    >>> parse_event({"type": "surprise", "x": 1}).data
    {'type': 'surprise', 'x': 1}
    """
    kind = data.get("type")
    names = _FIELDS.get(kind)
    if names is None:
        return OtherEvent(type=str(kind), data=data)
    record = _RECORDS[kind](**{name: data.get(name) for name in names})
    if kind == EventType.MESSAGE and "error_kind" not in data:
        _upgrade_message(data, record)
    elif kind == EventType.EPISODE_START and record.schema is None:
        record.schema = 1
    return record


def as_events(events: Iterable[Event | dict]) -> list[Event]:
    """Records as they are; dicts (an episode read raw, or built by hand) parsed by :func:`parse_event`."""
    return [e if isinstance(e, _Record) else parse_event(e) for e in events]


def iter_events(events: Iterable[Event | dict]) -> Iterator[Event]:
    """:func:`as_events` one at a time: a long episode's events read from a file are never all in memory."""
    for event in events:
        yield event if isinstance(event, _Record) else parse_event(event)


@dataclass(frozen=True, eq=False)
class EpisodeRecord:
    """One episode: its events from ``episode_start`` to ``episode_end``, typed.

    What :func:`~negotiate.episode.run_episode` returns and :func:`~negotiate.trace.read_records` reads back;
    training data, the replay and the report wrap it rather than copy it.
    """

    events: list[Event]
    """The trace, in order: the engine's own records, or events read from a file (dicts given
    here are parsed by :func:`parse_event`). A long episode's are :class:`~negotiate.trace.StoredEvents` (a
    sequence that reads them from a file as it is iterated), whether it was played or read."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", as_events(self.events))

    @classmethod
    def of(cls, events: Iterable[Event | dict]) -> EpisodeRecord:
        """An episode from its events, records or dicts (schema 1 or 2)."""
        return cls(list(events))

    @classmethod
    def built(cls, events: list[Event]) -> EpisodeRecord:
        """An episode from the records the engine built, taken as they are (no check: 2 us an episode less)."""
        record = object.__new__(cls)
        object.__setattr__(record, "events", events)
        return record

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    @property
    def start(self) -> EpisodeStart:
        first = self.events[0] if self.events else None
        return first if isinstance(first, EpisodeStart) else EpisodeStart()

    @property
    def end(self) -> EpisodeEnd:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, EpisodeEnd) else EpisodeEnd()

    @property
    def complete(self) -> bool:
        """Whether the episode has its ``episode_end``."""
        return bool(self.events) and isinstance(self.events[-1], EpisodeEnd)

    @property
    def id(self) -> str:
        return self.start.episode or self.end.episode or ""

    @property
    def outcome(self) -> str | None:
        return self.end.outcome

    @property
    def failed(self) -> bool:
        return self.end.outcome == Outcome.FAILED

    @property
    def reason(self) -> str:
        return self.end.reason or ""

    @property
    def metrics(self) -> dict | None:
        """The live metrics written at the end (None for a failed episode)."""
        metrics = self.end.metrics
        return metrics if isinstance(metrics, dict) else None

    def messages(self) -> list[MessageEvent]:
        return [e for e in self.events if isinstance(e, MessageEvent)]

    def seller_messages(self) -> list[MessageEvent]:
        return [e for e in self.events if isinstance(e, MessageEvent) and e.sender == "seller"]

    def deals(self) -> list[DealEvent]:
        return [e for e in self.events if isinstance(e, DealEvent)]

    def violations(self) -> list[ViolationEvent]:
        return [e for e in self.events if isinstance(e, ViolationEvent)]
