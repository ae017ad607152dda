"""The unit tier needs no clock: every async test runs on virtual time
(`tests/unit/virtual_time.py`)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tests.unit.virtual_time import VirtualTimeLoop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, type[VirtualTimeLoop]]:
    """pytest-asyncio's hook: the loops this directory's async tests run on (one, so the
    test ids do not change)."""
    return {"virtual": VirtualTimeLoop}
