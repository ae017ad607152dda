"""Streams end to end: the engine holds streams on a real fleet found through its endpoints
file, the recorder feeds windows, metrics and the storm detector, and a batch restart gives
exactly the resets it caused and a storm event in the store."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry

from probes.clients import EndReason, StreamPolicy, StreamProber
from probes.discovery import FileSource
from probes.measure.window import WindowAggregator
from probes.metrics import ProbeMetrics
from probes.run.engine import Engine
from probes.spec import PathSpec, StreamSpec
from probes.store import Store
from probes.streams import STORM_EVENT, StormDetector, StormParams, StreamRecorder
from probes.types import CallResult, Endpoint
from targets.fleet import Fleet
from targets.profile import parse_profiles
from targets.proto import target_pb2
from targets.server import TargetServer

SUBSCRIBE = "/skewprobe.target.v1.Target/Subscribe"
POLICY = StreamPolicy(initial_backoff_s=0.02, max_backoff_s=0.5, open_spread_s=0.0,
                      linger_s=10.0)


def stream_path(per_endpoint: int, *, port: str | None = None, msd: bool = False) -> PathSpec:
    request = target_pb2.SubscribeRequest(interval_ms=100).SerializeToString()
    return PathSpec("feed", 1.0, 1.0, port=port, stream=StreamSpec(
        method=SUBSCRIBE, request=request, per_endpoint=per_endpoint))


class NoCalls:
    """The engine's unary sink; a stream-only engine never records a call."""

    def record(self, result: CallResult, endpoint: Endpoint) -> None:
        raise AssertionError("no unary calls on a stream path")

    def dropped(self, path: str, reason: str, count: int = 1) -> None:
        raise AssertionError(f"dropped {count} ({reason})")


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


class Watch:
    """Wakes a waiter on every stream report (wraps the recorder; no polling)."""

    def __init__(self, recorder: StreamRecorder) -> None:
        self.recorder = recorder
        self._waiters: list[asyncio.Future[None]] = []

    def __getattr__(self, name: str) -> object:
        method = getattr(self.recorder, name)

        def call(*args: object) -> object:
            out = method(*args)
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._waiters.clear()
            return out

        return call

    async def until(self, predicate: object, within: float = 10.0) -> None:
        assert callable(predicate)
        async with asyncio.timeout(within):
            while not predicate():
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter


async def test_recorder_feeds_windows_and_metrics_from_real_streams():
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    aggregator = WindowAggregator(length_s=1.0, grace_s=0.0)
    recorder = StreamRecorder(aggregator, metrics)
    watch = Watch(recorder)
    path = stream_path(3)
    profile = parse_profiles(
        f'versions: {{"1.21.0": {{routes: {{"{SUBSCRIBE}": {{max_stream_duration: 700ms}}}}}}}}'
    ).profile("1.21.0")
    prober = StreamProber([path], watch, policy=POLICY)  # type: ignore[arg-type]
    labels = {"proxy_version": "1.21.0"}
    async with TargetServer(profile, pod="pod-0") as server:
        assert server.grpc_port is not None
        endpoint = Endpoint("pod-0", "127.0.0.1", server.grpc_port, labels=labels)
        hold = asyncio.create_task(prober.hold(path, endpoint, "1.21.0"))
        await watch.until(lambda: sum(recorder.ends.values()) >= 6)
        assert sample(registry, "skewprobe_streams_open", path="feed", cohort="1.21.0") <= 3
        prober.checkpoint()
        hold.cancel()
        await asyncio.gather(hold, return_exceptions=True)
        await prober.aclose()
    windows, endpoint_windows = aggregator.flush(time.time(), force=True)
    resets: Counter[str] = Counter()
    for w in windows:
        resets.update(w.stream_resets)
    seen = recorder.resets("feed")
    assert seen["grpc_INTERNAL"] >= 6 and set(seen) == {"grpc_INTERNAL"}
    # Every reset the server caused is in the windows, the metrics and the recorder alike.
    assert resets == seen
    assert sample(registry, "skewprobe_stream_resets_total", path="feed", cohort="1.21.0",
                  reason="grpc_INTERNAL") == seen["grpc_INTERNAL"]
    assert sample(registry, "skewprobe_streams_open", path="feed", cohort="1.21.0") == 0
    opened = sum(w.streams_opened for w in windows)
    assert opened == recorder.opened[("feed", "1.21.0")] >= 6
    assert sample(registry, "skewprobe_stream_lifetime_seconds_count", path="feed",
                  cohort="1.21.0") == opened  # every opened stream ended (resets + stopped)
    assert sample(registry, "skewprobe_stream_message_gap_seconds_count", path="feed",
                  cohort="1.21.0") > 0
    # Exposure: three streams held for the whole run, minus the re-open gaps.
    held = sum(w.stream_seconds for w in windows)
    assert held == sample(registry, "skewprobe_stream_seconds_total", path="feed",
                          cohort="1.21.0")
    assert held > 0
    assert sum(e.errors for e in endpoint_windows) == sum(seen.values())
    (report,) = recorder.lifetime_report(())
    assert report.cap.ended == sum(seen.values())  # probe-stopped streams are left out


async def test_a_batch_restart_during_held_streams_is_a_storm_with_every_reset_counted(
    tmp_path: Path,
):
    pods, per_pod, batch = 8, 2, [1, 3, 4, 6, 7]
    endpoints_file = tmp_path / "fleet.json"
    # A test cannot wait out an hour of quiet baseline, so the steady rate's bound is
    # loosened (confidence 0.5) and alpha raised; the logic is the one unit-tested in
    # test_streams_storm.py with the defaults.
    params = StormParams(bucket_s=1.0, confidence=0.5, alpha=1e-3)
    registry = CollectorRegistry()
    aggregator = WindowAggregator(length_s=5.0, grace_s=0.0, retain_s=600.0)
    recorder = StreamRecorder(aggregator, ProbeMetrics(registry),
                              storms=StormDetector(params))
    watch = Watch(recorder)
    path = stream_path(per_pod, port="grpc")
    prober = StreamProber([path], watch, policy=POLICY)  # type: ignore[arg-type]
    engine = Engine([path], {}, NoCalls(), streams=prober)
    fleet = Fleet(pods=pods, version="1.20.3", profiles=None, base_host="127.0.43.2",
                  endpoints_file=endpoints_file, notice_s=0.4, drain_s=0.2)
    old = ("feed", "1.20.3")
    async with fleet:
        source = FileSource(str(endpoints_file), refresh_s=0.05)
        engine_task = asyncio.create_task(engine.run(source.snapshots()))
        await watch.until(lambda: recorder.opened[old] == pods * per_pod)
        await asyncio.sleep(2.0)  # some quiet history for the steady rate
        # Five of eight pods restart together, as a rollout step without a max connection
        # duration: each leaves the endpoint list before it drains.
        await asyncio.gather(*(fleet.restart(i, "1.21.0") for i in batch))
        await watch.until(lambda: recorder.opened[("feed", "1.21.0")] == len(batch) * per_pod)
        await asyncio.sleep(params.bucket_s)  # let the storm's last bucket complete
        events = recorder.storm_events(time.time())
        # A later restart of one pod at a time is a steady trickle, not a storm.
        await fleet.restart(0, "1.21.0")
        await asyncio.sleep(params.bucket_s)
        later = recorder.storm_events(time.time())
        prober.checkpoint()
        # Stop probing before the fleet stops, or its final drain would cut every stream.
        engine_task.cancel()
        await asyncio.gather(engine_task, return_exceptions=True)
        await prober.aclose()
    restarted = {f"target-{i}" for i in batch}
    # Exactly the resets the fleet caused: K per drained pod, all goaway (the drain),
    # none lost to the endpoint leaving discovery first.
    assert recorder.resets() == {EndReason.GOAWAY: (len(batch) + 1) * per_pod}
    assert len(events) == 1 and later == []
    storm = events[0]
    assert storm.kind == STORM_EVENT and storm.path == "feed" and storm.cohort == "1.20.3"
    assert set(storm.detail["endpoints"]) == restarted
    assert storm.detail["resets"] == len(batch) * per_pod
    assert storm.detail["reasons"] == {EndReason.GOAWAY: len(batch) * per_pod}
    with Store.open(tmp_path / "probe.db") as store:
        store.write_events(events)
        stored = store.read_events(kinds=[STORM_EVENT])
    assert [(e.cohort, e.detail["endpoints_count"]) for e in stored] == [("1.20.3", 5)]
    windows, _ = aggregator.flush(time.time(), force=True)
    in_windows: Counter[str] = Counter()
    for w in windows:
        if w.cohort == "1.20.3":
            in_windows.update(w.stream_resets)
    assert in_windows == {EndReason.GOAWAY: (len(batch) + 1) * per_pod}
