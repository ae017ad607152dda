"""How long one verdict takes on a store holding a day of a rollout, phase by phase: cold
(`skewprobe verdict --store`, a fresh process) and warm (the running probe's `GET /verdict`
and `/gate`, through its verdict cache, after one more window arrived).

Uses the store `benchmarks/report_speed.py` builds (24 h × 50 paths of 10 s windows, six
pods per path with their endpoint windows; cached). Each figure is the median of `--repeat`:

- cold, in a fresh Python process per repeat (modules imported, the file in the page cache,
  nothing of the store in memory): read the path windows, read the endpoint windows into
  the pods × strata grids, judge, and all of `compute_verdict`; and the wall time of the
  whole `skewprobe verdict --store ... --json` command (interpreter and imports included);
- warm, on a copy of the store: a `VerdictCache` reads it once (the running probe's first
  verdict), then one more window is written (the last window's rows again, 10 s later, as
  the probe writes them) before each timed verdict: the same phases through the cache.

    .venv/bin/python benchmarks/verdict_cost.py            # 24 h x 50 paths
    .venv/bin/python benchmarks/verdict_cost.py --quick    # 6 h x 50 paths
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from report_speed import NEW, OLD, T0, build, store_file  # noqa: E402

from probes._timeparse import rfc3339  # noqa: E402
from probes.store import Store  # noqa: E402
from probes.verdict import judge  # noqa: E402
from probes.verdict_cache import VerdictCache  # noqa: E402
from probes.verdict_service import JudgingSettings, _pod_grids, compute_verdict  # noqa: E402

PHASES = ("read path windows", "read endpoint windows + grids", "judge",
          "compute_verdict (all of it)")


class _Clock:
    """Wall and CPU seconds since the last `lap`: on a machine shared with other work the
    CPU time is what a verdict costs, the wall time what a gate waits."""

    def __init__(self) -> None:
        self.t, self.c = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        out = (t - self.t, c - self.c)
        self.t, self.c = t, c
        return out


def phases(now: float, settings: JudgingSettings, opened: Callable[[], Any],
           verdict: Callable[[], Any], before: Callable[[], None] = lambda: None,
           ) -> dict[str, Any]:
    """The phases of one verdict from the source `opened()` gives, then `before()` (not
    timed) and `verdict()`: (wall, CPU) seconds each."""
    out: dict[str, Any] = {}
    clock = _Clock()
    with opened() as src:
        since = src.first_window(NEW)
        until = now - settings.window_s + 1e-6
        table = src.read_table(since=since, until=until)
        out[PHASES[0]] = clock.lap()
        grids = _pod_grids(src, since, until, None, settings.warmup_s,
                           window_s=settings.window_s)
        out[PHASES[1]] = clock.lap()
        # Warm, the pod-level sums the cache keeps between verdicts, as `compute_verdict`.
        memos = getattr(src, "track_memo", None)
    judge(table, now=now, baseline=OLD, canary=NEW, since=since, pods=grids, memos=memos)
    out[PHASES[2]] = clock.lap()
    before()
    clock = _Clock()
    result = verdict()
    out[PHASES[3]] = clock.lap()
    out["paths judged per pod"] = sum(
        1 for p in result["paths"] if "pods" in p["metrics"].get("success_rate", {}))
    return out


def cold(db: str, now: float) -> dict[str, Any]:
    """One fresh-process measurement (run as `--cold DB NOW` in a child)."""
    settings = JudgingSettings()

    @contextlib.contextmanager
    def opened() -> Any:
        with Store.open(db, readonly=True) as store:
            yield store

    return phases(now, settings, opened, lambda: compute_verdict(
        db, settings, baseline=OLD, canary=NEW, now=now, overload=None))


def next_window(store: Store, start: float, window_s: float) -> None:
    """The windows of `start` written again at `start + window_s`, as the probe writes one."""
    paths = store.read_windows(since=start, until=start + 1)
    cells = store.read_endpoint_windows(since=start, until=start + 1)
    store.write([dataclasses.replace(w, start=w.start + window_s) for w in paths],
                [dataclasses.replace(e, start=e.start + window_s) for e in cells])


def warm(db: str, now: float, repeat: int) -> tuple[float, list[dict[str, Any]]]:
    settings = JudgingSettings()
    w = settings.window_s
    with tempfile.TemporaryDirectory() as tmp:
        copy = str(Path(tmp) / "probe.db")
        shutil.copy(db, copy)
        cache = VerdictCache(copy)
        t = time.perf_counter()
        compute_verdict(copy, settings, baseline=OLD, canary=NEW, now=now, overload=None,
                        cache=cache)
        first = time.perf_counter() - t
        runs = []
        with Store.open(copy) as writer:
            for _ in range(repeat):
                # One window for the phases, one more for compute_verdict: each is asked
                # after a window arrived, as the probe asks after every window.
                next_window(writer, now - w, w)
                now += w

                def cached(now: float = now) -> Any:
                    return compute_verdict(copy, settings, baseline=OLD, canary=NEW,
                                           now=now, overload=None, cache=cache)

                @contextlib.contextmanager
                def opened(now: float = now) -> Any:
                    with cache.open():
                        yield cache.source((), warmup_s=settings.warmup_s)

                runs.append(phases(now, settings, opened, lambda now=now: cached(now + w),
                                   lambda now=now: next_window(writer, now - w, w)))
                now += w
        cache.close()
    return first, runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 h instead of 24 h")
    ap.add_argument("--paths", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "skewprobe-bench"))
    ap.add_argument("--cold", nargs=2, metavar=("DB", "NOW"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold:
        print(json.dumps(cold(args.cold[0], float(args.cold[1]))))
        return 0
    hours = 6.0 if args.quick else 24.0
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    db = store_file(args.cache, hours, args.paths, 10.0)
    if not Path(db).exists():
        print(f"building {db} ...", flush=True)
        Path(db + ".building").unlink(missing_ok=True)  # a build cut short before
        build(db + ".building", hours=hours, paths=args.paths, window_s=10.0)
        Path(db + ".building").replace(db)
    now = T0 + hours * 3600
    colds: list[dict[str, Any]] = []
    walls: list[tuple[float, float]] = []
    for _ in range(args.repeat):
        out = subprocess.run([sys.executable, __file__, "--cold", db, repr(now)],
                             capture_output=True, text=True, check=True)
        colds.append(json.loads(out.stdout))
        t, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "probes.cli", "verdict", "--store", db,
                        "--baseline", OLD, "--canary", NEW, "--at", rfc3339(now), "--json"],
                       capture_output=True, check=False, cwd=REPO)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append((time.perf_counter() - t, after.ru_utime + after.ru_stime
                      - before.ru_utime - before.ru_stime))
    first, warms = warm(db, now, args.repeat)
    pods = int(colds[0]["paths judged per pod"])
    print(f"{hours:g} h x {args.paths} paths, six pods each, {pods} paths judged per pod; "
          f"median of {args.repeat}")
    print(f"  {'phase':34s} {'cold wall':>10s} {'cold CPU':>10s} {'warm wall':>10s} "
          f"{'warm CPU':>10s}")
    for name in PHASES:
        cells = [statistics.median(r[name][k] for r in runs) * 1000
                 for runs in (colds, warms) for k in (0, 1)]
        print(f"  {name:34s}" + "".join(f" {x:7.1f} ms" for x in cells))
    print(f"  skewprobe verdict --store (the whole command, cold): "
          f"{statistics.median(w for w, _ in walls):.2f} s wall, "
          f"{statistics.median(c for _, c in walls):.2f} s CPU")
    print(f"  the running probe's first verdict (reads the store into its cache): {first:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
