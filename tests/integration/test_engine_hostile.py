"""Hostile targets next to a healthy one, through the real engine: each is classified, none
slows the others, the calls in flight stay bounded and drain, and memory stays bounded; and
a target that flaps (listener up and down) over HTTP/1.1, HTTP/2 and gRPC.

Real servers on loopback (the reference target, tests/servers/hostile.py for HTTP/1.1,
tests/servers/h2raw.py for raw HTTP/2 and gRPC), the real probers, the real engine. The
single-call cases, with their details, are in tests/integration/test_hostile_http.py and
tests/integration/test_hostile_grpc.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from probes.clients import EndReason, OpenStream, StreamEnd, StreamProber, build_prober
from probes.run.engine import Engine, EngineLimits
from probes.spec import GrpcSpec, HttpSpec, PathSpec, StreamSpec, TlsSpec
from probes.types import CallResult, Endpoint, Outcome
from targets.profile import parse_profiles
from targets.server import TargetServer
from tests.integration.test_hostile_http import UNRESOLVABLE
from tests.integration.test_streams_prober import FAST
from tests.integration.test_streams_prober import ListSink as StreamListSink
from tests.servers.h2raw import RawH2Server
from tests.servers.hostile import HostileServer, closed_port, flapping
from tests.servers.lateness import LoopLateness
from tests.servers.memory import PeakRss
from tests.servers.tls import SERVER_NAME, make_cert
from tests.unit.test_engine import ListSink

# Sixteen hostile paths, their servers and the probe share one process (and a machine that
# may be busy): modest rates, and timeouts with room for a slow loop, so that only what the
# targets do decides the outcomes. Never-answering paths time out sooner, to keep it short.
RATE = 10.0
SECONDS = 3.0
TIMEOUT_S = 1.0
HANG_TIMEOUT_S = 0.5
FLAP_RATE = 20.0  # three light paths: enough calls to see both phases of each flap


class Sink(ListSink):
    """Keeps every result, the sends the engine skipped per path, and the most calls it had
    in flight when one finished."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: Engine | None = None
        self.peak_in_flight = 0
        self.skipped: Counter[str] = Counter()

    def dropped(self, path: str, reason: str, count: int = 1) -> None:
        super().dropped(path, reason, count)
        self.skipped[path] += count

    def record(self, result: CallResult, endpoint: Endpoint) -> None:
        super().record(result, endpoint)
        if self.engine is not None:
            self.peak_in_flight = max(self.peak_in_flight, self.engine.in_flight)

    def timeline(self, path: str) -> str:
        """`seconds:outcome` of each call of `path`, for a failure message."""
        start = min(r.intended_at for r in self.results)
        return " ".join(
            f"{r.intended_at - start:.2f}:{r.outcome.outcome}"
            for r in sorted(self.results, key=lambda r: r.intended_at) if r.path == path
        )

    def by_path(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = {}
        for result in self.results:
            out.setdefault(result.path, Counter())[result.outcome.outcome] += 1
        return out


class StreamSink(StreamListSink):
    """Also follows the one stream open at a time (one slot on one endpoint), so that its
    server resets it only once the probe has read every message it sent: grpc.aio drops the
    messages a client has not read yet when the call's status arrives, so a reset a fixed
    time after the messages would cut how many the probe counts whenever it reads late."""

    def __init__(self) -> None:
        super().__init__()
        self.gaps_of_open: int | None = None  # None between streams

    def stream_opened(self, stream: OpenStream, endpoint: Endpoint) -> None:
        self.gaps_of_open = 0
        super().stream_opened(stream, endpoint)

    def stream_message(self, path: str, cohort: str, gap_s: float) -> None:
        if self.gaps_of_open is not None:
            self.gaps_of_open += 1
        super().stream_message(path, cohort, gap_s)

    def stream_ended(self, end: StreamEnd, endpoint: Endpoint) -> None:
        self.gaps_of_open = None
        super().stream_ended(end, endpoint)

    async def read(self, count: int, within_s: float) -> None:
        """Until the open stream's `count` messages are read (a stream's first message has
        no gap before it: `count - 1` gaps), or `within_s` passes: then the server resets
        anyway, and the count the probe reports shows what it missed."""
        with contextlib.suppress(TimeoutError):
            await self.wait(lambda s: s.gaps_of_open is not None and s.gaps_of_open >= count - 1,
                            within=within_s)


def _http(
    name: str, target: str, timeout_s: float = TIMEOUT_S, rate: float = RATE, **spec: object
) -> PathSpec:
    return PathSpec(
        name=name, rate_per_s=rate, timeout_s=timeout_s, selector={"kind": name},
        http=HttpSpec(path=target, **spec),  # type: ignore[arg-type]
    )


def _grpc(name: str, mode: str, timeout_s: float = TIMEOUT_S) -> PathSpec:
    return PathSpec(
        name=name, rate_per_s=RATE, timeout_s=timeout_s, selector={"kind": name},
        grpc=GrpcSpec(method=f"/x.Hostile/{mode}"),
    )


def _ep(kind: str, port: int, host: str = "127.0.0.1") -> Endpoint:
    return Endpoint(name=kind, host=host, port=port,
                    labels={"kind": kind, "proxy_version": "1.20.3"})


@contextlib.asynccontextmanager
async def running(engine: Engine, endpoints: Sequence[Endpoint]) -> AsyncIterator[None]:
    """Run the engine on one snapshot; on exit stop it and cancel what is left."""

    async def snapshots():  # type: ignore[no-untyped-def]
        yield endpoints
        await asyncio.Event().wait()

    task = asyncio.create_task(engine.run(snapshots()))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def assert_flapping(sink: Sink, path: str, refusal: str, downs: int) -> None:
    """Answers and refusals, several of each. A connection still in the listener's backlog,
    or a request in flight, as the server goes down is reset (as by a crashing pod): at
    most one per time it went down, at this rate."""
    counts, timeline = sink.by_path()[path], sink.timeline(path)
    assert counts[Outcome.OK] >= 5 and counts[refusal] >= 5, (downs, timeline)
    assert set(counts) <= {Outcome.OK, refusal, Outcome.RESET}, timeline
    assert counts[Outcome.RESET] <= downs, timeline


async def drain(engine: Engine) -> float:
    """Stop sending and let every call in flight end on its own; seconds it took. A call
    stuck past its path's timeout would hold this to the grace time."""
    started = time.perf_counter()
    await engine.stop(grace_s=5.0)
    assert engine.in_flight == 0
    return time.perf_counter() - started


async def test_hostile_targets_are_classified_and_do_not_slow_the_healthy_one(tmp_path: Path):
    cert = make_cert(tmp_path)
    tls = TlsSpec(ca=str(cert.cert), server_name=SERVER_NAME)
    profiles = parse_profiles('versions: {"1.20.3": {attempt_count_header: true}}')
    paths = [
        _http("healthy", "/api/checkout"),
        _http("hang", "/hang", timeout_s=HANG_TIMEOUT_S),
        _http("slowloris", "/slowheaders", timeout_s=HANG_TIMEOUT_S),
        _http("reset", "/reset"),
        _http("reset_mid_body", "/resetbody/16384"),
        _http("garbage", "/garbage"),
        # Each of these reads a MiB per call: a quarter of the rate keeps the test's own CPU
        # (servers included, in this one process) well below what the machine has.
        _http("big", f"/big/{50 * 1024 * 1024}", timeout_s=2.0, rate=RATE / 4),
        _http("endless", "/endless", timeout_s=2.0, rate=RATE / 4),
        _http("refused", "/"),
        _http("dns", "/"),
        _http("flapping", "/status/200"),
        _http("tls_on_plaintext", "/status/200", scheme="https", tls=tls),
        _http("plaintext_on_tls", "/status/200"),
        _http("h2_bad_frame", "/x.Hostile/badframe", version="2"),
        _grpc("grpc_bad_hpack", "badhpack"),
        _grpc("grpc_compressed", "compressed"),
        _grpc("grpc_slowloris", "slowheaders", timeout_s=HANG_TIMEOUT_S),
    ]
    stream = PathSpec("stream_reset", 1.0, TIMEOUT_S, selector={"kind": "stream_reset"},
                      stream=StreamSpec(method="/x.Hostile/tcprst-3"))
    async with contextlib.AsyncExitStack() as stack:
        target = TargetServer(profiles.profile("1.20.3"), host="127.0.0.1", grpc_port=None)
        await target.start()
        stack.push_async_callback(target.stop, 0.0)
        hostile = await stack.enter_async_context(HostileServer())
        tls_server = await stack.enter_async_context(
            HostileServer(ssl_context=cert.server_context())
        )
        raw = await stack.enter_async_context(RawH2Server(after_s=0.1))
        sink, stream_sink = Sink(), StreamSink()
        # Resets each stream once the probe has read its three messages (at most 2 s on).
        stream_server = await stack.enter_async_context(
            RawH2Server(hold=lambda: stream_sink.read(3, within_s=2.0)))
        flap = await stack.enter_async_context(flapping(0.2))
        refused_port = stack.enter_context(closed_port())

        ports = {"healthy": target.http_port, "refused": refused_port, "flapping": flap.port,
                 "plaintext_on_tls": tls_server.port, "stream_reset": stream_server.port}
        endpoints = [_ep("dns", 80, UNRESOLVABLE)]
        for p in [*paths, stream]:
            if p.name != "dns":
                raw_kind = p.grpc is not None or p.stream is not None or p.name.startswith("h2")
                default = raw.port if raw_kind else hostile.port
                endpoints.append(_ep(p.name, ports.get(p.name, default)))
        probers = {p.name: build_prober(p) for p in paths}
        streams = StreamProber([stream], stream_sink, policy=FAST)
        engine = Engine([*paths, stream], probers, sink, streams=streams)
        sink.engine = engine
        with PeakRss() as rss:
            async with LoopLateness() as late, running(engine, endpoints):
                await asyncio.sleep(SECONDS)
                drained_s = await drain(engine)
        await streams.aclose()
        for prober in probers.values():
            await prober.aclose()

    by_path = sink.by_path()
    started = min(r.intended_at for r in sink.results)
    healthy = [r for r in sink.results if r.path == "healthy"]
    # The open loop holds the healthy path's rate while sixteen neighbours misbehave, every
    # call answered within its timeout, and once the probers have started (their first
    # calls build sessions, channels and TLS contexts) at loopback speed. Generous bounds:
    # "not stalled", not a benchmark; the machine is shared.
    assert len(healthy) + sink.skipped["healthy"] >= RATE * SECONDS - 2, by_path
    assert by_path["healthy"] == Counter({Outcome.OK: len(healthy)})
    assert all(r.outcome.attempts == 1 for r in healthy)
    steady = [r.latency_s for r in healthy if r.intended_at >= started + 1.0]
    assert statistics.median(steady) < 0.25, sorted(steady)

    exact = {
        "hang": Outcome.TIMEOUT,
        "slowloris": Outcome.TIMEOUT,
        "reset": Outcome.RESET,
        "reset_mid_body": Outcome.RESET,
        "garbage": Outcome.PROTOCOL_ERROR,
        "big": Outcome.OK,
        "endless": Outcome.OK,
        "refused": Outcome.CONNECT_REFUSED,
        "dns": Outcome.DNS_ERROR,
        "tls_on_plaintext": Outcome.TLS_ERROR,
        "plaintext_on_tls": Outcome.RESET,
        "h2_bad_frame": Outcome.PROTOCOL_ERROR,
        "grpc_bad_hpack": Outcome.PROTOCOL_ERROR,
        "grpc_compressed": "grpc_INTERNAL",
        "grpc_slowloris": "grpc_DEADLINE_EXCEEDED",
    }
    for name, outcome in exact.items():
        counts = by_path[name]
        if outcome == "grpc_DEADLINE_EXCEEDED":
            # grpc core's deadline is 25 ms inside the engine's; when this loaded loop
            # delivers it later than that, the engine's backstop records the same event
            # as `timeout` (a probe that late is flagged overloaded in production). How many
            # lose that race depends on the machine's load, so only its existence is asserted.
            assert counts[outcome] >= 1, (name, counts)
            counts = +Counter({o: n for o, n in counts.items() if o != Outcome.TIMEOUT})
        assert set(counts) == {outcome}, (name, by_path[name])
    for name in ("big", "endless"):
        assert all("truncated" in r.outcome.detail for r in sink.results if r.path == name)
    assert_flapping(sink, "flapping", Outcome.CONNECT_REFUSED, flap.closed)

    # Every path kept its schedule (sends the engine skipped, if the shared machine starved
    # it, are counted as such and few); calls that never answer ended at their timeout, and
    # those still running at the stop drained on their own.
    never = {name for name, o in exact.items() if o in (Outcome.TIMEOUT, "grpc_DEADLINE_EXCEEDED")}
    for p in paths:
        done = sum(by_path[p.name].values()) + sink.skipped[p.name]
        floor = (SECONDS - p.timeout_s if p.name in never else SECONDS) * p.rate_per_s
        assert done >= floor - 2, (p.name, done)
    assert sum(sink.skipped.values()) <= 0.05 * sum(p.rate_per_s * SECONDS for p in paths)
    assert sink.drops["max_in_flight"] == 0
    timeouts = {p.name: p.timeout_s for p in paths}
    for r in sink.results:
        # From the intended send: at most the engine's catch-up limit late, then the timeout,
        # which a loaded loop fires as late as it woke up late.
        limit = timeouts[r.path] + EngineLimits().max_catch_up_s + late.max_s + 0.25
        assert r.latency_s < limit, (r.path, r.latency_s, late.max_s)
    assert sink.peak_in_flight <= sum(p.rate_per_s * p.timeout_s for p in paths) + 20
    # The longest path timeout (2 s), not the 5 s grace: no call outlived its timeout.
    assert drained_s < 2.0 + late.max_s + 0.5, (drained_s, late.max_s)

    # The stream path: re-opened after each reset, each ending after its three messages.
    ends = stream_sink.ended
    assert len(ends) >= 3
    assert {(e.reason, e.messages) for e in ends if e.reason != EndReason.CLIENT_STOPPED} == {
        (EndReason.CONNECTION_RESET, 3)
    }
    assert streams.tasks == 0

    # Fifty-megabyte and endless bodies, hung and dripping connections, sixteen neighbours'
    # pools: the process's peak memory grew by some MiB of buffers (about 11 measured);
    # bodies held whole would take 50 MB each.
    assert rss.growth_mib < 40, rss.growth_mib


async def test_a_flapping_target_is_a_mix_of_answers_and_refusals(h2_client):
    # Up 200 ms, down 200 ms (listener and connections closed, as a restarting pod), for
    # HTTP/1.1, HTTP/2 and gRPC. Nothing is stuck in flight, and a call that finds the
    # server gone is a refusal. Under httpcore the idle HTTP/2 connection the server dropped
    # is found dead only by the next request, which is re-sent on a fresh one (churn), not a
    # reset; the probe's own client sees the close when it happens and needs no re-send.
    paths = [
        _http("h1", "/status/200", rate=FLAP_RATE),
        PathSpec("h2", FLAP_RATE, TIMEOUT_S, selector={"kind": "raw"},
                 http=HttpSpec(path="/x.Hostile/status0", version="2")),
        PathSpec("grpc", FLAP_RATE, TIMEOUT_S, selector={"kind": "raw"},
                 grpc=GrpcSpec(method="/x.Hostile/status0")),
    ]
    async with (
        flapping(0.2) as h1,
        flapping(0.2, serve=lambda port: RawH2Server(bind_port=port, after_s=0.0)) as h2,
    ):
        probers = {p.name: h2_client.build(p) for p in paths}
        sink = Sink()
        engine = Engine(paths, probers, sink)
        async with LoopLateness() as late, running(
                engine, [_ep("h1", h1.port), _ep("raw", h2.port)]):
            await asyncio.sleep(2.5)
            drained_s = await drain(engine)
        for prober in probers.values():
            await prober.aclose()
        assert h1.closed >= 4 and h2.closed >= 4

    by_path = sink.by_path()
    for name, refusal in (("h1", Outcome.CONNECT_REFUSED), ("h2", Outcome.CONNECT_REFUSED),
                          ("grpc", "grpc_UNAVAILABLE")):
        counts = by_path[name]
        # gRPC's reconnect backoff (100 ms to 1 s) also fails calls while the server is up
        # again; the other two see about half and half.
        assert_flapping(sink, name, refusal, min(h1.closed, h2.closed))
        assert sum(counts.values()) >= FLAP_RATE * 2.5 - 2, (name, counts)
    if h2_client.name == "httpcore":
        assert sum(r.outcome.churn for r in sink.results if r.path == "h2") >= 1
    assert drained_s < TIMEOUT_S + late.max_s + 0.5, (drained_s, late.max_s)
