"""How long `skewprobe report` takes on a day of data, and how much memory it needs.

Builds a synthetic store through the Store API (the same `write`, `write_events` and
`write_inventory` the probe uses): `--hours` of `--window`-second windows for `--paths`
paths, two cohorts (a rollout from 1.20.3 to 1.21.0 starting at hour 2 and holding at 60 %
of pods from hour 14), six pods per path (`build(..., pods=N)`: N) with their endpoint
windows (calls, errors, attempts and a latency histogram per pod, as the probe writes
them), pod restarts and
reconnect storms as events, and an inventory snapshot every five minutes. Four paths
regress on the new version (errors, p99, retries, stream resets). Then it runs the report
command in a fresh process (`python -m probes.cli report ...`) and reads its wall time and
peak RSS, so nothing of the build stays in the measured process.

    .venv/bin/python benchmarks/report_speed.py            # 24 h x 50 paths (the target)
    .venv/bin/python benchmarks/report_speed.py --quick    # 6 h x 50 paths

The store is cached under --cache (keyed by its parameters): building a day takes a minute
or two. Exit 0 when the report rendered within --budget seconds, 1 when it was slower or
wrong, 2 for bad options.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from probes._parsing import rfc3339  # noqa: E402
from probes.measure.histogram import BUCKET_COUNT, index_of  # noqa: E402
from probes.store import Event, InventoryRow, Store  # noqa: E402
from probes.types import EndpointWindow, PathWindow  # noqa: E402

T0 = 1_795_910_400.0  # 2026-11-28T00:00:00Z
OLD, NEW = "1.20.3", "1.21.0"
PODS = 6
PATHS_PER_SERVICE = 5
REGRESS = {"errors": 5, "latency": 13, "retries": 21, "resets": 29}


def _restart_times(services: int, hours: float, per_service: int = PODS) -> np.ndarray:
    """When each pod restarts onto the new version (inf: never): 60 % of pods, one by one
    from hour 2 to hour 14 (scaled down for shorter runs)."""
    pods = services * per_service
    begin, end = hours * 2 / 24, hours * 14 / 24
    moving = round(pods * 0.6)
    times = np.full(pods, np.inf)
    # Pod 0 of every service first, then pod 1, ...: every path sees both versions early.
    order = np.array([s * per_service + j for j in range(per_service) for s in range(services)])
    times[order[:moving]] = T0 + 3600 * (begin + (end - begin) * np.arange(moving) / moving)
    return times.reshape(services, per_service)


def store_file(cache: str | Path, hours: float, paths: int, window_s: float,
               pods: int = PODS) -> str:
    """Where the store of these parameters is cached ("v2": with per-pod latency and
    attempts, as store schema v2 keeps them; the pods per path named unless six)."""
    per = "" if pods == PODS else f"-{pods}pods"
    return os.path.join(cache, f"report-v2-{hours:g}h-{paths}p-{window_s:g}s{per}.db")


def build(path: str, *, hours: float, paths: int, window_s: float, seed: int = 7,
          pods: int = PODS) -> None:
    """The store of `hours` × `paths`, `pods` pods per path (each service's)."""
    rng = np.random.default_rng(seed)
    services = -(-paths // PATHS_PER_SERVICE)
    restarts = _restart_times(services, hours, pods)
    names = [f"svc{p // PATHS_PER_SERVICE:02d}-op{p % PATHS_PER_SERVICE}" for p in range(paths)]
    streams = {p for p in range(paths) if p % 10 == 9}
    steps = int(hours * 3600 / window_s)
    store = Store.open(path)
    try:
        batch: list[PathWindow] = []
        ep_batch: list[EndpointWindow] = []
        for k in range(steps):
            start = T0 + k * window_s
            for p, name in enumerate(names):
                s = p // PATHS_PER_SERVICE
                new = restarts[s] <= start
                for cohort, pods in ((OLD, ~new), (NEW, new)):
                    n_pods = int(pods.sum())
                    if not n_pods:
                        continue
                    batch.append(_window(rng, start, window_s, name, p, cohort, n_pods,
                                         p in streams))
                    calls = int(window_s)
                    # Each pod's calls' latency and attempts, as the probe writes them.
                    slow = 1.5 if (cohort == NEW and p == REGRESS["latency"]) else 1.0
                    retry = 0.3 if (cohort == NEW and p == REGRESS["retries"]) else 0.02
                    buckets = index_of(rng.lognormal(np.log(0.02), 0.4, (n_pods, calls)) * slow)
                    for row, j in enumerate(np.flatnonzero(pods)):
                        worst = p == REGRESS["errors"] and cohort == NEW and j == 0
                        bad = 0.3 if worst else 0.001
                        pod = f"{name.split('-')[0]}-{j}" + ("-n" if cohort == NEW else "")
                        ids, counts = np.unique(buckets[row], return_counts=True)
                        ep_batch.append(EndpointWindow(
                            start, name, pod, cohort, calls, int(rng.binomial(calls, bad)),
                            {"pod": pod, "namespace": f"ns-{s:02d}", "proxy_version": cohort},
                            attempts_sum=calls + int(rng.binomial(calls, retry)),
                            attempts_count=calls,
                            latency=dict(zip(ids.tolist(), counts.tolist(), strict=True)),
                        ))
            if len(batch) >= 2000 or k == steps - 1:
                store.write(batch, ep_batch)
                batch, ep_batch = [], []
        _events_and_inventory(store, restarts, names, streams, hours, rng)
    finally:
        store.close()


def _window(rng: np.random.Generator, start: float, length: float, name: str, p: int,
            cohort: str, pods: int, streams: bool) -> PathWindow:
    n = int(rng.poisson(length * pods))
    new = cohort == NEW
    err = 0.021 if (new and p == REGRESS["errors"]) else 0.001
    scale = 1.5 if (new and p == REGRESS["latency"]) else 1.0
    retry = 0.3 if (new and p == REGRESS["retries"]) else 0.02
    e = int(rng.binomial(n, err))
    lat = rng.lognormal(np.log(0.02), 0.4, n) * scale
    hist = np.bincount(index_of(lat), minlength=BUCKET_COUNT)
    kw: dict = {}
    if streams:
        rate = 30.0 if (new and p == REGRESS["resets"]) else 1.0
        seconds = length * pods
        kw.update(streams_opened=int(rng.poisson(0.01 * pods)), stream_seconds=seconds,
                  stream_resets={"goaway": int(rng.poisson(rate * seconds / 3600))})
    return PathWindow(
        start=start, length=length, path=name, cohort=cohort,
        outcomes={"ok": n - e, "http_5xx": e}, latency=tuple(hist.tolist()),
        attempts_sum=n + int(rng.binomial(n, retry)), attempts_count=n, **kw,
    )


def _events_and_inventory(store: Store, restarts: np.ndarray, names: list[str],
                          streams: set[int], hours: float, rng: np.random.Generator) -> None:
    events = [
        Event("restart", float(t), endpoint=f"svc{s:02d}-{j}",
              detail={"namespace": f"ns-{s:02d}", "to": NEW})
        for (s, j), t in np.ndenumerate(restarts) if np.isfinite(t)
    ]
    storm_path = names[REGRESS["resets"]] if REGRESS["resets"] < len(names) else names[-1]
    for h in (0.3, 0.55, 0.8):
        events.append(Event("storm", T0 + hours * 3600 * h, path=storm_path, cohort=NEW,
                            detail={"resets": 40, "endpoints_count": 3}))
    store.write_events(events)
    services = restarts.shape[0]
    for at in np.arange(T0, T0 + hours * 3600, 300.0):
        rows = []
        for s in range(services):
            new = int((restarts[s] <= at).sum())
            for version, pods in ((OLD, restarts.shape[1] - new), (NEW, new)):
                if pods:
                    rows.append(InventoryRow(f"ns-{s:02d}", f"svc{s:02d}", version, pods,
                                             float(rng.uniform(60, 86400))))
        store.write_inventory(float(at), rows)


def _regressed(paths: int) -> list[str]:
    """The paths built to regress (those that exist with this many paths)."""
    return [f"svc{p // PATHS_PER_SERVICE:02d}-op{p % PATHS_PER_SERVICE}"
            for p in REGRESS.values() if p < paths]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 h instead of 24 h")
    ap.add_argument("--hours", type=float)
    ap.add_argument("--paths", type=int, default=50)
    ap.add_argument("--window", type=float, default=10.0, help="window length, seconds")
    ap.add_argument("--budget", type=float, default=10.0, help="seconds the report may take")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "skewprobe-bench"))
    args = ap.parse_args(argv)
    hours = args.hours or (6.0 if args.quick else 24.0)
    if hours <= 0 or args.paths < 1 or args.window <= 0:
        print("report_speed: --hours, --paths and --window must be positive", file=sys.stderr)
        return 2
    os.makedirs(args.cache, exist_ok=True)
    db = store_file(args.cache, hours, args.paths, args.window)
    if not os.path.exists(db):
        t = time.perf_counter()
        tmp = db + ".building"
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(tmp + suffix):
                os.remove(tmp + suffix)
        build(tmp, hours=hours, paths=args.paths, window_s=args.window)
        os.replace(tmp, db)
        print(f"built {db} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="skewprobe-report-bench-") as out:
        cmd = [sys.executable, "-m", "probes.cli.report", "--store", db,
               "--from", rfc3339(T0), "--to", rfc3339(T0 + hours * 3600), "--out", out]
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        ok = proc.returncode == 0
        figures: dict = {}
        if ok:
            report = json.loads(Path(out, "report.json").read_text())
            diverged = [p["path"] for p in report["paths"] if p.get("first_divergence")]
            html_mb = Path(out, "report.html").stat().st_size / 1e6
            figures = {"diverged": diverged, "html_mb": round(html_mb, 1)}
            ok = wall <= args.budget and sorted(diverged) == sorted(_regressed(args.paths))
        else:
            print(proc.stderr.strip()[-2000:], file=sys.stderr)
    print("| store | report wall time | peak RSS | HTML | paths diverged |")
    print("|---|---|---|---|---|")
    print(f"| {hours:g} h x {args.paths} paths, {args.window:g} s windows "
          f"({os.path.getsize(db) / 1e6:.0f} MB) | {wall:.1f} s (budget {args.budget:g} s) "
          f"| {peak_mb:.0f} MB | {figures.get('html_mb', '-')} MB "
          f"| {', '.join(figures.get('diverged', [])) or '-'} |")
    bulk = hasattr(Store, "read_endpoint_totals")
    shown = " ".join(cmd[1:]).replace(out, "DIR")
    print(f"\n`{shown}`; endpoint sums "
          + ("in SQLite (Store.read_endpoint_totals)" if bulk else
             "in Python (this Store has no read_endpoint_totals: slower)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
