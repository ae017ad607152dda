"""The reference target's relay over the wire: a relay pod and destination pods on loopback,
asked with plain httpx and grpc clients, as the probe will ask them."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from targets.profile import VersionProfile, parse_profiles
from targets.proto import target_pb2, target_pb2_grpc
from targets.relay import RoundRobinView
from targets.relay_config import RelayConfig, parse_relay
from targets.server import TargetServer
from tests.servers.ports import refused_port

ECHO = "/skewprobe.target.v1.Target/Echo"
CALLS = 24  # distinct request ids per case; every count below is derived from it

# The caller's version retries twice on 503 (its outbound side); the destination's app fails
# the first attempt of every request on /flaky and every attempt on /broken.
PROFILES = f"""
versions:
  "1.20.3": {{}}
  "1.21.0":
    outbound: {{retries: {{num_retries: 2, retry_on: [503]}}}}
  "callee":
    routes:
      /flaky: {{transient_error_rate: 1.0}}
      /broken: {{error_rate: 1.0}}
      {ECHO}: {{transient_error_rate: 1.0}}
"""


def relay_config(dest: TargetServer, *, timeout: str = "5s", max_body: int = 65536,
                 extra: str = "") -> RelayConfig:
    big = base64.b64encode(target_pb2.EchoRequest(payload_bytes=max_body * 4)
                           .SerializeToString()).decode()
    return parse_relay(f"""
relay:
  timeout: {timeout}
  max_body: {max_body}
  destinations:
    catalog: {{http: {{url: "http://{dest.http_address}/api/catalog"}}}}
    flaky: {{http: {{url: "http://{dest.http_address}/flaky"}}}}
    broken: {{http: {{url: "http://{dest.http_address}/broken"}}}}
    slow: {{http: {{url: "http://{dest.http_address}/api/slow?ms=30000"}}}}
    big: {{http: {{url: "http://{dest.http_address}/x?bytes={max_body * 4}"}}}}
    echo: {{grpc: {{target: "{dest.grpc_address}", method: {ECHO}}}}}
    big-echo: {{grpc: {{target: "{dest.grpc_address}", method: {ECHO}, request: "{big}"}}}}
{extra}""")


@contextlib.asynccontextmanager
async def pods(caller_version: str = "1.20.3", **relay: str | int
               ) -> AsyncIterator[tuple[TargetServer, TargetServer]]:
    """(relay pod in platform-test, destination pod in shop), both on 127.0.0.1."""
    profiles = parse_profiles(PROFILES)
    dest = TargetServer(profiles.profile("callee"), pod="catalog-0", namespace="shop", seed=7)
    await dest.start()
    try:
        caller = TargetServer(profiles.profile(caller_version), pod="relay-0",
                              namespace="platform-test", seed=7,
                              relay=relay_config(dest, **relay))  # type: ignore[arg-type]
        await caller.start()
        try:
            yield caller, dest
        finally:
            await caller.stop(0.0)
    finally:
        await dest.stop(0.0)


async def relay_http(client: httpx.AsyncClient, relay: TargetServer, name: str,
                     rid: str | None = None) -> httpx.Response:
    headers = {"x-request-id": rid} if rid else {}
    return await client.get(f"http://{relay.http_address}/relay/{name}", headers=headers)


async def test_http_relay_reports_destination_pod_and_caller() -> None:
    async with pods("1.20.3") as (relay, dest), httpx.AsyncClient() as client:
        r = await relay_http(client, relay, "catalog")
        assert r.status_code == 200
        assert r.headers["x-proxy-version"] == "1.20.3"  # the relay pod's own version
        doc = r.json()
        assert doc["outcome"] == "ok" and doc["status"] == 200
        assert doc["answered_by"] == {"pod": "catalog-0", "namespace": "shop",
                                      "proxy_version": "callee"}
        assert doc["caller"] == {"pod": "relay-0", "namespace": "platform-test",
                                 "proxy_version": "1.20.3"}
        assert doc["address"] == dest.http_address
        assert doc["latency_ms"] > 0
        # No outbound proxy counted attempts and the callee sends no attempt header:
        # not measured, never 1.
        assert doc["attempts"] is None and doc["attempts_from"] is None


async def test_grpc_relay_of_a_grpc_destination() -> None:
    async with pods("1.20.3") as (relay, dest), grpc.aio.insecure_channel(
        relay.grpc_address or ""
    ) as channel:
        stub = target_pb2_grpc.TargetStub(channel)
        reply = await stub.Relay(target_pb2.RelayRequest(destination="catalog"))
        assert (reply.outcome, reply.status) == ("ok", 200)
        assert reply.answered_by.pod == "catalog-0"
        # The destination's first attempt fails and nothing retries it.
        reply = await stub.Relay(target_pb2.RelayRequest(destination="echo"))
        assert (reply.outcome, reply.grpc_code) == ("grpc_UNAVAILABLE", "UNAVAILABLE")
        assert reply.answered_by == target_pb2.PodIdentity(
            pod="catalog-0", namespace="shop", proxy_version="callee")
        assert reply.caller.proxy_version == "1.20.3"
        assert reply.address == dest.grpc_address
        assert not reply.HasField("attempts")


@pytest.mark.parametrize("kind", ["http", "grpc"])
async def test_the_callers_outbound_retries_are_counted_as_the_destination_saw_them(
    kind: str,
) -> None:
    name = "flaky" if kind == "http" else "echo"
    results: dict[str, list[tuple[str, int | None, str]]] = {}
    for version in ("1.20.3", "1.21.0"):
        async with pods(version) as (relay, dest):
            got = []
            if kind == "http":
                async with httpx.AsyncClient() as client:
                    for i in range(CALLS):
                        doc = (await relay_http(client, relay, name, f"{version}-{i}")).json()
                        got.append((doc["outcome"], doc["attempts"], doc["attempts_from"]))
            else:
                async with grpc.aio.insecure_channel(relay.grpc_address or "") as channel:
                    stub = target_pb2_grpc.TargetStub(channel)
                    for i in range(CALLS):
                        reply = await stub.Relay(target_pb2.RelayRequest(destination=name),
                                                 metadata=(("x-request-id", f"{version}-{i}"),))
                        got.append((reply.outcome,
                                    reply.attempts if reply.HasField("attempts") else None,
                                    reply.attempts_from or None))
            # What the destination's app received: one attempt per call, or two.
            results[version] = got
            assert len(dest.sidecar.counter) == CALLS
    failed = "http_5xx" if kind == "http" else "grpc_UNAVAILABLE"
    assert results["1.20.3"] == [(failed, None, None)] * CALLS
    # The new caller's proxy retried each once: the destination saw attempt 2 succeed.
    assert results["1.21.0"] == [("ok", 2, "destination")] * CALLS


async def test_retries_stop_at_the_policy_when_every_attempt_fails() -> None:
    async with pods("1.21.0") as (relay, dest), httpx.AsyncClient() as client:
        docs = [(await relay_http(client, relay, "broken", f"b-{i}")).json()
                for i in range(CALLS)]
        # The destination's app saw each request id three times (hit() adds the fourth).
        assert len(dest.sidecar.counter) == CALLS
        assert {dest.sidecar.counter.hit(f"b-{i}") for i in range(CALLS)} == {4}
    assert {(d["outcome"], d["attempts"]) for d in docs} == {("http_5xx", 3)}


async def test_only_allowlisted_names_are_ever_called() -> None:
    async with pods() as (relay, dest), httpx.AsyncClient() as client:
        for name in ("nope", f"http://{dest.http_address}/api/catalog",
                     f"{dest.http_address}", "CATALOG", "catalog%2Fx"):
            r = await client.get(f"http://{relay.http_address}/relay/{name}")
            assert r.status_code == 403, name
            assert "allowlist" in r.json()["error"]
        async with grpc.aio.insecure_channel(relay.grpc_address or "") as channel:
            stub = target_pb2_grpc.TargetStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Relay(target_pb2.RelayRequest(destination=dest.http_address))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Nothing reached the destination's app.
        assert len(dest.sidecar.counter) == 0


async def test_a_pod_without_relay_refuses() -> None:
    server = TargetServer(VersionProfile("1.20.3"), pod="plain")
    async with server, httpx.AsyncClient() as client:
        r = await client.get(f"http://{server.http_address}/relay/catalog")
        assert r.status_code == 404
        async with grpc.aio.insecure_channel(server.grpc_address or "") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await target_pb2_grpc.TargetStub(channel).Relay(
                    target_pb2.RelayRequest(destination="catalog"))
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_the_relay_has_its_own_timeout() -> None:
    async with pods(timeout="200ms") as (relay, dest), httpx.AsyncClient() as client:
        doc = (await relay_http(client, relay, "slow")).json()
        assert doc["outcome"] == "timeout"
        assert doc["answered_by"] == {"pod": "", "namespace": "", "proxy_version": ""}
        # The destination did get the request: the timeout is the relay's, not a refusal.
        assert len(dest.sidecar.counter) == 1


async def test_the_destinations_answer_is_read_only_up_to_max_body() -> None:
    # 1.21.0 retries the echo's transient first failure, so the second attempt's answer counts.
    async with pods("1.21.0", max_body=1024) as (relay, _), httpx.AsyncClient() as client:
        doc = (await relay_http(client, relay, "big")).json()
        assert doc["outcome"] == "ok" and doc["detail"] == "body cut at 1024 bytes"
        assert doc["answered_by"]["pod"] == "catalog-0"
        doc = (await relay_http(client, relay, "big-echo")).json()
        assert doc["outcome"] == "grpc_RESOURCE_EXHAUSTED"


async def test_an_address_nobody_holds_is_connect_refused() -> None:
    with refused_port() as gone:
        extra = f"""    gone: {{http: {{url: "http://127.0.0.1:{gone}/api/catalog"}}}}
    gone-grpc: {{grpc: {{target: "127.0.0.1:{gone}", method: {ECHO}}}}}
"""
        await _refused(extra, gone)


async def _refused(extra: str, gone: int) -> None:
    async with pods(extra=extra) as (relay, _), httpx.AsyncClient() as client:
        doc = (await relay_http(client, relay, "gone")).json()
        assert (doc["outcome"], doc["address"]) == ("connect_refused", f"127.0.0.1:{gone}")
        doc = (await relay_http(client, relay, "gone-grpc")).json()
        assert doc["outcome"] == "grpc_UNAVAILABLE"


async def test_an_endpoint_view_picks_the_address_and_an_empty_one_sends_nothing() -> None:
    profiles = parse_profiles(PROFILES)
    dests = [TargetServer(profiles.profile("callee"), pod=f"catalog-{i}", namespace="shop")
             for i in range(2)]
    view = RoundRobinView({"catalog": []})
    config = parse_relay("""
relay:
  destinations:
    catalog: {http: {url: "http://catalog.shop.svc:8080/api/catalog"}, service: catalog}
""")
    relay = TargetServer(profiles.profile("1.20.3"), pod="relay-0", relay=config,
                         relay_view=view)
    async with dests[0], dests[1], relay, httpx.AsyncClient() as client:
        doc = (await relay_http(client, relay, "catalog")).json()
        assert (doc["outcome"], doc["status"]) == ("http_5xx", 503)
        assert "no endpoint for catalog" in doc["detail"]
        view.update("catalog", [d.http_address for d in dests])
        docs = [(await relay_http(client, relay, "catalog")).json() for _ in range(CALLS)]
    answered = [d["answered_by"]["pod"] for d in docs]
    assert answered == ["catalog-0", "catalog-1"] * (CALLS // 2)
    assert [d["address"] for d in docs] == [d.http_address for d in dests] * (CALLS // 2)
