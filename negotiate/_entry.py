"""The ``negotiate`` console script: :func:`negotiate.cli.main`, with a Ctrl-C that comes while its modules
are still loading (about a second) ended in one line, as every command ends one, not in a traceback."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from negotiate.cli import main as run
    except KeyboardInterrupt:
        print("negotiate: interrupted", file=sys.stderr)
        return 130
    return run()
