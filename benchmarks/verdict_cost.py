"""How long one verdict takes on a store holding a day of a rollout, phase by phase.

Uses the store `benchmarks/report_speed.py` builds (24 h × 50 paths of 10 s windows, six
pods per path with their endpoint windows; cached) and times, in this process, what
`skewprobe verdict --store` does: read the path windows, read the endpoint windows (the
pods × windows grids of the pod-level success rate), and judge. Median of `--repeat` runs.

    .venv/bin/python benchmarks/verdict_cost.py            # 24 h x 50 paths
    .venv/bin/python benchmarks/verdict_cost.py --quick    # 6 h x 50 paths
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from report_speed import NEW, OLD, T0, build  # noqa: E402

from probes.store import Store  # noqa: E402
from probes.verdict import judge  # noqa: E402
from probes.verdict_service import JudgingSettings, _pod_grids, compute_verdict  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 h instead of 24 h")
    ap.add_argument("--paths", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "skewprobe-bench"))
    args = ap.parse_args()
    hours = 6.0 if args.quick else 24.0
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    db = str(Path(args.cache) / f"report-{hours:g}h-{args.paths}p-10s.db")
    if not Path(db).exists():
        print(f"building {db} ...", flush=True)
        build(db, hours=hours, paths=args.paths, window_s=10.0)
    now = T0 + hours * 3600
    settings = JudgingSettings()
    phases: dict[str, list[float]] = {"read path windows": [], "read endpoint windows + grids": [],
                                      "judge": [], "compute_verdict (all of it)": []}
    for _ in range(args.repeat):
        with Store.open(db, readonly=True) as store:
            since = store.first_window(NEW)
            t = time.perf_counter()
            table = store.read_table(since=since)
            phases["read path windows"].append(time.perf_counter() - t)
            t = time.perf_counter()
            grids = _pod_grids(store, since, now, None, settings.warmup_s,
                               window_s=settings.window_s)
            phases["read endpoint windows + grids"].append(time.perf_counter() - t)
            t = time.perf_counter()
            judge(table, now=now, baseline=OLD, canary=NEW, since=since, pods=grids)
            phases["judge"].append(time.perf_counter() - t)
        t = time.perf_counter()
        result = compute_verdict(db, settings, baseline=OLD, canary=NEW, now=now,
                                 overload=None)
        phases["compute_verdict (all of it)"].append(time.perf_counter() - t)
    pods = sum(1 for p in result["paths"] if "pods" in p["metrics"].get("success_rate", {}))
    print(f"{hours:g} h x {args.paths} paths, six pods each; verdict {result['verdict']}, "
          f"{pods} paths judged per pod; median of {args.repeat}")
    for name, times in phases.items():
        print(f"  {name}: {statistics.median(times):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
