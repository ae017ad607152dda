"""A reconnect storm from real HAProxy restarts: a real `ProbeRunner` holds streams through
HAProxy sidecars on every pod, five of eight pods restart at once (SIGUSR1 soft-stop, then
`hard-stop-after` cuts the streams still open, as a sidecar upgrade without a maximum
connection duration does), and the store gets one storm event naming exactly those pods,
with every stream the drains cut counted once."""

from __future__ import annotations

import asyncio
import base64
import random
from collections import Counter
from pathlib import Path

import pytest

from probes.store import Event, Store
from probes.streams import STORM_EVENT, StormDetector, StormParams
from targets.fleet import Fleet
from targets.haproxy import HaproxySidecars, default_versions_file
from targets.haproxy_config import load_haproxy_versions
from targets.proto import target_pb2
from tests.servers.haproxy_procs import kill_leftovers, needs_haproxy
from tests.servers.probe_run import probe_runner, running

pytestmark = [needs_haproxy, pytest.mark.slow]

OLD, NEW = "1.20.3", "1.21.0"
PODS, PER_POD, BATCH = 8, 2, (1, 2, 4, 5, 7)
SUBSCRIBE = "/skewprobe.target.v1.Target/Subscribe"
REQUEST = base64.b64encode(target_pb2.SubscribeRequest(interval_ms=100).SerializeToString())
CONFIG = """\
targets: {{file: {{path: {endpoints}}}}}
window: 1s
paths:
  - name: feed
    stream: {{method: {method}, request: {request}, per_endpoint: {per_pod}}}
    port: grpc
    timeout: 2s
"""

# The default StormParams judge a cluster against the steady reset rate of the last hour,
# bounded at 99 % confidence: with an hour of quiet streams five endpoints in one 5 s bucket
# are a storm by far (p ≈ 1e-13), but a test has seconds of history, after which that bound
# still expects a reset every few seconds. So the bound is taken at 50 % and the bucket is
# 2 s (the five drains end within milliseconds of each other; 2 s leaves room for HAProxy's
# own exit); alpha stays at its default. The detection logic itself is the one unit-tested
# with the defaults in tests/unit/test_streams_storm.py.
PARAMS = StormParams(bucket_s=2.0, confidence=0.5)


async def test_haproxy_restart_of_several_pods_during_held_streams_is_a_storm(
    tmp_path: Path,
) -> None:
    endpoints = tmp_path / "endpoints.json"
    haproxy_dir = tmp_path / "haproxy"
    store = str(tmp_path / "probe.db")
    config = CONFIG.format(endpoints=endpoints, method=SUBSCRIBE, request=REQUEST.decode(),
                           per_pod=PER_POD)
    window_done = asyncio.Event()
    runner = probe_runner(config, store, on_window=lambda _windows: window_done.set())
    runner.streams.storms = StormDetector(PARAMS)
    recorder = runner.streams
    old, new = ("feed", OLD), ("feed", NEW)

    async def windows_until(done: object, within: float, what: str) -> None:
        """Wake after each window the probe writes until `done()` holds (bounded)."""
        assert callable(done)
        try:
            async with asyncio.timeout(within):
                while not done():
                    await window_done.wait()
                    window_done.clear()
        except TimeoutError:
            pytest.fail(f"not within {within:g} s: {what} (opened {dict(recorder.opened)}, "
                        f"ends {dict(recorder.ends)})")

    def stored_storms() -> list[Event]:
        with Store.open(store, readonly=True) as s:
            return list(s.read_events(kinds=[STORM_EVENT]))

    # The example's versions: 1.20.3 drains for 5 s (hard_stop_after) and then cuts every
    # stream still open. The notice outlasts the file source's 1 s refresh, so the probe has
    # stopped re-opening on a pod before its HAProxy unbinds.
    versions = load_haproxy_versions(default_versions_file())
    try:
        async with HaproxySidecars(versions, workdir=haproxy_dir) as sidecars, Fleet(
            pods=PODS, version=OLD, sidecar=sidecars, endpoints_file=endpoints,
            base_host=f"127.{random.randint(64, 250)}.9.1", drain_s=1.0, notice_s=1.5,
        ) as fleet, running(runner, stop_within_s=15):
            await windows_until(lambda: recorder.opened[old] == PODS * PER_POD, 15,
                                "every stream open")
            await asyncio.sleep(1.0)  # a little quiet history for the steady rate
            assert sum(recorder.ends.values()) == 0
            await asyncio.gather(*(fleet.restart(i, NEW) for i in BATCH))
            await windows_until(lambda: recorder.opened[new] == len(BATCH) * PER_POD, 15,
                                "streams re-opened on the new pods")
            # The storm is written once its last bucket is complete.
            await windows_until(lambda: bool(stored_storms()), 10, "a storm event stored")
    finally:
        leftover = kill_leftovers(haproxy_dir)
    assert not leftover, "HAProxy processes outlived the fleet"

    restarted = {f"target-{i}" for i in BATCH}
    cut = len(BATCH) * PER_POD
    # Every stream on a restarted pod was cut by its drain, once; none elsewhere (the probe's
    # own shutdown ends the others as client_stopped, which is not a reset).
    resets = recorder.resets()
    assert sum(resets.values()) == cut, resets
    (event,) = stored_storms()
    assert event.kind == STORM_EVENT
    assert (event.path, event.cohort) == old
    detail = event.detail
    assert detail["endpoints_count"] == len(BATCH) and set(detail["endpoints"]) == restarted
    assert detail["resets"] == cut and sum(detail["reasons"].values()) == cut
    assert detail["reasons"] == dict(resets)
    # The five drains end together: the storm spans well under one bucket.
    assert detail["span_s"] < PARAMS.bucket_s
    # The windows in the store hold the same resets, all on the old cohort.
    with Store.open(store, readonly=True) as s:
        windows = [w for w in s.read_windows() if w.path == "feed"]
    in_windows: Counter[tuple[str, str]] = Counter()
    for w in windows:
        for reason, n in w.stream_resets.items():
            in_windows[(w.cohort, reason)] += n
    assert in_windows == {(OLD, reason): n for reason, n in resets.items()}
    assert runner.registry.get_sample_value(
        "skewprobe_stream_resets_total",
        {"path": "feed", "cohort": OLD, "reason": next(iter(resets))},
    ) == resets[next(iter(resets))]
