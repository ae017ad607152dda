"""API flood: what a burst of `GET /verdict` requests costs the probe's own schedule (issue 32).

A local fleet (`python -m targets.fleet`, 12 pods, half rolled to 1.21.0 with the example
fault profiles) in its own process, probed by `skewprobe run` (two HTTP paths at 10/s per
pod, 5 s windows, as the demo's); once the canary has windows, `h2load --h1 -c C -n N` on
`/verdict`. Read from outside the probe: h2load's verdicts/s, mean time per request and
failed requests; the probe's schedule lag over the flood (`/metrics` before and after);
its overload marks (the store's `overload` events that declared it overloaded, from the
flood's start to the end of the run); the same lag figures over as long a stretch with no
requests just before (the control: the machine is shared); and the verdicts it computed
(`skewprobe_verdict_computations_total`, where the probe exports it).

    .venv/bin/python benchmarks/api_flood.py                  # -c 50 -n 1000
    .venv/bin/python benchmarks/api_flood.py --duration 20 --distinct 50   # 50 queries, 20 s
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h

from probes.measure.overload import OVERLOAD_EVENT
from probes.store import Store

LAG = "skewprobe_schedule_lag_seconds"
COMPUTED = "skewprobe_verdict_computations_total"
PROFILES = h.REPO / "targets" / "examples" / "profiles.yaml"


def _config(endpoints: Path) -> str:
    return (
        f"targets: {{file: {{path: {endpoints}}}}}\n"
        "cohort: {by: proxy_version}\n"
        "window: 5s\n"
        "verdict: {alpha: 0.01, min_samples: 100, warmup: 5s}\n"
        "paths:\n"
        "  - {name: checkout, http: {path: /api/checkout}, rate: 10/s, timeout: 1s}\n"
        "  - {name: catalog, http: {path: /api/catalog}, rate: 10/s, timeout: 1s}\n"
    )


def _h2load(urls: list[str], clients: int, requests: int, duration_s: float | None,
            timeout_s: float) -> dict[str, Any]:
    amount = ["-D", f"{duration_s:g}"] if duration_s else ["-n", str(requests)]
    out = subprocess.run(
        ["h2load", "--h1", "-c", str(clients), *amount, *urls],
        capture_output=True, text=True, timeout=timeout_s, check=False).stdout
    finished = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    counts = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                       r"(\d+) failed", out)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
    statuses = re.search(r"status codes: (.*)", out)
    if finished is None or counts is None or mean is None:
        raise RuntimeError(f"h2load said: {out[-2000:]}")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    return {"req_s": float(finished.group(3)), "succeeded": int(counts.group(4)),
            "failed": int(counts.group(5)), "mean_s": float(mean.group(1)) * scale[mean.group(2)],
            "statuses": statuses.group(1).strip() if statuses else "?"}


def run_once(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    endpoints = work / "endpoints.json"
    store = work / "flood.db"
    port = h.free_port()
    base = f"http://127.0.0.1:{port}"
    with h.children() as kids:
        fleet = h.Child("fleet", [
            h.PYTHON, "-m", "targets.fleet", "--pods", "12", "--from", "1.20.3",
            "--to", "1.21.0", "--rollout-after", "2s", "--interval", "1s", "--batch", "3",
            "--restarts", "6", "--profiles", str(PROFILES), "--endpoints-file", str(endpoints),
            "--base-host", args.base_host, "--no-grpc", "--quiet"], log=work / "fleet.err")
        kids.append(fleet)
        fleet.wait_line("pods of", timeout_s=60.0)
        config = work / "flood.yaml"
        config.write_text(_config(endpoints), encoding="utf-8")
        probe = h.Child("probe", [*h.skewprobe_cmd(), "run", "--config", str(config),
                                  "--store", str(store), "--listen", f"127.0.0.1:{port}"],
                        log=work / "probe.err")
        kids.append(probe)
        h.wait_http(f"{base}/healthz", "probing 12 endpoints", 60.0)
        time.sleep(args.warmup)
        # The control: as long without any request, on the same (shared) machine.
        quiet = h.snapshot([probe.pid], f"{base}/metrics")
        time.sleep(args.duration or 10.0)
        before = h.snapshot([probe.pid], f"{base}/metrics")
        # --distinct: as many different queries (each its own verdict), else one.
        urls = ([f"{base}/verdict?since=-{i + 1}m" for i in range(args.distinct)]
                if args.distinct else [f"{base}/verdict"])
        flood = _h2load(urls, args.clients, args.requests, args.duration,
                        timeout_s=args.requests * 10.0 + (args.duration or 0) * 3)
        after = h.snapshot([probe.pid], f"{base}/metrics")
        # The overload rule looks back three windows: let it see the flood's last ones.
        time.sleep(args.settle)
        end = h.snapshot([probe.pid], f"{base}/metrics")
        rc = probe.stop()
    if rc != 0:
        raise RuntimeError(f"skewprobe run exited {rc}: {(work / 'probe.err').read_text()[-2000:]}")
    with Store.open(str(store), readonly=True) as s:
        marks = [e for e in s.read_events(kinds=[OVERLOAD_EVENT])
                 if e.at >= before.wall and e.detail.get("reason")]
    lag = h.bucket_delta(h.buckets(before.metrics, LAG), h.buckets(after.metrics, LAG))
    control = h.bucket_delta(h.buckets(quiet.metrics, LAG), h.buckets(before.metrics, LAG))
    computed = [sum(v for n, _, v in h.samples(s.metrics) if n == COMPUTED)
                for s in (before, after)]
    return {**flood, "marks": len(marks), "lag_p99": h.bucket_quantile(lag, 0.99),
            "lag_over_10ms": 1.0 - h.fraction_at_most(lag, 0.010),
            "quiet_p99": h.bucket_quantile(control, 0.99),
            "quiet_over_10ms": 1.0 - h.fraction_at_most(control, 0.010),
            "computed": computed[1] - computed[0], "cpu_s": after.cpu[probe.pid]
            - before.cpu[probe.pid], "load": f"{before.load} → {end.load}"}


def report(runs: list[dict[str, Any]]) -> str:
    rows = [[i, f"{r['req_s']:.1f}", f"{r['mean_s'] * 1000:.1f}", r["succeeded"], r["failed"],
             r["statuses"], f"{r['computed']:.0f}", f"{r['lag_p99'][0] * 1000:.1f}",
             f"{r['lag_over_10ms']:.2%}",
             f"{r['quiet_p99'][0] * 1000:.1f} / {r['quiet_over_10ms']:.2%}", r["marks"],
             f"{r['cpu_s']:.1f}", r["load"]]
             for i, r in enumerate(runs, 1)]
    return h.md_table(["run", "verdicts/s", "mean ms", "succeeded", "failed", "status codes",
                       "computed", "lag p99 ms", "sends > 10 ms late",
                       "no requests: lag p99 ms / > 10 ms", "overload marks",
                       "probe CPU s", "loadavg"], rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50, help="h2load -c (50)")
    ap.add_argument("--requests", type=int, default=1000, help="h2load -n (1000)")
    ap.add_argument("--duration", type=float, help="h2load -D: flood this long instead")
    ap.add_argument("--distinct", type=int, default=0,
                    help="this many different queries (since=-1m, -2m, ...), round robin")
    ap.add_argument("--warmup", type=float, default=30.0, help="probing before the flood (30 s)")
    ap.add_argument("--settle", type=float, default=16.0, help="probing after it (16 s)")
    ap.add_argument("--repeat", type=int, default=1, help="independent runs")
    ap.add_argument("--base-host", default="127.83.0.10", help="pod 0's loopback address")
    ap.add_argument("--quick", action="store_true", help="a short run for run_all.py")
    args = ap.parse_args(argv)
    if shutil.which("h2load") is None:
        print("api_flood: h2load not found (apt-get install nghttp2-client)", file=sys.stderr)
        return 2
    if args.quick:
        args.requests, args.warmup = 300, 20.0
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="skewprobe-api-flood-") as tmp:
            runs.append(run_once(args, Path(tmp)))
    cmd = " ".join(["benchmarks/api_flood.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"## API flood: {cmd}\n")
    print(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
