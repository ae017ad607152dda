"""Connection churn: a request the server provably did not process is re-sent once on a fresh
connection and counted in `churn`, not as a failure (RFC 9113 §6.8, §8.7).

The server (tests/servers/h2drain.py) holds four requests on its first connection, then
sends GOAWAY(last_stream_id=3) and answers only streams 1 and 3, as nginx does when a
connection reaches `keepalive_requests`. `processed` lists what it really handled, so the
tests check both what the probe reported and what the callee saw.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from probes.clients import Prober
from probes.spec import GrpcSpec, HttpSpec, PathSpec
from probes.types import CallOutcome, Endpoint, Outcome
from tests.servers.engine import engine_call
from tests.servers.h2drain import H2DrainServer

IDS = [f"r{i}" for i in range(4)]


def h2_path(method: str = "GET") -> PathSpec:
    body = b"payload" if method == "POST" else None
    return PathSpec("p", 1.0, 3.0, http=HttpSpec(method=method, version="2", body=body))


def grpc_path() -> PathSpec:
    return PathSpec("g", 1.0, 3.0, grpc=GrpcSpec(method="/skewprobe.test.Probe/Echo"))


async def four_calls(prober: Prober, server: H2DrainServer) -> dict[str, CallOutcome]:
    endpoint = Endpoint("pod-0", "127.0.0.1", server.port)
    try:
        results = await asyncio.gather(*(engine_call(prober, endpoint, 3.0, rid) for rid in IDS))
    finally:
        await prober.aclose()
    return {rid: outcome for rid, (outcome, _) in zip(IDS, results, strict=True)}


def stream_of(server: H2DrainServer) -> dict[str, int]:
    """Request id → stream id on the draining first connection."""
    return {p.request_id: p.stream_id for p in server.processed if p.connection == 0}


async def test_the_drain_server_defeats_a_plain_httpx_client():
    # Without the probe's handling, httpx loses every request of the drained connection:
    # the h2 state-machine error on streams at or below last-stream-id, "Server
    # disconnected" on the streams above it.
    async with (
        H2DrainServer(drain_after=4, last_stream_id=3) as server,
        httpx.AsyncClient(http1=False, http2=True) as client,
    ):
        url = f"http://127.0.0.1:{server.port}/"
        results = await asyncio.gather(
            *(client.get(url, headers={"x-request-id": rid}) for rid in IDS),
            return_exceptions=True,
        )
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 4
    assert any("ConnectionState.CLOSED" in str(e) for e in errors)


async def test_http2_goaway_above_last_stream_is_churn_not_failure(h2_client):
    async with H2DrainServer(drain_after=4, last_stream_id=3) as server:
        outcomes = await four_calls(h2_client.build(h2_path()), server)
    assert {o.outcome for o in outcomes.values()} == {Outcome.OK}
    seen = Counter(p.request_id for p in server.processed)
    first = stream_of(server)
    above = [rid for rid in IDS if rid not in first]
    below = list(first)
    assert len(above) == 2 and len(below) == 2
    # Provably unprocessed: re-sent, and the callee handled each exactly once.
    for rid in above:
        assert seen[rid] == 1
        assert outcomes[rid].churn == 1
        assert "below stream" in outcomes[rid].detail
    for rid in below:
        if h2_client.name != "httpcore":
            # Processed and answered after the GOAWAY: read to the end, as sent.
            assert seen[rid] == 1
            assert outcomes[rid].churn == 0
        else:
            # Processed, but the answer was lost to h2's GOAWAY handling under httpcore: GET
            # is idempotent, so it is re-sent too, and the callee saw it twice.
            assert seen[rid] == 2
            assert outcomes[rid].churn == 1
            assert "graceful GOAWAY" in outcomes[rid].detail


async def test_http2_non_idempotent_request_is_re_sent_only_when_unprocessed(h2_client):
    async with H2DrainServer(drain_after=4, last_stream_id=3) as server:
        outcomes = await four_calls(h2_client.build(h2_path("POST")), server)
    first = stream_of(server)
    for rid, outcome in outcomes.items():
        if rid in first and h2_client.name != "httpcore":
            # Processed and answered after the GOAWAY (read to its end): nothing to re-send.
            assert (outcome.outcome, outcome.churn) == (Outcome.OK, 0)
        elif rid in first:
            # Processed by the callee: a POST must not be sent twice.
            assert outcome.outcome == Outcome.RESET
            assert outcome.churn == 0
            assert "not idempotent" in outcome.detail
        else:
            assert outcome.outcome == Outcome.OK
            assert outcome.churn == 1
    assert Counter(p.request_id for p in server.processed) == Counter(IDS)


async def test_http2_refused_stream_is_churn(h2_client):
    async with H2DrainServer(drain_after=4, last_stream_id=3, refuse=True) as server:
        outcomes = await four_calls(h2_client.build(h2_path("POST")), server)
    assert {o.outcome for o in outcomes.values()} == {Outcome.OK}
    assert sorted(o.churn for o in outcomes.values()) == [0, 0, 1, 1]
    assert Counter(p.request_id for p in server.processed) == Counter(IDS)
    # The re-sent ones went out on a fresh connection.
    assert {p.connection for p in server.processed if p.request_id not in stream_of(server)} == {1}


async def test_http2_goaway_after_the_answers_is_churn_for_the_unprocessed(h2_client):
    # GOAWAY after the answers: httpcore re-sends the streams above last-stream-id itself,
    # silently, and the probe still counts that churn; the probe's own client fails them as
    # unprocessed and the prober re-sends them.
    async with H2DrainServer(drain_after=4, last_stream_id=3, goaway_first=False) as server:
        outcomes = await four_calls(h2_client.build(h2_path()), server)
    assert {o.outcome for o in outcomes.values()} == {Outcome.OK}
    first = stream_of(server)
    for rid in IDS:
        if rid not in first:
            assert outcomes[rid].churn == 1


@pytest.mark.parametrize("refuse", [False, True])
async def test_grpc_unprocessed_rpc_is_re_sent_once_as_churn(refuse, grpc_client):
    # gRPC's own transparent retry is off (it would hide the churn); the prober re-sends
    # exactly the RPCs grpc core reports as never seen by the server.
    async with H2DrainServer(drain_after=4, last_stream_id=3, refuse=refuse) as server:
        outcomes = await four_calls(grpc_client.build(grpc_path()), server)
    assert {o.outcome for o in outcomes.values()} == {Outcome.OK}
    assert sorted(o.churn for o in outcomes.values()) == [0, 0, 1, 1]
    # grpc core finishes the streams at or below last-stream-id correctly, so every RPC
    # reached the callee exactly once.
    assert Counter(p.request_id for p in server.processed) == Counter(IDS)
    if grpc_client.name == "grpcio":
        marker = "error code 7" if refuse else "GOAWAY received"
    else:
        marker = "REFUSED_STREAM" if refuse else "GOAWAY last_stream_id=3"
    assert all(marker in o.detail for o in outcomes.values() if o.churn)
