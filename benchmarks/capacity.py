"""Capacity: one `skewprobe run` probing N fleet endpoints at 1 call/s each, on one core.

The product's goal is 2,400 endpoints × 1 call/s on one core. This runs the real product:
the local fleet (`python -m targets.fleet --no-grpc`) in one process pinned to one core,
`skewprobe run` with a generated config (file targets = the fleet's endpoints file) pinned
to the other, and reads everything from outside the probe:

- achieved / intended rate: `skewprobe_requests_total` (all outcomes) counted between two
  scrapes of `/metrics` taken after a warm-up, over N × rate × the time between them;
- schedule lag p50/p99: the probe's own `skewprobe_schedule_lag_seconds` histogram (every
  call, not a sample), as the difference of the two scrapes. Its buckets are coarse
  (…, 1, 2.5, 5, 10, 25 ms), so the table gives PromQL-style interpolation *and* the
  bucket the quantile lies in, plus the share of calls sent within the 10 ms budget.
  The store's `lag_max_s` per window is shown too (worst single call);
- latency p50/p99: the store's log-linear histograms (≤ 1 % error) of the 10 s windows
  that lie wholly inside the measured interval (from the intended send time, as reported);
- probe CPU seconds per 1,000 calls: utime + stime from /proc/<pid>/stat over the interval;
- peak RSS: VmHWM of the probe at the end of the run (start-up included);
- the fleet's CPU share, the CPU of every other process and of interrupts (loopback TCP
  runs partly in softirq, charged to no process) and steal, over the interval: other work on
  a 2-core machine shifts the figures, so each run shows it, with the load average;
- how long the /metrics scrapes took (the API shares the engine's event loop: a slow scrape
  means a stalled loop).

`--streams K` also holds K gRPC streams per endpoint (a `Subscribe` path, one message every
`--message-interval` s); `--target haproxy` answers the unary calls from one HAProxy on the
fleet's core (the streams stay on the fleet), so a slow machine's Python fleet is not what
limits the run. Each run prints the machine's speed on a fixed loop.

`--relay --target haproxy` probes each pod through a relay path instead (HAProxy answers
`GET /relay/bench` as a relay pod would): the relay prober's capacity, against a direct run
of the same pods and rate (issue 33: 50 relay pods at 20 calls/s each).

`--window 1s` gives a per-second series of the store's lag_max (in the JSON), which shows
periodic stalls; `--profile FILE` samples the probe with py-spy; `--gc-log FILE` logs its
garbage collections and a census of what they walk (`_gclog.py`); `--gc-experiment` runs the
same product with other gc settings (an experiment for the lead, labelled as such).

    .venv/bin/python benchmarks/capacity.py                          # 600 endpoints, 60 s
    .venv/bin/python benchmarks/capacity.py --pods 2400 --duration 20
    .venv/bin/python benchmarks/capacity.py --pods 2400 --streams 1 --duration 600
    .venv/bin/python benchmarks/capacity.py --http 2 --repeat 3 --duration 20
    .venv/bin/python benchmarks/capacity.py --pods 600 --duration 20 --profile /tmp/probe.txt
    .venv/bin/python benchmarks/capacity.py --target haproxy --pods 50 --rate 20 --relay
    .venv/bin/python benchmarks/capacity.py --quick                  # for run_all.py
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h
import _health_server as health_server

from probes.measure.histogram import Histogram
from probes.store import Store
from targets.proto import target_pb2

SUBSCRIBE = "/skewprobe.target.v1.Target/Subscribe"
LAG = "skewprobe_schedule_lag_seconds"
GC_PAUSE = "skewprobe_gc_pause_seconds"
BUDGET_S = 0.010


def _config(endpoints_file: Path, args: argparse.Namespace) -> str:
    version = '"2"' if args.http == "2" else '"1.1"'
    call = (
        "    grpc: {health: \"\"}\n    port: grpc\n" if args.grpc
        else f"    relay: {{destination: bench, version: {version}}}\n" if args.relay
        else f"    http: {{method: GET, path: /api/capacity, version: {version}}}\n"
    )
    text = (
        f"targets:\n  file: {{path: {endpoints_file}}}\n"
        f"window: {args.window}\n"
        f"probe: {{max_in_flight: {max(1000, args.pods * 2)}}}\n"
        "paths:\n"
        "  - name: capacity\n"
        f"{call}"
        f"    rate: {args.rate:g}/s\n"
        f"    timeout: {args.timeout}\n"
    )
    if args.streams:
        # The same held streams as benchmarks/streams.py, beside the unary path.
        request = target_pb2.SubscribeRequest(interval_ms=round(args.message_interval * 1000))
        text += (
            "  - name: feed\n"
            f"    stream: {{method: {SUBSCRIBE}, "
            f"request: {base64.b64encode(request.SerializeToString()).decode()}, "
            f"per_endpoint: {args.streams}}}\n"
            "    port: grpc\n"
            "    timeout: 5s\n"
        )
    return text


# An experiment, not the product as shipped: the same `skewprobe run`, with gc.freeze() once
# the warm-up has opened every connection, and larger collection thresholds, to show how much
# of the schedule lag is garbage-collection pauses (see --gc-experiment).
_GC_LAUNCHER = """
import gc, sys, threading
gc.set_threshold({t0}, {t1}, {t2})
threading.Timer({freeze_after}, gc.freeze).start()
from probes.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _probe_launcher(args: argparse.Namespace) -> list[str]:
    if args.client:
        if args.gc_log or args.gc_experiment:
            raise SystemExit("--client cannot be combined with --gc-log or --gc-experiment")
        h2 = args.client if not args.grpc else "lean"
        grpc = args.client if args.grpc else "lean"
        # The same `skewprobe run` with a library reference in place of the probe's own
        # client (tests/reference/).
        return [h.PYTHON, "-m", "tests.reference", "--http2", h2, "--grpc", grpc]
    if args.gc_log:
        # The product unchanged, with a gc.callbacks hook (benchmarks/_gclog.py) that logs
        # every collection after the warm-up's freeze.
        gclog = Path(__file__).with_name("_gclog.py")
        extra = "young" if args.gc_young_census else "heap" if args.heap_census else "-"
        return [h.PYTHON, str(gclog), args.gc_log, str(args.gc_census), extra, "--"]
    if not args.gc_experiment:
        return h.skewprobe_cmd()
    t0, t1, t2 = (int(x) for x in args.gc_experiment.split(","))
    code = _GC_LAUNCHER.format(t0=t0, t1=t1, t2=t2, freeze_after=max(1.0, args.warmup - 1.0))
    return [h.PYTHON, "-c", code]


def _niced(args: argparse.Namespace, cmd: list[str]) -> list[str]:
    # On a machine shared with other work, a higher priority for the two measured processes
    # keeps the row about the probe rather than about the neighbours (needs privileges).
    return ["nice", "-n", str(args.nice), *cmd] if args.nice else cmd


def run_once(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    endpoints = work / "endpoints.json"
    # What the probe reads: the fleet's own file, or (--target haproxy) the same pods with
    # their HTTP address on HAProxy and their gRPC port on the fleet.
    probe_endpoints = work / "probe-endpoints.json" if args.target == "haproxy" else endpoints
    store = work / "capacity.db"
    config = work / "capacity.yaml"
    config.write_text(_config(probe_endpoints, args), encoding="utf-8")
    listen_port = h.free_port()
    metrics_url = f"http://127.0.0.1:{listen_port}/metrics"
    with h.children() as kids:
        fleet_cmd = [
            h.PYTHON, "-m", "targets.fleet", "--pods", str(args.pods), "--from", "1.20.3",
            *([] if args.streams or (args.grpc and args.target == "fleet") else ["--no-grpc"]),
            "--endpoints-file", str(endpoints), "--base-host", args.base_host,
            "--http-port", "0", "--quiet", "--drain", "0", "--drain-notice", "0",
        ]
        fleet = h.Child("fleet", _niced(args, h.pinned(args.fleet_core, fleet_cmd)),
                        log=work / "fleet.err")
        kids.append(fleet)
        t0 = time.monotonic()
        fleet.wait_line(r"^fleet: ", timeout_s=max(60.0, args.pods / 10))
        fleet_start_s = time.monotonic() - t0
        haproxy = None
        if args.target == "haproxy":
            haproxy = _haproxy_target(args, work, endpoints, probe_endpoints)
            kids.append(haproxy)
            if args.grpc:
                kids.append(_grpc_target(args, work, probe_endpoints))
                haproxy = kids[-1]  # the callee of this run's calls
        probe_cmd = [
            *_probe_launcher(args), "run", "--config", str(config), "--store", str(store),
            "--listen", f"127.0.0.1:{listen_port}",
            # A backstop only: the run is ended by SIGTERM after the last scrape.
            "--duration", f"{int(args.warmup + args.duration + 120)}s",
        ]
        probe = h.Child("probe", _niced(args, h.pinned(args.probe_core, probe_cmd)),
                        log=work / "probe.err")
        kids.append(probe)
        t0 = time.monotonic()
        h.wait_http(f"http://127.0.0.1:{listen_port}/healthz", f"probing {args.pods} endpoints",
                    timeout_s=120.0)
        if args.streams:
            h.wait_streams(metrics_url, args.pods * args.streams, timeout_s=300.0)
        probe_start_s = time.monotonic() - t0
        time.sleep(args.warmup)
        pids = [probe.pid, fleet.pid, *([haproxy.pid] if haproxy else [])]
        a = h.snapshot(pids, metrics_url)
        rss_a = h.memory_kib(probe.pid).get("VmRSS", 0)
        if args.profile:
            # Sampled from the fleet's core so the sampler does not take the probe's CPU.
            h.profile(probe.pid, args.duration, Path(args.profile), core=args.fleet_core)
        else:
            time.sleep(args.duration)
        b = h.snapshot(pids, metrics_url)
        mem = h.memory_kib(probe.pid)
        probe_cpu_total = h.cpu_seconds(probe.pid)
        probe_rc = probe.stop(timeout_s=30.0)
        probe_lifetime_s = time.monotonic() - t0
        fleet.stop(timeout_s=30.0)
        if haproxy is not None:
            haproxy.stop(timeout_s=30.0)
    if probe_rc != 0:
        err = (work / "probe.err").read_text()[-2000:]
        raise RuntimeError(f"skewprobe run exited {probe_rc}: {err}")
    figures = _figures(args, a, b, mem, probe, fleet, store, probe_cpu_total,
                       fleet_start_s, probe_start_s, haproxy)
    # The store after the probe closed it (WAL merged): its growth per hour of probing.
    store_bytes = store.stat().st_size
    figures.update({
        "rss_at_first_scrape_mib": rss_a / 1024,
        "store_mib": store_bytes / 2**20,
        "store_mib_per_hour": store_bytes / 2**20 / probe_lifetime_s * 3600,
        "overloaded_at_end": h.gauge(b.metrics, "skewprobe_probe_overloaded"),
    })
    return figures


def _haproxy_target(
    args: argparse.Namespace, work: Path, endpoints: Path, probe_endpoints: Path
) -> h.Child:
    """One HAProxy answering 200 on every pod's address (port `--haproxy-port`), pinned to
    the fleet's core: a callee that costs next to nothing per call, so the run measures the
    probe, not the Python fleet (which cannot serve 2,400 calls/s on one core of a slow
    machine). The pods' gRPC ports stay on the fleet, for the held streams."""
    binary = shutil.which("haproxy")
    if binary is None:
        raise RuntimeError("--target haproxy: haproxy is not installed")
    doc = json.loads(endpoints.read_text(encoding="utf-8"))
    port = args.haproxy_port
    binds = []
    for e in doc["endpoints"]:
        host = e["address"].rpartition(":")[0]
        binds.append(f"    bind {host}:{port}")
        e["address"] = f"{host}:{port}"
        e["ports"] = {k: v for k, v in (e.get("ports") or {}).items() if k == "grpc"}
    probe_endpoints.write_text(json.dumps(doc), encoding="utf-8")
    cfg = work / "haproxy.cfg"
    cfg.write_text(
        "global\n    maxconn 8000\n    nbthread 1\n"
        "defaults\n    mode http\n    timeout client 60s\n    timeout server 60s\n"
        "    timeout connect 5s\n    timeout http-keep-alive 60s\n"
        "frontend pods\n" + "\n".join(binds) + "\n" + h.haproxy_relay_rule()
        + '    http-request return status 200 content-type text/plain string "ok\\n"\n',
        encoding="utf-8",
    )
    child = h.Child("haproxy", h.pinned(args.fleet_core, [binary, "-db", "-f", str(cfg)]),
                    log=work / "haproxy.err")
    # Ready once the last pod's address answers (a bounded poll of an outside process).
    h.wait_http(f"http://{doc['endpoints'][-1]['address']}/", "ok", timeout_s=60.0)
    return child


def _grpc_target(args: argparse.Namespace, work: Path, probe_endpoints: Path) -> h.Child:
    """`--grpc --target haproxy`: one grpc.aio server with the standard health service on
    every pod's address (port `--haproxy-port` + 1), pinned to the fleet's core, in place
    of the fleet's per-pod gRPC servers (HAProxy cannot answer gRPC itself: no trailers)."""
    doc = json.loads(probe_endpoints.read_text(encoding="utf-8"))
    port = args.haproxy_port + 1
    hosts = [e["address"].rpartition(":")[0] for e in doc["endpoints"]]
    for e in doc["endpoints"]:
        e["ports"] = {"grpc": port}
    probe_endpoints.write_text(json.dumps(doc), encoding="utf-8")
    return health_server.start(hosts, port, core=args.fleet_core, log=work / "grpc.err",
                               timeout_s=120.0)


def _figures(
    args: argparse.Namespace, a: h.Snapshot, b: h.Snapshot, mem: dict[str, int],
    probe: h.Child, fleet: h.Child, store: Path, probe_cpu_total: float,
    fleet_start_s: float, probe_start_s: float, haproxy: h.Child | None = None,
) -> dict[str, Any]:
    wall = b.mono - a.mono
    outcomes_a = h.counter_by(a.metrics, "skewprobe_requests", "outcome")
    outcomes_b = h.counter_by(b.metrics, "skewprobe_requests", "outcome")
    outcomes = {k: int(v - outcomes_a.get(k, 0.0)) for k, v in outcomes_b.items()}
    outcomes = {k: v for k, v in outcomes.items() if v}
    calls = sum(outcomes.values())
    dropped_a = h.counter_by(a.metrics, "skewprobe_calls_dropped", "reason")
    dropped_b = h.counter_by(b.metrics, "skewprobe_calls_dropped", "reason")
    dropped = {k: int(v - dropped_a.get(k, 0.0)) for k, v in dropped_b.items()}
    dropped = {k: v for k, v in dropped.items() if v}
    lag = h.bucket_delta(h.buckets(a.metrics, LAG), h.buckets(b.metrics, LAG))
    probe_cpu = b.cpu[probe.pid] - a.cpu[probe.pid]
    fleet_cpu = b.cpu[fleet.pid] - a.cpu[fleet.pid]
    if haproxy is not None:  # the callee side is both: HAProxy answers HTTP, the fleet gRPC
        fleet_cpu += b.cpu[haproxy.pid] - a.cpu[haproxy.pid]
    sys_delta = {k: b.system[k] - a.system[k] for k in b.system}
    # Kernel time in interrupts (loopback TCP runs in softirq) is often charged to no process.
    others_cpu = sys_delta["busy"] - sys_delta["irq"] - sys_delta["softirq"] - probe_cpu - fleet_cpu
    intended = args.pods * args.rate * wall
    resets_a = h.counter_by(a.metrics, "skewprobe_stream_resets", "reason")
    resets_b = h.counter_by(b.metrics, "skewprobe_stream_resets", "reason")
    lat, lag_max = _store_latency(store, a.wall, b.wall)
    # The probe's own collector pauses over the interval (skewprobe_gc_pause_seconds).
    gc_n = {g: n - h.by_label(a.metrics, GC_PAUSE + "_count", "generation").get(g, 0.0)
            for g, n in h.by_label(b.metrics, GC_PAUSE + "_count", "generation").items()}
    gc_s = {g: t - h.by_label(a.metrics, GC_PAUSE + "_sum", "generation").get(g, 0.0)
            for g, t in h.by_label(b.metrics, GC_PAUSE + "_sum", "generation").items()}
    return {
        "pods": args.pods,
        "http": "grpc" if args.grpc else f"relay {args.http}" if args.relay else args.http,
        "client": args.client or "default", "rate_per_endpoint": args.rate,
        "target": args.target, "machine_speed_s": args.machine_speed_s,
        "streams_wanted": args.pods * args.streams,
        "streams_open_first_last": [h.gauge_sum(a.metrics, "skewprobe_streams_open"),
                                    h.gauge_sum(b.metrics, "skewprobe_streams_open")],
        "stream_resets": int(sum(resets_b.values()) - sum(resets_a.values())),
        "interval_s": round(wall, 2),
        "intended_calls": round(intended), "calls": calls,
        "achieved_ratio": calls / intended if intended else float("nan"),
        "outcomes": outcomes, "dropped": dropped,
        "lag_p50": h.bucket_quantile(lag, 0.50), "lag_p99": h.bucket_quantile(lag, 0.99),
        "lag_within_10ms": h.fraction_at_most(lag, BUDGET_S),
        "lag_max_store_s": max(lag_max, default=float("nan")),
        "lag_max_per_window_ms": [round(x * 1000, 2) for x in lag_max],
        "latency_p50_s": lat[0], "latency_p99_s": lat[1], "latency_windows": lat[2],
        "probe_cpu_s": probe_cpu, "probe_core_share": probe_cpu / wall,
        "cpu_s_per_1000_calls": 1000 * probe_cpu / calls if calls else float("nan"),
        "probe_cpu_total_s": probe_cpu_total,
        "peak_rss_mib": mem.get("VmHWM", 0) / 1024, "rss_end_mib": mem.get("VmRSS", 0) / 1024,
        "gc_collections": gc_n, "gc_pause_s": gc_s,
        "fleet_core_share": fleet_cpu / wall,
        "irq_softirq_share": (sys_delta["irq"] + sys_delta["softirq"]) / wall,
        "steal_share": sys_delta["steal"] / wall, "others_cpu_share": others_cpu / wall,
        "scrape_s": round(max(a.scrape_s, b.scrape_s), 3),
        "load_before": a.load, "load_after": b.load,
        "fleet_start_s": round(fleet_start_s, 1), "probe_ready_s": round(probe_start_s, 1),
    }


def _store_latency(
    store: Path, since: float, until: float
) -> tuple[tuple[float, float, int], list[float]]:
    """Pooled p50/p99 of windows lying wholly in [since, until], and each one's max lag."""
    with Store.open(store, readonly=True) as s:
        windows = [w for w in s.read_windows() if w.start >= since and w.start + w.length <= until]
    if not windows:
        return (float("nan"), float("nan"), 0), []
    pooled = Histogram()
    for w in windows:
        pooled += Histogram.from_window(w.latency)
    p50, p99 = pooled.quantiles((0.5, 0.99))
    return (float(p50), float(p99), len(windows)), [w.lag_max_s for w in windows]


def _ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def _lag(q: tuple[float, float, float]) -> str:
    est, lo, hi = q
    return f"{est * 1000:.2f} ({lo * 1000:g}–{hi * 1000:g}]"


def _gc(r: dict[str, Any]) -> str:
    n, s = r["gc_collections"], r["gc_pause_s"]
    return " / ".join(f"{n.get(g, 0):.0f}, {s.get(g, 0.0):.2f}" for g in ("0", "1", "2"))


def report(runs: list[dict[str, Any]]) -> str:
    header = [
        "run", "endpoints", "target", "HTTP", "streams held (first → last scrape)", "stream resets",
        "interval s", "achieved/intended", "outcomes", "dropped",
        "lag p50 ms (bucket]", "lag p99 ms (bucket]", "lag ≤10 ms", "lag max ms (store)",
        "latency p50/p99 ms (store)", "probe CPU s/1k calls", "probe core share",
        "peak RSS MiB", "RSS first → last scrape MiB", "store MiB per hour",
        "gc: collections, pause s (young / middle / full)",
        "overloaded at end", "fleet core share", "other processes (cores)",
        "irq+softirq (cores)", "steal (cores)", "/metrics scrape s",
        "loadavg before → after",
    ]
    rows = []
    for i, r in enumerate(runs, 1):
        rows.append([
            i, r["pods"], r["target"], f"{r['http']} ({r.get('client', 'default')})",
            "{:,.0f} → {:,.0f}".format(*r["streams_open_first_last"]), r["stream_resets"],
            r["interval_s"], f"{r['achieved_ratio']:.4f}",
            ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items())) or "none",
            ", ".join(f"{k} {v}" for k, v in sorted(r["dropped"].items())) or "0",
            _lag(r["lag_p50"]), _lag(r["lag_p99"]), f"{r['lag_within_10ms']:.2%}",
            _ms(r["lag_max_store_s"]),
            f"{_ms(r['latency_p50_s'])} / {_ms(r['latency_p99_s'])}",
            f"{r['cpu_s_per_1000_calls']:.3f}", f"{r['probe_core_share']:.2f}",
            f"{r['peak_rss_mib']:.0f}",
            f"{r['rss_at_first_scrape_mib']:.0f} → {r['rss_end_mib']:.0f}",
            f"{r['store_mib_per_hour']:.0f}", _gc(r),
            f"{r['overloaded_at_end']:g}",
            f"{r['fleet_core_share']:.2f}",
            f"{r['others_cpu_share']:.2f}", f"{r['irq_softirq_share']:.2f}",
            f"{r['steal_share']:.2f}", f"{r['scrape_s']:.2f}",
            f"{r['load_before']} → {r['load_after']}",
        ])
    out = [h.md_table(header, rows)]
    per_k = [r["cpu_s_per_1000_calls"] for r in runs]
    med = statistics.median(per_k)
    goal = 2400.0
    out.append(
        f"\nmedian probe CPU {med:.3f} s per 1,000 calls → {1000 / med:,.0f} calls per "
        f"CPU-second; the goal ({goal:,.0f} endpoints × 1 call/s) needs "
        f"{goal * med / 1000:.2f} cores at this cost ({goal * med / 1000:.1f}× one core)."
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=600, help="fleet endpoints (default 600)")
    ap.add_argument("--duration", type=float, default=60.0, help="measured seconds (60)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring (5)")
    ap.add_argument("--rate", type=float, default=1.0, help="calls/s per endpoint (1)")
    ap.add_argument("--http", choices=("1.1", "2"), default="1.1", help="HTTP version")
    ap.add_argument("--grpc", action="store_true",
                    help="the unary path is a gRPC health Check on the pods' gRPC ports (with "
                         "--target haproxy: one grpc.aio health server on every pod address)")
    ap.add_argument("--client", choices=("lean", "httpcore", "grpcio"),
                    help="the HTTP/2 (--http 2) or gRPC (--grpc) client, if not the default:"
                         " a library reference (tests/reference/)")
    ap.add_argument("--target", choices=("fleet", "haproxy"), default="fleet",
                    help="what answers the HTTP calls: the Python fleet (default) or one "
                         "HAProxy returning 200 on every pod's address (streams stay on "
                         "the fleet)")
    ap.add_argument("--haproxy-port", type=int, default=18080)
    ap.add_argument("--relay", action="store_true",
                    help="a relay path (`GET /relay/bench`, --http's version) instead of a"
                    " direct one; HAProxy answers as a relay pod (needs --target haproxy)")
    ap.add_argument("--streams", type=int, default=0, metavar="K",
                    help="also hold K gRPC streams per endpoint (default 0)")
    ap.add_argument("--message-interval", type=float, default=1.0,
                    help="seconds between a held stream's messages (1)")
    ap.add_argument("--timeout", default="1s", help="the path's timeout (1s)")
    ap.add_argument("--window", default="10s",
                    help="the probe's window (10s); 1s gives a per-second lag_max series")
    ap.add_argument("--repeat", type=int, default=1, help="independent runs (fresh processes)")
    ap.add_argument("--probe-core", type=int, default=0)
    ap.add_argument("--fleet-core", type=int, default=1)
    ap.add_argument("--base-host", default="127.77.0.1", help="address of fleet pod 0")
    ap.add_argument("--nice", type=int, default=0,
                    help="run the fleet and the probe at this nice value (e.g. -10 on a machine"
                         " shared with other work; negative values need privileges)")
    ap.add_argument("--json", help="also write the figures as JSON here")
    ap.add_argument("--gc-experiment", metavar="T0,T1,T2",
                    help="experiment, not the shipped product: run the probe with these"
                         " gc thresholds and gc.freeze() after the warm-up")
    ap.add_argument("--gc-log", metavar="FILE",
                    help="log the probe's garbage collections (generation, pause) to FILE as"
                         " JSON: the product unchanged plus a gc.callbacks hook")
    ap.add_argument("--gc-census", type=int, default=2, metavar="N",
                    help="with --gc-log: count the old generation's objects by type at the"
                         " start of the N-th full collection after the freeze (2)")
    ap.add_argument("--gc-young-census", action="store_true",
                    help="with --gc-log: also list what each young collection walks, by type"
                         " (costly: for finding what fills the young generation)")
    ap.add_argument("--heap-census", action="store_true",
                    help="with --gc-log: count the whole Python heap by type and size once,"
                         " ~60 s after the freeze (stops the probe for seconds, once)")
    ap.add_argument("--profile", metavar="FILE",
                    help="sample the probe with py-spy over the measured interval; write its"
                         " collapsed stacks to FILE and print the top costs (the sampler"
                         " perturbs the figures a little: quote CPU figures from plain runs)")
    ap.add_argument("--quick", action="store_true",
                    help="a short run for run_all.py: 300 endpoints, 15 s")
    args = ap.parse_args(argv)
    if args.quick:
        args.pods, args.duration, args.warmup = 300, 15.0, 3.0
    if args.relay and (args.grpc or args.target != "haproxy"):
        ap.error("--relay needs --target haproxy and no --grpc")
    args.machine_speed_s = h.machine_speed_s()
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="skewprobe-capacity-") as tmp:
            runs.append(run_once(args, Path(tmp)))
    cmd = " ".join(["benchmarks/capacity.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"## capacity: {cmd}\n")
    print(report(runs))
    print(f"\nmachine speed: {args.machine_speed_s:.3f} s for the reference loop "
          "(benchmarks/_harness.py machine_speed_s; lower is faster)")
    if args.profile:
        print(f"\n### py-spy profile of the probe ({args.profile})\n")
        print(h.profile_summary(Path(args.profile)))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2), encoding="utf-8")
    failed = any(set(r["outcomes"]) - {"ok"} for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
