"""HttpProber against real loopback servers: one test per outcome class, both HTTP versions
where the behaviour lives below HTTP (connecting, hanging), plus the body cap, keep-alive,
attempts and cohort headers, and connection lifecycle."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

import pytest

from probes.clients import BODY_LIMIT, HttpProber
from probes.errors import BadInput
from probes.spec import ExpectSpec, HttpSpec, PathSpec, TlsSpec
from probes.types import Endpoint, Outcome
from tests.integration.test_hostile_http import FAR_DEADLINE_S
from tests.servers.engine import engine_call, one_call
from tests.servers.hostile import HostileServer, accept_and_hang, closed_port, full_backlog
from tests.servers.tls import SERVER_NAME, make_cert


def http_path(
    target: str = "/status/200",
    *,
    version: str = "1.1",
    timeout_s: float = 2.0,
    expect: tuple[int, ...] = (200,),
    **spec: object,
) -> PathSpec:
    extra = {k: spec.pop(k) for k in ("attempts_header", "cohort_header", "port") if k in spec}
    return PathSpec(
        name="p",
        rate_per_s=1.0,
        timeout_s=timeout_s,
        http=HttpSpec(path=target, version=version, **spec),  # type: ignore[arg-type]
        expect=ExpectSpec(status=expect),
        **extra,  # type: ignore[arg-type]
    )


def at(port: int, host: str = "127.0.0.1", **ports: int) -> Endpoint:
    return Endpoint("pod-0", host, port, {"proxy_version": "1.20.3"}, ports=ports)


# --- answers -------------------------------------------------------------------------------


async def test_ok_sends_request_id_and_reads_attempts_and_cohort_http1(hostile):
    path = http_path(
        "/status/200?x-envoy-attempt-count=3&x-proxy-version=1.21.0",
        cohort_header="X-Proxy-Version",
    )
    outcome, _ = await one_call(path, at(hostile.port), "abc-123")
    assert outcome.outcome == Outcome.OK
    assert (outcome.status, outcome.attempts, outcome.cohort_hint) == (200, 3, "1.21.0")
    assert outcome.churn == 0
    assert hostile.request_ids == ["abc-123"]


async def test_ok_reads_attempts_and_cohort_http2(h2c, h2_client):
    path = http_path(
        "/status/200?x-envoy-attempt-count=2&x-proxy-version=1.21.0",
        version="2",
        cohort_header="x-proxy-version",
    )
    outcome, _ = await one_call(path, at(h2c.port), "abc-456", on=h2_client)
    assert outcome.outcome == Outcome.OK
    assert (outcome.status, outcome.attempts, outcome.cohort_hint) == (200, 2, "1.21.0")
    assert [p.request_id for p in h2c.processed] == ["abc-456"]


async def test_attempts_fall_back_to_the_targets_echo_header(hostile):
    outcome, _ = await one_call(http_path("/status/200?x-app-attempts=4"), at(hostile.port))
    assert outcome.attempts == 4


async def test_attempts_header_is_configurable(hostile):
    path = http_path("/status/200?x-tries=5&x-envoy-attempt-count=9", attempts_header="x-tries")
    outcome, _ = await one_call(path, at(hostile.port))
    assert outcome.attempts == 5


async def test_attempts_absent_is_none_never_one(hostile):
    outcome, _ = await one_call(
        http_path("/status/200?x-envoy-attempt-count=many"), at(hostile.port)
    )
    assert outcome.outcome == Outcome.OK
    assert outcome.attempts is None


@pytest.mark.parametrize(
    ("status", "expect", "outcome"),
    [
        (503, (200,), Outcome.HTTP_5XX),
        (404, (200,), Outcome.HTTP_4XX),
        (302, (200,), Outcome.UNEXPECTED_STATUS),
        (204, (200,), Outcome.UNEXPECTED_STATUS),
        (204, (200, 204), Outcome.OK),
        (503, (503,), Outcome.OK),
    ],
)
async def test_status_classes(hostile, h2c, version, status, expect, outcome):
    server = h2c if version.number == "2" else hostile
    result, _ = await one_call(
        http_path(f"/status/{status}", version=version.number, expect=expect), at(server.port),
        on=version.clients,
    )
    assert result.outcome == outcome
    assert result.status == status


async def test_keep_alive_reuses_one_connection_per_endpoint(hostile):
    prober = HttpProber(http_path())
    try:
        for i in range(3):
            outcome, _ = await engine_call(prober, at(hostile.port), 2.0, f"r{i}")
            assert outcome.outcome == Outcome.OK
    finally:
        await prober.aclose()
    assert hostile.connections == 1
    assert hostile.request_ids == ["r0", "r1", "r2"]


async def test_keep_alive_http2(h2c, h2_client):
    prober = h2_client.build(http_path(version="2"))
    try:
        results = await asyncio.gather(
            *(engine_call(prober, at(h2c.port), 2.0, f"r{i}") for i in range(5))
        )
    finally:
        await prober.aclose()
    assert {r.outcome for r, _ in results} == {Outcome.OK}
    assert h2c.connections == 1


# --- the callee misbehaves -----------------------------------------------------------------


async def test_connect_refused(version):
    with closed_port() as port:
        outcome, _ = await one_call(http_path(version=version.number), at(port), on=version.clients)
    assert outcome.outcome == Outcome.CONNECT_REFUSED
    assert "refused" in outcome.detail.lower() or "failed" in outcome.detail.lower()


async def test_connect_timeout_when_syns_are_dropped(version):
    # The prober's own connect timeout fires inside the engine's deadline, so the outcome
    # says the connection never came up rather than just "timeout".
    with full_backlog() as port:
        # The engine's deadline is pushed out to a guard against a hang: which of two timers
        # 50 ms apart a loaded loop reads first is a race.
        outcome, _ = await one_call(
            http_path(version=version.number, timeout_s=1.0), at(port), on=version.clients,
            engine_timeout_s=FAR_DEADLINE_S)
    assert outcome.outcome == Outcome.CONNECT_TIMEOUT


async def test_timeout_when_accepted_but_never_answered(version):
    async with accept_and_hang() as port:
        outcome, _ = await one_call(
            http_path(version=version.number, timeout_s=0.3), at(port), on=version.clients
        )
    # The deadline's class: nothing else ends a call the server never answers.
    assert outcome.outcome == Outcome.TIMEOUT


async def test_timeout_after_the_request_was_read(hostile):
    outcome, _ = await one_call(http_path("/hang", timeout_s=0.3), at(hostile.port))
    assert outcome.outcome == Outcome.TIMEOUT
    assert hostile.requests == 1


async def test_reset_is_classified_and_not_silently_retried(hostile):
    # aiohttp would re-send an idempotent request after a reset on its own; the probe must
    # see the reset once, and the callee must see one request.
    outcome, _ = await one_call(http_path("/reset"), at(hostile.port))
    assert outcome.outcome == Outcome.RESET
    assert "reset" in outcome.detail.lower()
    assert hostile.requests == 1
    assert outcome.churn == 0


async def test_close_without_answer_on_a_fresh_connection_is_a_reset(hostile):
    outcome, _ = await one_call(http_path("/close"), at(hostile.port))
    assert outcome.outcome == Outcome.RESET
    assert hostile.requests == 1


async def test_garbage_answer_is_a_protocol_error(hostile):
    outcome, _ = await one_call(http_path("/garbage"), at(hostile.port))
    assert outcome.outcome == Outcome.PROTOCOL_ERROR


async def test_http2_against_an_http1_only_server_is_a_protocol_error(hostile, h2_client):
    outcome, _ = await one_call(http_path(version="2"), at(hostile.port), on=h2_client)
    assert outcome.outcome == Outcome.PROTOCOL_ERROR


async def test_stale_keep_alive_connection_is_re_sent_once_as_churn():
    # The server drops a reused keep-alive connection as the second request arrives
    # (RFC 9112 §9.3.1): an idempotent request is re-sent on a fresh connection.
    async with HostileServer(drop_after=1) as server:
        prober = HttpProber(http_path())
        try:
            first, _ = await engine_call(prober, at(server.port), 2.0, "r1")
            second, _ = await engine_call(prober, at(server.port), 2.0, "r2")
        finally:
            await prober.aclose()
    assert first.outcome == second.outcome == Outcome.OK
    assert (first.churn, second.churn) == (0, 1)
    assert "keep-alive" in second.detail
    assert server.request_ids == ["r1", "r2", "r2"]
    assert server.connections == 2


# --- bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["/big/52428800", "/endless"])
async def test_huge_or_endless_body_is_cut_with_bounded_memory(hostile, target):
    prober = HttpProber(http_path(target))
    tracemalloc.start()
    try:
        outcome, _ = await engine_call(prober, at(hostile.port), 5.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    try:
        assert outcome.outcome == Outcome.OK  # the 5 s deadline would have been a timeout
        assert outcome.detail.startswith("body truncated at ")
        read = int(outcome.detail.removeprefix("body truncated at ").removesuffix(" bytes"))
        assert BODY_LIMIT <= read <= 2 * BODY_LIMIT  # it stopped reading at the limit
        assert peak < 8 * BODY_LIMIT  # 50 MB buffered would be 50x this
        # The cut connection is not reused; the endpoint still answers.
        again, _ = await engine_call(prober, at(hostile.port), 2.0)
        assert again.outcome == Outcome.OK
    finally:
        await prober.aclose()


async def test_huge_body_over_http2_is_cut_and_the_connection_stays_usable(h2c, h2_client):
    prober = h2_client.build(http_path("/big/52428800", version="2"))
    try:
        outcome, _ = await engine_call(prober, at(h2c.port), 5.0)
        assert outcome.outcome == Outcome.OK
        assert outcome.detail.startswith("body truncated")
        again, _ = await engine_call(prober, at(h2c.port), 5.0)
        assert again.outcome == Outcome.OK
    finally:
        await prober.aclose()
    # The probe's own client resets the stream (CANCEL) and keeps the connection; httpcore
    # cannot reset one stream, and a stream left half-read would hold the connection's
    # flow-control window, so that connection is retired.
    assert h2c.connections == (2 if h2_client.name == "httpcore" else 1)


# --- TLS -----------------------------------------------------------------------------------


@pytest.fixture
def cert(tmp_path: Path):
    return make_cert(tmp_path)


async def test_tls_ok_with_the_right_ca_and_server_name(cert):
    async with HostileServer(ssl_context=cert.server_context()) as server:
        tls = TlsSpec(ca=str(cert.cert), server_name=SERVER_NAME)
        outcome, _ = await one_call(http_path(scheme="https", tls=tls), at(server.port))
    assert outcome.outcome == Outcome.OK


async def test_tls_error_when_the_certificate_is_not_trusted(cert):
    async with HostileServer(ssl_context=cert.server_context()) as server:
        outcome, _ = await one_call(http_path(scheme="https"), at(server.port))
    assert outcome.outcome == Outcome.TLS_ERROR
    assert "certificate" in outcome.detail.lower()


async def test_tls_error_when_https_meets_a_plaintext_server(hostile):
    outcome, _ = await one_call(http_path(scheme="https"), at(hostile.port))
    assert outcome.outcome == Outcome.TLS_ERROR


async def test_plaintext_against_a_tls_server_is_not_ok(cert):
    # The server's TLS stack rejects the plaintext request and hangs up; over plaintext the
    # client cannot know TLS was expected, so this reads as the connection being dropped.
    async with HostileServer(ssl_context=cert.server_context()) as server:
        outcome, _ = await one_call(http_path(), at(server.port))
    assert outcome.outcome in (Outcome.RESET, Outcome.PROTOCOL_ERROR)


def test_unreadable_ca_is_bad_input(tmp_path: Path):
    tls = TlsSpec(ca=str(tmp_path / "missing.pem"))
    with pytest.raises(BadInput, match="path p: tls"):
        HttpProber(http_path(scheme="https", tls=tls))


def test_bad_version_is_bad_input():
    with pytest.raises(BadInput, match="version"):
        HttpProber(http_path(version="3"))


# --- lifecycle -----------------------------------------------------------------------------


async def test_unknown_port_name_is_a_probe_error(hostile):
    outcome, _ = await one_call(http_path(port="admin"), at(hostile.port))
    assert outcome.outcome == Outcome.PROBE_ERROR
    assert hostile.connections == 0


async def test_named_port_is_used(hostile):
    outcome, _ = await one_call(http_path(port="http"), at(1, http=hostile.port))
    assert outcome.outcome == Outcome.OK


async def test_forget_closes_the_endpoints_connections(hostile, h2c, version):
    server = h2c if version.number == "2" else hostile
    prober = version.clients.build(http_path(version=version.number))
    try:
        outcome, _ = await engine_call(prober, at(server.port), 2.0)
        assert outcome.outcome == Outcome.OK
        await asyncio.wait_for(server.wait_open_connections(1), 2.0)
        prober.forget(at(server.port))
        await asyncio.wait_for(server.wait_open_connections(0), 2.0)
        # A forgotten endpoint that comes back gets a new connection.
        outcome, _ = await engine_call(prober, at(server.port), 2.0)
        assert outcome.outcome == Outcome.OK
        assert server.connections == 2
    finally:
        await prober.aclose()


async def test_forget_waits_for_in_flight_calls(hostile):
    prober = HttpProber(http_path("/big/200000"))
    try:
        call = asyncio.ensure_future(engine_call(prober, at(hostile.port), 2.0))
        await asyncio.wait_for(hostile.wait_open_connections(1), 2.0)
        prober.forget(at(hostile.port))
        outcome, _ = await call
        assert outcome.outcome == Outcome.OK
    finally:
        await prober.aclose()


async def test_call_after_aclose_is_an_error(hostile):
    prober = HttpProber(http_path())
    await prober.aclose()
    with pytest.raises(RuntimeError):
        await prober.call(at(hostile.port), "r")
