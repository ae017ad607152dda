"""The unit tier needs no clock: every async test runs on virtual time, and a real sleep fails
the test that made it (`tests/unit/virtual_time.py`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping

import pytest

from tests.unit.virtual_time import SleepGuard, VirtualTimeLoop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, type[VirtualTimeLoop]]:
    """pytest-asyncio's hook: the loops this directory's async tests run on (one, so the
    test ids do not change)."""
    return {"virtual": VirtualTimeLoop}


@pytest.fixture(autouse=True)
def no_real_sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[SleepGuard]:
    guard = SleepGuard()
    monkeypatch.setattr(time, "sleep", guard.time_sleep)
    monkeypatch.setattr(asyncio, "sleep", guard.asyncio_sleep)
    yield guard
    assert not guard.refused, f"waited on the real clock: {', '.join(guard.refused)}"
