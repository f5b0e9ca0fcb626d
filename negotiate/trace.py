"""Traces: JSON Lines files of episodes, written whole, read back with clear errors.

An episode's events are written with one ``write`` and a flush when it ends, so a
crash, SIGKILL or Ctrl-C loses at most the episodes still running. :func:`scan`
finds the complete episodes of a file and where the last one ends, so a resumed
run can drop a half-written tail and run only what is missing. The schema is in
``traces/README.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from negotiate.episode import SCHEMA_VERSION
from negotiate.errors import UserError

__all__ = ["TraceWriter", "encode", "read_episodes", "scan", "trace_files", "ScanResult", "shown"]


def encode(events: Iterable[dict]) -> bytes:
    """One episode's events as JSON lines."""
    dumps, option = orjson.dumps, orjson.OPT_APPEND_NEWLINE
    return b"".join([dumps(event, option=option) for event in events])


class TraceWriter:
    """Appends whole episodes to a JSONL file."""

    def __init__(self, path: str | Path, *, fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")
        self._fsync = fsync
        self.episodes = 0

    def write(self, events: Iterable[dict]) -> None:
        self.write_encoded(encode(events))

    def write_encoded(self, data: bytes) -> None:
        """Append one episode already encoded by :func:`encode` (a worker process encoded it)."""
        self._file.write(data)
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self.episodes += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class ScanResult:
    complete: list[dict]
    """The episode_start events of complete episodes, with ``metrics`` and ``outcome`` from their ends."""
    good_bytes: int
    """File offset just after the last complete episode."""
    partial: str | None
    """Id of a half-written trailing episode, if any."""


def _check_start(event: dict, path: Path, line_no: int) -> None:
    schema = event.get("schema")
    if not isinstance(schema, int):
        raise UserError("missing or not an integer", source=f"{path}:{line_no}", field="schema", value=schema)
    if schema > SCHEMA_VERSION:
        raise UserError(
            f"trace schema is newer than this negotiate reads ({SCHEMA_VERSION}); upgrade negotiate",
            source=f"{path}:{line_no}", field="schema", value=schema,
        )


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
    if text is None or any(ch < " " and ch not in "\t\r\n" or "\x7f" <= ch <= "\x9f" for ch in text):
        return f"{len(line)} bytes of binary data"
    return text.rstrip("\r\n")[:60]


def _binary(line: bytes) -> bool:
    return shown(line).endswith("bytes of binary data")


def _not_json(path: Path, line_no: int, line: bytes, *, last: bool) -> UserError:
    """A line that is not JSON: a cut-off last line is what a killed run leaves; anything else is not a trace."""
    if _binary(line):
        problem = "not a trace: binary data, not JSON lines"
    elif last:
        problem = "not a JSON line (cut off: a run killed mid-write? `negotiate serve --resume` repairs it, `report --allow-partial` skips it)"
    else:
        problem = "not a JSON line"
    return UserError(problem, source=f"{path}:{line_no}", field="line", value=shown(line))


def read_episodes(path: str | Path, *, allow_partial: bool = False,
                  on_skip: Callable[[str], None] | None = None) -> Iterator[list[dict]]:
    """Yield each complete episode of a trace file as its list of events.

    A malformed line, an event outside an episode or a schema newer than this
    package raises :class:`UserError` naming the file, line, field and value. A
    half-written trailing episode (a run killed mid-write) raises too, unless
    ``allow_partial``; then ``on_skip`` gets one line naming each part dropped.
    """
    path = Path(path)
    if not path.exists():
        raise UserError("no such trace file", source=str(path))
    current: list[dict] | None = None
    start_line = 0
    broken: tuple[int, bytes] | None = None

    def skip(what: str) -> None:
        if on_skip is not None:
            on_skip(what)

    for line_no, _offset, line in _lines(path):
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
                                    value=current[0].get("episode"))
                skip(f"{path}:{start_line}: episode {current[0].get('episode')!r} has no episode_end")
            current, start_line = [event], line_no
        elif kind is None:
            raise UserError("event has no 'type'", source=f"{path}:{line_no}", field="type", value=None)
        elif current is None:
            raise UserError("event before any episode_start", source=f"{path}:{line_no}", field="type", value=kind)
        else:
            current.append(event)
            if kind == "episode_end":
                yield current
                current = None
    if broken is not None:
        if not allow_partial or _binary(broken[1]):
            raise _not_json(path, *broken, last=True)
        skip(f"{path}:{broken[0]}: a cut-off last line" + (f" of episode {current[0].get('episode')!r}" if current else ""))
        current = None
    if current is not None:
        if not allow_partial:
            raise UserError(
                "episode has no episode_end (truncated; `negotiate serve --resume` repairs a killed run)",
                source=f"{path}:{start_line}", field="episode", value=current[0].get("episode"),
            )
        skip(f"{path}:{start_line}: episode {current[0].get('episode')!r} has no episode_end")


def scan(path: str | Path) -> ScanResult:
    """Find the complete episodes of a (possibly half-written) trace file."""
    path = Path(path)
    complete: list[dict] = []
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
            complete.append(start | {"outcome": event.get("outcome"), "metrics": event.get("metrics")})
            start = None
            good = offset
    return ScanResult(complete, good, start.get("episode") if start else None)


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders (searched recursively for ``*.jsonl``) into trace files. Operational logs
    (``*.log.jsonl``) are not traces: they are left out, whether found in a folder or named (a shell glob)."""
    found: list[Path] = []
    paths = list(paths)
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.jsonl") if not p.name.endswith(".log.jsonl")))
        elif path.name.endswith(".log.jsonl") and path.exists():
            continue
        elif path.exists():
            found.append(path)
        else:
            raise UserError("no such trace file or folder", source=str(path))
    if not found:
        raise UserError("no *.jsonl trace files found (operational logs, *.log.jsonl, are not traces)",
                        source=", ".join(str(p) for p in paths))
    return found
