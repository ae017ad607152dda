"""p99 and attempts on simulated estates: pooled cohorts against the pod as the unit.

The success rate takes the pod as the unit (`benchmarks/verdict_sim.py`); p99 and attempts
per request do too where the store keeps per-pod windows (schema v2,
`probes.verdict.pod_metrics`). This measures both rules on the rollouts `verdict_sim.py` draws
(12 pods, one restarting into the canary every 10 minutes until 6 have, cohort-balanced
sampling, 4 h, verdict after every window, α = 1 % over four metric slots):

p99, two verdict rules on the same draws (each pod's first 2 minutes left out):

- before: the pass from the pooled quantile test with every pod in, the fail with each
  cohort's worst pod's calls left out of the pooled histograms
  (`probes.stats.pod_quantile.pod_quantile_track`; the verdict before session 12);
- sequence's ends: both sides on exceedances per pod through `pod_track`, the spread between
  pods as noise, cut at the ends of the baseline p99's confidence sequence
  (`probes.stats.pod_exceed`; the verdict before session 23), each pod's warm calls pooled
  over time, read every `LOOK_EVERY` windows;
- live: the same pass, and the fail from the profile e-value over the baseline's p99
  (`probes.stats.pod_profile`), what `pod_metrics.pod_latency_p99s` runs.

Each call's latency is lognormal (median 50 ms, σ 0.5: p99 ≈ 160 ms) times its pod
instance's scale:

- independent: every pod alike (scale 1);
- latency spread: each pod instance draws its scale uniformly in 0.9–1.1 (±10 %) or
  0.7–1.3 (±30 %), anew at a restart;
- cold start: a pod's first 2 minutes 1.5× slower;
- one-pod canary (spread): the canary stuck at one pod instance for the whole run;
- slow node (spread): the first canary pod 2× slower for the whole run, not the version's
  fault;
- A/B: canary ×1.5 (spread), every canary call 1.5× slower (twice the ×1.2 tolerance and
  more): the same with pods alike and with ±10 %, and canary ×2 (spread).

Attempts per request (`--attempts`): each call retries once with its pod instance's
chance (2 %, lognormal σ 0.3 across instances, one in 12 at 5×, as a bad node); pooled is
`bounded.two_sample` on cohort totals, pods is `pod_track` on the scaled retry volume
(what `pod_attempts` runs); the control doubles every canary call's attempts (attempts ×2).

Reported per p99 scenario and rule: fails (95 % Clopper–Pearson upper bound) and their
median minute; passes (A/A: healthy canaries passed within 4 h and the median minute; A/B:
wrong passes, a pass before any fail). Per attempts scenario: the fail rate of each rule.

    .venv/bin/python benchmarks/p99_pods_sim.py                 # 300 rollouts per row
    .venv/bin/python benchmarks/p99_pods_sim.py --quick         # 30 rollouts per row
    .venv/bin/python benchmarks/p99_pods_sim.py --only p99 --scenario one-pod   # one row
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verdict_sim import ALPHA, SLOTS, TOL, WINDOW_S, Estate, Scenario, cp_upper, simulate

from probes.measure.histogram import LOWER, SUB_BUCKETS, UPPER, index_of
from probes.spec import DEFAULT_ATTEMPTS_MAX
from probes.stats import bounded, quantile
from probes.stats.pod_exceed import exceedance_cuts, exceedance_track, pass_track
from probes.stats.pod_profile import profile_cuts, profile_fails, profile_input, profile_threshold
from probes.stats.pod_quantile import pod_quantile_track
from probes.stats.pods import pod_track

MEDIAN_S, SIGMA = 0.050, 0.5
WARMUP_S = 120.0
# The live p99 rule is read every this many windows (each look is a track of its own).
LOOK_EVERY = 6


@dataclass(frozen=True)
class LatencyScenario:
    name: str
    spread: float = 0.0  # pod instance scale uniform in 1 ± spread
    cold_factor: float = 1.0  # latency × this in a pod's first cold_s
    one_pod: bool = False
    slow_node: float = 1.0  # the first canary instance × this, all along
    canary_factor: float = 1.0  # A/B: every canary call this much slower


SCENARIOS = (
    LatencyScenario("independent"),
    LatencyScenario("latency spread ±10 %", spread=0.1),
    LatencyScenario("latency spread ±30 %", spread=0.3),
    LatencyScenario("cold start ×1.5", cold_factor=1.5),
    LatencyScenario("one-pod canary (spread)", spread=0.3, one_pod=True),
    LatencyScenario("slow node ×2 under the first canary pod (spread)", spread=0.3,
                    slow_node=2.0),
    # A/B, the control that the test can fail at all: every canary call 1.5× slower.
    LatencyScenario("A/B: canary ×1.5 (spread)", spread=0.3, canary_factor=1.5),
    # The same with pods alike, and a slowdown twice the tolerance's ratio on pods ±30 %
    # apart: what a test that counts the spread between pods can show.
    LatencyScenario("A/B: canary ×1.5 (pods alike)", canary_factor=1.5),
    LatencyScenario("A/B: canary ×1.5 (spread ±10 %)", spread=0.1, canary_factor=1.5),
    LatencyScenario("A/B: canary ×2 (spread)", spread=0.3, canary_factor=2.0),
    # Just beyond the tolerance (×1.2 + 5 ms is ×1.23 at a p99 of ~160 ms): the pass side's
    # H0 at its edge, where a pass is wrong and a fail is right.
    LatencyScenario("A/B: canary ×1.25, just beyond (pods alike)", canary_factor=1.25),
    LatencyScenario("A/B: canary ×1.25, just beyond (spread ±10 %)", spread=0.1,
                    canary_factor=1.25),
    # Just inside (×1.2 < ×1.2 + 5 ms): the fail side's H0 near its edge, a fail is wrong.
    LatencyScenario("A/B: canary ×1.2, just inside (pods alike)", canary_factor=1.2),
    LatencyScenario("A/B: canary ×1.2, just inside (spread ±10 %)", spread=0.1,
                    canary_factor=1.2),
)


@dataclass(frozen=True)
class AttemptScenario:
    name: str
    spread: bool = False
    one_pod: bool = False
    canary_factor: float = 1.0  # A/B: every canary call's attempts × this


ATTEMPT_SCENARIOS = (
    AttemptScenario("independent"),
    AttemptScenario("retry spread (one instance in 12 at 5×)", spread=True),
    AttemptScenario("one-pod canary (spread)", spread=True, one_pod=True),
    AttemptScenario("A/B: attempts ×2 (spread)", spread=True, canary_factor=2.0),
)


def histograms(rng: np.random.Generator, n: np.ndarray, canary: np.ndarray, starts: np.ndarray,
               est: Estate, sc: LatencyScenario) -> tuple[np.ndarray, int, np.ndarray]:
    """Per pod instance and window, the latency histogram (instances, windows, buckets),
    its first bucket, and each instance's latency scale (warm, the version's factor in)."""
    inst, windows = n.shape
    scale = 1.0 + rng.uniform(-sc.spread, sc.spread, inst)
    scale[est.pods] *= sc.slow_node  # the first canary instance
    t0 = np.arange(windows) * WINDOW_S
    cold = (t0[None, :] < starts[:, None] + est.cold_s) & (starts[:, None] > 0)
    factor = (scale[:, None] * np.where(cold, sc.cold_factor, 1.0)
              * np.where(canary, sc.canary_factor, 1.0)[:, None])
    counts = n.astype(np.int64).ravel()
    cell = np.repeat(np.arange(counts.size), counts)
    x = rng.lognormal(math.log(MEDIAN_S), SIGMA, cell.size) * factor.ravel()[cell]
    bucket = index_of(x)
    # Only buckets near p99 decide anything: those from an octave below the median down,
    # and from two octaves above the p99 up, are merged into the layout's first and last
    # (which hold everything below and above), halving the arrays every look carries.
    mid, tail = np.quantile(bucket, [0.5, 0.99]).astype(int)
    lo, hi = max(0, int(mid) - SUB_BUCKETS), int(tail) + 2 * SUB_BUCKETS
    width = hi - lo + 1
    flat = cell * width + (np.clip(bucket, lo, hi) - lo)
    hist = np.bincount(flat, minlength=counts.size * width).astype(np.float64)
    return hist.reshape(inst, windows, width), lo, scale * np.where(canary, sc.canary_factor, 1.0)


def _layout(lo: int, width: int) -> quantile.Layout:
    return quantile.Layout.from_edges(LOWER[lo:lo + width], UPPER[lo:lo + width])


def warm(starts: np.ndarray, windows: int) -> np.ndarray:
    """(instances, windows): cells out of each restarted pod's warm-up."""
    t0 = np.arange(windows) * WINDOW_S
    return ~((t0[None, :] < starts[:, None] + WARMUP_S) & (starts[:, None] > 0))


def pods_p99_tracks(hist: np.ndarray, canary: np.ndarray, starts: np.ndarray,
                    layout: quantile.Layout, log_thr: float, before: bool = True
                    ) -> dict[str, np.ndarray]:
    """Flags per look on warm cells (without `before`, the live rule's alone). Fail rules:
    "pods", each cohort's worst pod out of pooled histograms (`pod_quantile_track`);
    "exceed", exceedances per pod through `pod_track` at the confidence sequence's ends,
    worst pods out (`probes.stats.pod_exceed`); "profile", the profile e-value over the
    baseline's p99 (`probes.stats.pod_profile`, the live verdict's). Pass rules:
    "pass-pooled", the pooled quantile test with every pod in; "pass-exceed", the canary's
    exceedances of the pass cut against 1 − p through `pod_track` (the live verdict's)."""
    r, m = TOL.latency_p99_ratio, TOL.latency_p99_margin_ms / 1000
    h = hist * warm(starts, hist.shape[1])[:, :, None]
    cum = np.cumsum(h, axis=1)
    out = {}
    if before:
        t = pod_quantile_track(cum, canary, layout, 0.99, r, m, log_thr)
        out = {"pods": np.asarray(t.log_e_fail >= log_thr),
               "pass-pooled": np.asarray(t.log_e_pass >= log_thr)}
    # The live rule judges each pod's warm calls pooled over time (one column, as the
    # verdict cache keeps them): at every `LOOK_EVERY`-th look, one track per side.
    fail, ok = np.full(n_looks := h.shape[1], -np.inf), np.full(h.shape[1], -np.inf)
    above = np.cumsum(cum[..., ::-1], axis=-1)[..., ::-1]  # (pods, looks, buckets)
    calls = cum.sum(axis=-1)
    width = h.shape[2]
    cum_b = np.cumsum(cum[~canary].sum(0), axis=-1)
    # As the live rule: α split between the baseline p99's confidence sequence (the cuts)
    # and the exceedance tracks.
    log_half = log_thr + math.log(2.0)
    cuts = exceedance_cuts(cum_b, layout, 0.99, r, m, log_half)
    zero = np.zeros(len(canary))

    def from_(look: int, cut: np.ndarray) -> np.ndarray:
        return (above[:, look, int(cut[look])] if int(cut[look]) < width else zero)[:, None]

    for look in range(LOOK_EVERY - 1, n_looks, LOOK_EVERY):
        if not (calls[canary, look] > 0).any():
            continue
        c = calls[:, look, None]
        if before:
            fail[look] = exceedance_track(
                c, from_(look, cuts.baseline_fail), from_(look, cuts.canary_fail), canary,
                log_threshold=log_half, last_only=True).log_e_fail[-1]
        ok[look] = pass_track(
            c, from_(look, cuts.baseline_level), from_(look, cuts.canary_pass), canary, 0.99,
            log_threshold=log_half, last_only=True).log_e_pass[-1]
    if before:
        out["exceed"] = fail >= log_half
    out["pass-exceed"] = ok >= log_half
    out["profile"] = profile_flags(cum, canary, layout, math.exp(-log_thr))
    return out


def profile_flags(cum: np.ndarray, canary: np.ndarray, layout: quantile.Layout,
                  alpha: float) -> np.ndarray:
    """The live fail per look (every `LOOK_EVERY`-th) from warm cumulative counts (pods,
    looks, buckets): the profile e-value over the baseline's p99 on each pod's calls pooled
    over time, as `pod_metrics.pod_latency_p99s` builds it."""
    r, m = TOL.latency_p99_ratio, TOL.latency_p99_margin_ms / 1000
    looks = np.arange(LOOK_EVERY - 1, cum.shape[1], LOOK_EVERY)
    calls = cum.sum(axis=-1)
    looks = looks[(calls[canary][:, looks] > 0).any(axis=0)
                  & (calls[~canary][:, looks] > 0).any(axis=0)]
    out = np.zeros(cum.shape[1], dtype=bool)
    if not looks.size:
        return out
    # Each pod's calls below each bucket: none below the first, all below past the last.
    below = np.concatenate([np.zeros((*cum.shape[:1], looks.size, 1)),
                            np.cumsum(cum[:, looks], axis=-1)], axis=-1)
    cuts = profile_cuts(np.cumsum(cum[~canary][:, looks].sum(0), axis=-1),
                        np.cumsum(cum[canary][:, looks].sum(0), axis=-1), layout, 0.99, r, m,
                        alpha)
    grids = [profile_input(below[:, i], canary, cuts, i) for i in range(looks.size)]
    out[looks] = profile_fails(grids, 0.99, alpha)[0] >= profile_threshold(alpha)
    return out


def _sprt_first(llr: np.ndarray, log_thr: float) -> float | None:
    """Minutes to the first window whose cumulative log-likelihood ratio reaches log_thr."""
    return _first(np.cumsum(llr) >= log_thr)


def p99_sprt(hist: np.ndarray, lo: int, scale: np.ndarray, canary: np.ndarray,
             starts: np.ndarray, log_thr: float) -> float | None:
    """Wald's SPRT on the canary's warm calls, each a 0/1 exceedance of the tolerance's cut
    at the baseline's true p99 (r·q + m): H0 the boundary's 1 − p, H1 each instance's true
    chance beyond the cut (knowing its scale); minutes to the fail. The optimum for a test
    of the p99 tolerance that knows the baseline's p99, on the calls the verdict sees.
    None when no canary instance is beyond the tolerance: there is no fail to find."""
    q = MEDIAN_S * math.exp(SIGMA * 2.3263478740408408)  # the baseline pods' p99 (scale 1)
    cut = TOL.latency_p99_ratio * q + TOL.latency_p99_margin_ms / 1000
    k = int(index_of(np.array([cut]))[0]) - lo + 1  # the first bucket wholly above the cut
    h = hist * warm(starts, hist.shape[1])[:, :, None]
    n, beyond = h.sum(-1)[canary], h[:, :, k:].sum(-1)[canary]
    p0 = 0.01
    p1 = 0.5 * np.array([math.erfc(math.log(cut / (MEDIAN_S * x)) / (SIGMA * math.sqrt(2)))
                         for x in scale[canary]])[:, None]
    if not (p1 > p0).any():
        return None
    p1 = np.clip(p1, 1e-9, 1 - 1e-9)
    llr = beyond * np.log(p1 / p0) + (n - beyond) * np.log((1 - p1) / (1 - p0))
    return _sprt_first(llr.sum(0), log_thr)


def attempts(rng: np.random.Generator, n: np.ndarray, canary: np.ndarray,
             sc: AttemptScenario) -> np.ndarray:
    """Per instance and window, the sum of the calls' attempts."""
    inst = n.shape[0]
    rate = np.full(inst, 0.02)
    if sc.spread:
        rate = rate * rng.lognormal(-0.045, 0.3, inst)
        rate = np.where(rng.random(inst) < 1 / 12, rate * 5.0, rate)
    retries = rng.binomial(n.astype(np.int64), np.clip(rate, 0, 1)[:, None])
    total = n + retries
    return np.where(canary[:, None], total * sc.canary_factor, total)


def attempt_fails(n: np.ndarray, total: np.ndarray, canary: np.ndarray, starts: np.ndarray,
                  log_thr: float) -> tuple[np.ndarray, np.ndarray]:
    """Fail flags per look: pooled (cohort totals, every call) and pods (`pod_attempts`)."""
    span = float(DEFAULT_ATTEMPTS_MAX - 1)
    r = TOL.attempts_ratio
    margin = min((r - 1.0) / span, 1 - 1e-12)
    y = (total - n) / span
    nb, nc = np.cumsum(n[~canary].sum(0)), np.cumsum(n[canary].sum(0))
    yb, yc = np.cumsum(y[~canary].sum(0)), np.cumsum(y[canary].sum(0))
    ok = (nb > 0) & (nc > 0)
    pooled = bounded.two_sample(yb, np.maximum(nb, 1), yc, np.maximum(nc, 1), r, margin)
    w = warm(starts, n.shape[1])
    track = pod_track(np.where(w, n, 0.0), np.where(w, y, 0.0), canary, r, margin,
                      log_threshold=log_thr)
    return (pooled.log_e_fail >= log_thr) & ok, np.asarray(track.log_e_fail >= log_thr)


def _row(name: str, rollouts: int, times: dict[str, list[float]],
         rules: tuple[str, ...] = ("pooled", "pods")) -> str:
    cells = []
    for rule in rules:
        k = len(times[rule])
        when = f"{np.median(times[rule]):.1f}" if times[rule] else "–"
        cells.append(f"{100 * k / rollouts:.1f} % ({100 * cp_upper(k, rollouts):.1f} %), {when}")
    return f"| {name} | " + " | ".join(cells) + " |"


# A verdict's p99 rule: its pass side and its fail side.
RULES = {"pooled pass, pods fail (before D18)": ("pass-pooled", "pods"),
         "pods, fail at the sequence's ends (before)": ("pass-exceed", "exceed"),
         "pods, profile fail (live)": ("pass-exceed", "profile")}


def _verdict_cell(fails: list[float], passes: list[float], rollouts: int, ab: bool) -> str:
    """A/A: fails (95 % upper), median minutes; passes, median minutes to pass. A/B: the
    same, the passes being wrong ones (before any fail), and the share failed within an
    hour (the goal for twice the tolerance)."""
    def median(x: list[float]) -> str:
        return f"{np.median(x):.1f}" if x else "–"

    k, q = len(fails), len(passes)
    word = "passed first" if ab else "passed"
    hour = f" ({100 * sum(t <= 60 for t in fails) / rollouts:.0f} % within 1 h)" if ab else ""
    return (f"fail {100 * k / rollouts:.1f} % ({100 * cp_upper(k, rollouts):.1f} %), "
            f"{median(fails)} min{hour}; {word} {100 * q / rollouts:.1f} % "
            f"({100 * cp_upper(q, rollouts):.1f} %), {median(passes)} min")


def _first(mask: np.ndarray) -> float | None:
    hit = np.flatnonzero(mask)
    return float((hit[0] + 1) * WINDOW_S / 60) if hit.size else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261204)
    ap.add_argument("--balance", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="30 rollouts per row (make bench)")
    ap.add_argument("--only", choices=("p99", "attempts"), help="one table only")
    ap.add_argument("--live-only", action="store_true",
                    help="p99: the live rule's column alone (a fraction of the CPU)")
    ap.add_argument("--scenario", action="append",
                    help="only the scenarios whose name starts so (repeatable; a row's figures "
                         "do not depend on which others run)")
    args = ap.parse_args()
    if args.quick:
        args.rollouts = 30
    est = Estate()
    log_thr = math.log(SLOTS / ALPHA)
    print(f"{args.rollouts} rollouts per row; 12 pods × {est.rate_per_s:g}/s (balance up to"
          f" {args.balance:g}×), {est.hours:g} h, p99 tolerance ×{TOL.latency_p99_ratio:g}"
          f" + {TOL.latency_p99_margin_ms:g} ms, attempts ×{TOL.attempts_ratio:g}, "
          f"α = {ALPHA} over {SLOTS} slots; each cell: fails (95 % upper), median minutes "
          "to the fail")
    if args.only != "attempts":
        rules = {k: v for k, v in RULES.items() if not args.live_only or "live" in k}
        print("\n| p99 scenario | " + " | ".join(rules) + " | SPRT, median time to fail |"
              "\n|---" + "|---" * (len(rules) + 1) + "|")
        for sc in SCENARIOS:
            if args.scenario and not sc.name.startswith(tuple(args.scenario)):
                continue
            began = time.perf_counter()
            rng = np.random.default_rng([args.seed, SCENARIOS.index(sc)])
            layout_sc = Scenario(sc.name, one_pod=sc.one_pod)
            fails: dict[str, list[float]] = {rule: [] for rule in rules}
            passes: dict[str, list[float]] = {rule: [] for rule in rules}
            sprt: list[float] = []
            for _ in range(args.rollouts):
                drawn = simulate(rng, est, layout_sc, 0.0, args.balance)
                n, canary, starts = drawn.n, drawn.canary, drawn.starts
                hist, lo, scale = histograms(rng, n, canary, starts, est, sc)
                layout = _layout(lo, hist.shape[2])
                flags = pods_p99_tracks(hist, canary, starts, layout, log_thr,
                                        before=not args.live_only)
                if sc.canary_factor > 1 and (t := p99_sprt(hist, lo, scale, canary, starts,
                                                            log_thr)) is not None:
                    sprt.append(t)
                for rule, (pass_rule, fail_rule) in rules.items():
                    tf, tp = _first(flags[fail_rule]), _first(flags[pass_rule])
                    if tf is not None:
                        fails[rule].append(tf)
                    if tp is not None and (tf is None or tp < tf):
                        passes[rule].append(tp)
            ab = sc.canary_factor > TOL.latency_p99_ratio  # beyond the tolerance
            optimum = f"{np.median(sprt):.1f} min" if sprt else "–"
            print(f"| {sc.name} | " + " | ".join(
                _verdict_cell(fails[r], passes[r], args.rollouts, ab) for r in rules)
                + f" | {optimum} |", flush=True)
            print(f"<!-- {sc.name}: {time.perf_counter() - began:.0f} s -->", file=sys.stderr)
    if args.only != "p99":
        print("\n| attempts scenario | pooled | pods |\n|---|---|---|")
        for asc in ATTEMPT_SCENARIOS:
            if args.scenario and not asc.name.startswith(tuple(args.scenario)):
                continue
            rng = np.random.default_rng([args.seed, 100 + ATTEMPT_SCENARIOS.index(asc)])
            layout_sc = Scenario(asc.name, one_pod=asc.one_pod)
            times = {"pooled": [], "pods": []}
            for _ in range(args.rollouts):
                drawn = simulate(rng, est, layout_sc, 0.0, args.balance)
                n, canary, starts = drawn.n, drawn.canary, drawn.starts
                total = attempts(rng, n, canary, asc)
                for rule, fails in zip(("pooled", "pods"),
                                       attempt_fails(n, total, canary, starts, log_thr),
                                       strict=True):
                    if (t := _first(fails)) is not None:
                        times[rule].append(t)
            print(_row(asc.name, args.rollouts, times), flush=True)


if __name__ == "__main__":
    main()
