"""The conformance suites: every HTTP/2 test of the client modules runs on both HTTP/2
clients, the probe's own (`_h2lean`) and httpcore's (`_h2`), and every gRPC unary test on
both gRPC clients, grpc core's (grpc.aio) and the probe's own (`_grpc_lean` over `_h2lean`),
as uvicorn runs one suite on both its HTTP parsers. A test takes `h2_client` (HTTP/2 only),
`version` ("1.1", then "2" on each client) or `grpc_client`; where the clients differ on
purpose (or only in a detail's words), the test says which does what."""

from __future__ import annotations

import pytest

from probes.clients import _grpc, _http


@pytest.fixture(params=_http.H2_CLIENTS)
def h2_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The HTTP/2 client HttpProber picks by default for this test."""
    monkeypatch.setattr(_http, "H2_CLIENT", request.param)
    return str(request.param)


@pytest.fixture(params=["1.1", *(f"2-{name}" for name in _http.H2_CLIENTS)])
def version(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The HTTP version a test's path asks for; HTTP/2 once on each client."""
    value = str(request.param)
    if value.startswith("2-"):
        monkeypatch.setattr(_http, "H2_CLIENT", value.removeprefix("2-"))
        return "2"
    return value


@pytest.fixture(params=_grpc.GRPC_CLIENTS)
def grpc_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The gRPC unary client GrpcProber picks by default for this test: grpc core (grpc.aio)
    or the probe's own HTTP/2 client."""
    monkeypatch.setattr(_grpc, "GRPC_CLIENT", request.param)
    return str(request.param)
