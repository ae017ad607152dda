"""Fixtures more than one test module uses."""

from __future__ import annotations

import os
import warnings
from asyncio import selector_events
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.servers.h2drain import H2DrainServer
from tests.servers.h2raw import RawH2Server
from tests.servers.hostile import HostileServer
from tests.servers.tls import Pki, make_pki


@pytest.fixture
async def hostile() -> AsyncIterator[HostileServer]:
    """The misbehaving HTTP/1.1 server (`tests/servers/hostile.py`)."""
    async with HostileServer() as server:
        yield server


@pytest.fixture
async def raw() -> AsyncIterator[RawH2Server]:
    """A raw HTTP/2 server that sends what a test tells it to (`tests/servers/h2raw.py`)."""
    async with RawH2Server() as server:
        yield server


@pytest.fixture
async def h2c() -> AsyncIterator[H2DrainServer]:
    """A well-behaved h2c server that can drain with GOAWAY (`tests/servers/h2drain.py`)."""
    async with H2DrainServer() as server:
        yield server


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with a server and a client certificate it signed (openssl CLI)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Another CA: its client certificate is well formed but not one the targets trust."""
    return make_pki(tmp_path_factory.mktemp("pki-other"), "other")


def _name_unclosed_transports() -> None:
    """An asyncio transport left open warns only `unclosed transport <fd=N>` when the
    collector frees it, often during a later test: name the protocol it served and the test
    that opened it, so the leak can be found (the warning is an error in this suite)."""
    transport_class: Any = selector_events._SelectorTransport  # type: ignore[attr-defined]
    init = transport_class.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._opened_in = os.environ.get("PYTEST_CURRENT_TEST", "outside a test")

    def naming_del(self: Any, _warn: Any = warnings.warn) -> None:
        if self._sock is not None:
            _warn(f"unclosed transport {self!r} of {self._protocol!r}, opened in "
                  f"{getattr(self, '_opened_in', '?')}", ResourceWarning, source=self)
            self._sock.close()

    transport_class.__init__ = recording_init  # type: ignore[method-assign]
    transport_class.__del__ = naming_del  # type: ignore[attr-defined]


_name_unclosed_transports()
