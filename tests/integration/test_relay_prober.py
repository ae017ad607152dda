"""The relay prober on the probe's own HTTP/1.1 and HTTP/2 clients: real relay pods (the
reference target) and a canned relay on loopback, as a direct path's client would see them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from probes._spec import PathSpec, RelaySpec
from probes._types import Endpoint, Outcome
from probes.clients import RelayProber
from targets.server import TargetServer
from tests.integration.test_target_relay import CALLS, pods
from tests.servers.ports import free_port


def relay_path(destination: str, version: str = "1.1", timeout_s: float = 5.0) -> PathSpec:
    return PathSpec("r", 1.0, timeout_s, relay=RelaySpec(destination, version=version))


def endpoint_of(server: TargetServer) -> Endpoint:
    host, port = server.http_address.rsplit(":", 1)
    return Endpoint("relay-0", host, int(port), {"pod": "relay-0"})


@pytest.mark.parametrize("version", ["1.1", "2"])
async def test_the_destinations_outcome_attempts_and_pod_over_each_client(version: str) -> None:
    # 1.21.0's outbound side retries the destination's transient first failure on /flaky.
    async with pods("1.21.0") as (relay, dest):
        where = endpoint_of(relay)
        prober = RelayProber(relay_path("flaky", version))
        refused = RelayProber(relay_path("nope", version))
        try:
            got = [await prober.call(where, f"{version}-{i}") for i in range(CALLS)]
            denied = await refused.call(where, "nope-0")
        finally:
            await prober.aclose()
            await refused.aclose()
    assert {(o.outcome, o.status, o.attempts, o.cohort_hint) for o in got} == {
        (Outcome.OK, 200, 2, "callee")}
    assert {o.detail for o in got} == {f"pod=catalog-0 address={dest.http_address}"}
    assert (denied.outcome, denied.status) == (Outcome.PROBE_ERROR, 403)
    assert "not in its allowlist" in denied.detail


async def test_a_relay_nobody_listens_on_is_the_relays_own_failure() -> None:
    prober = RelayProber(relay_path("catalog"))
    try:
        got = await prober.call(Endpoint("relay-0", "127.0.0.1", free_port()), "r-0")
    finally:
        await prober.aclose()
    assert got.outcome == Outcome.CONNECT_REFUSED
    assert got.detail.startswith("relay: ") and got.cohort_hint is None


ANSWER = json.dumps({"status": 200, "attempts": 1, "address": "10.0.0.1:8080",
                     "answered_by": {"pod": "catalog-0", "proxy_version": "callee"}}).encode()
# What the canned relay answers per destination: (status line, body).
CANNED = {
    b"catalog": (b"200 OK", ANSWER),
    b"text": (b"200 OK", b"not json"),
    b"huge": (b"200 OK", b"{" + b" " * (80 << 10) + b"}"),
    b"sick": (b"503 Service Unavailable", b"{}"),
}


@contextlib.asynccontextmanager
async def canned_relay() -> AsyncIterator[tuple[Endpoint, list[int]]]:
    """A keep-alive HTTP/1.1 relay answering CANNED; the list counts its connections."""
    accepted = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                name = head.split(b" ", 2)[1].rsplit(b"/", 1)[-1]
                status, body = CANNED[name]
                writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Endpoint("relay-0", "127.0.0.1", port), accepted
    finally:
        server.close()
        await server.wait_closed()


async def test_one_kept_alive_connection_and_answers_that_are_not_relay_answers() -> None:
    async with canned_relay() as (where, accepted):
        probers = {name: RelayProber(relay_path(name)) for name in ("catalog", "text", "huge",
                                                                     "sick")}
        try:
            ok = [await probers["catalog"].call(where, f"c-{i}") for i in range(CALLS)]
            # One connection carried every call, as a direct HTTP/1.1 path's does.
            assert accepted == [1]
            text = await probers["text"].call(where, "t-0")
            huge = await probers["huge"].call(where, "h-0")
            sick = await probers["sick"].call(where, "s-0")
        finally:
            for prober in probers.values():
                await prober.aclose()
    assert {(o.outcome, o.attempts, o.cohort_hint) for o in ok} == {(Outcome.OK, 1, "callee")}
    assert (text.outcome, text.detail) == (Outcome.PROTOCOL_ERROR, "relay answer is not JSON")
    assert (huge.outcome, huge.detail) == (Outcome.PROTOCOL_ERROR, "relay answer is not JSON")
    assert (sick.outcome, sick.status, sick.detail) == (Outcome.HTTP_5XX, 503,
                                                         "relay answered 503")
