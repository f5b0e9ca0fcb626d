"""What a test module needs installed: skip the module without it, or fail where CI requires it."""

from __future__ import annotations

import os

import pytest


def missing(reason: str, require_env: str) -> None:
    """Skip the whole module for ``reason``; fail instead when the variable ``require_env`` is set (``.ci/run`` sets it)."""
    if os.environ.get(require_env, "") not in ("", "0"):
        pytest.fail(f"{reason} ({require_env} is set)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
