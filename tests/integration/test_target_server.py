"""The reference target over the wire: every fault observed with plain httpx and grpc clients."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from targets.profile import VersionProfile, load_profiles, parse_profiles
from targets.proto import target_pb2, target_pb2_grpc
from targets.server import TargetServer
from tests.servers.lateness import LoopLateness

EXAMPLES = Path(__file__).resolve().parents[2] / "targets" / "examples"
ECHO = "/skewprobe.target.v1.Target/Echo"
SUBSCRIBE = "/skewprobe.target.v1.Target/Subscribe"
# A server timer on this loop fires late by at most what LoopLateness measured; what the
# answer takes on top (the channel's own hand-over, a connect) measured 1-33 ms in three runs
# at load 7-9: the bounds allow three times the most.
HAND_OVER_S = 0.1


@contextlib.asynccontextmanager
async def serve(profiles: str | None = None, version: str = "1.0") -> AsyncIterator[TargetServer]:
    profile = parse_profiles(profiles).profile(version) if profiles else VersionProfile(version)
    server = TargetServer(profile, host="127.0.0.1", pod="pod-a", seed=42)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.0)


async def get_many(
    client: httpx.AsyncClient, url: str, ids: list[str], *, concurrency: int = 20
) -> list[httpx.Response]:
    """GET `url` once per request id, a bounded number at a time."""
    sem = asyncio.Semaphore(concurrency)

    async def one(rid: str) -> httpx.Response:
        async with sem:
            return await client.get(url, headers={"x-request-id": rid})

    return await asyncio.gather(*(one(rid) for rid in ids))


async def test_http1_and_h2c_on_one_port_report_the_version() -> None:
    async with serve(version="1.20.3") as server:
        url = f"http://{server.http_address}/api/catalog"
        async with httpx.AsyncClient() as h1, httpx.AsyncClient(http1=False, http2=True) as h2:
            for client, proto in ((h1, "HTTP/1.1"), (h2, "HTTP/2")):
                r = await client.get(url)
                assert r.http_version == proto
                assert r.status_code == 200
                assert r.headers["x-proxy-version"] == "1.20.3"
                assert r.headers["x-app-attempts"] == "1"
                assert r.json() | {"request_id": None} == {
                    "pod": "pod-a", "version": "1.20.3", "path": "/api/catalog",
                    "request_id": None, "attempts": 1, "app_attempts": 1,
                }


async def test_app_counts_attempts_per_request_id() -> None:
    async with serve() as server, httpx.AsyncClient() as client:
        url = f"http://{server.http_address}/x"
        seen = [(await client.get(url, headers={"x-request-id": "same"})).headers["x-app-attempts"]
                for _ in range(3)]
        assert seen == ["1", "2", "3"]
        r = await client.get(url, headers={"x-request-id": "other"})
        assert r.headers["x-app-attempts"] == "1" and r.headers["x-request-id"] == "other"


async def test_grpc_empty_requests_echo_subscribe_and_health() -> None:
    async with serve(version="1.20.3") as server, grpc.aio.insecure_channel(
        server.grpc_address or ""
    ) as channel:
        # The probe sends raw bytes, often b"": every request must make sense empty.
        echo = channel.unary_unary(ECHO)
        call = echo(b"", metadata=(("x-request-id", "e1"),))
        reply = target_pb2.EchoReply.FromString(await call)
        assert (reply.pod, reply.proxy_version, reply.app_attempts) == ("pod-a", "1.20.3", 1)
        trailers = dict(await call.trailing_metadata())
        assert trailers["x-proxy-version"] == "1.20.3"
        assert trailers["x-app-attempts"] == "1"

        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "skewprobe.target.v1.Target"):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING

        stream = channel.unary_stream(SUBSCRIBE)(b"")
        assert dict(await stream.initial_metadata())["x-proxy-version"] == "1.20.3"
        first = target_pb2.Event.FromString(await stream.read())
        async with LoopLateness() as late:
            t0 = time.monotonic()
            second = target_pb2.Event.FromString(await stream.read())
            gap = time.monotonic() - t0
        stream.cancel()
        assert (first.seq, second.seq, second.proxy_version) == (1, 2, "1.20.3")
        # interval_ms = 0 means the default 500 ms; the server's timer runs on this loop, so
        # it is late by at most what the loop measured, plus the channel's own hand-over.
        assert 0.35 < gap < 0.5 + late.max_s + HAND_OVER_S, (gap, late.max_s)


async def test_error_rate_is_persistent_per_request_id_within_binomial_bound() -> None:
    profiles = 'versions:\n  "1":\n    routes:\n      /api/x: {error_rate: 0.2}\n'
    async with serve(profiles, "1") as server, httpx.AsyncClient() as client:
        base = f"http://{server.http_address}"
        ids = [f"req-{i}" for i in range(300)]
        responses = await get_many(client, f"{base}/api/x", ids)
        failed = [r.headers["x-request-id"] for r in responses if r.status_code == 503]
        assert all(r.status_code in (200, 503) for r in responses)
        # Binomial(300, 0.2): mean 60, sd 6.9; ±5 sd
        assert 26 <= len(failed) <= 94
        again = await get_many(client, f"{base}/api/x", failed[:20])
        assert [r.status_code for r in again] == [503] * len(again)  # persistent per id
        assert {r.headers["x-app-attempts"] for r in again} == {"2"}
        others = await get_many(client, f"{base}/api/y", ids[:100])
        assert {r.status_code for r in others} == {200}  # other paths are clean


async def test_transient_errors_are_fixed_by_a_retry_and_counted() -> None:
    profiles = """
versions:
  "1":
    attempt_count_header: true
    routes:
      /no-retry: {transient_error_rate: 1.0}
      /retry: {transient_error_rate: 1.0, retries: {num_retries: 2}}
"""
    async with serve(profiles, "1") as server, httpx.AsyncClient() as client:
        base = f"http://{server.http_address}"
        first = await client.get(f"{base}/no-retry", headers={"x-request-id": "t"})
        second = await client.get(f"{base}/no-retry", headers={"x-request-id": "t"})
        assert (first.status_code, second.status_code) == (503, 200)
        assert second.headers["x-app-attempts"] == "2"
        assert first.headers["x-envoy-attempt-count"] == "1"
        retried = await client.get(f"{base}/retry")
        assert retried.status_code == 200
        assert retried.headers["x-envoy-attempt-count"] == "2"
        assert retried.headers["x-app-attempts"] == "2"


async def test_example_canary_regresses_checkout_only() -> None:
    profiles = load_profiles(EXAMPLES / "profiles.yaml")
    for version in ("1.20.3", "1.21.0"):
        server = TargetServer(profiles.profile(version), host="127.0.0.1", seed=3)
        await server.start()
        try:
            async with httpx.AsyncClient() as client:
                base = f"http://{server.http_address}"
                ids = [f"{version}-{i}" for i in range(400)]
                checkout = await get_many(client, f"{base}/api/checkout", ids)
                catalog = await get_many(client, f"{base}/api/catalog", ids[:100])
        finally:
            await server.stop(0.0)
        errors = sum(r.status_code == 503 for r in checkout)
        attempts = {r.headers["x-envoy-attempt-count"] for r in checkout}
        assert {r.status_code for r in catalog} == {200}
        assert {r.headers["x-envoy-attempt-count"] for r in catalog} == {"1"}
        if version == "1.20.3":
            assert errors == 0 and attempts == {"1"}
        else:
            # Binomial(400, 0.01): mean 4; P(0) = 1.8 %, P(>14) < 1e-5; the seed is fixed
            assert 1 <= errors <= 14
            assert attempts == {"2"}  # every first attempt failed and was retried once


async def test_grpc_errors_carry_status_and_trailers() -> None:
    profiles = f"""
versions:
  "1":
    attempt_count_header: true
    routes:
      {ECHO}: {{error_rate: 1.0, retries: {{num_retries: 2}}}}
"""
    async with serve(profiles, "1") as server, grpc.aio.insecure_channel(
        server.grpc_address or ""
    ) as channel:
        stub = target_pb2_grpc.TargetStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Echo(target_pb2.EchoRequest())
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        trailers = dict(info.value.trailing_metadata() or ())
        assert trailers["x-proxy-version"] == "1"
        assert trailers["x-envoy-attempt-count"] == "3"
        assert trailers["x-app-attempts"] == "3"


async def test_latency_fixed_and_tail() -> None:
    profiles = """
versions:
  "1":
    routes:
      /fixed: {latency: {fixed: 80ms}}
      /tail: {latency: {tail: 150ms, tail_probability: 0.5}}
"""
    async with serve(profiles, "1") as server, httpx.AsyncClient() as client:
        base = f"http://{server.http_address}"

        async def timed(path: str) -> tuple[float, float]:
            """(seconds the caller waited, seconds the sidecar held the request): the second
            from its x-envoy-upstream-service-time, which a loaded machine cannot inflate for
            a request the fault did not delay (no await between its start and its answer)."""
            t0 = time.monotonic()
            r = await client.get(f"{base}{path}")
            assert r.status_code == 200
            return time.monotonic() - t0, int(r.headers["x-envoy-upstream-service-time"]) / 1e3

        plain = [await timed("/plain") for _ in range(10)]
        fixed = await asyncio.gather(*(timed("/fixed") for _ in range(10)))
        tail = await asyncio.gather(*(timed("/tail") for _ in range(40)))
        assert max(held for _, held in plain) < 0.04
        assert min(waited for waited, _ in fixed) >= 0.079
        assert min(held for _, held in fixed) >= 0.079
        slow = sum(held >= 0.149 for _, held in tail)
        assert 4 <= slow <= 36  # Binomial(40, 0.5), ±5 sd
        # The others were not delayed at all: no fixed part under the tail.
        assert all(held < 0.1 for _, held in tail if held < 0.149)
        assert all(waited >= held for waited, held in (*plain, *fixed, *tail))


async def test_max_stream_duration_ends_streams_near_t() -> None:
    profiles = f"""
versions:
  "1":
    routes:
      {SUBSCRIBE}: {{max_stream_duration: 600ms}}
      /api/slow: {{max_stream_duration: 300ms}}
"""
    async with serve(profiles, "1") as server, grpc.aio.insecure_channel(
        server.grpc_address or ""
    ) as channel:
        stub = target_pb2_grpc.TargetStub(channel)
        # The channel's first connect is not the stream's: made (and left out) first.
        await asyncio.wait_for(channel.channel_ready(), 5)
        events = 0
        async with LoopLateness() as late:
            t0 = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Subscribe(target_pb2.SubscribeRequest(interval_ms=50)):
                    events += 1
            lifetime = time.monotonic() - t0
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "max_stream_duration" in (info.value.details() or "")
        # The server's timers run on this loop: the end comes at 600 ms, late by at most what
        # the loop measured, plus the channel's hand-over; each 50 ms event as late at most.
        assert 0.55 <= lifetime <= 0.6 + late.max_s + HAND_OVER_S, (lifetime, late.max_s)
        assert int(0.6 / (0.05 + late.max_s)) - 1 <= events <= (0.6 + late.max_s) / 0.05 + 1, (
            events, late.max_s)
        async with httpx.AsyncClient() as client, LoopLateness() as late:
            t0 = time.monotonic()
            r = await client.get(f"http://{server.http_address}/api/slow?ms=5000")
            took = time.monotonic() - t0
        assert r.status_code == 408
        assert 0.29 <= took < 0.3 + late.max_s + HAND_OVER_S, (took, late.max_s)


async def test_max_connection_age_sends_real_goaways() -> None:
    profiles = 'versions:\n  "1": {max_connection_age: 400ms, max_connection_age_grace: 300ms}\n'
    async with serve(profiles, "1") as server, grpc.aio.insecure_channel(
        server.grpc_address or ""
    ) as channel:
        stub = target_pb2_grpc.TargetStub(channel)
        async with LoopLateness() as late:
            t0 = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stub.Subscribe(target_pb2.SubscribeRequest(interval_ms=50)):
                    pass
            took = time.monotonic() - t0
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # The GOAWAY at the age, the stream cut at most the grace later (a connect first).
        assert 0.3 <= took <= 0.4 + 0.3 + late.max_s + HAND_OVER_S, (took, late.max_s)
        # a GOAWAY is not fatal: the channel reconnects for the next call
        reply = await stub.Echo(target_pb2.EchoRequest(message="after"))
        assert reply.message == "after"


async def test_header_handling_differences() -> None:
    profiles = """
versions:
  "old": {}
  "new":
    defaults:
      headers:
        remove: [x-envoy-upstream-service-time]
        rename: {x-request-id: x-trace-id}
        add: {x-mesh: next}
        reject_requests_with: [x-legacy-auth]
"""
    async with serve(profiles, "old") as old, serve(profiles, "new") as new:
        async with httpx.AsyncClient() as client:
            before = await client.get(f"http://{old.http_address}/a", headers={"x-request-id": "h"})
            after = await client.get(f"http://{new.http_address}/a", headers={"x-request-id": "h"})
            legacy = {"x-legacy-auth": "1"}
            ok_old = await client.get(f"http://{old.http_address}/a", headers=legacy)
            refused = await client.get(f"http://{new.http_address}/a", headers=legacy)
        assert before.headers["x-request-id"] == "h"
        assert "x-envoy-upstream-service-time" in before.headers and "x-mesh" not in before.headers
        assert "x-request-id" not in after.headers and after.headers["x-trace-id"] == "h"
        assert "x-envoy-upstream-service-time" not in after.headers
        assert after.headers["x-mesh"] == "next"
        assert (ok_old.status_code, refused.status_code) == (200, 400)
        assert refused.headers["x-proxy-version"] == "new"

        async with grpc.aio.insecure_channel(new.grpc_address or "") as channel:
            stub = target_pb2_grpc.TargetStub(channel)
            call = stub.Echo(target_pb2.EchoRequest(), metadata=(("x-request-id", "g"),))
            await call
            trailers = dict(await call.trailing_metadata())
            assert trailers["x-trace-id"] == "g" and trailers["x-mesh"] == "next"
            assert "x-request-id" not in trailers
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Echo(target_pb2.EchoRequest(), metadata=(("x-legacy-auth", "1"),))
            assert info.value.code() == grpc.StatusCode.INTERNAL


async def test_query_knobs() -> None:
    async with serve() as server, httpx.AsyncClient() as client:
        base = f"http://{server.http_address}"
        t0 = time.monotonic()
        assert (await client.get(f"{base}/api/slow?ms=120")).status_code == 200
        assert time.monotonic() - t0 >= 0.119
        assert (await client.get(f"{base}/any?status=418")).status_code == 418
        assert len((await client.get(f"{base}/any?bytes=1000")).json()["filler"]) == 1000
        assert (await client.post(f"{base}/any", content=b"x" * 10_000)).status_code == 200


def test_command_on_a_busy_port_is_one_line_and_exit_2() -> None:
    """`python -m targets.server` with its HTTP port held by another socket: one line on
    stderr naming the command and the address, exit 2 (bad input), no traceback."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        address = f"127.0.0.1:{held.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "-m", "targets.server", "--version", "1.20.3", "--http", address,
             "--grpc", "127.0.0.1:0"],
            cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
            timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("targets.server: ") and address in line, line
