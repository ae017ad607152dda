"""Streams: one `skewprobe run` holding N long-lived gRPC streams for D seconds while the fleet
restarts a known number of pods; memory, CPU, and every reset the fleet caused counted.

The product claim (issue 4): 2,000 concurrent streams held by one probe process for ten
minutes, with the probe's reset count equal to the resets the fleet caused, exactly. This
runs the real product, as `capacity.py` does: the local fleet (`python -m targets.fleet`,
emulated sidecars, or `--sidecar haproxy`) in one process pinned to one core, `skewprobe
run` with a stream path (`Subscribe`, `per_endpoint` streams on every pod) pinned to the
other, everything read from outside the probe:

- the fleet restarts `--restarts` pods (a rollout to the next version, `--batch` at a time,
  a batch every `--interval`, starting `--rollout-after` after the fleet is up). Each
  restart drains the pod (notice, then GOAWAY, then the streams still open are cut), so it
  cuts exactly the `per_endpoint` streams the probe holds on that pod: the resets the fleet
  causes are restarts × per_endpoint. The fleet's own event lines (restart_finished) give
  the restarts it made; the benchmark checks that every stream was open (the probe's
  `skewprobe_streams_open` = pods × per_endpoint) before the first restart began;
- the probe's count, two ways: `skewprobe_stream_resets_total` from its `/metrics` once the
  rollout is over, and the sum of `stream_resets` over every window in its SQLite store
  after it exited. Both must equal the fleet's figure; anything else is a failure (exit 1);
- memory: the probe's VmRSS sampled every 10 s over the held interval (first, last, max) and
  its peak (VmHWM), with the streams all open;
- CPU: utime + stime of the probe (and of the fleet) over the held interval, from /proc;
- also reported: time to open every stream, streams opened (store), storm events (store),
  and the p99 gap between messages (the probe's histogram).

    .venv/bin/python benchmarks/streams.py                    # 500 pods x 4 = 2,000, 600 s
    .venv/bin/python benchmarks/streams.py --quick            # 200 pods x 2 = 400, 60 s
    .venv/bin/python benchmarks/streams.py --pods 100 --per-endpoint 2 --duration 60 \\
        --sidecar haproxy --restarts 20 --batch 5 --interval 5 --rollout-after 15
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h

from probes.store import Store
from probes.streams import STORM_EVENT
from targets.proto import target_pb2

SUBSCRIBE = "/skewprobe.target.v1.Target/Subscribe"
OLD, NEW = "1.20.3", "1.21.0"
RSS_EVERY_S = 10.0


def _config(endpoints: Path, args: argparse.Namespace) -> str:
    request = target_pb2.SubscribeRequest(interval_ms=round(args.message_interval * 1000))
    b64 = base64.b64encode(request.SerializeToString()).decode()
    return (
        f"targets:\n  file: {{path: {endpoints}}}\n"
        "window: 10s\n"
        "paths:\n"
        "  - name: feed\n"
        f"    stream: {{method: {SUBSCRIBE}, request: {b64}, "
        f"per_endpoint: {args.per_endpoint}}}\n"
        "    port: grpc\n"
        "    timeout: 5s\n"
    )


def _wait_rollout(endpoints: Path, pods: int, restarted: int, timeout_s: float) -> None:
    """Poll the fleet's endpoints file until every pod is published and `restarted` of them
    run the new version (a bounded poll of an outside process's file)."""
    deadline = time.monotonic() + timeout_s
    versions: Counter[str] = Counter()
    while time.monotonic() < deadline:
        doc = json.loads(endpoints.read_text(encoding="utf-8"))
        versions = Counter(e["labels"]["proxy_version"] for e in doc["endpoints"])
        if versions[NEW] == restarted and sum(versions.values()) == pods:
            return
        time.sleep(0.25)
    raise RuntimeError(f"rollout not over after {timeout_s:.0f}s: {dict(versions)}")


def _stamp_seconds(wall: float) -> int:
    """Seconds into the local day, as the fleet's event lines stamp them (%H:%M:%S)."""
    t = time.localtime(wall)
    return t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec


def _fleet_events(lines: list[str]) -> list[tuple[int, str, str]]:
    """(seconds into the day, kind, pod) of the fleet's event lines."""
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[0].count(":") == 2 and parts[1].endswith(("_started",
                                                                               "_finished")):
            hh, mm, ss = (int(x) for x in parts[0].split(":"))
            out.append((hh * 3600 + mm * 60 + ss, parts[1], parts[2]))
    return out


def _mean(before: str, after: str, name: str) -> float:
    """Mean of histogram `name` between two scrapes (its _sum and _count deltas)."""
    def totals(text: str) -> tuple[float, float]:
        got = h.samples(text)
        return (sum(v for s, _, v in got if s == f"{name}_sum"),
                sum(v for s, _, v in got if s == f"{name}_count"))

    (s0, n0), (s1, n1) = totals(before), totals(after)
    return (s1 - s0) / (n1 - n0) if n1 > n0 else float("nan")


def run_once(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    endpoints = work / "endpoints.json"
    store = work / "streams.db"
    config = work / "streams.yaml"
    config.write_text(_config(endpoints, args), encoding="utf-8")
    port = h.free_port()
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    want = args.pods * args.per_endpoint
    with h.children() as kids:
        fleet_cmd = [
            h.PYTHON, "-m", "targets.fleet", "--pods", str(args.pods), "--from", OLD,
            "--to", NEW, "--rollout-after", f"{args.rollout_after}s",
            "--interval", f"{args.interval}s", "--batch", str(args.batch),
            "--restarts", str(args.restarts), "--endpoints-file", str(endpoints),
            "--base-host", args.base_host, "--http-port", "0", "--grpc-port", "0",
            # The notice outlasts the probe's 1 s file refresh: the probe stops re-opening on
            # a pod before it closes its listeners, as a terminating pod leaves the endpoints
            # before it drains.
            "--drain", "1s", "--drain-notice", "1.5s", "--sidecar", args.sidecar,
        ]
        if args.sidecar == "haproxy":
            fleet_cmd += ["--haproxy-dir", str(work / "haproxy")]
        fleet = h.Child("fleet", h.pinned(args.fleet_core, fleet_cmd), log=work / "fleet.err")
        kids.append(fleet)
        fleet.wait_line(r"^fleet: \d+ pods", timeout_s=max(60.0, args.pods / 5))
        fleet_up = time.time()
        probe_cmd = [
            *h.skewprobe_cmd(), "run", "--config", str(config), "--store", str(store),
            "--listen", f"127.0.0.1:{port}",
            # A backstop only: the run is ended by SIGTERM after the last scrape.
            "--duration", f"{int(args.rollout_after + args.duration + 300)}s",
        ]
        probe = h.Child("probe", h.pinned(args.probe_core, probe_cmd), log=work / "probe.err")
        kids.append(probe)
        h.wait_http(f"http://127.0.0.1:{port}/healthz", f"probing {args.pods} endpoints",
                    timeout_s=120.0)
        all_open_wall, _ = h.wait_streams(metrics_url, want, timeout_s=args.rollout_after)
        open_s = all_open_wall - fleet_up
        pids = [probe.pid, fleet.pid]
        a = h.snapshot(pids, metrics_url)
        rss: list[int] = [h.memory_kib(probe.pid).get("VmRSS", 0)]
        began = time.monotonic()
        while (left := args.duration - (time.monotonic() - began)) > 0:
            time.sleep(min(RSS_EVERY_S, left))
            rss.append(h.memory_kib(probe.pid).get("VmRSS", 0))
        # The rollout is over (every restarted pod published again on the new version; the
        # fleet's event lines are read after it stops) and the restarted pods' new streams
        # are open: nothing is mid-drain.
        _wait_rollout(endpoints, args.pods, args.restarts, timeout_s=60.0)
        h.wait_streams(metrics_url, want, timeout_s=30.0)
        b = h.snapshot(pids, metrics_url)
        mem = h.memory_kib(probe.pid)
        probe_rc = probe.stop(timeout_s=60.0)
        fleet.stop(timeout_s=60.0)
    if probe_rc != 0:
        err = (work / "probe.err").read_text()[-2000:]
        raise RuntimeError(f"skewprobe run exited {probe_rc}: {err}")
    return _figures(args, a, b, rss, mem, probe, fleet, store, open_s, all_open_wall)


def _figures(
    args: argparse.Namespace, a: h.Snapshot, b: h.Snapshot, rss: list[int],
    mem: dict[str, int], probe: h.Child, fleet: h.Child, store: Path, open_s: float,
    all_open_wall: float,
) -> dict[str, Any]:
    wall = b.mono - a.mono
    events = _fleet_events(fleet.lines)
    restarts = [e for e in events if e[1] == "restart_finished"]
    first_restart = min((e[0] for e in events if e[1] == "restart_started"), default=None)
    # Stamps have a 1 s resolution: a restart stamped in the second the last stream opened
    # may have begun before it, so it counts as too early.
    opened_first = first_restart is not None and first_restart > _stamp_seconds(all_open_wall)
    caused = len(restarts) * args.per_endpoint
    metrics_resets = h.counter_by(b.metrics, "skewprobe_stream_resets", "reason")
    resets_before = sum(h.counter_by(a.metrics, "skewprobe_stream_resets", "reason").values())
    with Store.open(store, readonly=True) as s:
        windows = [w for w in s.read_windows() if w.path == "feed"]
        storms = s.read_events(kinds=[STORM_EVENT])
    store_resets: Counter[str] = Counter()
    for w in windows:
        store_resets.update(w.stream_resets)
    gap = h.bucket_delta(h.buckets(a.metrics, "skewprobe_stream_message_gap_seconds"),
                         h.buckets(b.metrics, "skewprobe_stream_message_gap_seconds"))
    probe_cpu = b.cpu[probe.pid] - a.cpu[probe.pid]
    fleet_cpu = b.cpu[fleet.pid] - a.cpu[fleet.pid]
    sys_delta = {k: b.system[k] - a.system[k] for k in b.system}
    others = sys_delta["busy"] - sys_delta["irq"] - sys_delta["softirq"] - probe_cpu - fleet_cpu
    streams = args.pods * args.per_endpoint
    return {
        "pods": args.pods, "per_endpoint": args.per_endpoint, "streams": streams,
        "sidecar": args.sidecar, "message_interval_s": args.message_interval,
        "held_s": round(wall, 1), "open_all_s": round(open_s, 1),
        "restarts": len(restarts), "restarts_asked": args.restarts,
        "all_open_before_first_restart": opened_first,
        "resets_caused": caused,
        "resets_metrics": int(sum(metrics_resets.values())),
        "resets_store": int(sum(store_resets.values())),
        "resets_before_rollout": int(resets_before),
        "resets_by_reason": dict(store_resets),
        "streams_opened_store": sum(w.streams_opened for w in windows),
        "storm_events": len(storms),
        "storm_endpoints": [int(e.detail.get("endpoints_count", 0)) for e in storms],
        "gap_p99": h.bucket_quantile(gap, 0.99),
        "gap_mean_s": _mean(a.metrics, b.metrics, "skewprobe_stream_message_gap_seconds"),
        "probe_cpu_s": round(probe_cpu, 2), "probe_core_share": probe_cpu / wall,
        "probe_cpu_ms_per_stream_hour": 1000 * probe_cpu / (streams * wall / 3600.0),
        "fleet_core_share": fleet_cpu / wall, "others_cpu_share": others / wall,
        "irq_softirq_share": (sys_delta["irq"] + sys_delta["softirq"]) / wall,
        "rss_mib_first": rss[0] / 1024, "rss_mib_last": rss[-1] / 1024,
        "rss_mib_max": max(rss) / 1024, "peak_rss_mib": mem.get("VmHWM", 0) / 1024,
        "rss_samples": len(rss), "rss_mib_series": [round(x / 1024, 1) for x in rss],
        "load_before": a.load, "load_after": b.load,
    }


def report(r: dict[str, Any]) -> str:
    _, lo, hi = r["gap_p99"]
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["resets_by_reason"].items())) or "none"
    rows = [
        ["streams held", f"{r['streams']:,} ({r['pods']} pods × {r['per_endpoint']}, "
                         f"{r['sidecar']} sidecars, a message every "
                         f"{r['message_interval_s']:g} s)"],
        ["held for (measured interval)", f"{r['held_s']} s"],
        ["every stream open, from fleet up", f"{r['open_all_s']} s"],
        ["pods restarted by the fleet", f"{r['restarts']} (asked {r['restarts_asked']}); "
         "all streams open before the first: "
         f"{'yes' if r['all_open_before_first_restart'] else 'NO'}"],
        ["**resets caused** (restarts × per_endpoint)", f"**{r['resets_caused']}**"],
        ["**resets seen**: /metrics skewprobe_stream_resets_total", f"**{r['resets_metrics']}**"],
        ["**resets seen**: store windows (after exit)", f"**{r['resets_store']}** ({reasons})"],
        ["resets before the rollout", r["resets_before_rollout"]],
        ["streams opened (store)", f"{r['streams_opened_store']:,}"],
        ["storm events (store; endpoints each)",
         f"{r['storm_events']} ({', '.join(map(str, r['storm_endpoints'])) or '-'})"],
        ["message gap: mean; p99 lies in (bucket]",
         f"{r['gap_mean_s']:.3f} s; ({lo:g}–{hi:g}] s"],
        ["probe CPU", f"{r['probe_cpu_s']} s = {r['probe_core_share']:.3f} core; "
                      f"{r['probe_cpu_ms_per_stream_hour']:.1f} ms per stream-hour"],
        ["probe RSS (VmRSS every 10 s: first / last / max)",
         f"{r['rss_mib_first']:.0f} / {r['rss_mib_last']:.0f} / {r['rss_mib_max']:.0f} MiB "
         f"({r['rss_samples']} samples)"],
        ["probe peak RSS (VmHWM)", f"{r['peak_rss_mib']:.0f} MiB"],
        ["fleet core share / other processes / irq+softirq (cores)",
         f"{r['fleet_core_share']:.2f} / {r['others_cpu_share']:.2f} / "
         f"{r['irq_softirq_share']:.2f}"],
        ["loadavg before → after", f"{r['load_before']} → {r['load_after']}"],
    ]
    return h.md_table(["figure", "value"], rows)


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    batches = -(-args.restarts // args.batch) if args.restarts else 0
    # The last batch starts at rollout_after + (batches - 1) × interval after the fleet is
    # up and takes the notice (1.5 s) plus the drain (1 s) plus a restart.
    rollout_end = args.rollout_after + max(0, batches - 1) * args.interval + 5.0
    if args.restarts > args.pods:
        ap.error("--restarts cannot exceed --pods")
    if rollout_end >= args.duration:
        ap.error(f"the rollout ends about {rollout_end:.0f}s after the fleet is up; "
                 "--duration must be longer")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=500, help="fleet pods (500)")
    ap.add_argument("--per-endpoint", type=int, default=4, help="streams per pod (4)")
    ap.add_argument("--duration", type=float, default=600.0,
                    help="seconds the streams are held, measured (600)")
    ap.add_argument("--message-interval", type=float, default=1.0,
                    help="seconds between messages on each stream (1)")
    ap.add_argument("--restarts", type=int, default=100, help="pods the fleet restarts (100)")
    ap.add_argument("--batch", type=int, default=10, help="pods restarted at once (10)")
    ap.add_argument("--interval", type=float, default=30.0,
                    help="seconds between restart batches (30)")
    ap.add_argument("--rollout-after", type=float, default=90.0,
                    help="first restart this long after the fleet is up (90); every stream "
                         "must be open by then")
    ap.add_argument("--sidecar", choices=("emulated", "haproxy"), default="emulated")
    ap.add_argument("--probe-core", type=int, default=0)
    ap.add_argument("--fleet-core", type=int, default=1)
    ap.add_argument("--base-host", default="127.79.0.1", help="address of fleet pod 0")
    ap.add_argument("--json", help="also write the figures as JSON here")
    ap.add_argument("--quick", action="store_true",
                    help="for run_all.py: 200 pods × 2 streams, 60 s, 20 restarts")
    args = ap.parse_args(argv)
    if args.quick:
        args.pods, args.per_endpoint, args.duration = 200, 2, 60.0
        args.restarts, args.batch, args.interval, args.rollout_after = 20, 5, 6.0, 20.0
    if min(args.pods, args.per_endpoint, args.batch) < 1 or args.restarts < 0:
        ap.error("--pods, --per-endpoint and --batch must be >= 1, --restarts >= 0")
    _check_args(ap, args)
    with tempfile.TemporaryDirectory(prefix="skewprobe-streams-") as tmp:
        r = run_once(args, Path(tmp))
    cmd = " ".join(["benchmarks/streams.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"## streams: {cmd}\n")
    print(report(r))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2), encoding="utf-8")
    exact = r["resets_caused"] == r["resets_metrics"] == r["resets_store"]
    sane = (exact and r["restarts"] == args.restarts and r["all_open_before_first_restart"]
            and r["resets_before_rollout"] == 0)
    print(f"\nreset accounting: caused {r['resets_caused']}, seen {r['resets_metrics']} "
          f"(/metrics) and {r['resets_store']} (store): {'EXACT' if exact else 'MISMATCH'}")
    return 0 if sane else 1


if __name__ == "__main__":
    sys.exit(main())
