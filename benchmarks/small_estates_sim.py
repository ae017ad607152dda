"""Small estates: wrong passes at the tolerance's boundary and at twice it, and healthy
passes, for the success rate and p99 with the pod as the unit, on estates of 2 to 12 pods.

Why. The pod-level test (`probes.stats.pods`) counts the spread between pods τ² as noise,
estimated from the pods. With few pods τ² is itself uncertain: a few pods that happen to
agree make it ≈ 0, and a canary pod that happens to be fast then passed a version beyond
the tolerance in several per cent of rollouts whatever α. `pods.few_pods_factor` allows for
τ²'s degrees of freedom; this measures what that buys and costs.

Each rollout draws its pods anew, so H0 is about the version's population of pods, not
the pods drawn. Every pod runs from the start (no ramp, no warm-up; `verdict_sim.py` and
`p99_pods_sim.py` have those on 12-pod estates), the canary's calls balanced to the
baseline's. A rollout passes when some look passes.

- Success rate (`pod_track`, ratio 1, tolerance +0.5 pp, α = 1 %, a look every 10
  windows of 60): the baseline's pods at 1 % errors and the canary's at 1.5 % (the
  boundary) or 2 % (twice the tolerance), each pod's rate × lognormal(σ) with mean 1;
  200 calls per baseline pod per window. The fail side likewise, every window: false fails
  within 1 h of a canary like the baseline or at the boundary, and how soon +1 pp and +3 pp
  fail.
- p99 (`pod_exceed`'s cuts and pass track, α/2 each, and `pod_profile`'s fail, as
  `pod_metrics` runs them): calls lognormal (median 50 ms, σ 0.5) × each pod's scale,
  uniform in 1 ± spread; the canary's pods × a factor putting the version's p99 at 1.001 ×
  the boundary ×1.2 + 5 ms of the baseline version's (its population's) p99, or ×1.25; 100
  calls per baseline pod per window, each pod's calls pooled over time, a look every 20
  windows of 240. The fail side on pods ±30 % apart at 50 calls/s per baseline pod: false
  fails of a canary like the baseline within 4 h, and how soon ×2 fails.

    .venv/bin/python benchmarks/small_estates_sim.py            # 1,000-1,500 rollouts per row
    .venv/bin/python benchmarks/small_estates_sim.py --quick    # 200 per row
    .venv/bin/python benchmarks/small_estates_sim.py --fails    # the fail side's tables alone
    .venv/bin/python benchmarks/small_estates_sim.py --every-look   # p99's fail, every window
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verdict_sim import cp_upper

from probes.measure.histogram import LOWER, UPPER, index_of
from probes.stats.pod_exceed import exceedance_cuts, pass_tracks
from probes.stats.pod_profile import profile_cuts, profile_fails, profile_input, profile_threshold
from probes.stats.pods import pod_track
from probes.stats.quantile import Layout

LAYOUT = Layout.from_edges(LOWER, UPPER)
MEDIAN_S, SIGMA = 0.050, 0.5
RATIO, MARGIN_S = 1.2, 0.005
# `--every-look` keeps the buckets from the median to 2 s (p99 is ~160 ms, ×2.4 at most
# here), the rest merged into the two ends: a look at every window then fits in memory.
_EVERY_LOOK_SPAN = (int(index_of(MEDIAN_S)), int(index_of(2.0)) + 1)
EVERY_LOOK_LAYOUT = Layout.from_edges(LOWER[slice(*_EVERY_LOOK_SPAN)],
                                      UPPER[slice(*_EVERY_LOOK_SPAN)])


@dataclass(frozen=True)
class RateRow:
    baseline: int
    canary: int
    spread: float  # σ of the lognormal pod factor on the error rate
    worse_pp: float  # the canary version's error rate above the baseline's 1 %
    rollouts: int
    additive_pp: float = 0.0  # else each pod's rate + normal(0, this) pp, alike in both cohorts


@dataclass(frozen=True)
class P99Row:
    baseline: int
    canary: int
    spread: float  # each pod's latency scale uniform in 1 ± spread (`lognormal`: its σ)
    alpha: float
    rollouts: int
    edge: float | None = 0.001  # the canary version's p99 at (1 + edge) × the boundary
    factor: float = 1.0  # else every canary call × this
    canary_spread: float | None = None  # the canary pods' own spread, else `spread`
    lognormal: bool = False  # pods' scales lognormal (median 1): now and then a slow node


def rate_passes(rng: np.random.Generator, row: RateRow, alpha: float = 0.01,
                windows: int = 60, calls: int = 200, every: int = 10, side: str = "pass"
                ) -> tuple[int, list[float]]:
    """Rollouts passed (or with `side` "fail", failed), and each one's first such window
    (inf: none)."""
    margin, log_thr = 0.005, math.log(1 / alpha)
    pods = row.baseline + row.canary
    is_canary = np.arange(pods) >= row.baseline
    n = np.where(is_canary, calls * row.baseline / row.canary, calls)[:, None] * np.ones(windows)
    first = []
    for _ in range(row.rollouts):
        scale = rng.lognormal(-row.spread ** 2 / 2, row.spread, pods)
        rates = np.where(is_canary, 0.01 + row.worse_pp / 100, 0.01) * scale
        if row.additive_pp:
            rates = np.where(is_canary, 0.01 + row.worse_pp / 100, 0.01) + rng.normal(
                0.0, row.additive_pp / 100, pods)
        s = rng.binomial(n.astype(np.int64), np.clip(rates, 0, 1)[:, None]).astype(float)
        track = pod_track(n, s, is_canary, 1.0, margin, log_threshold=log_thr)
        evidence = track.log_e_pass if side == "pass" else track.log_e_fail
        looks = np.flatnonzero(evidence[every - 1::every] >= log_thr)
        first.append(float((looks[0] + 1) * every) if looks.size else math.inf)
    return sum(math.isfinite(x) for x in first), first


def _bucket_probs(scale: float) -> np.ndarray:
    """Each histogram bucket's chance for a call lognormal(median × scale, σ)."""
    lo = np.log(np.maximum(LOWER, 1e-300) / (MEDIAN_S * scale)) / SIGMA
    hi = np.log(UPPER / (MEDIAN_S * scale)) / SIGMA
    p = norm.cdf(hi) - norm.cdf(lo)
    p[0], p[-1] = norm.cdf(hi[0]), 1.0 - norm.cdf(lo[-1])
    p = np.clip(p, 0.0, None)
    return p / p.sum()


def _population(spread: float, lognormal: bool) -> np.ndarray:
    """Evenly spaced quantiles of a version's pods' latency scales: uniform in 1 ± `spread`,
    or lognormal with median 1 and σ `spread`."""
    if spread <= 0:
        return np.array([1.0])
    u = (np.arange(2001) + 0.5) / 2001
    return np.exp(spread * norm.ppf(u)) if lognormal else 1 - spread + 2 * spread * u


def _mixture_p99(scales: np.ndarray) -> float:
    """The p99 of a version whose pods' scales are `scales`' population."""

    def below(x: float) -> float:
        return float(np.mean(norm.cdf(np.log(x / (MEDIAN_S * scales)) / SIGMA))) - 0.99

    return float(brentq(below, 1e-3, 10.0))


def _pods_drawn(rng: np.random.Generator, row: P99Row, calls: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One rollout's pods drawn anew: the canary flags, each pod's calls per window (the
    canary's balanced to the baseline's) and its latency scale (the version's factor in)."""
    spread_c = row.spread if row.canary_spread is None else row.canary_spread
    factor = row.factor
    if row.edge is not None:
        boundary = RATIO * _mixture_p99(_population(row.spread, row.lognormal)) + MARGIN_S
        factor = (1 + row.edge) * boundary / _mixture_p99(_population(spread_c, row.lognormal))
    pods = row.baseline + row.canary
    is_canary = np.arange(pods) >= row.baseline

    def draw(spread: float, k: int) -> np.ndarray:
        if row.lognormal:
            return rng.lognormal(0.0, spread, k)
        return 1 + rng.uniform(-spread, spread, k)

    per = np.where(is_canary, calls * row.baseline / row.canary, calls)
    scales = np.concatenate([draw(row.spread, row.baseline), draw(spread_c, row.canary) * factor])
    return is_canary, per, scales


def _p99_histograms(rng: np.random.Generator, row: P99Row, looks: Sequence[int], calls: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """One rollout's pods drawn anew: each pod's calls per bucket pooled over time at each
    look, after `looks` windows (looks, pods, buckets), and the canary flags."""
    is_canary, per, scales = _pods_drawn(rng, row, calls)
    pods = is_canary.size
    probs = [_bucket_probs(s) for s in scales]
    hist = np.zeros((pods, LAYOUT.size))
    out, done = [], 0
    for look in looks:
        for i in range(pods):
            hist[i] += rng.multinomial(round(per[i] * (look - done)), probs[i])
        done = look
        out.append(hist.copy())
    return np.array(out), is_canary


def _every_window(rng: np.random.Generator, row: P99Row, windows: int, calls: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`_p99_histograms` after every window, on `EVERY_LOOK_LAYOUT` (the buckets below and
    above it merged into its first and last): (windows, pods, buckets), the canary flags."""
    is_canary, per, scales = _pods_drawn(rng, row, calls)
    lo, hi = _EVERY_LOOK_SPAN
    hist = np.empty((windows, is_canary.size, hi - lo))
    for i, scale in enumerate(scales):
        p = _bucket_probs(scale)
        p = np.concatenate([[p[:lo + 1].sum()], p[lo + 1:hi - 1], [p[hi - 1:].sum()]])
        hist[:, i] = np.cumsum(rng.multinomial(round(per[i]), p / p.sum(), size=windows),
                               axis=0)
    return hist, is_canary


def _profile_fails(h: np.ndarray, is_canary: np.ndarray, alpha: float,
                   layout: Layout = LAYOUT) -> np.ndarray:
    """Whether `pod_profile`'s fail reaches its threshold at each look of `h` (looks, pods,
    buckets), as `pod_metrics` runs it."""
    cum_b = np.cumsum(h[:, ~is_canary].sum(axis=1), axis=-1)
    profile = profile_cuts(cum_b, np.cumsum(h[:, is_canary].sum(axis=1), axis=-1), layout,
                           0.99, RATIO, MARGIN_S, alpha)
    below = np.concatenate([np.zeros((*h.shape[:2], 1)), np.cumsum(h, axis=-1)], axis=-1)
    fails = profile_fails([profile_input(below[k], is_canary, profile, k)
                           for k in range(h.shape[0])], 0.99, alpha)[0]
    return np.asarray(fails >= profile_threshold(alpha))


def p99_passes(rng: np.random.Generator, row: P99Row, windows: int = 240, calls: int = 100,
               every: int = 20) -> tuple[int, int, list[float]]:
    """Rollouts passed and failed at some look, and each one's first passing window."""
    log_half = math.log(2.0 / row.alpha)
    passed = failed = 0
    first = []
    for _ in range(row.rollouts):
        h, is_canary = _p99_histograms(rng, row, range(every, windows + 1, every), calls)
        cum_b = np.cumsum(h[:, ~is_canary].sum(axis=1), axis=-1)
        cuts = exceedance_cuts(cum_b, LAYOUT, 0.99, RATIO, MARGIN_S, log_half)
        above = np.concatenate([np.cumsum(h[..., ::-1], axis=-1)[..., ::-1],
                                np.zeros((*h.shape[:2], 1))], axis=-1)
        oks = pass_tracks(_sides(above, cuts.baseline_level, cuts.canary_pass, is_canary),
                          0.99, log_threshold=log_half, last_only=True)
        ok = np.flatnonzero([float(t.log_e_pass[-1]) >= log_half for t in oks])
        passed += bool(ok.size)
        failed += bool(_profile_fails(h, is_canary, row.alpha).any())
        first.append(float((ok[0] + 1) * every) if ok.size else math.inf)
    return passed, failed, first


def p99_fails(rng: np.random.Generator, row: P99Row, looks: Sequence[int], calls: int
              ) -> tuple[int, list[float]]:
    """Rollouts failed at some look (after `looks` windows), and each one's first failing
    window (inf: none)."""
    first = []
    for _ in range(row.rollouts):
        hit = np.flatnonzero(_profile_fails(*_p99_histograms(rng, row, looks, calls), row.alpha))
        first.append(float(looks[hit[0]]) if hit.size else math.inf)
    return sum(math.isfinite(x) for x in first), first


def fail_tables(seed: int, big: int, quick: bool) -> None:
    """The fail side on few pods: the success rate's (α = 1 %, `rate_passes`), then p99's
    (`p99_fail_table`)."""
    rollouts = big // 2
    print("\nSuccess rate, the fail side (each cohort's worst pod left out or capped, τ² with "
          "the few-pods allowance), α = 1 %: false fails within 360 windows (1 h) of a canary "
          "like the baseline (A/A) or at the boundary (+0.5 pp), and a canary +1 pp or +3 pp "
          "failed within 120 windows (20 min)\n")
    print("| baseline vs canary pods | pods' spread σ | A/A false fails | at the boundary | "
          "+1 pp: failed, median | +3 pp: failed, median |")
    print("| --- | --- | --- | --- | --- | --- |")
    for b, c in ((2, 2), (3, 2), (4, 2), (3, 3), (2, 4), (6, 6)):
        for spread in (0.0, 0.3):
            cells = []
            for worse in (0.0, 0.5, 1.0, 3.0):
                rng = np.random.default_rng([seed, 7, b, c, int(spread * 10),
                                             int(worse * 10)])
                k, first = rate_passes(rng, RateRow(b, c, spread, worse, rollouts),
                                       windows=120 if worse >= 1.0 else 360, every=1,
                                       side="fail")
                cells.append(_share(k, rollouts) if worse < 1.0 else
                             f"{100 * k / rollouts:.0f} %, {_median(first)}")
            print(f"| {b} vs {c} | {spread:g} | " + " | ".join(cells) + " |")
    p99_fail_table(seed, rollouts if quick else big // 3)


def p99_fail_table(seed: int, rollouts: int) -> None:
    """p99's fail (`pod_profile`) on few pods ±30 % apart, drawn per rollout, α = 0.25 %, 50
    calls/s per baseline pod: false fails of a canary like the baseline within 4 h (looks
    after 1, 5, 15, 30, 60, 120 and 240 min: a healthy canary's false fails came early, while
    τ² rests on few calls), and a canary ×2 failed within 1 h (a look a minute)."""
    print("\np99's fail, α = 0.25 %, pods ±30 % apart: false fails of a canary like the "
          "baseline within 4 h, and a canary ×2 failed within 1 h\n")
    print("| baseline vs canary pods | A/A false fails | ×2: failed, median |")
    print("| --- | --- | --- |")
    for b, c in ((2, 2), (3, 2), (4, 2), (2, 4), (4, 4), (6, 1)):
        rng = np.random.default_rng([seed, 98, b, c])
        k, _ = p99_fails(rng, P99Row(b, c, 0.3, 0.0025, rollouts, edge=None),
                         (6, 30, 90, 180, 360, 720, 1440), calls=500)
        cells = [_share(k, rollouts)]
        if (b, c) == (2, 2):
            rng = np.random.default_rng([seed, 98, b, c, 2])
            k, first = p99_fails(rng, P99Row(b, c, 0.3, 0.0025, rollouts // 3, edge=None,
                                              factor=2.0), range(6, 361, 6), calls=500)
            cells.append(f"{100 * k / (rollouts // 3):.0f} %, {_median(first)}")
        else:
            cells.append("")
        print(f"| {b} vs {c} | " + " | ".join(cells) + " |")


# `--every-look`: label, row (its rollouts a share of the table's), α = 0.25 % on each.
_EVERY_LOOK_ROWS = (
    ("6 vs 6", P99Row(6, 6, 0.3, 0.0025, 1, edge=None)),
    ("3 vs 2", P99Row(3, 2, 0.3, 0.0025, 1, edge=None)),
    ("2 vs 2", P99Row(2, 2, 0.3, 0.0025, 1, edge=None)),
    ("6 vs 1", P99Row(6, 1, 0.3, 0.0025, 1, edge=None)),
    ("11 vs 1", P99Row(11, 1, 0.3, 0.0025, 1, edge=None)),
    ("6 vs 6", P99Row(6, 6, 0.0, 0.0025, 1, edge=0.0)),
    ("6 vs 6", P99Row(6, 6, 0.3, 0.0025, 1, edge=0.0)),
    ("6 vs 6", P99Row(6, 6, 0.0, 0.0025, 5, edge=None, factor=1.5)),
    ("2 vs 2", P99Row(2, 2, 0.3, 0.0025, 5, edge=None, factor=2.0)),
    ("11 vs 1", P99Row(11, 1, 0.0, 0.0025, 5, edge=None, factor=2.0)),
    # H0's edge on the estates an independent review asked for, and pods with a long tail.
    ("2 vs 2", P99Row(2, 2, 0.3, 0.0025, 1, edge=0.0)),
    ("3 vs 2", P99Row(3, 2, 0.3, 0.0025, 1, edge=0.0)),
    ("6 vs 2", P99Row(6, 2, 0.3, 0.0025, 1, edge=0.0)),
    ("6 vs 1", P99Row(6, 1, 0.3, 0.0025, 1, edge=0.0)),
    ("11 vs 1", P99Row(11, 1, 0.3, 0.0025, 1, edge=0.0)),
    ("12 vs 12", P99Row(12, 12, 0.3, 0.0025, 1, edge=0.0)),
    ("6 vs 6", P99Row(6, 6, 0.2, 0.0025, 1, edge=0.0, lognormal=True)),
    ("6 vs 6", P99Row(6, 6, 0.1, 0.0025, 5, edge=None, factor=1.5)),
)


def every_look_table(seed: int, rollouts: int, minutes: int, rows: Sequence[int] | None = None,
                     calls: int = 500) -> None:
    """p99's fail (`pod_profile`) looked at after every window (as the live verdict is), pods
    drawn per rollout: false fails of canaries within H0 (like the baseline, or at its edge:
    the version's p99 exactly ×1.2 + 5 ms of the baseline version's) against α, and how
    soon regressions fail; `calls` per baseline pod per window (10 s). `rows`: indices into
    `_EVERY_LOOK_ROWS` (each row draws from its own seed, so a row's figures do not depend
    on which others run)."""
    windows = minutes * 6
    print(f"\np99's fail at every window ({minutes} min), pods drawn per rollout, {calls // 10}"
          " calls/s per baseline pod, α = 0.25 %\n")
    print("| baseline vs canary pods | pods' spread | canary | rollouts | failed (95 % upper)"
          " | median minute |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i, (label, row) in enumerate(_EVERY_LOOK_ROWS):
        if rows and i not in rows:
            continue
        n = rollouts // row.rollouts
        rng = np.random.default_rng([seed, 31, i])
        first = []
        for _ in range(n):
            h, is_canary = _every_window(rng, row, windows, calls)
            hit = np.flatnonzero(_profile_fails(h, is_canary, row.alpha, EVERY_LOOK_LAYOUT))
            first.append(float(hit[0] + 1) if hit.size else math.inf)
        k = sum(math.isfinite(x) for x in first)
        what = ("like the baseline" if row.edge is None and row.factor == 1.0 else
                f"×{row.factor:g}" if row.edge is None else "at the tolerance's edge")
        spread = (f"lognormal σ {row.spread:g}" if row.lognormal else
                  f"±{100 * row.spread:.0f} %")
        print(f"| {label} | {spread} | {what} | {n} | "
              f"{100 * k / n:.1f} % ({100 * cp_upper(k, n):.2f} %) | {_minutes(first)} |",
              flush=True)


def one_pod_table(rng: np.random.Generator, rollouts: int) -> None:
    """A canary of one pod against few and many baseline pods (α = 1 %, 60 windows): passes
    at the boundary and at twice the tolerance (a look every 10 windows), and fails of a
    canary like the baseline, at the boundary, and +1 pp (a look every window)."""
    print("| baseline vs canary pods | pods' spread σ | passes at the boundary | at twice the "
          "tolerance | A/A fails | fails at the boundary | +1 pp failed |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for b, c in ((5, 1), (7, 1), (11, 1)):
        for spread in (0.0, 0.3, 0.5):
            cells = [rate_passes(rng, RateRow(b, c, spread, 0.5, rollouts))[0],
                     rate_passes(rng, RateRow(b, c, spread, 1.0, rollouts))[0]]
            cells += [rate_passes(rng, RateRow(b, c, spread, worse, rollouts), side="fail",
                                  every=1)[0] for worse in (0.0, 0.5, 1.0)]
            print(f"| {b} vs {c} | {spread:g} | "
                  + " | ".join(f"{100 * k / rollouts:.1f} %" for k in cells) + " |")


def _sides(above: np.ndarray, base: np.ndarray, canary_cut: np.ndarray, is_canary: np.ndarray
           ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per look, one side's exceedances as `pod_exceed` takes them: `above` (looks, pods,
    buckets + 1) each pod's calls from a bucket on, `base` / `canary_cut` the cuts."""
    return [(above[k, :, :1], above[k, :, base[k]][:, None], above[k, :, canary_cut[k]][:, None],
             is_canary) for k in range(above.shape[0])]


def _share(k: int, n: int) -> str:
    return f"{k} of {n} ({100 * k / n:.1f} %, 95 % upper {100 * cp_upper(k, n):.1f} %)"


def _minutes(first: list[float]) -> str:
    """The median of the finite windows in minutes, to the tenth (10 s windows)."""
    done = [x for x in first if math.isfinite(x)]
    return f"{np.median(done) / 6:.1f}" if done else "–"


def _median(first: list[float], window_s: float = 10.0) -> str:
    x = np.array(first)
    done = x[np.isfinite(x)]
    return f"{np.median(done) * window_s / 60:.0f} min" if done.size else "–"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 rollouts per row (make bench)")
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--fails", action="store_true",
                    help="only the fail side's tables (success rate and p99, few pods)")
    ap.add_argument("--one-pod", action="store_true",
                    help="only the table of a canary of one pod (BENCHMARKS.md D21)")
    ap.add_argument("--every-look", action="store_true",
                    help="only p99's fail at every window, pods drawn per rollout (1,200 "
                         "rollouts per A/A row, a fifth of it per regression row)")
    ap.add_argument("--rollouts", type=int, help="with --every-look: instead of 1,000")
    ap.add_argument("--minutes", type=int, default=60,
                    help="with --every-look: each rollout's length")
    ap.add_argument("--row", type=int, action="append",
                    help="with --every-look: only this row (0-based, repeatable)")
    args = ap.parse_args(argv)
    if args.every_look:
        every_look_table(args.seed, args.rollouts or (200 if args.quick else 1200),
                         args.minutes, args.row)
        return 0
    if args.one_pod:
        one_pod_table(np.random.default_rng(args.seed), 200 if args.quick else 600)
        return 0
    big = 200 if args.quick else 1000
    if args.fails:
        fail_tables(args.seed, big, args.quick)
        return 0
    edge_n = 200 if args.quick else 1500
    started = time.monotonic()
    cmd = "python benchmarks/small_estates_sim.py" + (" --quick" if args.quick else "")
    print(f"`{cmd}` (seed {args.seed})\n")
    print("Success rate, α = 1 %: wrong passes within 60 windows (10 min) of a canary at the "
          "boundary (+0.5 pp) or at twice the tolerance (+1 pp), and healthy canaries passed "
          "within 360 windows (1 h)\n")
    print("| baseline vs canary pods | pods' spread σ | at the boundary | at twice the "
          "tolerance | healthy: passed, median |")
    print("| --- | --- | --- | --- | --- |")
    for b, c in ((1, 1), (3, 1), (2, 2), (5, 1), (4, 2), (11, 1), (6, 6)):
        for spread in (0.0, 0.3, 0.5):
            cells = []
            for worse in (0.5, 1.0, 0.0):
                rng = np.random.default_rng([args.seed, b, c, int(spread * 10), int(worse * 10)])
                k, first = rate_passes(rng, RateRow(b, c, spread, worse, big),
                                       windows=60 if worse else 360)
                cells.append(_share(k, big) if worse else f"{100 * k / big:.0f} %, "
                             f"{_median(first)}")
            print(f"| {b} vs {c} | {spread:g} | " + " | ".join(cells) + " |")
    print("\nSuccess rate at the live verdict's α per metric (0.25 %), pods' rates spread "
          "alike in both cohorts (+ normal(0, sd) pp), a look every window of 120 (20 min): "
          "wrong passes at the boundary and at twice the tolerance\n")
    print("| baseline vs canary pods | pods' sd | at the boundary | at twice the tolerance |")
    print("| --- | --- | --- | --- |")
    for b, c in ((3, 1), (5, 1), (7, 1), (4, 2), (6, 2), (3, 3)):
        cells = []
        for worse in (0.5, 1.0):
            rng = np.random.default_rng([args.seed, 25, b, c, int(worse * 10)])
            k, _ = rate_passes(rng, RateRow(b, c, 0.0, worse, big, additive_pp=0.3),
                               alpha=0.0025, windows=120, every=1)
            cells.append(_share(k, big))
        print(f"| {b} vs {c} | 0.3 pp | " + " | ".join(cells) + " |")
    fail_tables(args.seed, big, args.quick)
    print("\np99, each side at α/2: wrong passes of a canary just beyond the tolerance, and "
          "healthy passes within 240 windows (40 min)\n")
    print("| baseline vs canary pods | pods' spread | α | canary | passes | fails |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = [
        ("3 vs 1", P99Row(3, 1, 0.1, 0.0025, edge_n)),
        ("2 vs 2", P99Row(2, 2, 0.2, 0.0025, edge_n)),
        ("3 vs 1", P99Row(3, 1, 0.2, 0.0025, edge_n)),
        ("5 vs 1", P99Row(5, 1, 0.1, 0.0025, edge_n)),
        ("4 vs 2", P99Row(4, 2, 0.2, 0.0025, edge_n)),
        ("1 vs 1", P99Row(1, 1, 0.1, 0.0025, edge_n)),
        ("11 vs 1", P99Row(11, 1, 0.1, 0.0025, edge_n)),
        ("2 vs 2", P99Row(2, 2, 0.1, 0.01, big)),
        ("3 vs 1", P99Row(3, 1, 0.1, 0.01, big, edge=None, factor=1.25)),
        ("7 vs 3", P99Row(7, 3, 0.1, 0.0025, edge_n, canary_spread=0.3)),
        ("3 vs 1", P99Row(3, 1, 0.0, 0.01, big // 4, edge=None)),
        ("3 vs 1", P99Row(3, 1, 0.1, 0.01, big // 4, edge=None)),
        ("7 vs 3", P99Row(7, 3, 0.1, 0.01, big // 2, edge=None)),
        ("11 vs 1", P99Row(11, 1, 0.0, 0.01, big // 4, edge=None)),
    ]
    for i, (label, row) in enumerate(rows):
        rng = np.random.default_rng([args.seed, 99, i])
        passed, failed, first = p99_passes(rng, row)
        spread = f"±{100 * row.spread:.0f} %" + (
            f", canary ±{100 * row.canary_spread:.0f} %" if row.canary_spread else "")
        if row.edge is not None:
            what, shown = f"{1 + row.edge:g} × the boundary", _share(passed, row.rollouts)
        elif row.factor != 1.0:
            what, shown = f"×{row.factor:g}", _share(passed, row.rollouts)
        else:
            what = "healthy"
            shown = f"{100 * passed / row.rollouts:.0f} % of {row.rollouts}, {_median(first)}"
        print(f"| {label} | {spread} | {100 * row.alpha:g} % | {what} | {shown} | "
              f"{failed} |")
    print(f"\n{time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
