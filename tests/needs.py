"""What a test module needs installed: skip the module without it, or fail where CI requires it."""

from __future__ import annotations

import os

import pytest


def missing(reason: str, require_env: str) -> None:
    """Skip the whole module for ``reason``; fail instead when the variable ``require_env`` is set (``.ci/run`` sets it)."""
    if os.environ.get(require_env, "") not in ("", "0"):
        pytest.fail(f"{reason} ({require_env} is set)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def openai_client_missing() -> str | None:
    """Why ``client=openai`` cannot run here, or None: the openai package, and for openai 2 (built on httpx) the
    httpx-aiohttp transport its aiohttp client needs (openai 3, on httpx2, needs none)."""
    try:
        import openai  # noqa: F401

        from negotiate.agents.clients import _openai_httpx

        if _openai_httpx().__name__ == "httpx":
            import httpx_aiohttp  # noqa: F401
    except ImportError as error:
        return f"client=openai is not installed here: {error}"
    return None
