"""Operational logs: JSON lines to a file, short readable lines on the console (structlog)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import orjson
import structlog

__all__ = ["configure", "console_level", "RequestLog", "REQUEST_LOG"]

REQUEST_LOG = "requests.log.jsonl"
"""Every model request of a run, one JSON line each, in the run's folder."""


def _short_line(_logger, _name, event: dict) -> dict:
    """The console gets the event and its fields; the time and logger name stay in the file."""
    event.pop("timestamp", None)
    event.pop("logger", None)
    return event


def console_level() -> int:
    """The level of this process's console lines, as :func:`configure` last set it (WARNING, the CLI's default, before):
    read off the console handler it installed on the ``negotiate`` logger, so the setting lives in one place."""
    for handler in logging.getLogger("negotiate").handlers:
        if getattr(handler, "negotiate_console", False):
            return handler.level
    return logging.WARNING


def configure(log_file: Path | None = None, *, console_level: int = logging.INFO) -> None:
    """Send structlog events through stdlib logging: JSON to ``log_file``, one short line to stderr."""
    root = logging.getLogger("negotiate")
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.DEBUG)
    root.propagate = False
    pre_chain = [structlog.stdlib.add_log_level, structlog.processors.TimeStamper(fmt="iso")]
    console = logging.StreamHandler(sys.stderr)
    console.negotiate_console = True  # what console_level() reads
    console.setLevel(console_level)
    console.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, _short_line,
                    structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty(), pad_event_to=0)],
        foreign_pre_chain=pre_chain,
    ))
    root.addHandler(console)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(log_file)
        to_file.setLevel(logging.DEBUG)
        to_file.setFormatter(structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.JSONRenderer()],
            foreign_pre_chain=pre_chain,
        ))
        root.addHandler(to_file)
    _third_party(root.handlers[-1] if log_file is not None else None, pre_chain)
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, structlog.stdlib.add_logger_name, *pre_chain,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


THIRD_PARTY_CONSOLE = logging.ERROR
"""The least severe line of another library (transformers, peft, torch, Python warnings) shown on the console; below
it, its lines go to the run's log file only."""


def _third_party(to_file: logging.Handler | None, pre_chain: list) -> None:
    """Other libraries' log lines and Python warnings (``logging.captureWarnings``): warnings and up into the run's log
    file, errors also on the console, so the screen shows the project's own progress (issue 44: peft's warnings and
    model-loading bars flooded it). Their progress bars are off (``HF_HUB_DISABLE_PROGRESS_BARS``, set by the CLI)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "negotiate_third_party", False):
            root.removeHandler(handler)
            if handler is not to_file:
                handler.close()
    console = logging.StreamHandler(sys.stderr)
    console.negotiate_third_party = True
    console.setLevel(THIRD_PARTY_CONSOLE)
    console.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
    root.addHandler(console)
    if to_file is not None:
        to_file.negotiate_third_party = True
        root.addHandler(to_file)
    root.setLevel(logging.WARNING)
    logging.captureWarnings(False)  # anew: whatever shows warnings now (a test's recorder, say) is what it replaces
    logging.captureWarnings(True)


class RequestLog:
    """Every model request, one JSON line each (model, role, latency, retries, tokens, or the error).

    Hundreds of requests a second go through this, so it takes structlog's lean path (a
    ``BytesLogger``, which writes and flushes each line, and orjson): about 14 us a line here,
    against about 70 us through stdlib logging like the other logs. ``logger`` is None while it is
    closed. A run's pools hold one (``negotiate.agents.pools.Pools.requests``); ``negotiate serve``,
    ``collect`` and ``eval`` open it in the run folder.
    """

    def __init__(self) -> None:
        self.logger = None
        self._file = None
        self._waiting: dict[int, float] = {}
        """Requests in flight: a number each, and when it began (``time.monotonic``)."""
        self._next = 0

    def begin(self) -> int:
        """A request goes out; the number :meth:`end` takes when it is answered (or fails, or is cancelled)."""
        self._next += 1
        self._waiting[self._next] = time.monotonic()
        return self._next

    def end(self, number: int) -> None:
        self._waiting.pop(number, None)

    def slow(self, after: float = 5.0) -> tuple[int, float]:
        """How many requests have waited more than ``after`` seconds, and the longest wait (0 and 0.0: none)."""
        now = time.monotonic()
        waits = [now - began for began in self._waiting.values() if now - began > after]
        return len(waits), max(waits, default=0.0)

    def open(self, path: Path) -> None:
        self.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")
        self.logger = structlog.wrap_logger(
            structlog.BytesLogger(self._file),
            processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True),
                        structlog.processors.JSONRenderer(serializer=orjson.dumps)],
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO), cache_logger_on_first_use=True)

    def close(self) -> None:
        self.logger = None
        if self._file is not None:
            self._file.close()
            self._file = None
