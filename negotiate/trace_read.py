"""Reading traces: the complete episodes of a file, what a resumed run keeps, and the files a path names.

:func:`read_records` yields each complete episode as an :class:`~negotiate.trace_schema.EpisodeRecord`
(:func:`read_episodes`: the JSON objects as read), a long one lazily; bad input gives one line naming the file,
line, field and value. :func:`scan` finds the complete episodes of a half-written file and where the last one
ends, so a resumed run can drop a half-written tail and run only what is missing; :func:`count_complete` counts
them at the speed of a read, and :func:`drop_failed` takes the failed ones out to be played again.
:func:`trace_files` expands files and folders into trace files.

Import these names from :mod:`negotiate.trace`, which re-exports them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import orjson

from negotiate.errors import UserError
from negotiate.protocol import CONTROL
from negotiate.trace_schema import SCHEMA_VERSION, EpisodeRecord, Outcome, parse_event
from negotiate.trace_store import SPILL_EVENTS, StoredEvents, TraceSpan

__all__ = [
    "read_episodes", "read_records", "scan", "drop_failed", "count_complete", "trace_files", "ScanResult", "Scanned",
    "shown", "twice_in_one_file",
]


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
                yield StoredEvents(TraceSpan(path, begin, offset - len(line), count, parse_event(first), True), [parse_event(event)])
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
