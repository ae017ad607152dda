"""Loopback ports for servers a test starts by address (a subprocess, hypercorn, Prometheus)
rather than by binding port 0 itself."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now: bound and released, so it stays free unless
    another process takes it before the test's server binds it."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
