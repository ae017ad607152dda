"""The conformance suite: every HTTP/2 test of the client modules runs on the probe's own
HTTP/2 client (`_h2lean`) and on the library reference, httpcore's
(`tests/reference/httpcore_h2.py`), and every gRPC unary test on the probe's own
(`_grpc` over `_h2lean`) and on grpc core's (grpc.aio, `tests/reference/grpcio_unary.py`),
as uvicorn runs one suite on both its HTTP parsers. A test takes `h2_client` (HTTP/2 only),
`version` (HTTP/1.1, then HTTP/2 on each client) or `grpc_client`, and builds its probers
with the fixture's `build`; where the clients differ on purpose (or only in a detail's
words), the test says which does what."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from tests.reference import GRPCIO, HTTPCORE, OWN, Clients


class Version(NamedTuple):
    """An HTTP version, and the clients a test builds its probers with."""

    number: str
    clients: Clients


@pytest.fixture(params=[OWN, HTTPCORE], ids=lambda c: c.name)
def h2_client(request: pytest.FixtureRequest) -> Clients:
    """The clients whose HTTP/2 client this test runs on."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(
    params=[Version("1.1", OWN), Version("2", OWN), Version("2", HTTPCORE)],
    ids=["1.1", "2-lean", "2-httpcore"],
)
def version(request: pytest.FixtureRequest) -> Version:
    """The HTTP version a test's path asks for; HTTP/2 once on each client."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=[GRPCIO, OWN], ids=lambda c: c.name)
def grpc_client(request: pytest.FixtureRequest) -> Clients:
    """The clients whose gRPC unary client this test runs on: grpc core (grpc.aio) or the
    probe's own HTTP/2 client."""
    return request.param  # type: ignore[no-any-return]
