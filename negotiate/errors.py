"""The one error type a user sees: bad input, named by file, field and value."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a spec, an agent name, a trace file).

    The CLI prints ``str(error)`` on one line and exits with code 2; nothing is
    overwritten. Build messages as ``"FILE: field: value: what is wrong"``.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None, value: object = None):
        parts = [p for p in (source, field) if p]
        if value is not None:
            parts.append(repr(value))
        parts.append(message)
        super().__init__(": ".join(parts))
        self.source = source
        self.field = field
        self.value = value
