"""Storms: the reconnect-storm detector on simulated reset times, over many seeds.

The product claim (issue 4): a rollout restarting 20 % of 500 stream-holding pods at once is
flagged within one window; a steady reset rate of the same total spread over an hour is not.
This runs the detector itself (`probes.streams.storm.find_storms`, the pure function the
online `StormDetector` in `skewprobe run` is tested equal to) with its default `StormParams`
on simulated reset times; no processes, one core:

1. **Burst**: streams observed for `--history` seconds with a steady background of
   `--background` pod resets per hour, then `--fraction` of `--pods` pods restart at once
   (each pod's `--per-endpoint` streams share a connection and end together; the pods' drains
   end within `--spread` seconds of each other). Per seed: is it flagged, with how many
   endpoints and resets, and the detection delay: the first time t at which
   `find_storms(resets up to t, until=t)` reports it, from the first reset of the batch
   (found by bisection: once reported, a storm stays reported). `skewprobe run` writes
   storms at each window flush, so the store has it at most one window (+ grace) later.
   The same for shorter histories (a probe that started recently: the steady-rate bound is
   wider, so a cluster must be larger). Exit 1 unless every batch is flagged, whole, within
   one window.
2. **Spread**: the same restarts (same pods, same resets) at uniformly random times over an
   hour, and evenly spaced over the hour: any storm is a false one.
3. **Steady rate**: Poisson pod resets at several rates for `--steady-hours` per seed, from the
   probe's start (short history included): false storms per hour, with a 95 % upper bound.

    .venv/bin/python benchmarks/storms.py              # 200 / 500 / 200 seeds
    .venv/bin/python benchmarks/storms.py --quick      # 40 / 100 / 20 seeds
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h

from probes.streams.storm import ResetMark, Storm, StormParams, find_storms

HOUR = 3600.0
PARAMS = StormParams()


@dataclass(frozen=True)
class Burst:
    flagged: bool
    delay_s: float
    stored_s: float
    endpoints: int
    resets: int
    restarted_in_storm: int
    false_storms: int


def steady(rng: random.Random, pods: list[str], per_hour: float, start: float, end: float,
           per_endpoint: int) -> list[ResetMark]:
    """Poisson pod resets (pods at random), each ending the pod's streams together."""
    out: list[ResetMark] = []
    t = start
    if per_hour <= 0:
        return out
    while True:
        t += rng.expovariate(per_hour / HOUR)
        if t >= end:
            return out
        pod = rng.choice(pods)
        out += [ResetMark(t, pod, "goaway")] * per_endpoint


def batch(rng: random.Random, restarted: list[str], at: float, spread_s: float,
          per_endpoint: int) -> list[ResetMark]:
    """Pods drained together: each pod's streams end at one instant in [at, at + spread]."""
    out: list[ResetMark] = []
    for pod in restarted:
        t = at + rng.uniform(0.0, spread_s)
        out += [ResetMark(t, pod, "goaway")] * per_endpoint
    return out


def _storms_until(marks: list[ResetMark], t: float) -> list[Storm]:
    seen = [m for m in marks if m.at <= t]
    return find_storms(seen, observed_from=0.0, until=t, params=PARAMS)


def _first_flag(marks: list[ResetMark], lo: float, hi: float,
                is_burst: Callable[[Storm], bool]) -> float | None:
    """The earliest t in [lo, hi] at which the burst's storm is reported (to 1 ms)."""
    if not any(is_burst(s) for s in _storms_until(marks, hi)):
        return None
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        if any(is_burst(s) for s in _storms_until(marks, mid)):
            hi = mid
        else:
            lo = mid
    return hi


def burst_run(seed: int, args: argparse.Namespace, history_s: float) -> Burst:
    rng = random.Random(seed)
    pods = [f"pod-{i}" for i in range(args.pods)]
    restarted = rng.sample(pods, round(args.fraction * args.pods))
    # A random phase against the probe's window boundaries (its flushes).
    at = history_s + rng.uniform(0.0, args.window)
    end = at + 120.0
    marks = steady(rng, pods, args.background, 0.0, end, args.per_endpoint)
    marks += batch(rng, restarted, at, args.spread, args.per_endpoint)
    marks.sort()
    first = min(m.at for m in marks if m.at >= at and m.endpoint in set(restarted))
    wanted = set(restarted)

    def is_burst(s: Storm) -> bool:
        return s.start >= at - PARAMS.bucket_s and len(wanted & set(s.endpoints)) > 0

    storms = find_storms(marks, observed_from=0.0, until=end, params=PARAMS)
    mine = [s for s in storms if is_burst(s)]
    false = len(storms) - len(mine)
    if not mine:
        return Burst(False, math.nan, math.nan, 0, 0, 0, false)
    flag_at = _first_flag(marks, first, end, is_burst)
    assert flag_at is not None
    # `skewprobe run` polls the detector at each window boundary (then + grace) and writes
    # the storms it gets to the store.
    stored_at = math.ceil(flag_at / args.window) * args.window
    return Burst(
        True, flag_at - first, stored_at - first, sum(len(s.endpoints) for s in mine),
        sum(s.resets for s in mine), len(wanted & {e for s in mine for e in s.endpoints}),
        false,
    )


def _q(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def burst_table(args: argparse.Namespace) -> tuple[str, bool]:
    rows = []
    ok = True
    for history in args.histories:
        runs = [burst_run(seed, args, history) for seed in range(args.burst_seeds)]
        flagged = [r for r in runs if r.flagged]
        delays = [r.delay_s for r in flagged]
        stored = [r.stored_s for r in flagged]
        within = sum(d <= args.window for d in delays)
        restarted = round(args.fraction * args.pods)
        complete = sum(r.restarted_in_storm == restarted for r in flagged)
        rows.append([
            f"{history:g} s", len(runs), f"{len(flagged)}/{len(runs)}",
            f"{complete}/{len(flagged)}",
            f"{min((r.endpoints for r in flagged), default=0)}–"
            f"{max((r.endpoints for r in flagged), default=0)}",
            f"{min((r.resets for r in flagged), default=0)}–"
            f"{max((r.resets for r in flagged), default=0)}",
            f"{statistics.median(delays):.2f} / {_q(delays, 0.9):.2f} / {max(delays):.2f}"
            if delays else "-",
            f"{within}/{len(runs)}",
            f"{statistics.median(stored):.1f} / {max(stored):.1f}" if stored else "-",
            sum(r.false_storms for r in runs),
        ])
        ok = ok and within == len(runs) and complete == len(runs)
    header = [
        "history before the batch", "seeds", "flagged", "every restarted pod in it",
        "endpoints in storm", "resets in storm", "detector delay s: median / p90 / max",
        f"flagged within one {args.window:g} s window",
        "in the store after s (at the next flush, + grace): median / max",
        "false storms in the background",
    ]
    return h.md_table(header, rows), ok


def spread_table(args: argparse.Namespace) -> tuple[str, bool]:
    restarted_n = round(args.fraction * args.pods)
    random_storms = 0
    for seed in range(args.spread_seeds):
        rng = random.Random(10_000 + seed)
        pods = [f"pod-{i}" for i in range(args.pods)]
        marks: list[ResetMark] = []
        for pod in rng.sample(pods, restarted_n):
            t = rng.uniform(0.0, HOUR)
            marks += [ResetMark(t, pod, "goaway")] * args.per_endpoint
        marks.sort()
        random_storms += len(find_storms(marks, observed_from=0.0, until=HOUR + 60,
                                         params=PARAMS))
    step = HOUR / restarted_n
    even = sorted(ResetMark((i + 0.5) * step, f"pod-{i}", "goaway")
                  for i in range(restarted_n) for _ in range(args.per_endpoint))
    even_storms = len(find_storms(even, observed_from=0.0, until=HOUR + 60, params=PARAMS))
    rows = [
        [f"{restarted_n} restarts at uniform random times over 1 h", args.spread_seeds,
         restarted_n * args.per_endpoint, random_storms],
        [f"{restarted_n} restarts evenly spaced ({step:.0f} s apart) over 1 h", 1,
         restarted_n * args.per_endpoint, even_storms],
    ]
    table = h.md_table(["the same restarts, spread", "seeds", "resets per seed", "storms"], rows)
    return table, random_storms == 0 and even_storms == 0


def steady_table(args: argparse.Namespace) -> tuple[str, bool]:
    rows = []
    total = 0
    pods = [f"pod-{i}" for i in range(args.pods)]
    for rate in args.steady_rates:
        storms = 0
        resets = 0
        cpu0 = time.process_time()
        for seed in range(args.steady_seeds):
            rng = random.Random(20_000 + seed)
            end = args.steady_hours * HOUR
            marks = steady(rng, pods, rate, 0.0, end, args.per_endpoint)
            resets += len(marks)
            storms += len(find_storms(marks, observed_from=0.0, until=end + 60, params=PARAMS))
        cpu = time.process_time() - cpu0
        hours = args.steady_seeds * args.steady_hours
        # 95 % upper bound of a Poisson rate from `storms` events in `hours` (exact).
        upper = _poisson_upper(storms, 0.95) / hours
        rows.append([f"{rate:g}", f"{args.steady_seeds} × {args.steady_hours:g} h",
                     f"{resets:,}", storms, f"{storms / hours:.4f}", f"{upper:.4f}",
                     f"{1000 * cpu / hours:.1f}"])
        total += storms
    header = ["pod resets per hour", "seeds × hours", "stream resets", "false storms",
              "false storms per hour", "95 % upper bound per hour",
              "detector CPU ms per simulated hour"]
    return h.md_table(header, rows), total == 0


def _poisson_upper(k: int, level: float) -> float:
    """Exact upper confidence bound of a Poisson mean after k events."""
    from scipy.special import gammaincinv

    return float(gammaincinv(k + 1, level))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--fraction", type=float, default=0.2, help="pods restarted at once (0.2)")
    ap.add_argument("--per-endpoint", type=int, default=4, help="streams per pod (4)")
    ap.add_argument("--spread", type=float, default=1.0,
                    help="the batch's drains end within this many seconds (1)")
    ap.add_argument("--background", type=float, default=20.0,
                    help="steady pod resets per hour around the batch (20)")
    ap.add_argument("--histories", default="10,60,600,3600",
                    help="seconds observed before the batch, comma-separated")
    ap.add_argument("--window", type=float, default=10.0, help="the probe's window (10 s)")
    ap.add_argument("--burst-seeds", type=int, default=200)
    ap.add_argument("--spread-seeds", type=int, default=500)
    ap.add_argument("--steady-rates", default="60,600,3600",
                    help="pod resets per hour, comma-separated")
    ap.add_argument("--steady-seeds", type=int, default=200)
    ap.add_argument("--steady-hours", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true",
                    help="for run_all.py: 40 / 100 / 20 seeds, 1 h each")
    args = ap.parse_args(argv)
    if args.quick:
        args.burst_seeds, args.spread_seeds, args.steady_seeds = 40, 100, 20
        args.steady_hours = 1.0
    try:
        args.histories = [float(x) for x in args.histories.split(",")]
        args.steady_rates = [float(x) for x in args.steady_rates.split(",")]
    except ValueError:
        ap.error("--histories and --steady-rates are comma-separated numbers")
    if not 0 < args.fraction <= 1 or min(args.pods, args.per_endpoint) < 1:
        ap.error("need 0 < --fraction <= 1 and --pods, --per-endpoint >= 1")
    cmd = " ".join(["benchmarks/storms.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"## storms: {cmd}\n")
    p = PARAMS
    print(f"StormParams defaults: bucket {p.bucket_s:g} s, baseline {p.baseline_s:g} s, "
          f"min_endpoints {p.min_endpoints}, alpha {p.alpha:g}, confidence {p.confidence:g}, "
          f"max span {p.max_span_s:g} s\n")
    started = time.monotonic()
    restarted = round(args.fraction * args.pods)
    print(f"### 1. {restarted} of {args.pods} pods ({args.per_endpoint} streams each) "
          f"restarted at once (drains within {args.spread:g} s), "
          f"background {args.background:g} pod resets/h\n")
    burst, burst_ok = burst_table(args)
    print(burst)
    print(f"\nThe detector reports a storm once it has ended: one bucket ({p.bucket_s:g} s) "
          "after its last reset, so the delay is the drains' spread plus one bucket. A "
          "background reset within one bucket after the batch makes it judge one more "
          "bucket before it can say the storm is over (up to one more bucket of delay).")
    print("\n### 2. The same restarts spread over an hour\n")
    spread, spread_ok = spread_table(args)
    print(spread)
    print(f"\n### 3. False storms of a steady reset rate ({args.pods} pods, "
          f"{args.per_endpoint} streams each, from the probe's start)\n")
    steady_md, steady_ok = steady_table(args)
    print(steady_md)
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0 if burst_ok and spread_ok and steady_ok else 1


if __name__ == "__main__":
    sys.exit(main())
