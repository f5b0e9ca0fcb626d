"""Traces: the schema of what a run writes, and JSON Lines files of episodes, written whole.

This module is the one place to import the trace from; it holds no code of its own. Its names live in three
modules, one noun each, so that each reads whole (together they were 1,097 lines):

- :mod:`negotiate.trace_schema`, the schema (``traces/README.md``): every event a typed record
  (:class:`EpisodeStart`, :class:`MessageEvent`, :class:`ViolationEvent`, :class:`DealEvent`,
  :class:`NoticeEvent`, :class:`EpisodeEnd`), and :class:`EpisodeRecord`, one episode, the one object every
  reader (metrics, report, training data, the replay) and the engine share. Schema 2 keeps schema 1's fields and
  records a timeout as data (``error_kind``, ``timeout_s``); :func:`parse_event` still reads schema 1.
- :mod:`negotiate.trace_store`, writing: :func:`encode` and :class:`TraceWriter`, which appends an episode's events
  when it ends, all at once and then flushed, so a crash, SIGKILL or Ctrl-C loses at most the episodes still
  running; and a long episode's events past :data:`SPILL_EVENTS`, kept in a :class:`Spill` (an unnamed temporary
  file) and read back as :class:`StoredEvents`, so a 10**6-turn episode is never in memory whole.
- :mod:`negotiate.trace_read`, reading: :func:`read_records` (typed) and :func:`read_episodes` (the JSON objects),
  with one-line errors; :func:`scan`, which finds the complete episodes of a file and where the last one ends, so a
  resumed run can drop a half-written tail and run only what is missing; :func:`count_complete`,
  :func:`drop_failed` and :func:`trace_files`.
"""

from __future__ import annotations

from negotiate.rules import TIMEOUT  # a message's error_kind is its violation's kind: TIMEOUT, one that never came
from negotiate.trace_read import (
    Scanned, ScanResult, count_complete, drop_failed, read_episodes, read_records, scan, shown, trace_files, twice_in_one_file,
)
from negotiate.trace_schema import (
    SCHEMA_VERSION, DealEvent, EndReason, EpisodeEnd, EpisodeRecord, EpisodeStart, Event, EventType, MessageEvent, NoticeEvent,
    OtherEvent, Outcome, ViolationEvent, as_events, iter_events, parse_event,
)
from negotiate.trace_store import SPILL_EVENTS, Spill, StoredEvents, TraceWriteError, TraceWriter, encode

__all__ = [
    "SCHEMA_VERSION", "EventType", "Outcome", "EndReason", "TIMEOUT",
    "EpisodeStart", "MessageEvent", "ViolationEvent", "DealEvent", "NoticeEvent", "EpisodeEnd", "OtherEvent", "Event",
    "EpisodeRecord", "parse_event", "as_events",
    "TraceWriter", "TraceWriteError", "encode", "Spill", "StoredEvents", "SPILL_EVENTS", "iter_events", "read_episodes",
    "read_records", "scan", "drop_failed", "count_complete", "trace_files", "ScanResult", "Scanned", "shown",
    "twice_in_one_file",
]
