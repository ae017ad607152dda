"""The relay prober on the probe's own HTTP/1.1 and HTTP/2 clients: real relay pods (the
reference target) and a canned relay on loopback, as a direct path's client would see them."""

from __future__ import annotations

import asyncio
import collections
import sys
import time

import pytest

from probes.clients import RelayProber
from probes.spec import PathSpec, RelaySpec
from probes.types import Endpoint, Outcome
from targets.server import TargetServer
from tests.integration.test_target_relay import CALLS, pods
from tests.servers.ports import refused_port
from tests.servers.relay_canned import OK, canned_relay


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
        with refused_port() as port:
            got = await prober.call(Endpoint("relay-0", "127.0.0.1", port), "r-0")
    finally:
        await prober.aclose()
    assert got.outcome == Outcome.CONNECT_REFUSED
    assert got.detail.startswith("relay: ") and got.cohort_hint is None


# What the canned relay answers per destination: (status line, body).
CANNED = {
    **OK,
    b"text": (b"200 OK", b"not json"),
    b"huge": (b"200 OK", b"{" + b" " * (80 << 10) + b"}"),
    b"sick": (b"503 Service Unavailable", b"{}"),
}


async def test_one_kept_alive_connection_and_answers_that_are_not_relay_answers() -> None:
    async with canned_relay(CANNED) as (port, accepted):
        where = Endpoint("relay-0", "127.0.0.1", port)
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


# Calls kept in flight against a relay that answers after DELAY_S: a few, as at a modest
# rate, and hundreds, as when a destination turns slow under a busy probe (httpcore's pool
# spent 73 % of a core at 80 relay calls/s walking every queued request per connection).
DELAY_S = 0.1
FEW, MANY = 20, 400
MEASURED = 800  # calls per in-flight count and repeat
REPEATS = 3
TIMEOUT_S = 5.0


async def _cpu_per_call(prober: RelayProber, where: Endpoint, in_flight: int) -> float:
    """Process CPU per call over MEASURED calls made in waves of `in_flight` at once, after
    a first wave that opens the `in_flight` connections they keep alive (otherwise half the
    calls at 400 in flight would pay a connect, which is per-call work, not bookkeeping)."""
    # A wave ends within the path's timeout (connect and read budgets inside it) per call.
    bound_s = 2 * TIMEOUT_S + DELAY_S
    async with asyncio.timeout(bound_s):
        await asyncio.gather(*(prober.call(where, f"warm-{i}") for i in range(in_flight)))
    outcomes: list[str] = []
    cpu = time.process_time()
    for wave in range(MEASURED // in_flight):
        async with asyncio.timeout(bound_s):
            done = await asyncio.gather(*(prober.call(where, f"{in_flight}-{wave}-{i}")
                                          for i in range(in_flight)))
        outcomes += (o.outcome for o in done)
    cpu = time.process_time() - cpu
    assert set(outcomes) == {Outcome.OK}, collections.Counter(outcomes)
    return cpu / len(outcomes)


async def test_cpu_per_call_stays_flat_with_hundreds_of_calls_in_flight() -> None:
    # The relay in its own process: this process's CPU is then the prober's alone.
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.servers.relay_canned", str(DELAY_S * 1000),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdin is not None
        async with asyncio.timeout(60.0):  # a Python start-up on a loaded machine
            line = (await server.stdout.readline()).decode()
        where = Endpoint("relay-0", "127.0.0.1", int(line.removeprefix("port=")))
        # Interleaved, the least of REPEATS each: what else the machine runs only ever adds
        # CPU to a measurement (cache misses, the collector), so the least is the call's own.
        costs: dict[int, list[float]] = {FEW: [], MANY: []}
        for _ in range(REPEATS):
            for in_flight in (FEW, MANY):
                prober = RelayProber(relay_path("catalog", timeout_s=TIMEOUT_S))
                try:
                    costs[in_flight].append(await _cpu_per_call(prober, where, in_flight))
                finally:
                    await prober.aclose()
        cost = {n: min(c) for n, c in costs.items()}
    finally:
        if server.stdin is not None:
            server.stdin.close()
        async with asyncio.timeout(30.0):
            await server.wait()
    # Bookkeeping that grew with the calls in flight would make a call at 400 cost many
    # times one at 20; per-call work (a connection each, parsing, JSON) keeps it level.
    assert cost[MANY] <= 2 * cost[FEW], cost
