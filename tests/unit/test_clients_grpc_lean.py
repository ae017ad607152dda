"""`_grpc.timeout_header`: the deadline the server is told never falls before the
call's own (rounded up to the millisecond, as grpc core and grpc-go round it)."""

from __future__ import annotations

import pytest

from probes.clients._grpc import timeout_header


@pytest.mark.parametrize(
    ("seconds", "value"),
    [(0.9996, b"1000m"), (0.95, b"950m"), (0.0001, b"1m"), (0.0, b"1m"), (1e9, b"99999999m")],
)
def test_grpc_timeout_is_rounded_up_to_the_millisecond(seconds: float, value: bytes) -> None:
    assert timeout_header(seconds) == (b"grpc-timeout", value)
