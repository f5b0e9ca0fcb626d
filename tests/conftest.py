"""Shared test settings: anyio runs async tests on asyncio (the only backend the bus supports)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # The bus's Mailbox uses asyncio futures, so trio is not an option.
    return "asyncio"
