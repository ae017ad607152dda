"""Loopback ports for servers a test starts by address (a subprocess, hypercorn, Prometheus)
rather than by binding port 0 itself."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now: bound and released, so it stays free unless
    another process takes it before the test's server binds it."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def refused_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port that refuses connections for as long as the block runs: bound, never listened
    on, and held, so no other process (another test, another worker) can take it meanwhile."""
    with socket.socket() as s:
        s.bind((host, 0))
        yield int(s.getsockname()[1])
