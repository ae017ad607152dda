"""p99 on simulated estates: how often today's p99 test fails a healthy canary when pods differ.

The success rate takes the pod as the unit (`benchmarks/verdict_sim.py`); p99 is still judged on
each cohort's pooled histogram (`probes.stats.quantile.two_sample`, what `judge()` runs). This
measures what that costs on the same rollouts `verdict_sim.py` draws (12 pods, one restarting
into the canary every 10 minutes until 6 have, cohort-balanced sampling, 4 h, verdict after
every window, α = 1 % over four metric slots), with each call's latency lognormal (median
50 ms, σ 0.5: p99 ≈ 160 ms) times its pod instance's scale:

- independent: every pod alike (scale 1);
- latency spread: each pod instance draws its scale uniformly in 0.7–1.3 (±30 %), anew at a
  restart;
- cold start: a pod's first 2 minutes 1.5× slower (the verdict's warm-up does not apply to
  p99 today: the pooled histograms hold every call);
- one-pod canary (spread): the canary stuck at one pod instance for the whole run.

Reported per scenario: the A/A false-fail rate of p99 with its 95 % Clopper–Pearson upper
bound, and the median time of those false fails; the last row is an A/B control (every canary
call 1.5× slower), where every rollout should fail.

    .venv/bin/python benchmarks/p99_pods_sim.py                 # 300 rollouts per row
    .venv/bin/python benchmarks/p99_pods_sim.py --quick         # 30 rollouts per row
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verdict_sim import ALPHA, SLOTS, TOL, WINDOW_S, Estate, Scenario, cp_upper, simulate

from probes.measure.histogram import BUCKET_COUNT, LOWER, UPPER, index_of
from probes.stats import quantile

MEDIAN_S, SIGMA = 0.050, 0.5


@dataclass(frozen=True)
class LatencyScenario:
    name: str
    spread: float = 0.0  # pod instance scale uniform in 1 ± spread
    cold_factor: float = 1.0  # latency × this in a pod's first cold_s
    one_pod: bool = False
    canary_factor: float = 1.0  # A/B: every canary call this much slower


SCENARIOS = (
    LatencyScenario("independent"),
    LatencyScenario("latency spread ±30 %", spread=0.3),
    LatencyScenario("cold start ×1.5", cold_factor=1.5),
    LatencyScenario("one-pod canary (spread)", spread=0.3, one_pod=True),
    # A/B, the control that the test can fail at all: every canary call 1.5× slower.
    LatencyScenario("A/B: canary ×1.5 (spread)", spread=0.3, canary_factor=1.5),
)


def histograms(rng: np.random.Generator, n: np.ndarray, canary: np.ndarray, starts: np.ndarray,
               est: Estate, sc: LatencyScenario) -> tuple[np.ndarray, np.ndarray]:
    """Per window, each cohort's latency histogram (windows × BUCKET_COUNT)."""
    inst, windows = n.shape
    scale = 1.0 + rng.uniform(-sc.spread, sc.spread, inst)
    t0 = np.arange(windows) * WINDOW_S
    cold = (t0[None, :] < starts[:, None] + est.cold_s) & (starts[:, None] > 0)
    factor = (scale[:, None] * np.where(cold, sc.cold_factor, 1.0)
              * np.where(canary, sc.canary_factor, 1.0)[:, None])
    counts = n.astype(np.int64).ravel()
    cell = np.repeat(np.arange(counts.size), counts)
    x = rng.lognormal(math.log(MEDIAN_S), SIGMA, cell.size) * factor.ravel()[cell]
    bucket = index_of(x)
    window = cell % windows
    out = []
    for mine in (~canary, canary):
        keep = mine.repeat(windows)[cell]
        flat = window[keep] * BUCKET_COUNT + bucket[keep]
        out.append(np.bincount(flat, minlength=windows * BUCKET_COUNT)
                   .reshape(windows, BUCKET_COUNT))
    return out[0], out[1]


def p99_fails(hb: np.ndarray, hc: np.ndarray, log_thr: float, chunk: int = 90) -> np.ndarray:
    """Fail flags per look of the pooled p99 test on the cumulative histograms, as judge()
    runs it (cropped to the buckets used)."""
    used = np.flatnonzero((hb.sum(0) + hc.sum(0)) > 0)
    lo, hi = max(0, int(used.min()) - 1), min(BUCKET_COUNT, int(used.max()) + 2)
    layout = quantile.Layout.from_edges(LOWER[lo:hi], UPPER[lo:hi])
    # Per look, the pooled histogram so far as cumulative bucket counts (the last is n).
    cb = np.cumsum(np.cumsum(hb[:, lo:hi], axis=0), axis=1)
    cc = np.cumsum(np.cumsum(hc[:, lo:hi], axis=0), axis=1)
    both = (cb[:, -1] > 0) & (cc[:, -1] > 0)
    fails = []
    for a in range(0, cb.shape[0], chunk):
        t = quantile.two_sample(cb[a:a + chunk], cc[a:a + chunk], layout, 0.99,
                                TOL.latency_p99_ratio, TOL.latency_p99_margin_ms / 1000, log_thr)
        fails.append(t.log_e_fail >= log_thr)
    return np.concatenate(fails) & both


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261204)
    ap.add_argument("--balance", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="30 rollouts per row (make bench)")
    args = ap.parse_args()
    if args.quick:
        args.rollouts = 30
    est = Estate()
    log_thr = math.log(SLOTS / ALPHA)
    print(f"{args.rollouts} A/A rollouts per row; 12 pods × {est.rate_per_s:g}/s (balance up to"
          f" {args.balance:g}×), {est.hours:g} h, p99 tolerance ×{TOL.latency_p99_ratio:g}"
          f" + {TOL.latency_p99_margin_ms:g} ms, α = {ALPHA} over {SLOTS} slots")
    print("| scenario | p99 fails (95 % upper) | median time to the fail, min |")
    print("|---|---|---|")
    for sc in SCENARIOS:
        rng = np.random.default_rng([args.seed, SCENARIOS.index(sc)])
        layout_sc = Scenario(sc.name, one_pod=sc.one_pod)
        times = []
        for _ in range(args.rollouts):
            n, _s, _p, canary, starts = simulate(rng, est, layout_sc, 0.0, args.balance)
            hb, hc = histograms(rng, n, canary, starts, est, sc)
            hit = np.flatnonzero(p99_fails(hb, hc, log_thr))
            if hit.size:
                times.append((hit[0] + 1) * WINDOW_S / 60)
        k = len(times)
        when = f"{np.median(times):.1f}" if times else "–"
        print(f"| {sc.name} | {100 * k / args.rollouts:.1f} % "
              f"({100 * cp_upper(k, args.rollouts):.1f} %) | {when} |", flush=True)


if __name__ == "__main__":
    main()
