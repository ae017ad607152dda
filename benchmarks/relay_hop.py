"""Relay hop cost: what a relay call adds over a direct call to the same pod (issue 17).

Two reference targets on one core: the destination (`python -m targets.server`, a fault
profile adding a fixed delay, default 20 ms, to every request) and a relay pod (`--relay`,
an allowlist naming the destination's URL, no outbound retries). On the other core one
`skewprobe run` probes, at the same rate, the same route twice: `direct` (HTTP/1.1 to the
destination) and `relay` (a `relay:` path asking the relay pod to call it). Latencies come
from the probe's store (1 s windows wholly inside the measured interval, pooled log-linear
histograms) and run from the intended send time, so both include the probe's own lag alike.

The hop is `relay − direct` at p50 and p99: the probe → relay request and answer (its JSON),
the relay's HTTP server, and the relay's own client call (httpx) to the destination. The
relay's `latency_ms` (its measure of the destination call) is not kept by the probe; the
hop is read end to end, as a user of the relay sees it.

    .venv/bin/python benchmarks/relay_hop.py                       # 20 ms, 20/s, 30 s
    .venv/bin/python benchmarks/relay_hop.py --rate 50 --repeat 3
    .venv/bin/python benchmarks/relay_hop.py --quick               # for run_all.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h

from probes.measure.histogram import Histogram
from probes.store import Store

PATHS = ("direct", "relay")
LAG = "skewprobe_schedule_lag_seconds"
ROUTE = "/api/relay-bench"


def _config(dest: str, relay: str, rate: float) -> str:
    common = f"    rate: {rate:g}/s\n    timeout: 1s\n"
    return (
        "targets:\n  static:\n"
        f"    - {{address: '{dest}', labels: {{pod: dest-0, role: dest, proxy_version: bench}}}}\n"
        f"    - {{address: '{relay}', labels: {{pod: relay-0, role: relay, "
        "proxy_version: bench}}\n"
        "window: 1s\npaths:\n"
        f"  - name: direct\n    http: {{method: GET, path: {ROUTE}, version: '1.1'}}\n"
        f"    selector: {{role: dest}}\n{common}"
        "  - name: relay\n    relay: {destination: dest}\n"
        f"    selector: {{role: relay}}\n{common}"
    )


def _server(args: argparse.Namespace, work: Path, name: str, host: str,
            extra: list[str]) -> tuple[h.Child, str]:
    cmd = [h.PYTHON, "-m", "targets.server", "--http", f"{host}:0", "--grpc", "off",
           "--version", "bench", "--pod", f"{name}-0", "--drain", "0s", *extra]
    child = h.Child(name, h.pinned(args.server_core, cmd), log=work / f"{name}.err")
    m = child.wait_line(r"http=([\d.]+:\d+)", timeout_s=30.0)
    return child, m.group(1)


def run_once(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    profiles = work / "profiles.yaml"
    delay = f"{{latency: {{fixed: {args.delay}}}}}"
    profiles.write_text(f'versions:\n  "bench":\n    defaults: {delay}\n', encoding="utf-8")
    store = work / "relay-hop.db"
    listen_port = h.free_port()
    metrics_url = f"http://127.0.0.1:{listen_port}/metrics"
    with h.children() as kids:
        dest, dest_addr = _server(args, work, "dest", args.host,
                                  ["--profiles", str(profiles)])
        kids.append(dest)
        allowlist = work / "relay.yaml"
        allowlist.write_text("relay:\n  timeout: 1s\n  destinations:\n"
                             f"    dest: {{http: {{url: 'http://{dest_addr}{ROUTE}'}}}}\n",
                             encoding="utf-8")
        relay, relay_addr = _server(args, work, "relay", args.relay_host,
                                    ["--relay", str(allowlist)])
        kids.append(relay)
        config = work / "relay-hop.yaml"
        config.write_text(_config(dest_addr, relay_addr, args.rate), encoding="utf-8")
        probe_cmd = [*h.skewprobe_cmd(), "run", "--config", str(config), "--store", str(store),
                     "--listen", f"127.0.0.1:{listen_port}",
                     "--duration", f"{int(args.warmup + args.duration + 60)}s"]
        probe = h.Child("probe", h.pinned(args.client_core, probe_cmd), log=work / "probe.err")
        kids.append(probe)
        h.wait_http(f"http://127.0.0.1:{listen_port}/healthz", "probing 2 endpoints", 60.0)
        time.sleep(args.warmup)
        a = h.snapshot([relay.pid, dest.pid], metrics_url)
        time.sleep(args.duration)
        b = h.snapshot([relay.pid, dest.pid], metrics_url)
        probe_rc = probe.stop(timeout_s=30.0)
    if probe_rc != 0:
        raise RuntimeError(f"skewprobe run exited {probe_rc}: "
                           f"{(work / 'probe.err').read_text()[-2000:]}")
    return _figures(args, a, b, store, relay.pid, dest.pid)


def _figures(args: argparse.Namespace, a: h.Snapshot, b: h.Snapshot, store: Path,
             relay_pid: int, dest_pid: int) -> dict[str, Any]:
    from probes._parsing import parse_duration

    lag = h.bucket_delta(h.buckets(a.metrics, LAG), h.buckets(b.metrics, LAG))
    seconds = b.mono - a.mono
    out: dict[str, Any] = {
        "delay_s": parse_duration(args.delay), "rate": args.rate, "interval_s": seconds,
        "load_before": a.load, "load_after": b.load,
        "lag_p50": h.bucket_quantile(lag, 0.5), "lag_p99": h.bucket_quantile(lag, 0.99),
        # CPU of the relay pod per relay call, and of the destination per call it answered.
        "relay_cpu_s": b.cpu[relay_pid] - a.cpu[relay_pid],
        "dest_cpu_s": b.cpu[dest_pid] - a.cpu[dest_pid], "rows": {}}
    with Store.open(store, readonly=True) as s:
        windows = [w for w in s.read_windows()
                   if w.start >= a.wall and w.start + w.length <= b.wall]
    for path in PATHS:
        pooled = Histogram()
        outcomes: dict[str, int] = {}
        for w in (w for w in windows if w.path == path):
            pooled += Histogram.from_window(w.latency)
            for k, n in w.outcomes.items():
                outcomes[k] = outcomes.get(k, 0) + n
        p50, p99 = pooled.quantiles((0.5, 0.99)) if pooled.count else (np.nan, np.nan)
        out["rows"][path] = {"n": pooled.count, "p50": float(p50), "p99": float(p99),
                             "outcomes": outcomes}
    return out


def _ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def report(runs: list[dict[str, Any]]) -> str:
    header = ["run", "path", "n", "p50 ms", "p99 ms", "hop p50 ms", "hop p99 ms",
              "relay pod CPU per call ms", "probe lag p50/p99 ms", "loadavg"]
    rows = []
    for i, r in enumerate(runs, 1):
        direct, relay = r["rows"]["direct"], r["rows"]["relay"]
        for name, x in (("direct", direct), ("relay", relay)):
            hop = (("—", "—") if name == "direct" else
                   (_ms(relay["p50"] - direct["p50"]), _ms(relay["p99"] - direct["p99"])))
            cpu = (_ms(r["relay_cpu_s"] / relay["n"]) if name == "relay" and relay["n"]
                   else "—")
            rows.append([i, name, x["n"], _ms(x["p50"]), _ms(x["p99"]), *hop, cpu,
                         f"{_ms(r['lag_p50'][0])} / {_ms(r['lag_p99'][0])}",
                         f"{r['load_before']} → {r['load_after']}"])
    return h.md_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", default="20ms", help="fixed delay the destination adds (20ms)")
    ap.add_argument("--rate", type=float, default=20.0, help="calls/s per path (20)")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds (30)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring (3)")
    ap.add_argument("--repeat", type=int, default=1, help="independent runs (fresh processes)")
    ap.add_argument("--client-core", type=int, default=0, help="core of the probe")
    ap.add_argument("--server-core", type=int, default=1, help="core of the two targets")
    ap.add_argument("--host", default="127.79.0.1", help="the destination's loopback address")
    ap.add_argument("--relay-host", default="127.79.0.2", help="the relay pod's address")
    ap.add_argument("--json", help="also write the figures as JSON here")
    ap.add_argument("--quick", action="store_true", help="a short run for run_all.py (15 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration = 15.0
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="skewprobe-relay-hop-") as tmp:
            runs.append(run_once(args, Path(tmp)))
    cmd = " ".join(["benchmarks/relay_hop.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"## relay hop: {cmd}\n")
    print(report(runs))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2), encoding="utf-8")
    bad = any(set(x["outcomes"]) - {"ok"} for r in runs for x in r["rows"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
