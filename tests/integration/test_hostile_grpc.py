"""Hostile gRPC targets, one real server each on loopback, for unary calls and held streams:
garbage frames and messages, a reset in the middle of a stream, slowloris headers, TLS
mismatches both ways, a name that does not resolve. Each gets its exact outcome class (or
stream end reason) within the path's timeout.

The raw server (tests/servers/h2raw.py) answers by the method's last path segment.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc
import grpc.aio
import pytest

from probes.clients import EndReason, StreamEnd, StreamProber
from probes.spec import GrpcSpec, PathSpec, StreamSpec, TlsSpec
from probes.types import Endpoint, Outcome
from tests.integration.test_hostile_http import FAR_DEADLINE_S, UNRESOLVABLE
from tests.integration.test_streams_prober import FAST, ListSink, holding
from tests.servers._loopback import served_apart
from tests.servers.engine import endpoint_at, one_call, stuck_beside_healthy
from tests.servers.h2raw import RawH2Server
from tests.servers.hostile import HostileServer
from tests.servers.tls import SERVER_NAME, Cert, make_cert


def unary(method: str, *, timeout_s: float = 1.0, **spec: object) -> PathSpec:
    return PathSpec(
        name="g",
        rate_per_s=1.0,
        timeout_s=timeout_s,
        grpc=GrpcSpec(method=f"/x.Hostile/{method}", **spec),  # type: ignore[arg-type]
    )


at = endpoint_at


async def first_end(endpoint: Endpoint, method: str = "x", tls: TlsSpec | None = None
                    ) -> StreamEnd:
    """Hold one stream of `method` on `endpoint` until it ends; its end."""
    sink = ListSink()
    spec = PathSpec("s", 1.0, 1.0, stream=StreamSpec(method=f"/x.Hostile/{method}", tls=tls))
    prober = StreamProber([spec], sink, policy=FAST)
    async with holding(prober, spec, endpoint):
        await sink.wait(lambda s: len(s.ended) >= 1, within=3.0)
    return sink.ended[0]


@pytest.fixture
def cert(tmp_path: Path) -> Cert:
    return make_cert(tmp_path)


# --- unary: garbage in the answer ------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "outcome", "detail"),
    [
        # A length prefix promising more than the stream carries: grpc core drops the cut
        # message, so the call "succeeds" with none; a unary answer must carry one.
        ("badlength", "grpc_INTERNAL", "status OK without a message"),
        ("compressed", "grpc_INTERNAL", "Compression bit set but no encoding"),
        # A 50 MiB message is refused at its length prefix (the 4 MiB receive limit).
        ("huge", "grpc_RESOURCE_EXHAUSTED", "larger than max"),
        # HTTP/2 that does not parse: grpc core says UNKNOWN or INTERNAL; the class is the
        # same as for an HTTP/2 path.
        ("badframe", Outcome.PROTOCOL_ERROR, "max frame size"),
        ("badhpack", Outcome.PROTOCOL_ERROR, "hpack|header block"),
        # A reset after the message, before the trailers.
        ("tcprst", "grpc_UNAVAILABLE", "Connection reset"),
        # Raw bytes are counted, not parsed: what a non-protobuf answer means is the
        # callee's business (the health check below does parse).
        ("notproto", Outcome.OK, ""),
        # The server cancels the call well inside its deadline: cancelled, not the deadline.
        ("rst8", "grpc_CANCELLED", "error code 8|reset by the server (CANCEL)"),
    ],
)
async def test_unary_garbage_is_classified(raw, mode, outcome, detail, grpc_client):
    result, took = await one_call(
        unary(mode, timeout_s=FAR_DEADLINE_S), at(raw.port), on=grpc_client
    )
    assert result.outcome == outcome, result
    # grpc core's words, or the probe's own client's ("a|b": either).
    assert any(d in result.detail for d in detail.split("|")), result.detail
    assert took < FAR_DEADLINE_S / 2  # answered after 0.2 s at most; never the deadline


async def test_a_server_cancel_after_the_deadline_is_the_deadline(grpc_client):
    """A gRPC server resets a call whose `grpc-timeout` ran out (RST_STREAM CANCEL). Read
    after the call's own deadline, before the probe's own timer for it has run (a busy
    probe's race: its loop is held here from the request's arrival until the reset is on
    the wire, so the reset is read first), it is DEADLINE_EXCEEDED, as grpc core reports
    it, not CANCELLED."""
    loop = asyncio.get_running_loop()
    ended = threading.Event()

    def hold_the_probe(mode: str) -> None:
        # Bounded only against a hang: the server writes its reset at the deadline.
        loop.call_soon_threadsafe(ended.wait, 30.0)

    server = RawH2Server(on_request=hold_the_probe, on_end=lambda mode: ended.set())
    prober = grpc_client.build(unary("deadline", timeout_s=1.0))
    async with served_apart(server):
        try:  # no engine deadline around it: the call's own deadline ends it
            result = await prober.call(at(server.port), "req-1")
        finally:
            await prober.aclose()
    assert ended.is_set()
    assert result.outcome == "grpc_DEADLINE_EXCEEDED", result
    if grpc_client.name == "lean":  # the reset, not the probe's own timer, ended it
        assert "reset by the server after it" in result.detail, result.detail


async def test_a_health_answer_that_is_not_protobuf_is_unexpected(grpc_client):
    async with RawH2Server(fallback="notproto") as server:
        result, _ = await one_call(
            unary("Check", health_service=""), at(server.port), on=grpc_client
        )
    assert result.outcome == Outcome.UNEXPECTED_STATUS
    assert result.detail == "health status UNPARSEABLE"


async def test_an_http1_server_is_a_protocol_error(grpc_client):
    async with HostileServer() as server:
        result, _ = await one_call(unary("Echo"), at(server.port), on=grpc_client)
        end = await first_end(at(server.port))
    assert result.outcome == Outcome.PROTOCOL_ERROR
    assert ("http1.x server" if grpc_client.name == "grpcio" else "answered in HTTP/1.x") in (
        result.detail)
    assert (end.reason, end.established) == (EndReason.PROTOCOL_ERROR, False)


async def test_slowloris_headers_hit_the_deadline_and_do_not_hold_up_other_calls(
    raw, grpc_client
):
    timeout_s = 1.0
    slow = grpc_client.build(unary("slowheaders", timeout_s=timeout_s))
    good = grpc_client.build(unary("status0", timeout_s=timeout_s))
    async with RawH2Server(after_s=0.0) as healthy:
        # The engine's deadline around the stuck call is only a guard against a hang: which of
        # two timers 50 ms apart is read first is a race a loaded machine loses, and the call's
        # own deadline is what this test is about.
        (result, _), answers = await stuck_beside_healthy(
            slow, at(raw.port), good, at(healthy.port, name="pod-1"), timeout_s,
            stuck_timeout_s=30.0)
    # grpc core's own deadline (just inside the path's) reports it.
    assert result.outcome == "grpc_DEADLINE_EXCEEDED", result
    # Held up until the stuck call ended, the loop would get one answer: more came meanwhile.
    assert len(answers) >= 2
    assert {a.outcome for a, _ in answers} == {Outcome.OK}


# --- streams: garbage and resets after messages -------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "reason", "messages"),
    [
        # The TCP connection reset (SO_LINGER 0) after three messages.
        ("tcprst-3", EndReason.CONNECTION_RESET, 3),
        # Malformed HTTP/2 after two messages: grpc core tears the connection down, but the
        # server's frames, not the network, were at fault.
        ("badframe-2", EndReason.PROTOCOL_ERROR, 2),
        ("badhpack-2", EndReason.PROTOCOL_ERROR, 2),
        ("compressed", "grpc_INTERNAL", 0),
        ("huge", "grpc_RESOURCE_EXHAUSTED", 0),
    ],
)
async def test_a_stream_cut_by_garbage_or_a_reset_is_a_reset_with_its_reason(
    raw, mode, reason, messages
):
    end = await first_end(at(raw.port), mode)
    assert (end.reason, end.messages) == (reason, messages), end.detail
    assert end.established and end.is_reset


@pytest.mark.parametrize(
    ("mode", "messages"),
    [
        # grpc core discards a message whose length prefix overruns the end of the stream and
        # reports the OK trailers: an orderly end with no message. Pinned here so a grpc
        # release that starts to report it shows up.
        ("badlength", 0),
        # Raw messages are counted, not parsed.
        ("notproto", 1),
    ],
)
async def test_streams_that_end_in_order_despite_a_bad_message(raw, mode, messages):
    end = await first_end(at(raw.port), mode)
    assert (end.reason, end.messages) == (EndReason.SERVER_CLOSED_OK, messages)
    assert not end.is_reset


# --- TLS mismatches ----------------------------------------------------------------------------


async def test_tls_on_a_plaintext_port(raw, cert, grpc_client):
    tls = TlsSpec(ca=str(cert.cert), server_name=SERVER_NAME)
    result, _ = await one_call(unary("status0", tls=tls), at(raw.port), on=grpc_client)
    assert result.outcome == Outcome.TLS_ERROR
    assert "WRONG_VERSION_NUMBER" in result.detail
    # A stream that cannot complete its handshake never opened: an open failure.
    end = await first_end(at(raw.port), "status0", tls=tls)
    assert (end.reason, end.established) == (EndReason.REFUSED, False)
    assert "Tls handshake failed" in end.detail


async def test_plaintext_on_a_tls_port(cert, grpc_client):
    # The server's TLS stack closes the connection at the first plaintext bytes; grpc core
    # reports a socket closed while connecting, the probe's own client a disconnect.
    server = grpc.aio.server()
    creds = grpc.ssl_server_credentials([(cert.key.read_bytes(), cert.cert.read_bytes())])
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    try:
        result, _ = await one_call(unary("status0"), at(port), on=grpc_client)
        end = await first_end(at(port), "status0")
    finally:
        await server.stop(None)
    assert result.outcome == "grpc_UNAVAILABLE"
    said = "socket closed" if grpc_client.name == "grpcio" else "disconnected"
    assert said in result.detail.lower()
    assert (end.reason, end.established) == (EndReason.REFUSED, False)


# --- DNS -------------------------------------------------------------------------------------


async def test_a_name_that_does_not_resolve(grpc_client):
    result, took = await one_call(
        unary("status0", timeout_s=FAR_DEADLINE_S), at(80, UNRESOLVABLE), on=grpc_client)
    assert result.outcome == Outcome.DNS_ERROR
    assert took < FAR_DEADLINE_S / 2  # the lookup failed; it was not the deadline
    end = await first_end(at(80, UNRESOLVABLE))
    assert (end.reason, end.established) == (EndReason.REFUSED, False)
    assert "resolving" in end.detail
