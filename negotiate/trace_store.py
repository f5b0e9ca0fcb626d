"""Writing traces: episodes appended whole to a JSON Lines file, and a long episode's events kept in a file until then.

:func:`encode` writes an episode's records as JSON lines (orjson writes a dataclass's ``__dict__`` natively, near a
dict's speed). :class:`TraceWriter` appends each episode when it ends, all at once and then flushed, so a crash,
SIGKILL or Ctrl-C loses at most the episodes still running.

A long episode does not hold its events until then. Past :data:`SPILL_EVENTS` the regulator
encodes them into a :class:`Spill`, an unnamed temporary file of the episode's own, and keeps
only the events since; what the episode then returns is a :class:`StoredEvents`, which reads
its older events back from that file, and :class:`TraceWriter` copies the file's bytes into the
trace before the rest (so every trace file still holds whole episodes, one after another, each
``episode_end`` written last). The system removes the file when it is closed, or when the
process ends or is killed: an episode that never ends leaves nothing, in its trace or beside
it. Measured (``benchmarks/bench_long.py --rss``): one 10**6-turn episode held 2.8 GB until it
ended; spilled, ``serve`` of it peaks at 130 MB, as at 10**4 turns. A long episode read back
from a trace is :class:`StoredEvents` too, over a :class:`TraceSpan` of the file.

Import these names from :mod:`negotiate.trace`, which re-exports them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice
from pathlib import Path

import orjson

from negotiate.errors import UserError
from negotiate.trace_schema import EpisodeStart, Event, parse_event

__all__ = ["encode", "SPILL_EVENTS", "Spill", "TraceSpan", "StoredEvents", "TraceWriteError", "TraceWriter"]


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
budgets are 1.5 turns a buyer-product pair, at most 24 turns in ``train``). :func:`~negotiate.trace.read_records` reads
an episode longer than this lazily too."""


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
        self.append(encode(events))
        self.count += len(events)

    def append(self, data: bytes) -> None:
        """Append lines already encoded (:meth:`write`'s, or a worker's part of a long episode on its way to the
        trace); on an error the file is cut back to what it held, and the error raised."""
        try:
            self.file.seek(self.size)
            self.file.write(data)
            self.file.flush()
        except OSError:
            self.file.seek(self.size)
            self.file.truncate()
            raise
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


class TraceSpan:
    """The lines of one episode in a trace file, from byte ``begin`` up to ``stop`` (its ``episode_end`` not
    included): where :func:`~negotiate.trace.read_records` leaves a long episode's events, read again when they are
    asked for."""

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
    episode :func:`~negotiate.trace.read_records` reads (the span of the trace file it came from).

    Its length and its first and last events are at hand; iterating it reads and parses the stored events as it goes,
    a megabyte at a time; :class:`TraceWriter` copies a spill's bytes as they are. An index into the stored part
    reads up to it, and a slice makes a list of every event: for tests and short episodes, not for a long one's readers.
    """

    __slots__ = ("stored", "tail")

    def __init__(self, stored: Spill | TraceSpan, tail: list):
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

    def write_encoded(self, data: bytes, stored: Spill | None = None) -> None:
        """Append one episode already encoded by :func:`encode` (a worker process encoded it), after the lines of
        ``stored`` where a long episode's first lines came ahead of it; a :class:`TraceWriteError` where the file takes
        no more (a full disk, a file size limit), and for every write after that one (an episode appended after a
        half-written one would corrupt the file's middle)."""
        self._write_parts((data,) if stored is None else chain(stored.chunks(), (data,)))

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
