"""Real HAProxy sidecars: retry amplification measured from the callee, stream cuts by drain and
by timeouts, a fleet rollout that restarts HAProxy processes, and no orphan processes.

Every test runs real HAProxy processes (skipped only where haproxy is not installed; `.ci/run`
installs it) in front of the reference target app, with plain httpx / grpc clients and with the
probe's own clients.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from probes.clients import build_prober
from probes.spec import GrpcSpec, HttpSpec, PathSpec
from probes.types import CallOutcome, Endpoint, Outcome
from targets.fleet import Fleet
from targets.haproxy import DEFAULT_READY_TIMEOUT_S, HaproxyPod, HaproxySidecars
from targets.haproxy_config import HaproxyVersion, parse_haproxy_versions
from targets.haproxy_process import HaproxyUnavailable, check_config, haproxy_version, listen_socket
from targets.profile import VersionProfile
from targets.proto import target_pb2, target_pb2_grpc
from targets.server import hostport
from tests.servers.fleet_cli import read_until, reap, start_fleet, terminate
from tests.servers.haproxy_procs import haproxy_pids, kill_leftovers, needs_haproxy
from tests.servers.lateness import LoopLateness

pytestmark = needs_haproxy

ROOT = Path(__file__).resolve().parents[2]
ECHO = "/skewprobe.target.v1.Target/Echo"
VERSIONS = parse_haproxy_versions(f"""
app:
  routes:
    /api/flaky: {{transient_error_rate: 0.3}}    # first attempt fails: a retry succeeds
    /api/broken: {{error_rate: 0.2}}              # every attempt of that id fails
    {ECHO}: {{transient_error_rate: 0.3}}
versions:
  "A": {{retries: 0, hard_stop_after: 1s}}
  "B": {{retries: 2, retry_on: [all-retryable-errors], attempt_count_header: true,
         hard_stop_after: 1s}}
  "server-600ms": {{retries: 0, timeouts: {{server: 600ms}}}}
  "tunnel-600ms-http": {{retries: 0, timeouts: {{tunnel: 600ms}}}}
  "tunnel-600ms-tcp": {{retries: 0, grpc: tcp, timeouts: {{tunnel: 600ms}}}}
""", source="<test versions>")
# One local subchannel pool per channel: each stream gets its own connection, as HAProxy's
# TCP-mode timeouts act per connection.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture
async def sidecars(tmp_path: Path) -> AsyncIterator[HaproxySidecars]:
    async with HaproxySidecars(VERSIONS, workdir=tmp_path) as factory:
        yield factory
    leftover = kill_leftovers(tmp_path)  # only ours: started with a config in tmp_path
    assert not leftover, "HAProxy processes outlived their test"


def pod(sidecars: HaproxySidecars, version: str, *, seed: int = 7, drain_s: float = 1.0,
        notice_s: float = 0.0) -> HaproxyPod:
    return sidecars.pod(sidecars.app_profile(version), host="127.0.0.1", http_port=0,
                        grpc_port=0, pod=f"pod-{version}", seed=seed, keep_alive_s=30.0,
                        drain_s=drain_s, notice_s=notice_s)


def endpoint(p: HaproxyPod) -> Endpoint:
    assert p.grpc_port is not None
    return Endpoint(name=p.pod, host=p.host, port=p.http_port,
                    labels={"proxy_version": p.version},
                    ports={"http": p.http_port, "grpc": p.grpc_port})


def base_host() -> str:
    return f"127.{random.randint(64, 250)}.{random.randint(0, 255)}.1"


# --- retry volume --------------------------------------------------------------------------


async def test_retries_amplify_attempts_with_the_same_or_better_success(
    sidecars: HaproxySidecars,
) -> None:
    # Same app seed on both pods: the app fails the same request ids behind A and B, so what
    # differs is only what HAProxy does about it.
    async with pod(sidecars, "A") as a, pod(sidecars, "B") as b, httpx.AsyncClient() as client:
        async def run(p: HaproxyPod, path: str) -> list[httpx.Response]:
            url = f"http://{hostport(p.host, p.http_port)}{path}"
            return [await client.get(url, headers={"x-request-id": f"{path}-{i}"})
                    for i in range(200)]

        flaky_a, flaky_b = await run(a, "/api/flaky"), await run(b, "/api/flaky")
        broken_a, broken_b = await run(a, "/api/broken"), await run(b, "/api/broken")

    assert {r.headers["x-sidecar"] for r in flaky_a} == {"haproxy/A"}
    assert {r.headers["x-sidecar"] for r in flaky_b} == {"haproxy/B"}
    # A: no retries. Every request reached the app once; ~30 % of /api/flaky failed.
    assert {r.headers["x-app-attempts"] for r in flaky_a + broken_a} == {"1"}
    failed_a = [i for i, r in enumerate(flaky_a) if r.status_code == 503]
    assert 30 <= len(failed_a) <= 90  # Binomial(200, 0.3): 60 ± 4.6 sd
    assert "x-envoy-attempt-count" not in flaky_a[0].headers
    # B: HAProxy retried exactly those requests, once each, and all succeeded.
    assert all(r.status_code == 200 for r in flaky_b)
    retried = [i for i, r in enumerate(flaky_b) if r.headers["x-app-attempts"] == "2"]
    assert retried == failed_a
    attempts_b = sum(int(r.headers["x-app-attempts"]) for r in flaky_b) / len(flaky_b)
    assert attempts_b == pytest.approx(1 + len(failed_a) / 200)
    # HAProxy's own count (x-envoy-attempt-count from %rc) agrees with the app's.
    for r in flaky_b + broken_b:
        assert r.headers["x-envoy-attempt-count"] == r.headers["x-app-attempts"]
    # Persistent failures: the same requests fail behind both (same success rate), but
    # behind B each reached the app three times (1 + retries 2).
    fail_a = {i for i, r in enumerate(broken_a) if r.status_code != 200}
    fail_b = {i for i, r in enumerate(broken_b) if r.status_code != 200}
    assert fail_a == fail_b and 15 <= len(fail_a) <= 65
    assert {broken_b[i].headers["x-app-attempts"] for i in fail_b} == {"3"}


async def test_probe_clients_see_attempts_over_http1_h2c_and_grpc(
    sidecars: HaproxySidecars,
) -> None:
    paths = [
        PathSpec("flaky-h1", rate_per_s=50, timeout_s=2.0, http=HttpSpec(path="/api/flaky")),
        PathSpec("flaky-h2c", rate_per_s=50, timeout_s=2.0,
                 http=HttpSpec(path="/api/flaky", version="2")),
        PathSpec("echo", rate_per_s=50, timeout_s=2.0, grpc=GrpcSpec(method=ECHO), port="grpc"),
    ]
    results: dict[tuple[str, str], list[CallOutcome]] = {}
    async with pod(sidecars, "A") as a, pod(sidecars, "B") as b:
        for path in paths:
            prober = build_prober(path)
            try:
                for p in (a, b):
                    results[path.name, p.version] = [
                        await prober.call(endpoint(p), f"{path.name}-{i}") for i in range(120)]
            finally:
                await prober.aclose()

    def success(name: str, version: str) -> float:
        calls = results[name, version]
        return sum(c.outcome == Outcome.OK for c in calls) / len(calls)

    def attempts(name: str, version: str) -> list[int | None]:
        return [c.attempts for c in results[name, version]]

    for name in ("flaky-h1", "flaky-h2c"):
        assert set(attempts(name, "A")) == {1}, name  # measured (x-app-attempts), never None
        mean_b = sum(n or 0 for n in attempts(name, "B")) / 120
        assert mean_b > 1.15, (name, mean_b)  # 1 + ~0.3 for the first attempts that failed
        assert success(name, "B") == 1.0 >= success(name, "A")
        assert success(name, "A") < 0.85, name
    # gRPC errors are HTTP 200 with grpc-status in trailers: HAProxy never retries them.
    assert set(attempts("echo", "A")) == set(attempts("echo", "B")) == {1}
    assert success("echo", "A") == success("echo", "B") < 0.85
    failed = [c for c in results["echo", "B"] if c.outcome != Outcome.OK]
    assert {c.outcome for c in failed} == {Outcome.grpc("UNAVAILABLE")}


# --- streams: drain and timeouts -----------------------------------------------------------


async def hold(
    address: str, interval_ms: int, *, limit_s: float, opened: asyncio.Event | None = None,
) -> tuple[str, float, int]:
    """Hold one Subscribe stream on its own connection: (how it ended, seconds from the
    request to the end, messages). "held" when it was still open `limit_s` after the first
    message arrived. `opened` is set once it did. Seconds count from the request: whatever
    a loaded machine delays, the stream's last activity in the proxy came after it."""
    async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as channel:
        asked = time.monotonic()
        stream = target_pb2_grpc.TargetStub(channel).Subscribe(
            target_pb2.SubscribeRequest(interval_ms=interval_ms))
        await stream.read()
        count = 1
        if opened is not None:
            opened.set()
        try:
            async with asyncio.timeout(limit_s):
                while True:
                    await stream.read()
                    count += 1
        except TimeoutError:
            stream.cancel()
            return "held", time.monotonic() - asked, count
        except grpc.aio.AioRpcError as err:
            return err.code().name, time.monotonic() - asked, count
    raise AssertionError("unreachable")


async def test_soft_stop_finishes_requests_in_flight_and_cuts_held_streams_at_hard_stop(
    sidecars: HaproxySidecars,
) -> None:
    async with pod(sidecars, "B", drain_s=1.0) as b, httpx.AsyncClient() as client:
        assert b.process is not None
        grpc_address = hostport(b.host, b.grpc_port or 0)
        opened = [asyncio.Event() for _ in range(4)]
        asked = time.monotonic()
        streams = [asyncio.create_task(hold(grpc_address, 100, limit_s=6.0, opened=event))
                   for event in opened]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), 5)
        # Each first message crossed from grpc's own thread to this loop, as a cut does.
        open_s = time.monotonic() - asked
        assert b.app.open_streams == 4
        slow = asyncio.create_task(
            client.get(f"http://{hostport(b.host, b.http_port)}/api/slow?ms=400"))
        await asyncio.wait_for(b.app.wait_inflight(1), 5)
        exited: list[float] = []
        async with LoopLateness() as late:
            t0 = time.monotonic()
            b.process.exited.add_done_callback(lambda _: exited.append(time.monotonic() - t0))
            stopping = asyncio.create_task(b.stop(1.0))  # SIGUSR1; hard-stop-after 1s
            ended = await asyncio.gather(*streams)
            cut_at = time.monotonic() - t0
            assert (await slow).status_code == 200  # in flight, finished inside the drain
            with pytest.raises(OSError):  # the listener is gone: a restarting pod refuses
                await asyncio.open_connection(b.host, b.http_port)
            await stopping
    assert all(how not in ("held", "OK") for how, _, _ in ended), ended
    assert {how for how, _, _ in ended} <= {"UNKNOWN", "UNAVAILABLE", "INTERNAL"}, ended
    # HAProxy exited by itself after its hard stop: an escalation (SIGTERM, SIGKILL once the
    # exit margin passed) would be a negative status.
    assert b.process.returncode is not None and b.process.returncode >= 0, b.process.returncode
    assert "hard-stop" in b.log_path.read_text()
    # Not before hard-stop-after (the soft stop keeps held streams), and no later than the
    # exit HAProxy makes right after it (which closes whatever is left): seen here late by at
    # most this loop's lateness and grpc's hand-over to it (bounded by the streams' opening).
    (exit_at,) = exited
    assert b.hard_stop_after_s - 0.2 <= cut_at <= exit_at + late.max_s + open_s, (
        cut_at, exit_at, late.max_s, open_s)


IDLE_S = 0.6  # the "server-600ms" and "tunnel-600ms-*" versions' timeouts


async def test_timeouts_cut_idle_streams_server_in_http_mode_tunnel_in_tcp_mode(
    sidecars: HaproxySidecars,
) -> None:
    async with pod(sidecars, "server-600ms") as server_cut, \
            pod(sidecars, "tunnel-600ms-http") as tunnel_http, \
            pod(sidecars, "tunnel-600ms-tcp") as tunnel_tcp:
        def grpc_of(p: HaproxyPod) -> str:
            return hostport(p.host, p.grpc_port or 0)

        # 1.5 s between messages: idle longer than the 600 ms timeouts; 150 ms: never idle.
        runs = await asyncio.gather(
            hold(grpc_of(server_cut), 1500, limit_s=1.8),
            hold(grpc_of(server_cut), 150, limit_s=1.8),
            hold(grpc_of(tunnel_http), 1500, limit_s=1.8),
            hold(grpc_of(tunnel_tcp), 1500, limit_s=1.8),
            hold(grpc_of(tunnel_tcp), 150, limit_s=1.8),
        )
    server_idle, server_busy, http_tunnel_idle, tcp_idle, tcp_busy = runs
    # An idle stream is cut after its 600 ms of idleness, which began after the request, and
    # before the second message (1.5 s after the first): counts and a lower bound only, as
    # a loaded machine can only make the client see it later.
    # HTTP mode: `timeout server` ends an idle stream (HAProxy closes it without trailers).
    assert server_idle[0] == "UNKNOWN" and server_idle[2] == 1, server_idle
    assert server_idle[1] >= IDLE_S, server_idle
    assert server_busy[0] == "held", server_busy
    # HTTP mode: a gRPC stream is not a tunnel, so `timeout tunnel` does not touch it.
    assert http_tunnel_idle[0] == "held" and http_tunnel_idle[2] >= 2, http_tunnel_idle
    # TCP mode: `timeout tunnel` closes a connection idle in both directions at T.
    assert tcp_idle[0] == "UNAVAILABLE" and tcp_idle[2] == 1 and tcp_idle[1] >= IDLE_S, tcp_idle
    assert tcp_busy[0] == "held", tcp_busy


# --- the fleet -----------------------------------------------------------------------------


async def test_fleet_rollout_restarts_haproxy_and_the_new_version_is_seen(
    sidecars: HaproxySidecars, tmp_path: Path,
) -> None:
    file = tmp_path / "endpoints.json"
    fleet = Fleet(pods=2, version="A", sidecar=sidecars, base_host=base_host(),
                  endpoints_file=file, drain_s=1.0, notice_s=0.2, seed=5)
    async with fleet, httpx.AsyncClient() as client:
        def published() -> list[dict[str, object]]:
            doc = json.loads(file.read_text())
            return list(doc["endpoints"])

        before = published()
        assert [e["labels"]["proxy_version"] for e in before] == ["A", "A"]  # type: ignore[index]
        first = fleet.pods[0]
        assert isinstance(first, HaproxyPod) and first.process is not None
        old_process, generation = first.process, fleet.generation
        url = f"http://{hostport(first.host, first.http_port)}/api/flaky"
        r = await client.get(url, headers={"x-request-id": "before"})
        assert r.headers["x-sidecar"] == "haproxy/A"
        opened = asyncio.Event()
        held = asyncio.create_task(
            hold(hostport(first.host, first.grpc_port or 0), 100, limit_s=8.0, opened=opened))
        await asyncio.wait_for(opened.wait(), 5)

        await fleet.rollout("B", interval_s=0.0)

        how, _, _ = await held
        assert how in ("UNKNOWN", "UNAVAILABLE", "INTERNAL"), how  # cut by A's drain
        after = published()
        assert [e["labels"]["proxy_version"] for e in after] == ["B", "B"]  # type: ignore[index]
        assert [e["address"] for e in after] == [e["address"] for e in before]
        assert fleet.generation >= generation + 4  # each pod left and re-entered the list
        new = fleet.pods[0]
        assert isinstance(new, HaproxyPod) and new.process is not old_process
        assert old_process.returncode is not None
        answers = [await client.get(url, headers={"x-request-id": f"after-{i}"})
                   for i in range(40)]
        assert {a.headers["x-sidecar"] for a in answers} == {"haproxy/B"}
        assert all(a.status_code == 200 for a in answers)  # B retries what the app fails
        assert any(a.headers["x-envoy-attempt-count"] == "2" for a in answers)
        live = haproxy_pids(tmp_path)
        assert len(live) == 2 and old_process.pid not in live
    assert haproxy_pids(tmp_path) == set()
    assert json.loads(file.read_text())["endpoints"] == []


async def test_a_sidecar_that_cannot_start_fails_fast_and_leaves_nothing(
    sidecars: HaproxySidecars, tmp_path: Path,
) -> None:
    bad = HaproxyVersion("bad", retry_on=("sometimes",))  # bypasses the file's validation
    broken = HaproxyPod(bad, VersionProfile("bad"), binary=sidecars.binary, workdir=tmp_path,
                        host="127.0.0.1", pod="broken")
    t0 = time.monotonic()
    with pytest.raises(HaproxyUnavailable, match="sometimes"):
        await broken.start()
    # Fails fast: on HAProxy's exit, not after waiting out the readiness timeout.
    assert time.monotonic() - t0 < DEFAULT_READY_TIMEOUT_S
    # Its listener and its app are closed: the port can be bound again.
    listen_socket("127.0.0.1", broken.http_port).close()
    with pytest.raises(HaproxyUnavailable, match="rejected"):
        await check_config(sidecars.binary, broken.config_path.read_text())
    missing = HaproxyPod(HaproxyVersion("A"), VersionProfile("A"), binary=str(tmp_path / "no"),
                         workdir=tmp_path, host="127.0.0.1", pod="missing")
    with pytest.raises(HaproxyUnavailable, match="cannot run"):
        await missing.start()
    assert (await haproxy_version(sidecars.binary)).startswith("2.")


# --- the command line ----------------------------------------------------------------------


async def start_fleet_cli(workdir: Path, *extra: str) -> asyncio.subprocess.Process:
    return await start_fleet(
        "--sidecar", "haproxy", "--pods", "2", "--from", "1.20.3", "--base-host", base_host(),
        "--http-port", "0", "--grpc-port", "0", "--haproxy-dir", str(workdir), "--drain", "0.5s",
        "--drain-notice", "0.1s", *extra,
    )


async def wait_gone(pids: set[int], timeout_s: float) -> None:
    """Wait for processes that are not our children to exit (pidfd: readable at exit)."""
    loop = asyncio.get_running_loop()
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        gone = loop.create_future()
        loop.add_reader(fd, gone.set_result, None)
        try:
            await asyncio.wait_for(gone, timeout_s)
        finally:
            loop.remove_reader(fd)
            os.close(fd)


async def test_cli_rollout_then_sigterm_stops_every_haproxy(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.json"
    proc = await start_fleet_cli(tmp_path, "--to", "1.21.0", "--rollout-after", "0.3s",
                                 "--interval", "0.1s", "--endpoints-file", str(endpoints))
    try:
        lines = await read_until(proc, "rollout_finished")
        assert "HAProxy sidecars" in lines[0]
        versions = {e["labels"]["proxy_version"]
                    for e in json.loads(endpoints.read_text())["endpoints"]}
        assert versions == {"1.21.0"}
        assert len(haproxy_pids(tmp_path)) == 2
        err = await terminate(proc)
    finally:
        await reap(proc)
    assert proc.returncode == 0, err.decode()
    assert haproxy_pids(tmp_path) == set()
    assert {"checkout-0-1.20.3.cfg", "checkout-0-1.21.0.cfg"} <= set(os.listdir(tmp_path))


async def test_cli_killed_with_sigkill_leaves_no_haproxy_behind(tmp_path: Path) -> None:
    proc = await start_fleet_cli(tmp_path, "--quiet")
    try:
        await read_until(proc, "pods of checkout")
        pids = haproxy_pids(tmp_path)
        assert len(pids) == 2
        proc.kill()  # no cleanup runs in the fleet: the kernel's parent-death signal does it
        await proc.communicate()
        await wait_gone(pids, 5.0)
    finally:
        await reap(proc)
    assert haproxy_pids(tmp_path) == set()


async def test_cli_rejects_fault_profiles_in_haproxy_mode(tmp_path: Path) -> None:
    proc = await start_fleet_cli(
        tmp_path, "--profiles", str(ROOT / "targets" / "examples" / "profiles.yaml"))
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 2
    message = err.decode().strip()
    assert "\n" not in message and "--profiles" in message and "Traceback" not in message
    assert haproxy_pids(tmp_path) == set()


async def test_cli_relay_in_haproxy_mode_calls_through_an_outbound_haproxy_per_version(
    tmp_path: Path,
) -> None:
    allowlist = tmp_path / "relay.yaml"
    allowlist.write_text("relay:\n  destinations:\n    catalog:\n"
                         '      http: {url: "http://checkout.demo.svc:8080/api/catalog"}\n'
                         "      service: checkout\n")
    endpoints = tmp_path / "endpoints.json"
    proc = await start_fleet_cli(tmp_path, "--relay", str(allowlist), "--control-plane",
                                 "1.21.0", "--to", "1.21.0", "--rollout-after", "0.3s",
                                 "--interval", "0.1s", "--restarts", "1",
                                 "--endpoints-file", str(endpoints))
    try:
        lines = await read_until(proc, "rollout_finished")
        [outbound] = [line for line in lines if "outbound HAProxy of" in line]
        assert "1.20.3 callers on 127.0.0.1:" in outbound
        # Two pods, and one outbound HAProxy per caller version: 1.21.0's started with its
        # first pod.
        assert len(haproxy_pids(tmp_path)) == 4
        pods = json.loads(endpoints.read_text())["endpoints"]
        assert sorted(e["labels"]["proxy_version"] for e in pods) == ["1.20.3", "1.21.0"]
        answers = {}
        async with httpx.AsyncClient(timeout=10) as client:
            for e in pods:
                got = await client.get(f"http://{e['address']}/relay/catalog")
                assert got.status_code == 200, got.text
                answers[e["labels"]["proxy_version"]] = got.json()
        err = await terminate(proc)
    finally:
        await reap(proc)
    assert proc.returncode == 0, err.decode()
    assert haproxy_pids(tmp_path) == set()
    addresses = {e["address"] for e in pods}
    for version, answer in answers.items():
        # Answered by a pod of the service, reached through the caller's own HAProxy (its
        # address the pod's, from the proxy), as the caller it is.
        assert answer["outcome"] == "ok" and answer["address"] in addresses, answer
        assert answer["caller"]["proxy_version"] == version
        assert answer["answered_by"]["namespace"] == "demo"
    # 1.21.0 counts its attempts (x-envoy-attempt-count); 1.20.3 counts none, and never
    # passes on the callee's own count as its own.
    assert answers["1.21.0"]["attempts"] == 1 and answers["1.20.3"]["attempts"] is None
    assert {"checkout-outbound-1.20.3.cfg", "checkout-outbound-1.21.0.cfg"} <= set(
        os.listdir(tmp_path))
