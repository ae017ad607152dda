"""GrpcProber against a real grpc.aio server started in the test (generic bytes handlers and
the standard health service), plus refused and black-holed ports and TLS."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from probes.errors import BadInput
from probes.spec import ExpectSpec, GrpcSpec, PathSpec, TlsSpec
from probes.types import Endpoint, Outcome
from tests.integration.test_hostile_http import FAR_DEADLINE_S
from tests.servers.engine import engine_call, one_call
from tests.servers.h2drain import H2DrainServer
from tests.servers.hostile import closed_port, full_backlog
from tests.servers.tls import SERVER_NAME, make_cert

SERVICE = "skewprobe.test.Probe"


class ProbeService:
    """Generic unary handlers on raw bytes, each producing one kind of answer."""

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.requests: list[bytes] = []

    def _note(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        self.requests.append(request)
        metadata = dict(context.invocation_metadata() or ())
        self.request_ids.append(str(metadata.get("x-request-id", "")))

    async def echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._note(request, context)
        await context.send_initial_metadata((("x-proxy-version", "1.21.0"),))
        context.set_trailing_metadata((("x-envoy-attempt-count", "2"),))
        return request

    async def app_attempts(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._note(request, context)
        context.set_trailing_metadata((("x-app-attempts", "4"),))
        return b""

    async def unavailable(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._note(request, context)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "upstream connect error")
        return b""

    async def not_found(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._note(request, context)
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        return b""

    async def slow(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._note(request, context)
        await asyncio.sleep(5.0)
        return b""

    def handler(self) -> grpc.GenericRpcHandler:
        methods = {
            "Echo": self.echo,
            "AppAttempts": self.app_attempts,
            "Unavailable": self.unavailable,
            "NotFound": self.not_found,
            "Slow": self.slow,
        }
        return grpc.method_handlers_generic_handler(
            SERVICE, {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in methods.items()}
        )


class GrpcTarget:
    def __init__(self, service: ProbeService, port: int, server: grpc.aio.Server) -> None:
        self.service = service
        self.port = port
        self.server = server


async def start_server(credentials: grpc.ServerCredentials | None = None):
    service = ProbeService()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((service.handler(),))
    servicer = health.aio.HealthServicer()
    await servicer.set("svc.up", health_pb2.HealthCheckResponse.SERVING)
    await servicer.set("svc.down", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return GrpcTarget(service, port, server)


@pytest.fixture
async def target() -> AsyncIterator[GrpcTarget]:
    started = await start_server()
    try:
        yield started
    finally:
        await started.server.stop(None)


# Every test here runs on both gRPC clients (tests/integration/conftest.py).
def grpc_path(
    method: str = "Echo",
    *,
    timeout_s: float = 2.0,
    expect: tuple[str, ...] = ("OK",),
    health_service: str | None = None,
    tls: TlsSpec | None = None,
    **path: object,
) -> PathSpec:
    return PathSpec(
        name="g",
        rate_per_s=1.0,
        timeout_s=timeout_s,
        grpc=GrpcSpec(
            method=f"/{SERVICE}/{method}",
            request=b"\x0a\x02hi",
            metadata={"X-Tenant": "probe"},
            health_service=health_service,
            tls=tls,
        ),
        expect=ExpectSpec(grpc_codes=expect),
        **path,  # type: ignore[arg-type]
    )


def at(port: int) -> Endpoint:
    return Endpoint("pod-0", "127.0.0.1", port, {"proxy_version": "1.20.3"})


async def test_ok_sends_bytes_and_request_id_and_reads_metadata(target, grpc_client):
    path = grpc_path(cohort_header="x-proxy-version")
    outcome, _ = await one_call(path, at(target.port), "abc-1", on=grpc_client)
    assert outcome.outcome == Outcome.OK
    assert (outcome.status, outcome.attempts, outcome.cohort_hint) == (0, 2, "1.21.0")
    assert target.service.requests == [b"\x0a\x02hi"]
    assert target.service.request_ids == ["abc-1"]


async def test_attempts_fall_back_to_the_app_echo_in_trailers(target, grpc_client):
    outcome, _ = await one_call(grpc_path("AppAttempts"), at(target.port), on=grpc_client)
    assert outcome.outcome == Outcome.OK
    assert outcome.attempts == 4


async def test_unavailable_keeps_the_details(target, grpc_client):
    outcome, _ = await one_call(grpc_path("Unavailable"), at(target.port), on=grpc_client)
    assert outcome.outcome == "grpc_UNAVAILABLE"
    assert outcome.status == grpc.StatusCode.UNAVAILABLE.value[0]
    assert outcome.detail == "upstream connect error"
    assert outcome.churn == 0


async def test_expected_codes_are_ok(target, grpc_client):
    outcome, _ = await one_call(
        grpc_path("NotFound", expect=("OK", "NOT_FOUND")), at(target.port), on=grpc_client
    )
    assert outcome.outcome == Outcome.OK
    outcome, _ = await one_call(grpc_path("NotFound"), at(target.port), on=grpc_client)
    assert outcome.outcome == "grpc_NOT_FOUND"


async def test_deadline_exceeded_is_reported_before_the_engine_deadline(target, grpc_client):
    # The call's own deadline, just inside the path's, ends it. The engine's deadline is pushed
    # out to a guard against a hang: which of two timers 50 ms apart a loaded loop reads first
    # is a race.
    outcome, _ = await one_call(grpc_path("Slow", timeout_s=1.0), at(target.port), on=grpc_client,
                                engine_timeout_s=FAR_DEADLINE_S)
    assert outcome.outcome == "grpc_DEADLINE_EXCEEDED"


async def test_unimplemented_method(target, grpc_client):
    outcome, _ = await one_call(grpc_path("NoSuchMethod"), at(target.port), on=grpc_client)
    assert outcome.outcome == "grpc_UNIMPLEMENTED"


@pytest.mark.parametrize(
    ("service", "outcome", "detail"),
    [
        ("svc.up", Outcome.OK, ""),
        ("", Outcome.OK, ""),  # the server's overall health, SERVING by default
        ("svc.down", Outcome.UNEXPECTED_STATUS, "health status NOT_SERVING"),
        ("svc.unknown", "grpc_NOT_FOUND", ""),
    ],
)
async def test_health_check(target, service, outcome, detail, grpc_client):
    result, _ = await one_call(grpc_path(health_service=service), at(target.port), on=grpc_client)
    assert result.outcome == outcome
    assert detail in result.detail


async def test_connect_refused_is_unavailable_with_the_reason(grpc_client):
    with closed_port() as port:
        outcome, _ = await one_call(grpc_path(), at(port), on=grpc_client)
    assert outcome.outcome == "grpc_UNAVAILABLE"
    assert "refused" in outcome.detail.lower()


async def test_black_holed_port_is_a_deadline_with_no_connection(grpc_client):
    with full_backlog() as port:
        # As above: the call's own deadline ends it; the engine's only guards against a hang.
        outcome, _ = await one_call(grpc_path(timeout_s=1.0), at(port), on=grpc_client,
                                    engine_timeout_s=FAR_DEADLINE_S)
    assert outcome.outcome == "grpc_DEADLINE_EXCEEDED"
    assert "no connection yet" in outcome.detail


async def test_one_channel_per_endpoint_closed_on_forget(grpc_client):
    async with H2DrainServer() as server:
        prober = grpc_client.build(grpc_path())
        try:
            for rid in ("r1", "r2", "r3"):
                outcome, _ = await engine_call(prober, at(server.port), 2.0, rid)
                assert outcome.outcome == Outcome.OK
            assert server.connections == 1
            prober.forget(at(server.port))
            await asyncio.wait_for(server.wait_open_connections(0), 2.0)
        finally:
            await prober.aclose()


async def test_tls_with_the_right_ca_and_server_name(tmp_path: Path, grpc_client):
    cert = make_cert(tmp_path)
    credentials = grpc.ssl_server_credentials([(cert.key.read_bytes(), cert.cert.read_bytes())])
    started = await start_server(credentials)
    try:
        good = TlsSpec(ca=str(cert.cert), server_name=SERVER_NAME)
        outcome, _ = await one_call(grpc_path(tls=good), at(started.port), on=grpc_client)
        assert outcome.outcome == Outcome.OK
        # Not trusted: the handshake fails; gRPC says UNAVAILABLE, the detail says TLS.
        outcome, _ = await one_call(grpc_path(tls=TlsSpec()), at(started.port), on=grpc_client)
        assert outcome.outcome == Outcome.TLS_ERROR
        assert "ssl" in outcome.detail.lower() or "handshake" in outcome.detail.lower()
    finally:
        await started.server.stop(None)


def test_insecure_skip_verify_is_refused_for_grpc(grpc_client):
    with pytest.raises(BadInput, match="insecure_skip_verify"):
        grpc_client.build(grpc_path(tls=TlsSpec(insecure_skip_verify=True)))


def test_bad_method_name_is_bad_input(grpc_client):
    path = PathSpec("g", 1.0, 1.0, grpc=GrpcSpec(method="Echo"))
    with pytest.raises(BadInput, match=r"grpc\.method"):
        grpc_client.build(path)
