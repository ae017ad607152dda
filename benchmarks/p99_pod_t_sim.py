"""p99's fail as pod-level t-tests at a bounded schedule of looks: tried for issue 31 point 6
(a fail sound at H0's edge without losing power) and not taken (BENCHMARKS.md D18).

Why. The profile e-value (`probes.stats.pod_profile`) is a normal mixture whose variance
plugs in the pods' spread τ²; its validity over looks is assumed, and at H0's edge on few
pods it fails above α (D18). This rule is valid by construction instead: at each look of a
fixed schedule (windows 1, 2, 4, ..., 1024 and 1440, i.e. 4 h: 12 looks, counted from the
first window with both cohorts' calls) a fixed-sample test at α/12, so a rollout errs with
chance at most α over all of them (union bound), whatever the looks share. Each look treats
the pods as the units, τ unknown (the pods' shares in a tail as normal draws):

- candidate baseline p99s q, every bucket of the layout; H0 is the union over q of
  {baseline pods' mean share at or beyond q ≥ 1 %, canary pods' mean share beyond
  r·q + m ≤ 1 %}, and the look fails when every candidate is rejected;
- `fisher`: a one-sample t per cohort against 1 % (each share's variance at least the
  binomial one at 1 %), combined by Fisher's method (disjoint pods, independent);
- `welch`: Welch's two-sample t of the canary's shares against the baseline's (under H0(q)
  the difference is ≤ 0), with both one-sample t's, Bonferroni over the three: the
  difference carries the candidates near the baseline's p99, the baseline's alone those
  far above it;
- a canary of one pod, against six baseline pods or more: a prediction t of the pod against
  the baseline pods' shares at q (it shares their spread), Bonferroni with the baseline's.

It is sound at H0's edge (every edge row 0 of 1,200) and decides far slower than the live
rule: the t's few degrees of freedom (six pods: 5) and the twelve looks' α/12 are what the
plug-in τ² of the live rule does not pay.

    .venv/bin/python benchmarks/p99_pod_t_sim.py --rule welch --row 6 --row 13 --rollouts 1200
    .venv/bin/python benchmarks/p99_pod_t_sim.py --rule welch --ab     # p99_pods_sim's A/B rows
    .venv/bin/python benchmarks/p99_pod_t_sim.py --oracle    # what τ unknown from k pods costs
    .venv/bin/python benchmarks/p99_pod_t_sim.py --quick     # the oracle and two edge rows
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import p99_pods_sim
import small_estates_sim as sim
from verdict_sim import cp_upper

from probes.stats.quantile import Layout

P0 = 0.01  # the share beyond p99
# The looks, in windows of both cohorts' calls: doubling to 4 h, α spent evenly over them.
SCHEDULE = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1440)
RULES = ("fisher", "welch")
# The fewest baseline pods that judge a canary of one pod (`_pod_batch.ONE_POD_BASELINE`).
ONE_POD_BASELINE = 6


def _one_sample(x: np.ndarray, n: np.ndarray, lower: bool) -> np.ndarray:
    """One-sided t p-values per candidate of the pods' shares `x` (candidates, pods), calls
    `n` (pods,), against a mean of `P0`: below it (`lower`) or above it."""
    k = x.shape[1]
    var = np.maximum(x.var(axis=1, ddof=1), np.mean(P0 * (1 - P0) / n))
    t = (x.mean(axis=1) - P0) / np.sqrt(var / k)
    return np.asarray(stats.t.cdf(t, k - 1) if lower else stats.t.sf(t, k - 1))


def _welch(xb: np.ndarray, nb: np.ndarray, xc: np.ndarray, nc: np.ndarray) -> np.ndarray:
    """Welch's one-sided p-values per candidate: the canary's shares above the baseline's."""
    vb = np.maximum(xb.var(axis=1, ddof=1), np.mean(P0 * (1 - P0) / nb)) / xb.shape[1]
    vc = np.maximum(xc.var(axis=1, ddof=1), np.mean(P0 * (1 - P0) / nc)) / xc.shape[1]
    t = (xc.mean(axis=1) - xb.mean(axis=1)) / np.sqrt(vb + vc)
    df = (vb + vc) ** 2 / (vb ** 2 / (xb.shape[1] - 1) + vc ** 2 / (xc.shape[1] - 1))
    return np.asarray(stats.t.sf(t, df))


def look_fails(counts: np.ndarray, canary: np.ndarray, layout: Layout, alpha: float,
               ratio: float, margin_s: float, rule: str) -> bool:
    """Whether one look at level `alpha` rejects every candidate: `counts` (pods, buckets)
    each pod's calls pooled over time, `canary` (pods,) the cohort flags."""
    live = counts.sum(axis=1) > 0
    counts, canary = counts[live], canary[live]
    kb, kc = int((~canary).sum()), int(canary.sum())
    if kb < 2 or kc < 1 or (kc == 1 and kb < ONE_POD_BASELINE):
        return False
    below = np.concatenate([np.zeros((counts.shape[0], 1)), np.cumsum(counts, axis=1)], axis=1)
    n = below[:, -1]
    cut = np.searchsorted(layout.lower, ratio * layout.upper + margin_s, side="left")
    cut[~np.isfinite(layout.upper)] = layout.size
    nb, nc = n[~canary], n[canary]
    xb = 1.0 - below[~canary][:, :layout.size].T / nb  # at or beyond each bucket's lower edge
    xc = 1.0 - below[canary][:, cut].T / nc  # beyond each bucket's canary cut
    pb = _one_sample(xb, nb, lower=True)
    if kc == 1:
        spread = np.maximum(xb.std(axis=1, ddof=1), math.sqrt(P0 * (1 - P0) / nc[0]))
        pc = stats.t.sf((xc[:, 0] - P0) / (spread * math.sqrt(1 + 1 / kb)), kb - 1)
        p = 2 * np.minimum(pb, pc)
    elif rule == "fisher":
        logs = np.log(np.maximum(pb, 1e-300)) + np.log(np.maximum(
            _one_sample(xc, nc, lower=False), 1e-300))
        p = stats.chi2.sf(-2 * logs, 4)
    else:
        p = 3 * np.minimum(np.minimum(_welch(xb, nb, xc, nc), pb),
                           _one_sample(xc, nc, lower=False))
    return bool((p <= alpha).all())


def first_fail(cum: np.ndarray, canary: np.ndarray, layout: Layout, alpha: float,
               ratio: float, margin_s: float, rule: str) -> int | None:
    """The window (index into `cum`'s looks) of the first scheduled look that fails, or None:
    `cum` (pods, looks, buckets) each pod's cumulative calls per bucket after each window."""
    calls = cum.sum(axis=-1)
    both = (calls[canary] > 0).any(axis=0) & (calls[~canary] > 0).any(axis=0)
    if not both.any():
        return None
    start = int(np.argmax(both))
    for w in SCHEDULE:
        look = start + w - 1
        if look >= cum.shape[1]:
            break
        if look_fails(cum[:, look], canary, layout, alpha / len(SCHEDULE), ratio, margin_s,
                      rule):
            return look
    return None


def every_look_rows(rows: Sequence[int], rollouts: int, minutes: int, seed: int, rule: str,
                    calls: int = 500) -> None:
    """`small_estates_sim.py --every-look`'s rows (the same draws) under this rule."""
    print(f"\n{rule}: p99's fail at a schedule of {len(SCHEDULE)} looks over 4 h, {minutes} min,"
          " pods drawn per rollout, α = 0.25 %\n")
    print("| row | baseline vs canary pods | pods' spread | canary | rollouts "
          "| failed (95 % upper) | median minute |\n| --- | --- | --- | --- | --- | --- | --- |")
    for i in rows:
        label, row = sim._EVERY_LOOK_ROWS[i]
        n = rollouts // row.rollouts
        rng = np.random.default_rng([seed, 31, i])
        first = []
        for _ in range(n):
            h, canary = sim._every_window(rng, row, minutes * 6, calls)
            hit = first_fail(np.moveaxis(h, 0, 1), canary, sim.EVERY_LOOK_LAYOUT, row.alpha,
                             sim.RATIO, sim.MARGIN_S, rule)
            first.append(math.inf if hit is None else float(hit + 1))
        k = sum(math.isfinite(x) for x in first)
        what = (f"×{row.factor:g}" if row.edge is None else "at the tolerance's edge")
        spread = (f"lognormal σ {row.spread:g}" if row.lognormal
                  else f"±{100 * row.spread:.0f} %")
        print(f"| {i} | {label} | {spread} | {what} | {n} | {100 * k / n:.1f} % "
              f"({100 * cp_upper(k, n):.2f} %) | {sim._minutes(first)} |", flush=True)


def ab_rows(rule: str, argv: list[str]) -> None:
    """`p99_pods_sim.py`'s p99 table (its draws, its other rules' columns) with this rule
    as the live fail: the one seam its live column reads the fail from."""

    def flags(cum: np.ndarray, canary: np.ndarray, layout: Layout, alpha: float
              ) -> np.ndarray:
        tol = p99_pods_sim.TOL
        out = np.zeros(cum.shape[1], dtype=bool)
        look = first_fail(cum, canary, layout, alpha, tol.latency_p99_ratio,
                          tol.latency_p99_margin_ms / 1000, rule)
        if look is not None:
            out[look:] = True
        return out

    p99_pods_sim.profile_flags = flags  # type: ignore[assignment]
    sys.argv = [sys.argv[0], "--only", "p99", "--live-only", *argv]
    p99_pods_sim.main()


def oracle_table(seed: int, draws: int = 100_000) -> None:
    """What the pods drawn allow once their calls are unlimited, to a test that knows the
    baseline version's p99 and the canary pods' spread τ: each canary pod's share beyond
    r·q_b + m is its true one, and the normal random-effects model's largest likelihood
    ratio against the boundary is exp(z²/2), z = √k (mean share − 1 %)/τ. Beside it the
    one-sided thresholds on z and on a t from the same k pods (k − 1 degrees of freedom),
    and how often those pods' own t passes its threshold at α/12."""
    rng = np.random.default_rng(seed)
    print("\n| canary pods | pods' spread | canary | version's share beyond the cut, τ "
          "| median z | exp(z²/2) ≥ 1/α | z, t at α; at α/12 | their t past α/12's |\n| --- | --- "
          "| --- | --- | --- | --- | --- | --- |")
    for k, spread, factor in ((6, 0.1, 1.5), (12, 0.1, 1.5), (6, 0.3, 1.5), (6, 0.3, 2.0),
                              (12, 0.3, 2.0)):
        cut = sim.RATIO * sim._mixture_p99(sim._population(spread, False)) + sim.MARGIN_S

        def share(scale: np.ndarray, cut: float = cut) -> np.ndarray:
            return np.asarray(stats.norm.sf(np.log(cut / (sim.MEDIAN_S * scale)) / sim.SIGMA))

        version = share(sim._population(spread, False) * factor)
        tau = float(version.std())
        drawn = share((1 + rng.uniform(-spread, spread, (draws, k))) * factor)
        z = math.sqrt(k) * (drawn.mean(axis=1) - P0) / tau
        alpha = 0.0025
        reach = np.mean((z > 0) & (z * z / 2 >= math.log(1 / alpha)))
        levels = [alpha, alpha / len(SCHEDULE)]
        # The same pods' one-sample t, τ estimated from them: the canary's factor of this
        # rule with unlimited calls and the baseline's p99 given.
        t = (drawn.mean(axis=1) - P0) / (drawn.std(axis=1, ddof=1) / math.sqrt(k))
        t_reach = np.mean(t >= stats.t.isf(levels[1], k - 1))
        thresholds = "; ".join(f"{stats.norm.isf(a):.2f}, {stats.t.isf(a, k - 1):.2f}"
                               for a in levels)
        print(f"| {k} | ±{100 * spread:.0f} % | ×{factor:g} | {100 * version.mean():.2f} %, "
              f"{100 * tau:.2f} pp | {np.median(z):.2f} | {100 * reach:.1f} % | {thresholds} "
              f"| {100 * t_reach:.1f} % |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rule", choices=RULES, default="welch")
    ap.add_argument("--row", type=int, action="append",
                    help="a row of small_estates_sim.py --every-look (repeatable)")
    ap.add_argument("--rollouts", type=int, default=1200)
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--ab", action="store_true",
                    help="p99_pods_sim.py --quick's A/B rows (×1.5 and ×2) instead")
    ap.add_argument("--oracle", action="store_true",
                    help="what unlimited calls allow a test knowing τ and the baseline's p99")
    ap.add_argument("--quick", action="store_true",
                    help="the oracle table and H0's edge on 6 vs 6 and 6 vs 1, 300 rollouts")
    args = ap.parse_args(argv)
    if args.quick:
        oracle_table(args.seed)
        every_look_rows([6, 13], 300, args.minutes, args.seed, args.rule)
        return 0
    if args.oracle:
        oracle_table(args.seed)
        return 0
    if args.ab:
        ab_rows(args.rule, ["--quick", "--scenario", "A/B: canary ×1.5",
                            "--scenario", "A/B: canary ×2"])
        return 0
    every_look_rows(args.row or list(range(len(sim._EVERY_LOOK_ROWS))), args.rollouts,
                    args.minutes, args.seed, args.rule)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
