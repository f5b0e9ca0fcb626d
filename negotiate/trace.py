"""Traces: the schema of what a run writes, and JSON Lines files of episodes, written whole.

This module owns the trace schema (``traces/README.md``). Every event is a typed record:
:class:`EpisodeStart`, :class:`MessageEvent`, :class:`ViolationEvent`, :class:`DealEvent`,
:class:`NoticeEvent` and :class:`EpisodeEnd`; :class:`EpisodeRecord` is one episode, the
one object every reader (metrics, report, training data, the replay) and the engine share.
The regulator builds the records; :func:`encode` writes them as JSON lines (orjson
writes a dataclass's ``__dict__`` natively, near a dict's speed); :func:`read_records`
reads them back. Schema 2 keeps schema 1's fields
and records a timeout as data (``error_kind``, ``timeout_s``); :func:`parse_event`
still reads schema 1, where a timeout was only English text.

An episode's events are written when it ends, all at once and then flushed, so a
crash, SIGKILL or Ctrl-C loses at most the episodes still running. :func:`scan`
finds the complete episodes of a file and where the last one ends, so a resumed
run can drop a half-written tail and run only what is missing.

A long episode does not hold its events until then. Past :data:`SPILL_EVENTS` the regulator
encodes them into a :class:`Spill`, an unnamed temporary file of the episode's own, and keeps
only the events since; what the episode then returns is a :class:`StoredEvents`, which reads
its older events back from that file, and :class:`TraceWriter` copies the file's bytes into the
trace before the rest (so every trace file still holds whole episodes, one after another, each
``episode_end`` written last). The system removes the file when it is closed, or when the
process ends or is killed: an episode that never ends leaves nothing, in its trace or beside
it. Measured (``benchmarks/bench_long.py --rss``): one 10**6-turn episode held 2.8 GB until it
ended; spilled, ``serve`` of it peaks at 130 MB, as at 10**4 turns.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from itertools import chain, islice
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import orjson

from negotiate.errors import UserError
from negotiate.protocol import CONTROL
from negotiate.rules import MALFORMED, TIMEOUT  # a message's error_kind is its violation's kind: TIMEOUT, one that never came

__all__ = [
    "SCHEMA_VERSION", "EventType", "Outcome", "EndReason", "TIMEOUT",
    "EpisodeStart", "MessageEvent", "ViolationEvent", "DealEvent", "NoticeEvent", "EpisodeEnd", "OtherEvent", "Event",
    "EpisodeRecord", "parse_event", "as_events",
    "TraceWriter", "TraceWriteError", "encode", "Spill", "StoredEvents", "SPILL_EVENTS", "iter_events", "read_episodes", "read_records", "scan", "drop_failed", "count_complete", "trace_files", "ScanResult", "Scanned", "shown", "twice_in_one_file",
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
    out); new code reads attributes. Outside negotiate/trace.py, nothing in the package uses it.
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
        """What :func:`encode` writes: every field, less the :data:`OMITTED` labels that are None."""
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

    What :func:`~negotiate.episode.run_episode` returns and :func:`read_records` reads back;
    training data, the replay and the report wrap it rather than copy it.
    """

    events: list[Event]
    """The trace, in order: the engine's own records, or events read from a file (dicts given
    here are parsed by :func:`parse_event`). A long episode's are :class:`StoredEvents` (a
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


def encode(events: Iterable[Event | dict]) -> bytearray:
    """One episode's events as JSON lines (a record as every field it has: orjson writes a dataclass natively).

    Appended one event at a time to one buffer: each ``dumps`` result holds an allocation of about 2 KB
    whatever its length, so a list of them (what ``b"".join`` builds first) peaked at about 5 KB a turn
    beside the 0.5 KB the lines take. The buffer itself is returned: a copy into ``bytes`` would double it."""
    dumps, option = orjson.dumps, orjson.OPT_APPEND_NEWLINE
    out = bytearray()
    if type(events) is StoredEvents:  # the stored lines as they are (all of them in memory: TraceWriter.write copies them)
        for chunk in events.stored.chunks():
            out += chunk
        events = events.tail
    for event in events:
        out += dumps(event.json_data() if type(event) is EpisodeStart else event, option=option)
    return out


SPILL_EVENTS = 1024
"""Events an episode holds before the regulator spills them (:meth:`~negotiate.regulator.EpisodeState.trace`): about
340 turns of a 1x1 market, 0.7 MB of records, 0.25 MB once encoded. No episode of the named splits reaches it (their
budgets are 1.5 turns a buyer-product pair, at most 24 turns in ``train``). :func:`read_records` reads an episode
longer than this lazily too."""


def _lines_of(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a stream of bytes (their newlines removed)."""
    rest = b""
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


class Spill:
    """Events an episode has spilled, encoded as its trace will hold them, in an unnamed temporary file of its own.

    ``tempfile.TemporaryFile`` (O_TMPFILE on Linux, else a file unlinked as soon as it is made): the system removes it
    when it is closed, garbage-collected, or its process ends or is killed. Reads go by offset (``os.pread``), so
    two readers never move each other's place, and a write always appends.
    """

    __slots__ = ("file", "count", "size", "start")

    def __init__(self, directory: str | Path | None = None):
        self.file = tempfile.TemporaryFile(dir=directory, prefix=".negotiate-spill-")
        self.count = 0
        """Events written."""
        self.size = 0
        """Bytes written."""
        self.start: EpisodeStart | None = None
        """The episode's ``episode_start`` record, when it was the first event spilled: kept, so its readers (``events[0]``)
        never read the file."""

    def write(self, events: list) -> None:
        """Append ``events`` (encoded); on an error (a full disk) the file is cut back to what it held, and the error
        raised, so that the caller may keep the events instead."""
        if self.count == 0 and events and type(events[0]) is EpisodeStart:
            self.start = events[0]
        data = encode(events)
        try:
            self.file.seek(self.size)
            self.file.write(data)
            self.file.flush()
        except OSError:
            self.file.seek(self.size)
            self.file.truncate()
            raise
        self.count += len(events)
        self.size += len(data)

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        """The bytes written, ``size`` at a time."""
        offset = 0
        while offset < self.size:
            chunk = self._read(offset, min(size, self.size - offset))
            if not chunk:
                raise OSError(f"the episode's spill file ends at byte {offset} of {self.size}")
            offset += len(chunk)
            yield chunk

    def _read(self, offset: int, size: int) -> bytes:
        if hasattr(os, "pread"):
            return os.pread(self.file.fileno(), size, offset)
        self.file.seek(offset)  # no pread (Windows): reads and writes come one at a time there, and write() seeks first
        return self.file.read(size)

    def events(self) -> Iterator[Event]:
        """The events written, read back and parsed one line at a time (the first is :attr:`start` where kept)."""
        lines = _lines_of(self.chunks())
        if self.start is not None and next(lines, None) is not None:
            yield self.start
        for line in lines:
            yield parse_event(orjson.loads(line))

    def close(self) -> None:
        self.file.close()

    def __del__(self) -> None:
        # Its episode is done with (written, failed or cancelled): the file goes with it, without a ResourceWarning.
        file = getattr(self, "file", None)  # None: the file could not be made
        if file is not None:
            file.close()


class _TraceSpan:
    """The lines of one episode in a trace file, from byte ``begin`` up to ``stop`` (its ``episode_end`` not
    included): where :func:`read_records` leaves a long episode's events, read again when they are asked for."""

    __slots__ = ("path", "begin", "stop", "count", "start", "typed")

    def __init__(self, path: Path, begin: int, stop: int, count: int, start, typed: bool):
        self.path, self.begin, self.stop, self.count, self.start, self.typed = path, begin, stop, count, start, typed

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        with open(self.path, "rb") as handle:
            handle.seek(self.begin)
            left = self.stop - self.begin
            while left > 0:
                chunk = handle.read(min(size, left))
                if not chunk:
                    raise UserError("the trace file is shorter than when it was read (changed meanwhile?)", source=str(self.path))
                left -= len(chunk)
                yield chunk

    def events(self) -> Iterator[Event | dict]:
        lines = (line for line in _lines_of(self.chunks()) if line.strip())  # blank lines, as read_episodes skips them
        if next(lines, None) is not None:
            yield self.start  # parsed on the first pass
        for line in lines:
            event = orjson.loads(line)
            yield parse_event(event) if self.typed else event


class StoredEvents(Sequence):
    """An episode's events, the older ones in a file and read back as they are asked for, the rest held: what a long
    episode returns (:meth:`~negotiate.regulator.EpisodeState.trace`: its :class:`Spill`), and the events of a long
    episode :func:`read_records` reads (the span of the trace file it came from).

    Its length and its first and last events are at hand; iterating it reads and parses the stored events as it goes,
    a megabyte at a time; :class:`TraceWriter` copies a spill's bytes as they are. An index into the stored part
    reads up to it, and a slice makes a list of every event: for tests and short episodes, not for a long one's readers.
    """

    __slots__ = ("stored", "tail")

    def __init__(self, stored: Spill | _TraceSpan, tail: list):
        self.stored = stored
        """Where the older events are: ``count`` of them, the first as ``start`` where it was kept."""
        self.tail = tail
        """The events held (an episode's own list, since its last spill: it may still grow)."""

    def __len__(self) -> int:
        return self.stored.count + len(self.tail)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(self)[index]
        stored = self.stored.count
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("event index out of range")
        if index >= stored:
            return self.tail[index - stored]
        if index == 0 and self.stored.start is not None:
            return self.stored.start
        return next(islice(self.stored.events(), index, None))

    def __iter__(self) -> Iterator[Event]:
        yield from self.stored.events()
        yield from self.tail

    def __reversed__(self) -> Iterator[Event]:
        yield from reversed(self.tail)
        yield from reversed(list(self.stored.events()))

    def __repr__(self) -> str:
        return f"StoredEvents({self.stored.count} stored, {len(self.tail)} held)"


def _later(function, *args) -> Iterator:
    """``function(*args)``, called only when the iterator is first asked (after what comes before it in a chain)."""
    yield function(*args)


class TraceWriteError(UserError):
    """A trace file that takes no more: the run stops with one line (exit code 3), and what it wrote stays."""


class TraceWriter:
    """Appends whole episodes to a JSONL file."""

    def __init__(self, path: str | Path, *, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")
        self._fsync = fsync
        self._failed = False
        self.episodes = 0

    def write(self, events: Iterable[Event | dict]) -> None:
        """Append one episode. A long one's :class:`StoredEvents` are copied from its spill file a megabyte at a
        time, the held events after them, with nothing else in between (no await: one episode's lines stay together)."""
        if type(events) is StoredEvents:
            self._write_parts(chain(events.stored.chunks(), _later(encode, events.tail)))
        else:
            self._write_parts((encode(events),))

    def write_encoded(self, data: bytes) -> None:
        """Append one episode already encoded by :func:`encode` (a worker process encoded it); a
        :class:`TraceWriteError` where the file takes no more (a full disk, a file size limit), and for every write
        after that one (an episode appended after a half-written one would corrupt the file's middle)."""
        self._write_parts((data,))

    def _write_parts(self, parts: Iterable[bytes]) -> None:
        if self._failed:
            raise self._error(OSError("an earlier write failed"))
        begun = False
        try:
            for data in parts:
                begun = True
                self._file.write(data)
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
        except OSError as error:
            self._failed = True
            raise self._error(error) from None
        except BaseException:
            self._failed = begun  # stopped part-way through an episode (Ctrl-C in a long one's copy): nothing may follow it
            raise
        self.episodes += 1

    def _error(self, error: OSError) -> TraceWriteError:
        return TraceWriteError(f"cannot write the trace ({error.strerror or error}); the episodes before this one are kept, "
                               "and --resume plays the rest once there is room", source=str(self.path))

    def close(self) -> None:
        """Close the file; after a failed write, what its buffer still holds is the half episode that failed (resume
        drops it), so a second failure is not news."""
        try:
            self._file.close()
        except OSError as error:
            if not self._failed:
                raise self._error(error) from None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Scanned(NamedTuple):
    """What resuming a run needs of one complete episode, and no more: its parsed start and end, market and metrics
    included, took about 9 kB an episode, so a run of 10**7 episodes could not be resumed in memory."""

    episode: str
    index: int | None
    """Its index in its run (None in traces older than indices)."""
    outcome: str


@dataclass(frozen=True)
class ScanResult:
    complete: list[Scanned]
    """The complete episodes, in file order."""
    good_bytes: int
    """File offset just after the last complete episode."""
    partial: str | None
    """Id of a half-written trailing episode, if any."""


_TEXT_LABELS = ("run", "seller", "buyers", "play", "split", "shape", "tier")
_WHOLE_LABELS = ("run_seed", "index", "seed", "group", "repeat")
_TABLES = ("spec", "market", "agents")


def _check_start(event: dict, path: Path, line_no: int) -> None:
    """An ``episode_start`` every reader can take (``report``, ``replay``, ``--resume``, training): a schema this package
    reads, an episode id that is text, and each label, where given, of its kind (text, a whole number, a JSON object).
    ``"market": 5`` printed as ``budget ? turns`` in ``replay --text`` where ``report`` refused it, an ``episode`` of null
    was reported, and a label that was a list or an object stopped ``report`` with a traceback."""
    where = f"{path}:{line_no}"
    schema = event.get("schema")
    if not isinstance(schema, int):
        raise UserError("missing or not an integer", source=where, field="schema", value=schema)
    if schema > SCHEMA_VERSION:
        raise UserError(
            f"trace schema is newer than this negotiate reads ({SCHEMA_VERSION}); upgrade negotiate",
            source=where, field="schema", value=schema,
        )
    episode = event.get("episode")
    if episode is None:
        raise UserError("missing or null; every episode has an id, a non-empty string", source=where, field="episode")
    if not isinstance(episode, str) or not episode:
        raise UserError("every episode has an id, a non-empty string", source=where, field="episode", value=episode)
    for names, kind, problem in ((_TEXT_LABELS, str, "must be a string"), (_TABLES, dict, "must be a JSON object"),
                                 (_WHOLE_LABELS, int, "must be a whole number")):
        for name in names:
            value = event.get(name)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                raise UserError(problem, source=where, field=name, value=value)


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset after the line, line) for each line."""
    offset = 0
    with open(path, "rb") as handle:
        for line_no, line in enumerate(handle, 1):
            offset += len(line)
            yield line_no, offset, line


def shown(line: bytes) -> str:
    """A bad line as an error may show it: the start of its text, or only its size when it is not text
    (a binary file's bytes are never echoed to a terminal).

    >>> shown(b'{"type": "episode_start"\\n'), shown(b"\\x89PNG\\r\\n\\x1a\\n\\x00")
    ('{"type": "episode_start"', '9 bytes of binary data')
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or CONTROL.search(text):
        return f"{len(line)} bytes of binary data"
    return text.rstrip("\r\n")[:60]


def _binary(line: bytes) -> bool:
    return shown(line).endswith("bytes of binary data")


def _not_json(path: Path, line_no: int, line: bytes, *, last: bool) -> UserError:
    """A line that is not JSON: a cut-off last line is what a killed run leaves; anything else is not a trace."""
    if _binary(line):
        problem = "not a trace: binary data, not JSON lines"
    elif last:
        problem = "not a JSON line (cut off: a run killed mid-write? `--resume` of the command that wrote it repairs it, `report` or `replay` --allow-partial skips it)"
    else:
        problem = "not a JSON line"
    return UserError(problem, source=f"{path}:{line_no}", field="line", value=shown(line))


def read_episodes(path: str | Path, *, allow_partial: bool = False,
                  on_skip: Callable[[str], None] | None = None, unique: bool = False) -> Iterator[list[dict]]:
    """Yield each complete episode of a trace file as its list of events, the JSON objects as read
    (:func:`read_records` gives them typed).

    A malformed line, an event outside an episode or a schema newer than this
    package raises :class:`UserError` naming the file, line, field and value. A
    half-written trailing episode (a run killed mid-write) raises too, unless
    ``allow_partial``; then ``on_skip`` gets one line naming each part dropped.

    ``unique``: a complete episode whose id an earlier complete one in the file had raises :func:`twice_in_one_file`'s
    error, giving both lines (``report`` and ``replay`` read so: one shows the first copy, the other counted both).
    It keeps a 64-bit hash of each id read (about 50 bytes an episode: ``report`` must fit 20,000 episodes in 1.2 kB
    each, tests/test_report_memory.py); on a hash seen before, the file is read again to the first copy, to be sure.
    """
    return _episodes_of(Path(path), allow_partial, on_skip, unique, lazy=False)


def _episodes_of(path: Path, allow_partial: bool, on_skip: Callable[[str], None] | None, unique: bool,
                 lazy: bool) -> Iterator[list[dict] | StoredEvents]:
    """:func:`read_episodes`; with ``lazy``, an episode of more than :data:`SPILL_EVENTS` events comes as typed
    :class:`StoredEvents` over its span of the file, read again when asked for (the first pass keeps only its first and
    last events, so a 10**6-turn episode is never in memory whole)."""
    if not path.exists():
        raise UserError("no such trace file", source=str(path))
    current: list[dict] | None = None  # the open episode's events (emptied once it is left in the file: spanned)
    first: dict | None = None
    spanned = False
    start_line = begin = count = 0
    broken: tuple[int, bytes] | None = None
    seen: set[int] | None = set() if unique else None  # the hash of each complete episode's id

    def skip(what: str) -> None:
        if on_skip is not None:
            on_skip(what)

    for line_no, offset, line in _lines(path):
        if not line.strip():
            continue
        if broken is not None:
            raise _not_json(path, *broken, last=False)  # a bad line with more after it is corruption, not a killed run's tail
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            broken = (line_no, line)
            continue
        if not isinstance(event, dict):
            raise UserError("not a JSON object", source=f"{path}:{line_no}", field="line", value=shown(line))
        kind = event.get("type")
        if kind == "episode_start":
            _check_start(event, path, line_no)
            if current is not None:
                if not allow_partial:
                    raise UserError("episode has no episode_end (truncated)", source=f"{path}:{start_line}", field="episode",
                                    value=first.get("episode"))
                skip(f"{path}:{start_line}: episode {first.get('episode')!r} has no episode_end")
            current, first, spanned, start_line, begin, count = [event], event, False, line_no, offset - len(line), 1
        elif kind is None:
            raise UserError("event has no 'type'", source=f"{path}:{line_no}", field="type", value=None)
        elif current is None:
            raise UserError("event before any episode_start", source=f"{path}:{line_no}", field="type", value=kind)
        elif kind == "episode_end":
            if seen is not None:
                episode_id = first.get("episode")
                key = hash(orjson.dumps(episode_id))  # any JSON value, told apart as written
                if key in seen and (first_copy := _first_complete(path, episode_id, start_line)) is not None:
                    raise twice_in_one_file(path, episode_id, first_copy, start_line)
                seen.add(key)
            if spanned:
                yield StoredEvents(_TraceSpan(path, begin, offset - len(line), count, parse_event(first), True), [parse_event(event)])
            else:
                current.append(event)
                yield current
            current = None
        elif spanned:
            count += 1
        else:
            current.append(event)
            count += 1
            if lazy and count >= SPILL_EVENTS:
                current, spanned = [], True
    if broken is not None:
        if not allow_partial or _binary(broken[1]):
            raise _not_json(path, *broken, last=True)
        skip(f"{path}:{broken[0]}: a cut-off last line" + (f" of episode {first.get('episode')!r}" if current is not None else ""))
        current = None
    if current is not None:
        if not allow_partial:
            raise UserError(
                "episode has no episode_end (truncated; `--resume` of the command that wrote it repairs a killed run, `report` or `replay` "
                "--allow-partial skips it)",
                source=f"{path}:{start_line}", field="episode", value=first.get("episode"),
            )
        skip(f"{path}:{start_line}: episode {first.get('episode')!r} has no episode_end")


def _first_complete(path: Path, episode_id: object, before: int) -> int | None:
    """The line of the first complete episode called ``episode_id`` that starts before line ``before`` (None: none,
    two ids whose hashes met)."""
    candidate = None
    for line_no, _offset, line in _lines(path):
        if line_no >= before:
            return None
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "episode_start":
            candidate = line_no if event.get("episode") == episode_id else None
        elif kind == "episode_end" and candidate is not None:
            return candidate
    return None


def twice_in_one_file(path: Path, episode_id: object, first: int, second: int) -> UserError:
    """The one line ``report`` and ``replay`` both give for an episode id that one trace file holds twice.

    >>> print(twice_in_one_file(Path("t.jsonl"), "greedy-000001", 3, 9))
    t.jsonl:9: episode: 'greedy-000001': the same episode id twice in one file (lines 3 and 9); keep one copy
    """
    return UserError(f"the same episode id twice in one file (lines {first} and {second}); keep one copy",
                     source=f"{path}:{second}", field="episode", value=episode_id)


def read_records(path: str | Path, *, allow_partial: bool = False,
                 on_skip: Callable[[str], None] | None = None, unique: bool = False) -> Iterator[EpisodeRecord]:
    """Each complete episode of a trace file (schema 1 or 2) as an :class:`EpisodeRecord`; errors as
    :func:`read_episodes` (which yields the raw JSON objects, for tools that rewrite traces).

    An episode of more than :data:`SPILL_EVENTS` events is not read into memory: its record's ``events`` are
    :class:`StoredEvents`, its start and end at hand and the rest read again from the file when iterated (a report of
    one 10**6-turn episode held 2.5 GB of its events as dicts, and then as records)."""
    for events in _episodes_of(Path(path), allow_partial, on_skip, unique, lazy=True):
        yield EpisodeRecord.built(events) if type(events) is StoredEvents else EpisodeRecord.of(events)


def scan(path: str | Path) -> ScanResult:
    """Find the complete episodes of a (possibly half-written) trace file."""
    path = Path(path)
    complete: list[Scanned] = []
    good = 0
    start: dict | None = None
    if not path.exists():
        return ScanResult([], 0, None)
    for line_no, offset, line in _lines(path):
        if not line.endswith(b"\n"):
            break  # the half-written last line of a killed run (even one that lost only its newline)
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise _not_json(path, line_no, line, last=False) from None
        if not isinstance(event, dict):
            raise UserError("not a JSON object", source=f"{path}:{line_no}", field="line", value=shown(line))
        kind = event.get("type")
        if kind == "episode_start":
            _check_start(event, path, line_no)
            start = event
        elif kind == "episode_end" and start is not None:
            complete.append(Scanned(start.get("episode"), start.get("index"), sys.intern(str(event.get("outcome")))))
            start = None
            good = offset
    return ScanResult(complete, good, start.get("episode") if start else None)


_END = b'{"type":"episode_end"'
"""How every ``episode_end`` line this package writes begins (orjson, fields in order); inside a JSON string its
quotes would be escaped, so these bytes start a line and nothing else."""


def count_complete(path: str | Path, *, chunk: int = 1 << 24) -> int:
    """How many complete episodes a trace written by this package holds, by counting its whole ``episode_end``
    lines in the raw bytes: what a stopped run says it kept, at the speed of a read (a :func:`scan` parses every
    line: minutes for the tens of GB of a long run). 0 for a missing file.
    """
    count, carry = 0, b"\n"  # as if a line ended before the file
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return 0
    with handle:
        while block := handle.read(chunk):
            data = carry + block
            last = data.rfind(b"\n")  # the lines before it are whole; the one after it may be cut off
            count += data.count(b"\n" + _END, 0, last + 1)
            carry = data[last:] if last >= 0 else data
    return count


def drop_failed(path: str | Path, *, fsync: bool = False) -> int:
    """Take the failed episodes (``episode_end`` outcome ``failed``) out of a complete trace file, so that a resumed
    run plays them again; returns how many. Every other episode keeps its bytes and its order. The file is replaced
    whole (a new file renamed over it): a crash leaves the old trace or the new one, never a mix; with nothing
    failed it is left alone."""
    path = Path(path)
    kept, episode, dropped = bytearray(), bytearray(), 0
    for _, _, line in _lines(path):
        episode += line
        event = orjson.loads(line) if line.endswith(b"\n") and line.strip() else {}  # not a half-written last line
        if event.get("type") == "episode_end":
            if event.get("outcome") == Outcome.FAILED:
                dropped += 1
            else:
                kept += episode
            episode = bytearray()
    if not dropped:
        return 0
    kept += episode  # blank lines after the last episode
    temporary = path.with_name(path.name + ".retry")
    with open(temporary, "wb") as handle:
        handle.write(kept)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(temporary, path)
    return dropped


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders (searched recursively for ``*.jsonl``) into trace files. Operational logs
    (``*.log.jsonl``) are not traces: they are left out, whether found in a folder or named (a shell glob).
    Neither is a training curve (``metrics.jsonl`` of a checkpoint), left out where a folder holds it, so a
    loop's run folder reports whole. Among several paths (a shell glob: ``run/*``), a file that is not ``*.jsonl``
    (the run's ``run.json``, ``results.md``, plots) is left out too; named alone, any file is read."""
    found: list[Path] = []
    paths = list(paths)
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.jsonl") if not p.name.endswith(".log.jsonl") and p.name != "metrics.jsonl"))
        elif path.exists() and (path.name.endswith(".log.jsonl") or (len(paths) > 1 and path.suffix != ".jsonl")):
            continue
        elif path.exists():
            found.append(path)
        else:
            raise UserError("no such trace file or folder", source=str(path))
    if not found:
        raise UserError("no *.jsonl trace files found (operational logs, *.log.jsonl, are not traces)",
                        source=", ".join(str(p) for p in paths))
    return found
