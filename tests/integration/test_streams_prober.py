"""StreamProber against real servers: the reference target (Subscribe, health Watch, fault
profiles, drains) and a raw HTTP/2 server (tests/servers/h2raw.py) that ends a gRPC stream in
each way grpc core distinguishes (RST_STREAM codes, GOAWAY, TCP RST, FIN, statuses)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import random
import socket
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from probes.clients import (
    EndReason,
    OpenStream,
    StreamEnd,
    StreamPolicy,
    StreamProber,
)
from probes.errors import BadInput
from probes.spec import PathSpec, StreamSpec
from probes.streams import find_cap
from probes.types import Endpoint
from targets.profile import VersionProfile, parse_profiles
from targets.proto import target_pb2
from targets.server import TargetServer
from tests.servers.h2raw import RawH2Server
from tests.servers.hostile import accept_and_hang
from tests.servers.lateness import LoopLateness

SUBSCRIBE = "/skewprobe.target.v1.Target/Subscribe"
# A wait ends as soon as what it waits for happens: this only stops a broken prober from
# hanging the suite. Below the 30 s a stream lingers by default, which two tests tell apart.
HANG_GUARD_S = 20.0
FAST = StreamPolicy(initial_backoff_s=0.02, max_backoff_s=0.2, open_spread_s=0.0,
                    stable_s=0.2, linger_s=2.0)


class ListSink:
    """Keeps every report; `wait` wakes on each one (no polling)."""

    def __init__(self) -> None:
        self.opened: list[OpenStream] = []
        self.ended: list[StreamEnd] = []
        self.held: list[tuple[str, str, str, float, float]] = []
        self.gaps: list[float] = []
        self._waiters: list[asyncio.Future[None]] = []

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait(self, predicate: Callable[[ListSink], bool], within: float = HANG_GUARD_S
                   ) -> None:
        async with asyncio.timeout(within):
            while not predicate(self):
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter

    def stream_opened(self, stream: OpenStream, endpoint: Endpoint) -> None:
        self.opened.append(stream)
        self._notify()

    def stream_held(self, path: str, cohort: str, endpoint: str, start: float, end: float
                    ) -> None:
        self.held.append((path, cohort, endpoint, start, end))

    def streams_held(self, path: str, cohort: str, start: float, end: float, count: int
                     ) -> None:
        self.held.extend([(path, cohort, "*", start, end)] * count)

    def stream_message(self, path: str, cohort: str, gap_s: float) -> None:
        self.gaps.append(gap_s)
        self._notify()

    def stream_ended(self, end: StreamEnd, endpoint: Endpoint) -> None:
        self.ended.append(end)
        self._notify()

    def established_ends(self) -> list[StreamEnd]:
        return [e for e in self.ended if e.established]


def subscribe_path(per_endpoint: int = 1, interval_ms: int = 50, **stream: object) -> PathSpec:
    request = target_pb2.SubscribeRequest(interval_ms=interval_ms).SerializeToString()
    spec = StreamSpec(method=SUBSCRIBE, request=request, per_endpoint=per_endpoint,
                      **stream)  # type: ignore[arg-type]
    return PathSpec("feed", 1.0, 1.0, stream=spec, cohort_header="x-proxy-version")


def endpoint_of(server: TargetServer) -> Endpoint:
    assert server.grpc_port is not None
    return Endpoint(server.pod, server.host, server.grpc_port,
                    labels={"proxy_version": server.version})


@contextlib.asynccontextmanager
async def holding(prober: StreamProber, path: PathSpec, endpoint: Endpoint,
                  cohort: str = "c") -> AsyncIterator[asyncio.Task[None]]:
    """Run hold() as the engine does; cancel it and close the prober at the end."""
    task = asyncio.create_task(prober.hold(path, endpoint, cohort))
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await prober.aclose()


async def test_subscribe_streams_are_held_measured_and_closed_without_leaks():
    sink = ListSink()
    prober = StreamProber([subscribe_path(3)], sink, policy=FAST)
    async with (
        LoopLateness() as late,
        TargetServer(VersionProfile("1.20.3"), pod="pod-0") as server,
    ):
        async with holding(prober, subscribe_path(3), endpoint_of(server)):
            await sink.wait(lambda s: len(s.opened) == 3 and len(s.gaps) >= 30)
            assert server.open_streams == 3
            assert prober.channels == 1  # K streams share one connection
            prober.checkpoint()
            assert {o.cohort for o in sink.opened} == {"1.20.3"}  # from x-proxy-version
            assert all(not o.lingering for o in prober.open_streams())
        assert prober.tasks == 0 and prober.channels == 0
    assert [e.reason for e in sink.ended] == [EndReason.CLIENT_STOPPED] * 3
    assert not any(e.is_reset for e in sink.ended)
    for end in sink.ended:
        assert end.messages >= 10
        # Messages every 50 ms: the stream's p99 gap is near that, stretched by as much as the
        # loop (the server's timer, then the prober's read) was late.
        assert end.gap_p99_s is not None
        assert 0.03 <= end.gap_p99_s <= 0.5 + 2 * late.max_s, (end.gap_p99_s, late.max_s)
    # The checkpoint's grouped report and each stream's final one add up to the lifetimes.
    assert {ep for *_, ep, _s, _e in sink.held} == {"*", "pod-0"}
    held = sum(e - s for p, c, ep, s, e in sink.held)
    assert held == pytest.approx(sum(end.lifetime_s for end in sink.ended), abs=0.3)
    current = asyncio.current_task()
    leftovers = [t for t in asyncio.all_tasks() if t is not current
                 and t.get_name().startswith(("stream ", "feed@"))]
    assert leftovers == []


async def test_a_held_stream_keeps_one_task_of_the_probers_own_and_no_finished_ones():
    """Slots run on callbacks and the open's headers task is dropped once read: at 2,400
    held streams a waiting task per slot, and a finished task kept per stream, were
    megabytes (BENCHMARKS.md, "Memory")."""
    sink = ListSink()
    prober = StreamProber([subscribe_path(3)], sink, policy=FAST)
    async with (
        TargetServer(VersionProfile("1.20.3"), pod="pod-0") as server,
        holding(prober, subscribe_path(3), endpoint_of(server)) as hold,
    ):
        await sink.wait(lambda s: len(s.opened) == 3 and len(s.gaps) >= 6)
        ours = [t.get_coro().__qualname__ for t in asyncio.all_tasks()
                if t is not hold and t.get_coro().__qualname__.startswith("StreamProber.")]
        assert sorted(ours) == ["StreamProber._run"] * 3
        gc.collect()
        kept = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and o.done()
                and getattr(o.get_coro(), "__qualname__", "") == "Call.initial_metadata"]
        assert kept == []
        assert server.open_streams == 3


@pytest.mark.parametrize(("code", "reason"), [
    (None, "grpc_INTERNAL"),  # the target's default emulation of an Envoy stream reset
    ("DEADLINE_EXCEEDED", EndReason.DEADLINE),
    ("CANCELLED", EndReason.CANCELLED),
])
async def test_a_max_stream_duration_caps_lifetimes_near_it_with_its_reason(code, reason):
    after = "600ms"
    msd = f"{{after: {after}, code: {code}}}" if code else after
    profiles = parse_profiles(
        f'versions: {{"1.21.0": {{routes: {{"{SUBSCRIBE}": {{max_stream_duration: {msd}}}}}}}}}'
    )
    sink = ListSink()
    path = subscribe_path(4)
    prober = StreamProber([path], sink, policy=FAST)
    async with (
        LoopLateness() as late,
        TargetServer(profiles.profile("1.21.0"), pod="pod-0") as server,
        holding(prober, path, endpoint_of(server)),
    ):
        await sink.wait(lambda s: len(s.established_ends()) >= 12)
    cut = [e for e in sink.established_ends() if e.reason != EndReason.CLIENT_STOPPED]
    assert len(cut) >= 12
    assert {e.reason for e in cut} == {reason}
    assert all(e.is_reset for e in cut)
    # The cap fires on the server's timer and is read on the prober's: each late by at most
    # what the loop was.
    slack = 2 * late.max_s
    lifetimes = [e.lifetime_s for e in cut]
    assert all(0.45 <= t <= 0.8 + slack for t in lifetimes), (lifetimes, late.max_s)
    from probes.streams import Lifetime
    finding = find_cap([Lifetime(e.lifetime_s, e.ended_at, e.reason) for e in cut])
    assert finding.capped, finding.why
    assert 0.54 <= finding.cap_s <= 0.66 + slack, (finding.cap_s, late.max_s)


async def test_grpc_max_connection_age_ends_streams_as_goaway():
    profile = VersionProfile("1.21.0", max_connection_age_s=0.4, max_connection_age_grace_s=0.2)
    sink = ListSink()
    path = subscribe_path(2)
    prober = StreamProber([path], sink, policy=FAST)
    async with (
        LoopLateness() as late,
        TargetServer(profile, pod="pod-0") as server,
        holding(prober, path, endpoint_of(server)),
    ):
        await sink.wait(lambda s: len(s.established_ends()) >= 4)
    cut = [e for e in sink.established_ends() if e.reason != EndReason.CLIENT_STOPPED]
    assert {e.reason for e in cut} == {EndReason.GOAWAY}
    assert any("max connection age" in e.detail for e in cut)
    # Age 0.4 s (grpc jitters it by up to ±10 %) plus 0.2 s grace; the server's timer and
    # the prober's read late by at most what the loop was.
    lifetimes = [e.lifetime_s for e in cut]
    assert all(0.3 <= t <= 0.9 + 2 * late.max_s for t in lifetimes), (lifetimes, late.max_s)


async def test_a_drain_cuts_held_streams_as_goaway():
    sink = ListSink()
    path = subscribe_path(2)
    prober = StreamProber([path], sink, policy=FAST)
    server = TargetServer(VersionProfile("1.20.3"), pod="pod-0")
    await server.start()
    try:
        async with holding(prober, path, endpoint_of(server)):
            await sink.wait(lambda s: len(s.opened) == 2)
            await server.stop(0.2)
            await sink.wait(lambda s: len(s.ended) >= 2)
    finally:
        await server.stop(0.0)
    first = sink.ended[:2]
    assert {e.reason for e in first} == {EndReason.GOAWAY}
    assert all("Cancelling all calls" in e.detail for e in first)


async def test_health_watch_sees_the_drain_coming_and_its_cut():
    sink = ListSink()
    path = PathSpec("health", 1.0, 1.0, stream=StreamSpec(health_service=""))
    prober = StreamProber([path], sink, policy=FAST)
    server = TargetServer(VersionProfile("1.20.3"), pod="pod-0")
    await server.start()
    try:
        async with holding(prober, path, endpoint_of(server)):
            await sink.wait(lambda s: len(s.opened) == 1)
            await server.stop(0.2, notice_s=0.2)
            await sink.wait(lambda s: len(s.ended) >= 1)
    finally:
        await server.stop(0.0)
    end = sink.ended[0]
    assert end.reason == EndReason.GOAWAY and end.is_reset
    assert end.messages == 2  # SERVING at once, NOT_SERVING when the drain began
    assert "last health status NOT_SERVING" in end.detail


async def test_refused_opens_back_off_then_the_stream_opens_when_the_pod_is_back(monkeypatch):
    drawn: list[tuple[int, float]] = []  # (consecutive failures, backoff), as each is drawn
    backoff = StreamPolicy.backoff

    def recording(policy: StreamPolicy, failures: int, rng: random.Random) -> float:
        delay = backoff(policy, failures, rng)
        drawn.append((failures, delay))
        return delay

    monkeypatch.setattr(StreamPolicy, "backoff", recording)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    sink = ListSink()
    path = subscribe_path(1)
    prober = StreamProber([path], sink, policy=FAST)
    endpoint = Endpoint("pod-0", "127.0.0.1", port, labels={"proxy_version": "1.20.3"})
    async with holding(prober, path, endpoint):
        await sink.wait(lambda s: len(s.ended) >= 6)
        failures = list(sink.ended)
        assert {e.reason for e in failures} == {EndReason.REFUSED}
        assert not any(e.established or e.is_reset for e in failures)
        starts = [e.started_at for e in failures]
        waits = [b - a for a, b in itertools.pairwise(starts)]
        # Backoff: the n-th is drawn from [d/2, d], d = min(0.2, 0.02 * 2**n), and each wait
        # lasted at least its draw (timers never fire early; 1 ms for the wall clock's reads).
        assert [n for n, _ in drawn[: len(waits)]] == list(range(1, len(waits) + 1))
        delays = [d for _, d in drawn[: len(waits)]]
        assert delays[0] <= 0.04 and delays[4] >= 0.1 and max(delays) <= 0.2
        assert all(w >= d - 0.001 for w, d in zip(waits, delays, strict=True))
        async with TargetServer(VersionProfile("1.20.3"), grpc_port=port, pod="pod-0"):
            await sink.wait(lambda s: len(s.opened) == 1)
    assert sink.opened[0].cohort == "1.20.3"


async def test_a_removed_endpoints_streams_linger_until_the_drain_cuts_them():
    # The fleet unpublishes a restarting pod ~1.5 s before it drains: the engine cancels
    # hold() first, and the drain's resets must still be counted.
    sink = ListSink()
    path = subscribe_path(2)
    prober = StreamProber([path], sink, policy=FAST)
    server = TargetServer(VersionProfile("1.20.3"), pod="pod-0")
    await server.start()
    try:
        hold = asyncio.create_task(prober.hold(path, endpoint_of(server), "1.20.3"))
        await sink.wait(lambda s: len(s.opened) == 2)
        hold.cancel()
        await asyncio.gather(hold, return_exceptions=True)
        assert [o.lingering for o in prober.open_streams()] == [True, True]
        assert server.open_streams == 2
        await server.stop(0.2, notice_s=0.3)
        await sink.wait(lambda s: len(s.ended) == 2)
    finally:
        await prober.aclose()
        await server.stop(0.0)
    assert [e.reason for e in sink.ended] == [EndReason.GOAWAY] * 2
    assert len(sink.opened) == 2  # nothing re-opened on a removed endpoint


async def test_a_lingering_stream_is_closed_after_the_linger_time_not_as_a_reset():
    sink = ListSink()
    path = subscribe_path(1)
    policy = StreamPolicy(open_spread_s=0.0, linger_s=0.3)
    prober = StreamProber([path], sink, policy=policy)
    async with TargetServer(VersionProfile("1.20.3"), pod="pod-0") as server:
        hold = asyncio.create_task(prober.hold(path, endpoint_of(server), "1.20.3"))
        await sink.wait(lambda s: len(s.opened) == 1)
        hold.cancel()
        await asyncio.gather(hold, return_exceptions=True)
        loop = asyncio.get_running_loop()
        released = loop.time()
        # Not before the linger time; a stream never closed, or kept the default 30 s, fails
        # the wait.
        await sink.wait(lambda s: len(s.ended) == 1)
        assert loop.time() - released >= 0.25
        await prober.aclose()
        assert prober.tasks == 0 and prober.channels == 0
    assert sink.ended[0].reason == EndReason.CLIENT_STOPPED
    assert not sink.ended[0].is_reset


async def test_max_lifetime_rotates_streams_client_side_without_resets():
    sink = ListSink()
    path = subscribe_path(1, max_lifetime_s=0.3)
    prober = StreamProber([path], sink, policy=FAST)
    async with (
        LoopLateness() as late,
        TargetServer(VersionProfile("1.20.3"), pod="pod-0") as server,
        holding(prober, path, endpoint_of(server)),
    ):
        await sink.wait(lambda s: len(s.ended) >= 3 and len(s.opened) >= 4)
    rotated = [e for e in sink.ended if e.reason == EndReason.CLIENT_ROTATED]
    assert len(rotated) >= 3
    # Rotated on the prober's own timer, the end read on its loop: late by what the loop was.
    lifetimes = [e.lifetime_s for e in rotated]
    assert all(0.26 <= t <= 0.5 + 2 * late.max_s for t in lifetimes), (lifetimes, late.max_s)
    assert not any(e.is_reset for e in sink.ended)


async def test_a_connection_that_never_completes_is_refused_and_not_opened_once_removed():
    # The kernel accepts, the server never speaks HTTP/2: the channel stays CONNECTING.
    path = PathSpec("feed", 1.0, 0.3, stream=StreamSpec(method=SUBSCRIBE))
    async with accept_and_hang() as port:
        endpoint = Endpoint("pod-0", "127.0.0.1", port)
        sink = ListSink()
        prober = StreamProber([path], sink, policy=FAST)
        async with holding(prober, path, endpoint):
            await sink.wait(lambda s: len(s.ended) >= 1)
        first = sink.ended[0]
        assert first.reason == EndReason.REFUSED and not first.established
        assert "no connection within 0.3s (channel CONNECTING)" in first.detail
        assert first.ended_at - first.started_at >= 0.25
        # Removed while the stream is still connecting (its open timeout now 30 s, so surely
        # still so): stopped at once, not kept open (kept to the timeout, it fails the wait).
        path = PathSpec("feed", 1.0, 30.0, stream=StreamSpec(method=SUBSCRIBE))
        sink = ListSink()
        prober = StreamProber([path], sink, policy=FAST)
        hold = asyncio.create_task(prober.hold(path, endpoint, "c"))
        await asyncio.sleep(0.1)  # the first attempt is connecting
        hold.cancel()
        await asyncio.gather(hold, return_exceptions=True)
        await sink.wait(lambda s: len(s.ended) == 1)
        assert sink.ended[0].reason == EndReason.CLIENT_STOPPED and not sink.opened
        await prober.aclose()
        assert prober.tasks == 0 and prober.channels == 0


def test_a_bad_policy_is_bad_input():
    with pytest.raises(BadInput):
        StreamPolicy(multiplier=0.5)
    with pytest.raises(BadInput):
        StreamPolicy(linger_s=-1.0)


def test_a_path_without_a_stream_or_with_a_bad_method_is_bad_input():
    with pytest.raises(BadInput, match="not a stream path"):
        StreamProber([], ListSink())._conf(PathSpec("u", 1.0, 1.0))
    with pytest.raises(BadInput, match=r"stream\.method"):
        StreamProber([PathSpec("s", 1.0, 1.0, stream=StreamSpec(method="Subscribe"))],
                     ListSink())


# --- a raw HTTP/2 server that ends a gRPC stream each way -------------------------------------


MODES = [
    ("status0", EndReason.SERVER_CLOSED_OK, "OK"),
    ("rst0", EndReason.RST_STREAM, "INTERNAL"),
    ("rst2", EndReason.RST_STREAM, "INTERNAL"),
    ("rst8", EndReason.RST_STREAM, "CANCELLED"),
    ("goaway", EndReason.GOAWAY, "UNAVAILABLE"),
    ("tcprst", EndReason.CONNECTION_RESET, "UNAVAILABLE"),
    ("fin", EndReason.CONNECTION_RESET, "UNAVAILABLE"),
    ("status4", EndReason.DEADLINE, "DEADLINE_EXCEEDED"),
    ("status1", EndReason.CANCELLED, "CANCELLED"),
    ("status13", "grpc_INTERNAL", "INTERNAL"),
]


@pytest.mark.parametrize(("mode", "reason", "code"), MODES)
async def test_each_way_a_server_ends_a_stream_is_classified(mode, reason, code):
    sink = ListSink()
    path = PathSpec("cut", 1.0, 1.0, stream=StreamSpec(method=f"/x.Cut/{mode}"))
    prober = StreamProber([path], sink, policy=FAST)
    async with (
        RawH2Server() as server,
        holding(prober, path, Endpoint("raw", "127.0.0.1", server.port)),
    ):
        await sink.wait(lambda s: len(s.ended) >= 1)
    end = sink.ended[0]
    assert end.established and end.messages == 1
    assert (end.reason, end.code) == (reason, code), end.detail
    assert end.is_reset == (reason != EndReason.SERVER_CLOSED_OK)
    assert grpc.StatusCode[code]  # a real status name
