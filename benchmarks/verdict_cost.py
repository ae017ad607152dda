"""How long one verdict takes on a store holding a day of a rollout, phase by phase: cold
(`skewprobe verdict --store`, a fresh process) and warm (the running probe's `GET /verdict`
and `/gate`, through its verdict cache, after one more window arrived).

Uses the store `benchmarks/report_speed.py` builds (24 h × 50 paths of 10 s windows, six
pods per path unless `--pods` says otherwise, with their endpoint windows; cached), as
the current schema keeps it: a copy of the newest cached older file, migrated (endpoint and
path windows rolled up per minute) once and cached beside it, the migration's CPU said.
Each figure is the median of `--repeat`:

- cold, in a fresh Python process per repeat (modules imported, the file in the page cache,
  nothing of the store in memory): read the path windows, read the endpoint windows into
  the pods × strata grids, judge, and all of `compute_verdict`; and the wall time, CPU and
  peak RSS of the whole `skewprobe verdict --store ... --json` command (interpreter and
  imports included);
- the running probe's first verdict after a restart (a fresh process, a new `VerdictCache`
  filled from the store): CPU and peak RSS;
- warm, on a copy of the store: a `VerdictCache` reads it once (the running probe's first
  verdict), then one more window is written (the last window's rows again, 10 s later, as
  the probe writes them) before each timed verdict: the same phases through the cache;
  then a verdict after each of `--windows` windows in a row, as the running probe asks
  (its once-a-minute work included): median, mean and max CPU.

    .venv/bin/python benchmarks/verdict_cost.py                  # 24 h x 50 paths x 6 pods
    .venv/bin/python benchmarks/verdict_cost.py --quick          # 6 h x 50 paths
    .venv/bin/python benchmarks/verdict_cost.py --pods 6,12,50   # one run per pod count
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

from report_speed import NEW, OLD, PODS, T0, build, store_file  # noqa: E402

from probes._parsing import rfc3339  # noqa: E402
from probes.spec import JudgingSettings  # noqa: E402
from probes.store import SCHEMA_VERSION, Store  # noqa: E402
from probes.verdict.cache import VerdictCache  # noqa: E402
from probes.verdict.judge import judge  # noqa: E402
from probes.verdict.service import (  # noqa: E402
    _pod_grids,
    _PooledStore,
    compute_verdict,
)

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


def _peak_mb() -> float:
    """This process's own peak RSS: its memory's high-water mark (`VmHWM`, KiB), not
    `ru_maxrss`, which a child started by a large parent (one that built a store) inherits
    through fork and exec."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def cold(db: str, now: float) -> dict[str, Any]:
    """One fresh-process measurement (run as `--cold DB NOW` in a child)."""
    settings = JudgingSettings()

    @contextlib.contextmanager
    def opened() -> Any:
        # As `skewprobe verdict --store` reads it: the path windows pooled range by range.
        with Store.open(db, readonly=True) as store:
            yield _PooledStore(store, ())

    out = phases(now, settings, opened, lambda: compute_verdict(
        db, settings, baseline=OLD, canary=NEW, now=now, overload=None))
    return {**out, "peak MB": _peak_mb()}


def first(db: str, now: float) -> dict[str, Any]:
    """A restarted probe's first verdict, which fills its cache from the store (run as
    `--first DB NOW` in a child): CPU seconds and peak RSS."""
    c = time.process_time()
    compute_verdict(db, JudgingSettings(), baseline=OLD, canary=NEW, now=now, overload=None,
                    cache=VerdictCache(db))
    return {"cpu": time.process_time() - c, "peak MB": _peak_mb()}


# The whole command in a child that reports its own peak RSS (on stderr, as it exits).
_COMMAND = ("import atexit, runpy, sys; atexit.register(lambda: print('PEAK_KB', next("
            "int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:')),"
            " file=sys.stderr));"
            " sys.argv = ['skewprobe', *sys.argv[1:]]; runpy.run_module('probes.cli',"
            " run_name='__main__')")


def next_window(store: Store, start: float, window_s: float) -> None:
    """The windows of `start` written again at `start + window_s`, as the probe writes one."""
    paths = store.read_windows(since=start, until=start + 1)
    cells = store.read_endpoint_windows(since=start, until=start + 1)
    store.write([dataclasses.replace(w, start=w.start + window_s) for w in paths],
                [dataclasses.replace(e, start=e.start + window_s) for e in cells])


def warm(db: str, now: float, repeat: int, windows: int,
         ) -> tuple[float, list[dict[str, Any]], list[float]]:
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
            # The probe's own pattern: a verdict after every window, seals and once-a-minute
            # work included, so the mean is what a window's verdict costs.
            every: list[float] = []
            for _ in range(windows):
                next_window(writer, now - w, w)
                now += w
                clock = _Clock()
                compute_verdict(copy, settings, baseline=OLD, canary=NEW, now=now,
                                overload=None, cache=cache)
                every.append(clock.lap()[1])
        cache.close()
    return first, runs, every


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 h instead of 24 h")
    ap.add_argument("--hours", type=float, help="hours of windows (24, or 6 with --quick)")
    ap.add_argument("--paths", type=int, default=50)
    ap.add_argument("--pods", default=str(PODS),
                    help="pods per path, comma-separated for one run each (6,12,50)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-warm", action="store_true", help="the cold figures only")
    ap.add_argument("--windows", type=int, default=36,
                    help="warm: verdicts asked after each of this many windows in a row")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "skewprobe-bench"))
    ap.add_argument("--cold", nargs=2, metavar=("DB", "NOW"), help=argparse.SUPPRESS)
    ap.add_argument("--first", nargs=2, metavar=("DB", "NOW"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold or args.first:
        db, now = args.cold or args.first
        print(json.dumps((cold if args.cold else first)(db, float(now))))
        return 0
    hours = args.hours or (6.0 if args.quick else 24.0)
    for pods in (int(p) for p in args.pods.split(",")):
        run(args, hours, pods)
    return 0


def _versions(v2: str) -> list[str]:
    """The cached copies of the store `v2` under each schema, the current one first: a
    newer copy is read as it is, so the v2 file is built only when none is cached."""
    return [v2.replace("report-v2-", f"report-v{v}-") for v in range(SCHEMA_VERSION, 1, -1)]


def migrated(v2: str) -> str:
    """The current schema's copy of the cached store `v2` (report_speed's files are v2),
    made once from the newest older copy cached (migrated, then rolled up at once): the
    older files stay as they are for code that reads them."""
    current, *older = _versions(v2)
    if not Path(current).exists():
        source = next((p for p in older if Path(p).exists()), v2)
        shutil.copy(source, current + ".migrating")
        t, c = time.perf_counter(), time.process_time()
        with Store.open(current + ".migrating") as store:  # migrated, then rolled up at once
            store.roll_up()
        print(f"migrated {Path(source).name} to schema v{SCHEMA_VERSION}:"
              f" {time.process_time() - c:.1f} s CPU, {time.perf_counter() - t:.1f} s wall",
              flush=True)
        Path(current + ".migrating").replace(current)
    return current


def run(args: argparse.Namespace, hours: float, pods: int) -> None:
    """The figures for one store: `hours` × `args.paths` paths × `pods` pods per path."""
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    db = store_file(args.cache, hours, args.paths, 10.0, pods)
    if not any(Path(p).exists() for p in _versions(db)):
        print(f"building {db} ...", flush=True)
        Path(db + ".building").unlink(missing_ok=True)  # a build cut short before
        build(db + ".building", hours=hours, paths=args.paths, window_s=10.0, pods=pods)
        Path(db + ".building").replace(db)
    db = migrated(db)
    now = T0 + hours * 3600
    colds: list[dict[str, Any]] = []
    walls: list[tuple[float, float, float]] = []
    firsts: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        out = subprocess.run([sys.executable, __file__, "--cold", db, repr(now)],
                             capture_output=True, text=True, check=True)
        colds.append(json.loads(out.stdout))
        t, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        cmd = subprocess.run([sys.executable, "-c", _COMMAND, "verdict", "--store", db,
                              "--baseline", OLD, "--canary", NEW, "--at", rfc3339(now),
                              "--json"], capture_output=True, text=True, check=False, cwd=REPO)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak = [line.split()[1] for line in cmd.stderr.splitlines()
                if line.startswith("PEAK_KB")]
        walls.append((time.perf_counter() - t, after.ru_utime + after.ru_stime
                      - before.ru_utime - before.ru_stime,
                      int(peak[-1]) / 1024 if peak else float("nan")))
        out = subprocess.run([sys.executable, __file__, "--first", db, repr(now)],
                             capture_output=True, text=True, check=True)
        firsts.append(json.loads(out.stdout))
    judged = int(colds[0]["paths judged per pod"])
    print(f"{hours:g} h x {args.paths} paths, {pods} pods each, store "
          f"{Path(db).stat().st_size / 1e6:.0f} MB, {judged} paths judged per pod; "
          f"median of {args.repeat}")
    warms: list[dict[str, Any]] = []
    if not args.no_warm:
        started, warms, every = warm(db, now, args.repeat, args.windows)
    print(f"  {'phase':34s} {'cold wall':>10s} {'cold CPU':>10s} {'warm wall':>10s} "
          f"{'warm CPU':>10s}")
    for name in PHASES:
        cells = [statistics.median(r[name][k] for r in runs) * 1000
                 for runs in (colds, warms) if runs for k in (0, 1)]
        print(f"  {name:34s}" + "".join(f" {x:7.1f} ms" for x in cells))
    print(f"  cold phases in one process: peak RSS "
          f"{statistics.median(r['peak MB'] for r in colds):.0f} MB")
    print(f"  skewprobe verdict --store (the whole command, cold): "
          f"{statistics.median(w for w, _, _ in walls):.2f} s wall, "
          f"{statistics.median(c for _, c, _ in walls):.2f} s CPU, peak RSS "
          f"{statistics.median(m for _, _, m in walls):.0f} MB")
    print(f"  the running probe's first verdict after a restart (fills its cache): "
          f"{statistics.median(f['cpu'] for f in firsts):.2f} s CPU, peak RSS "
          f"{statistics.median(f['peak MB'] for f in firsts):.0f} MB")
    if not args.no_warm:
        print(f"  the first verdict of the warm copy's cache (wall): {started:.2f} s")
        print(f"  warm, a verdict after each of {len(every)} windows in a row (CPU): median "
              f"{statistics.median(every) * 1000:.1f} ms, mean "
              f"{statistics.fmean(every) * 1000:.1f} ms, max {max(every) * 1000:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
