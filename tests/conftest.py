"""Fixtures more than one test module uses."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
