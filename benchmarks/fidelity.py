"""Fidelity: what the probe adds to the latency it reports, beside h2load on the same target.

One reference target (`python -m targets.server`) with a fault profile that adds a fixed
delay (default 20 ms) to every request, pinned to one core. On the other core, at the same
time and the same rate per protocol:

- `skewprobe run` probes three paths on it: HTTP/1.1, HTTP/2 (h2c) and gRPC unary `Echo`;
  its latencies are read from its SQLite store (log-linear histograms, ≤ 1 % error; at
  20 ms a bucket is 0.25 ms wide) over the 1 s windows lying wholly inside the measured
  interval. They run from the *intended* send time, so they include the probe's own
  schedule lag (shown beside them, from its `/metrics`).
- `h2load --h1` and `h2load` (h2c) at the same rate (`--rps`, one connection, one request
  in flight for HTTP/1.1, up to 4 streams for HTTP/2), per-request times from `--log-file`.
  h2load times from its actual send. Its quantiles are given twice: binned into the probe's
  histogram (like for like) and exact.
- gRPC's reference is a C-core client, `benchmarks/grpc_ref/unary_client.cc` (grpc++'s
  generic stub, one channel, one call at a time at the same rate, timed from its send to its
  status), built here with Debian's `libgrpc++-dev` (`apt-get install libgrpc++-dev g++
  pkg-config`). `--grpc-reference h2load` uses h2load instead (nghttp2, C): the same unary
  `Echo` as an HTTP/2 POST (`content-type: application/grpc`, `te: trailers`, an empty message
  behind its 5-byte prefix), up to 4 streams; it does not read `grpc-status`.
- `--grpc-client grpcio` runs the probe's gRPC path on grpc.aio instead of its own HTTP/2
  client, `--http2-client httpcore` its HTTP/2 path on httpcore: the library references the
  tests prove the probe's own clients against (`tests/reference/`), not in the product.

"minus delay" is the quantile minus the nominal injected delay: the server's, the loopback's
and the client's overhead together. The reference's is the floor; the probe's minus the
reference's is the probe's own addition.

    .venv/bin/python benchmarks/fidelity.py                        # 20 ms, 20/s, 30 s
    .venv/bin/python benchmarks/fidelity.py --rate 50 --duration 20 --repeat 3
    .venv/bin/python benchmarks/fidelity.py --quick                # for run_all.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
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

PATHS = ("http1", "http2", "grpc")
_NAMES = {"1.1": "http1", "2": "http2"}
LAG = "skewprobe_schedule_lag_seconds"


def _profile(delay: str) -> str:
    return f'versions:\n  "bench":\n    defaults: {{latency: {{fixed: {delay}}}}}\n'


def _config(
    host: str, http_port: int, grpc_port: int, rate: float, args: argparse.Namespace
) -> str:
    common = f"    rate: {rate:g}/s\n    timeout: 1s\n"
    return (
        "targets:\n  static:\n"
        f"    - address: {host}:{http_port}\n"
        f"      ports: {{http: {http_port}, grpc: {grpc_port}}}\n"
        "      labels: {pod: fidelity-0, proxy_version: bench}\n"
        "window: 1s\n"
        "paths:\n"
        "  - name: http1\n"
        '    http: {method: GET, path: /api/fidelity, version: "1.1"}\n'
        f"    port: http\n{common}"
        "  - name: http2\n"
        '    http: {method: GET, path: /api/fidelity, version: "2"}\n'
        f"    port: http\n{common}"
        "  - name: grpc\n"
        "    grpc: {method: /skewprobe.target.v1.Target/Echo}\n"
        f"    port: grpc\n{common}"
    )


def _h2load(
    version: str, url: str, rate: float, duration: float, log: Path, core: int | None,
    grpc_body: Path | None = None,
) -> subprocess.Popen[str]:
    n = max(1, round(rate * duration))
    cmd = ["h2load", "-n", str(n), "-c", "1", "--rps", str(max(1, round(rate))),
           "--log-file", str(log), url]
    cmd[1:1] = ["--h1", "-m", "1"] if version == "1.1" else ["-m", "4"]
    if grpc_body is not None:
        cmd[1:1] = ["-d", str(grpc_body), "-H", "content-type: application/grpc",
                    "-H", "te: trailers"]
    return subprocess.Popen(h.pinned(core, cmd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


_REF_SOURCE = Path(__file__).resolve().parent / "grpc_ref" / "unary_client.cc"


def _grpc_reference_binary() -> Path | None:
    """The C-core reference client, built once per source version (None: no grpc++ here)."""
    if shutil.which("g++") is None or shutil.which("pkg-config") is None:
        return None
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True,
                           text=True, check=False)
    if flags.returncode != 0:
        return None
    digest = hashlib.sha256(_REF_SOURCE.read_bytes()).hexdigest()[:12]
    binary = Path(tempfile.gettempdir()) / "skewprobe-bench" / f"unary_client-{digest}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["g++", "-O2", "-std=c++17", str(_REF_SOURCE), "-o", str(binary),
                        *flags.stdout.split()], check=True)
    return binary


def _grpc_reference(binary: Path, target: str, rate: float, duration: float, log: Path,
                    core: int | None) -> subprocess.Popen[str]:
    n = max(1, round(rate * duration))
    cmd = [str(binary), target, "/skewprobe.target.v1.Target/Echo", str(n), f"{rate:g}", str(log)]
    return subprocess.Popen(h.pinned(core, cmd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _h2load_seconds(log: Path) -> np.ndarray:
    """Per-request times (s) of completed requests from an h2load --log-file.

    Status -1 is a failed stream (dropped). Status 0 is kept: h2load's HTTP/1.1 parser takes
    the status code from llhttp's on_status callback, which never fires for a status line
    without a reason phrase ("HTTP/1.1 200 ", as hypercorn/h11 write it), so h2load --h1
    counts such answers as "failed" with status 0 although they are complete 200s (checked
    with -v). `_h2load_errors` makes sure no request errored or timed out.
    """
    values = []
    for line in log.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and (parts[1].startswith("2") or parts[1] == "0"):
            values.append(int(parts[2]) / 1e6)
    return np.asarray(values, dtype=np.float64)


def _h2load_errors(summary: str) -> int:
    """errored + timeout from h2load's `requests:` summary line."""
    m = re.search(r"(\d+) errored, (\d+) timeout", summary)
    if m is None:
        raise RuntimeError(f"h2load summary not understood: {summary[-500:]}")
    return int(m.group(1)) + int(m.group(2))


def run_once(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    profiles = work / "profiles.yaml"
    profiles.write_text(_profile(args.delay), encoding="utf-8")
    store = work / "fidelity.db"
    listen_port = h.free_port()
    metrics_url = f"http://127.0.0.1:{listen_port}/metrics"
    with h.children() as kids:
        server_cmd = [
            h.PYTHON, "-m", "targets.server", "--http", f"{args.host}:0",
            "--grpc", f"{args.host}:0", "--version", "bench", "--profiles", str(profiles),
            "--pod", "fidelity-0", "--drain", "0s",
        ]
        server = h.Child("server", h.pinned(args.server_core, server_cmd), log=work / "server.err")
        kids.append(server)
        m = server.wait_line(r"http=([\d.]+):(\d+) grpc=[\d.]+:(\d+)", timeout_s=30.0)
        http_port, grpc_port = int(m.group(2)), int(m.group(3))
        config = work / "fidelity.yaml"
        config.write_text(_config(args.host, http_port, grpc_port, args.rate, args),
                          encoding="utf-8")
        # `skewprobe run`, on a library reference if asked for (tests/reference/).
        launcher = [h.PYTHON, "-m", "tests.reference", "--http2", args.http2_client,
                    "--grpc", args.grpc_client]
        probe_cmd = [
            *launcher, "run", "--config", str(config), "--store", str(store),
            "--listen", f"127.0.0.1:{listen_port}",
            "--duration", f"{int(args.warmup + args.duration + 60)}s",
        ]
        probe = h.Child("probe", h.pinned(args.client_core, probe_cmd), log=work / "probe.err")
        kids.append(probe)
        h.wait_http(f"http://127.0.0.1:{listen_port}/healthz", "probing 1 endpoints", 60.0)
        time.sleep(args.warmup)
        a = h.snapshot([], metrics_url)
        url = f"http://{args.host}:{http_port}/api/fidelity"
        loads = {
            v: _h2load(v, url, args.rate, args.duration, work / f"h2load-{v}.log",
                       args.client_core)
            for v in ("1.1", "2")
        }
        if args.grpc_reference == "h2load":
            grpc_body = work / "echo.bin"
            grpc_body.write_bytes(b"\x00\x00\x00\x00\x00")  # an empty EchoRequest, framed
            loads["grpc"] = _h2load(
                "grpc", f"http://{args.host}:{grpc_port}/skewprobe.target.v1.Target/Echo",
                args.rate, args.duration, work / "h2load-grpc.log", args.client_core, grpc_body,
            )
        else:
            loads["grpc"] = _grpc_reference(
                args.grpc_reference_binary, f"{args.host}:{grpc_port}", args.rate,
                args.duration, work / "h2load-grpc.log", args.client_core)
        h2load_out = {v: p.communicate(timeout=args.duration * 3 + 30)[0]
                      for v, p in loads.items()}
        # h2load ends a little after its last send; the probe's interval is the same span.
        b = h.snapshot([], metrics_url)
        probe_rc = probe.stop(timeout_s=30.0)
        server.stop(timeout_s=30.0)
    if probe_rc != 0:
        raise RuntimeError(f"skewprobe run exited {probe_rc}: "
                           f"{(work / 'probe.err').read_text()[-2000:]}")
    for v, p in loads.items():
        if p.returncode != 0:
            raise RuntimeError(f"h2load ({v}) exited {p.returncode}: {h2load_out[v][-1000:]}")
        if _h2load_errors(h2load_out[v]):
            raise RuntimeError(f"h2load ({v}) saw errors: {h2load_out[v][-1000:]}")
    return _figures(args, a, b, store, work)


def _figures(
    args: argparse.Namespace, a: h.Snapshot, b: h.Snapshot, store: Path, work: Path
) -> dict[str, Any]:
    delay_s = _delay_s(args.delay)
    lag = h.bucket_delta(h.buckets(a.metrics, LAG), h.buckets(b.metrics, LAG))
    out: dict[str, Any] = {"delay_s": delay_s, "rate": args.rate, "interval_s": b.mono - a.mono,
                           "load_before": a.load, "load_after": b.load,
                           "lag_p50": h.bucket_quantile(lag, 0.5),
                           "lag_p99": h.bucket_quantile(lag, 0.99), "rows": {}}
    with Store.open(store, readonly=True) as s:
        windows = [
            w for w in s.read_windows() if w.start >= a.wall and w.start + w.length <= b.wall
        ]
    for path in PATHS:
        pooled = Histogram()
        outcomes: dict[str, int] = {}
        for w in windows:
            if w.path == path:
                pooled += Histogram.from_window(w.latency)
                for k, count in w.outcomes.items():
                    outcomes[k] = outcomes.get(k, 0) + count
        p50, p99 = pooled.quantiles((0.5, 0.99)) if pooled.count else (np.nan, np.nan)
        out["rows"][f"probe {path}"] = {"n": pooled.count, "p50": float(p50), "p99": float(p99),
                                        "outcomes": outcomes}
    for v in ("1.1", "2", "grpc"):
        values = _h2load_seconds(work / f"h2load-{v}.log")
        binned = Histogram.from_values(values)
        q = binned.quantiles((0.5, 0.99)) if binned.count else (np.nan, np.nan)
        exact = (np.quantile(values, [0.5, 0.99], method="inverted_cdf")
                 if values.size else (np.nan, np.nan))
        reference = args.grpc_reference if v == "grpc" else "h2load"
        out["rows"][f"{reference} {_NAMES.get(v, v)}"] = {
            "n": int(values.size), "p50": float(q[0]), "p99": float(q[1]),
            "p50_exact": float(exact[0]), "p99_exact": float(exact[1]),
        }
    return out


def _delay_s(text: str) -> float:
    from probes._parsing import parse_duration

    return parse_duration(text)


def _ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def report(runs: list[dict[str, Any]]) -> str:
    header = ["run", "client", "n", "p50 ms", "p99 ms", "p50 − delay", "p99 − delay",
              "vs reference p50", "vs reference p99", "reference exact p50/p99",
              "probe lag p50/p99 ms", "loadavg"]
    rows = []
    for i, r in enumerate(runs, 1):
        d = r["delay_s"]
        for name in sorted(r["rows"], key=lambda n: (PATHS.index(n.split()[1]),
                                                     not n.startswith("probe"))):
            x = r["rows"][name]
            proto = name.split()[1]
            ref = next((v for k, v in r["rows"].items()
                        if k.endswith(f" {proto}") and not k.startswith("probe")), None)
            vs = ("—", "—")
            if name.startswith("probe") and ref is not None:
                vs = (f"{_ms(x['p50'] - ref['p50'])}", f"{_ms(x['p99'] - ref['p99'])}")
            exact = (f"{_ms(x['p50_exact'])} / {_ms(x['p99_exact'])}" if "p50_exact" in x
                     else "—")
            lag = (f"{_ms(r['lag_p50'][0])} / {_ms(r['lag_p99'][0])}"
                   if name.startswith("probe") else "—")
            rows.append([i, name, x["n"], _ms(x["p50"]), _ms(x["p99"]), _ms(x["p50"] - d),
                         _ms(x["p99"] - d), vs[0], vs[1], exact, lag,
                         f"{r['load_before']} → {r['load_after']}"])
    return h.md_table(header, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", default="20ms", help="fixed delay the target adds (20ms)")
    ap.add_argument("--rate", type=float, default=20.0, help="calls/s per protocol (20)")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds (30)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring (3)")
    ap.add_argument("--repeat", type=int, default=1, help="independent runs (fresh processes)")
    ap.add_argument("--client-core", type=int, default=0, help="core of the probe and h2load")
    ap.add_argument("--server-core", type=int, default=1, help="core of the target")
    ap.add_argument("--host", default="127.78.0.1", help="the target's loopback address")
    ap.add_argument("--json", help="also write the figures as JSON here")
    ap.add_argument("--http2-client", choices=("lean", "httpcore"), default="lean",
                    help="the HTTP/2 client (lean)")
    ap.add_argument("--grpc-client", choices=("lean", "grpcio"), default="lean",
                    help="the gRPC unary client (lean)")
    ap.add_argument("--grpc-reference", choices=("grpc++", "h2load"), default="grpc++",
                    help="gRPC's reference client: the C-core one built from grpc_ref/ (grpc++)"
                         " or h2load sending the same request")
    ap.add_argument("--quick", action="store_true", help="a short run for run_all.py (15 s)")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration = 15.0
    if args.grpc_reference == "grpc++":
        args.grpc_reference_binary = _grpc_reference_binary()
        if args.grpc_reference_binary is None:
            print("fidelity: no grpc++ to build the C-core reference (apt-get install "
                  "libgrpc++-dev g++ pkg-config); using h2load for gRPC", file=sys.stderr)
            args.grpc_reference = "h2load"
    if shutil.which("h2load") is None:
        print("fidelity: h2load not found (Debian package nghttp2-client)", file=sys.stderr)
        return 2
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="skewprobe-fidelity-") as tmp:
            runs.append(run_once(args, Path(tmp)))
    cmd = " ".join(["benchmarks/fidelity.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"## fidelity: {cmd}\n")
    print(report(runs))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2), encoding="utf-8")
    bad = any(set(x.get("outcomes", {"ok": 1})) - {"ok"} for r in runs for x in r["rows"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
