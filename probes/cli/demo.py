"""`skewprobe demo`: a rollout on the local fleet, probed end to end.

The fleet (`python -m targets.fleet`, its own process, so fleet work never shows as the
probe's schedule lag) serves 12 pods on 127.0.0.10.. at proxy version 1.20.3. After a few
seconds a staged rollout restarts half of them, one by one, to 1.21.0, whose fault profile
regresses one path (`/api/checkout`: +1 pp errors, every request retried once by the
sidecar) and leaves the others alone; then the rollout holds, as a staged rollout pauses for
its gate. The probe follows the fleet's endpoints file, probes every path on every pod,
prints live progress, and ends with the per-path, per-cohort table and the verdict.

Every pod is also a relay pod (`--relay`): the `relay-inventory` path asks each pod to call
the service's `/api/inventory` through its own outbound side, whose retries are its
version's (1.21.0 retries 503 twice), so the verdict and the report show the caller ×
callee pair matrix, and the new callers fail on attempts. With `--proxy haproxy` the
outbound side is a real HAProxy per caller version and the path is `relay-checkout`
(the app fails 10 % of `/api/checkout` on every version; 1.21.0's HAProxy retries them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from probes.config import parse_config
from probes.discovery.changes import RESTART
from probes.errors import BadInput, MachineBusy, SkewprobeError
from probes.inventory import CONTROL_PLANE_EVENT
from probes.measure.overload import OVERLOAD_EVENT
from probes.report.summary import format_figures, summarise
from probes.report.write import write_report
from probes.run import ProbeRunner, RunOptions
from probes.spec import Config
from probes.store import BOOKKEEPING_EVENTS, Event, Store
from probes.store.lock import WriterLock
from probes.types import split_pair
from probes.verdict.entry import Query, StoreSource, verdict
from probes.verdict.service import format_table

__all__ = [
    "run_demo",
]

BASELINE = "1.20.3"
CANARY = "1.21.0"
BASE_HOST = "127.0.0.10"
ROLLOUT_AFTER_S = 8.0
HOLD_S = 24.0
BATCH = 3

_CONFIG = """\
targets:
  file: {{path: {endpoints}}}
cohort: {{by: proxy_version}}
window: 5s
verdict: {{alpha: 0.01, min_samples: 100, warmup: 5s}}  # the demo's pods start warm
inventory: {{snapshot_every: 5s}}  # the report's pod shares follow a one-minute rollout
paths:
  - name: checkout
    http: {{method: GET, path: /api/checkout}}
    rate: 10/s
    timeout: 1s
  - name: catalog
    http: {{method: GET, path: /api/catalog, version: "2"}}
    rate: 10/s
    timeout: 1s
  - name: echo
    grpc: {{method: /skewprobe.target.v1.Target/Echo}}
    port: grpc
    rate: 5/s
    timeout: 1s
  - name: health
    grpc: {{health: ""}}
    port: grpc
    rate: 2/s
    timeout: 1s
  - name: feed
    stream:
      method: /skewprobe.target.v1.Target/Subscribe
      request: CPQD                  # SubscribeRequest(interval_ms=500)
      per_endpoint: 2
    port: grpc
    timeout: 2s
"""
# Through each pod's own outbound side: a pair matrix. Emulated sidecars: /api/inventory,
# which 1.21.0's outbound side retries on 503. HAProxy: /api/checkout, whose app fails 10 %
# of requests on every version, which 1.21.0's outbound HAProxy retries (equal success rate,
# more attempts from the new callers).
_RELAY_PATH = """\
  - name: relay-{route}
    relay: {{destination: {route}, callees: {{service: checkout}}}}
    rate: 3/s
    timeout: 1s
"""
_ALLOWLIST = """\
relay:
  timeout: 500ms
  destinations:
    {route}: {{http: {{url: "http://checkout.demo.svc:18080/api/{route}"}}, service: checkout}}
"""


def _profiles() -> Path:
    import targets

    return Path(targets.__file__).parent / "examples" / "profiles.yaml"


def _fresh_store(path: str) -> None:
    """The demo's store holds one demo run; an older run would mix into the verdict. Removed
    under the writer lock: a store another probe is writing is refused (StoreLocked, exit 4)
    before anything of it is removed or the fleet starts."""
    with WriterLock.acquire(path):
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + suffix)


def run_demo(
    *, pods: int, rollout_s: float, store: str, out: str, quiet: bool, proxy: str = "emulated"
) -> int:
    if pods < 2:
        raise BadInput("--pods must be at least 2 (one per cohort)")
    if pods > 200:
        raise BadInput("--pods above 200 is a benchmark, not a demo (see benchmarks/)")
    if proxy == "haproxy":
        from targets.haproxy_process import find_haproxy

        if find_haproxy() is None:
            raise BadInput("--proxy haproxy needs haproxy (apt-get install haproxy)")
    _fresh_store(store)
    with tempfile.TemporaryDirectory(prefix="skewprobe-demo-") as workdir:
        return asyncio.run(_demo(pods, rollout_s, store, out, Path(workdir), quiet, proxy))


async def _demo(
    pods: int, rollout_s: float, store: str, out: str, workdir: Path, quiet: bool, proxy: str
) -> int:
    endpoints = workdir / "endpoints.json"
    restarts = pods // 2
    # Pods restart in batches of BATCH, as a tier of a rollout does: held streams on a batch
    # are reset together, which is what a reconnect storm looks like.
    batches = max(1, restarts // BATCH)
    interval = rollout_s / batches
    duration = ROLLOUT_AFTER_S + rollout_s + HOLD_S
    route = "checkout" if proxy == "haproxy" else "inventory"
    text = _CONFIG.format(endpoints=endpoints) + _RELAY_PATH.format(route=route)
    config = parse_config(text, file="<demo config>")
    allowlist = workdir / "relay.yaml"
    allowlist.write_text(_ALLOWLIST.format(route=route))
    sidecar = (
        ["--sidecar", "haproxy"] if proxy == "haproxy" else ["--profiles", str(_profiles())]
    ) + ["--relay", str(allowlist)]
    fleet = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "targets.fleet",
        "--pods", str(pods), "--from", BASELINE, "--to", CANARY,
        "--rollout-after", f"{ROLLOUT_AFTER_S}s", "--interval", f"{interval:.3f}s",
        "--batch", str(BATCH), "--restarts", str(restarts), *sidecar,
        "--endpoints-file", str(endpoints), "--base-host", BASE_HOST,
        "--drain", "1s", "--drain-notice", "1.5s", "--seed", "7", "--quiet",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    regression = (
        "HAProxy 1.21.0 retries failed requests (retry volume)" if proxy == "haproxy"
        else "/api/checkout: +1 pp errors, every request retried"
    )
    print(f"demo: fleet of {pods} pods at {BASE_HOST}.. on {BASELINE} ({proxy} sidecars); "
          f"from t={ROLLOUT_AFTER_S:.0f}s {restarts} pods restart to {CANARY}, {BATCH} at a "
          f"time every {interval:.1f}s, then the rollout holds; canary regression: "
          f"{regression}; probing for {duration:.0f}s")
    runner = ProbeRunner(config, RunOptions(store_path=store, listen=None, duration_s=duration))
    progress = asyncio.create_task(_progress(runner, time.monotonic(), quiet))
    started = time.time()
    try:
        await runner.run()
        _record_control_plane(store, started)
    finally:
        progress.cancel()
        with contextlib.suppress(ProcessLookupError):
            fleet.terminate()
        _, fleet_err = await fleet.communicate()
    if fleet.returncode not in (0, -15):
        raise SkewprobeError(f"the fleet failed: {fleet_err.decode().strip()[-300:]}")
    # "Upgrading now would reset N streams older than…": the demo's streams are young.
    lifetimes = runner.streams.lifetime_report(runner.events.open_at_stop, threshold_s=30.0)
    return _finish(store, config, [r.summary for r in lifetimes], out, _busy(runner))


def _record_control_plane(store_path: str, at: float) -> None:
    """The fleet's emulated control plane runs its `--from` version (`targets.fleet`): a
    control-plane event as a probe with Kubernetes discovery records one, so `skewprobe plan
    --store` and `inventory --store` on the demo's store know it."""
    plane = {"version": BASELINE, "revision": "", "source": "the demo fleet's emulated mesh"}
    with Store.open(store_path) as store:
        store.write_events([Event(CONTROL_PLANE_EVENT, at, detail={"versions": [plane]})])


def _busy(runner: ProbeRunner) -> str:
    """How late the probe was, for when the machine was too busy to show the result."""
    r = runner.recorder
    late = f"{100 * r.lagged / r.calls:.0f} %" if r.calls else "all"
    skipped = f" and {r.dropped_total:,} calls were skipped" if r.dropped_total else ""
    return (f"{late} of sends were late (more than {runner.overload.budget_s * 1e3:g} ms "
            f"behind schedule){skipped}")


async def _progress(runner: ProbeRunner, started: float, quiet: bool) -> None:
    last_calls = 0
    last_by_cohort: Counter[str] = Counter()
    last_errors: Counter[str] = Counter()
    while True:
        await asyncio.sleep(5.0)
        if quiet or runner.engine is None:
            continue
        recorder = runner.recorder
        versions = Counter(e.labels.get("proxy_version", "?") for e in runner.engine.endpoints)
        streams = Counter(
            s.cohort for s in (runner.stream_prober.open_streams() if runner.stream_prober else ())
        )
        calls = Counter(recorder.calls_by_cohort)
        errors = Counter(recorder.errors_by_cohort)
        delta_calls = calls - last_by_cohort
        delta_errors = errors - last_errors
        # Per proxy version; the relay path's pair cohorts are the matrix's, at the end.
        per_cohort = "  ".join(
            f"{c}: {100 * delta_errors[c] / n:.1f}% errors" for c, n in sorted(delta_calls.items())
            if split_pair(c) is None
        )
        pods = " ".join(f"{v}={n}" for v, n in sorted(versions.items()))
        rate = (recorder.calls - last_calls) / 5.0
        held = " ".join(f"{c}={n}" for c, n in sorted(streams.items())) or "-"
        print(f"t={time.monotonic() - started:4.0f}s  pods {pods:<24} {rate:6.0f} calls/s  "
              f"streams {held:<20} {per_cohort}", flush=True)
        last_calls, last_by_cohort, last_errors = recorder.calls, calls, errors


def _finish(store_path: str, config: Config, lifetimes: list[str], out: str,
            busy: str) -> int:
    store = Store.open(store_path, readonly=True)
    try:
        windows = store.read_windows()
        events = store.read_events()
    finally:
        store.close()
    print()
    print("per path and cohort (pooled over the run):")
    print(format_figures(summarise(windows)))
    for line in lifetimes:
        print(f"stream lifetimes: {line}")
    restarts = [e for e in events if e.kind == RESTART]
    if restarts:
        print(f"restarts seen through discovery: {len(restarts)} "
              f"({', '.join(sorted(e.endpoint for e in restarts))})")
    for event in events:
        if event.kind in (RESTART, CONTROL_PLANE_EVENT) or event.kind in BOOKKEEPING_EVENTS:
            continue
        stamp = time.strftime("%H:%M:%S", time.localtime(event.at))
        print(f"event {stamp} {event.kind} {event.path} cohort {event.cohort}: "
              f"{dict(event.detail)}")
    # The probe has stopped: judge the windows it wrote, leaving out any it wrote overloaded.
    judged = verdict(Query(now=time.time()), config.judging,
                     StoreSource(store_path, overload=None))
    result = judged.to_json()
    print()
    print(f"verdict, {result['canary']} (canary) against {result['baseline']} (baseline)"
          + ("; relay paths as caller × callee pairs" if judged.matrices else "") + ":")
    print(judged.format(format_table))
    span = Store.open(store_path, readonly=True)
    try:
        first_last = span.time_range()
    finally:
        span.close()
    if first_last is not None:
        files = write_report(store_path, out, since=first_last[0], until=first_last[1],
                             settings=config.judging)
        print()
        print(f"report: {files.html}  (and report.md, report.json beside it)")
    print(f"store: {store_path}  (skewprobe verdict --store {store_path} --json)")
    overloaded = any(e.kind == OVERLOAD_EVENT and e.detail.get("reason") for e in events)
    if overloaded and judged.verdict != "fail":
        # The promised failing path did not show on a probe that was overloaded: say so as
        # the run's one error line, with its own exit code (README).
        raise MachineBusy(f"this machine is too busy: {busy}, and the demo's regression did "
                          "not show; rerun on a quieter machine")
    return 0
