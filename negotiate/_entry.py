"""The ``negotiate`` console script: :func:`negotiate.cli.main`, with a Ctrl-C that comes before the command
has its own handling ended in one line, as every command ends one, not in a traceback: while its modules
are still loading (about a second), or while :func:`negotiate.cli.main` reads its arguments and sets up
logging."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from negotiate.cli import main as run

        return run()  # it ends its commands' own Ctrl-C in one line; what comes before that lands here
    except KeyboardInterrupt:
        print("negotiate: interrupted", file=sys.stderr)
        return 130
