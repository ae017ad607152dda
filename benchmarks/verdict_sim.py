"""Verdicts on simulated estates: false fails, wrong passes and times to decide, per scenario.

What real estates do, each as a scenario of its own and all together:

- independent: every call independent, every pod alike (the old method's assumption);
- heterogeneity: each pod instance draws its own error rate (lognormal spread σ = 0.3 around
  0.1 %, and one instance in 12 at 10×); a restarted pod draws anew;
- cold start: a pod's first 2 minutes after it starts have 3× the errors;
- shared bursts: two 30 s dependency outages in 4 h hit every pod of both cohorts (30 %
  errors);
- all: the three together;
- one-pod canary: "all", with the canary stuck at one pod for the whole run;
- bad nodes: two nodes fail 10 % of calls, whatever runs there: the first pod to move to
  the canary and one pod that stays on the baseline (as the fleet test does on loopback);
- two-pod start: "independent", with two pods moving to the canary at once at the start, so
  the rule that one pod does not fail a version does not wait for the second move.

A rollout: 12 pods at 5 calls/s each (10 s windows), 4 hours; one pod restarts into the canary
cohort every 10 minutes until 6 of 12 have (a restart is a new pod instance: it starts cold
and, under heterogeneity, draws a new rate). The verdict is asked after every window, with
α = 1 % shared over a path's four metric slots as `judge()` does (α/4 per metric).

Methods on the same data:
- pooled: the old verdict, `probes.stats.bounded.two_sample` on cohort totals (every call
  independent, no warm-up, no strata);
- pods: `probes.stats.pods.pod_track`, pods × windows, each pod's first `--warmup` seconds
  left out (what the verdict core does);
- SPRT: Wald's SPRT on the canary's calls knowing every cell's true rate, H0 the tolerance
  boundary against H1 the truth (time to fail), or the truth against the boundary (time to
  pass): the optimum for the same calls, which no real test reaches (it must learn the
  baseline and the pods' spread).

Reported per scenario: A/A false-fail rate (with its 95 % Clopper–Pearson upper bound), the
share of healthy canaries passed within 4 h and their median time to pass, beside the SPRT's;
A/B with +0.5 pp errors: median time to fail beside the SPRT's; A/B at twice the tolerance
(+0.2 pp): how often the canary was passed before any fail (a wrong pass).

    .venv/bin/python benchmarks/verdict_sim.py                    # 300 rollouts per row
    .venv/bin/python benchmarks/verdict_sim.py --rollouts 60      # a quick look
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import beta as beta_dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes._spec import Tolerances
from probes.stats import bounded
from probes.stats.pods import pod_track

TOL = Tolerances()
ALPHA = 0.01
SLOTS = 4
WINDOW_S = 10.0


@dataclass(frozen=True)
class Scenario:
    name: str
    spread: float = 0.0  # lognormal σ of each pod instance's error rate
    sick: str = ""  # a pod instance at 10× the errors: "baseline", "first canary", "third canary"
    cold: bool = False
    bursts: bool = False
    one_pod: bool = False
    bad_nodes: bool = False
    first_moves: int = 1  # pods moved to the canary together at the start

    @property
    def sick_canary(self) -> bool:
        """A scenario whose fails on the A/A side are wanted: the canary's only pod is sick."""
        return self.sick == "first canary" or self.bad_nodes


SCENARIOS = (
    Scenario("independent"),
    Scenario("one-pod canary", one_pod=True),
    Scenario("pod spread σ 0.5", spread=0.5),
    Scenario("pod spread, one-pod canary", spread=0.5, one_pod=True),
    Scenario("sick baseline pod", spread=0.3, sick="baseline"),
    Scenario("sick first canary pod", spread=0.3, sick="first canary"),
    Scenario("sick third canary pod", spread=0.3, sick="third canary"),
    Scenario("cold start", cold=True),
    Scenario("shared bursts", bursts=True),
    Scenario("all", spread=0.5, cold=True, bursts=True),
    Scenario("bad nodes", bad_nodes=True),
    Scenario("two-pod start", first_moves=2),
)


@dataclass(frozen=True)
class Estate:
    pods: int = 12
    canary_pods: int = 6
    move_every_s: float = 600.0
    rate_per_s: float = 5.0
    hours: float = 4.0
    base_error: float = 0.001
    cold_s: float = 120.0
    cold_factor: float = 3.0
    burst_s: float = 30.0
    bursts: int = 2
    burst_error: float = 0.3

    @property
    def windows(self) -> int:
        return int(self.hours * 3600 / WINDOW_S)


def simulate(rng: np.random.Generator, est: Estate, sc: Scenario, delta: float,
             balance: float = 1.0):
    """One rollout: per pod instance × window, calls, errors, true rates, cohort, start."""
    t_len = est.windows
    moves = 1 if sc.one_pod else est.canary_pods
    # Instances: the 12 original (baseline) pods, then one canary instance per move.
    starts = np.zeros(est.pods + moves)
    ends = np.full(est.pods + moves, np.inf)
    canary = np.zeros(est.pods + moves, dtype=bool)
    for k in range(moves):
        at = max(0, k - sc.first_moves + 1) * est.move_every_s
        ends[k] = at
        starts[est.pods + k] = at
        canary[est.pods + k] = True
    n_inst = starts.size
    rate = np.full(n_inst, est.base_error)
    if sc.spread:
        rate = rate * rng.lognormal(-sc.spread ** 2 / 2, sc.spread, n_inst)
    if sc.sick:
        sick = {"baseline": est.pods - 1, "first canary": est.pods,
                "third canary": est.pods + 2}[sc.sick]
        if sick < n_inst:
            rate[sick] *= 10.0
    t0 = np.arange(t_len) * WINDOW_S
    alive = (t0[None, :] >= starts[:, None]) & (t0[None, :] < ends[:, None])
    if sc.bad_nodes:
        rate[est.pods] = 0.1  # the first canary instance, on pod 0's node
        rate[est.pods - 1] = 0.1  # a baseline pod that never moves
    p = np.broadcast_to(rate[:, None], (n_inst, t_len)).copy()
    if sc.cold:
        cold = alive & (t0[None, :] < starts[:, None] + est.cold_s) & (starts[:, None] > 0)
        p = np.where(cold, p * est.cold_factor, p)
    p = np.where(canary[:, None], p + delta, p)
    if sc.bursts:
        for b_start in rng.uniform(0, t_len * WINDOW_S - est.burst_s, est.bursts):
            hit = (t0 >= b_start - WINDOW_S) & (t0 < b_start + est.burst_s)
            frac = np.clip((np.minimum(t0 + WINDOW_S, b_start + est.burst_s)
                            - np.maximum(t0, b_start)) / WINDOW_S, 0, 1) * hit
            p = p * (1 - frac) + est.burst_error * frac
    p = np.clip(p, 0, 1)
    # Cohort-balanced sampling, as the engine does: the smaller cohort's pods are called
    # up to `balance` × the rate, so that both cohorts get about as many calls.
    pods_b = (alive & ~canary[:, None]).sum(axis=0)
    pods_c = (alive & canary[:, None]).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        speed_c = np.clip(np.where(pods_c > 0, pods_b / np.maximum(pods_c, 1), 1.0), 1, balance)
        speed_b = np.clip(np.where(pods_b > 0, pods_c / np.maximum(pods_b, 1), 1.0), 1, balance)
    speed = np.where(canary[:, None], speed_c[None, :], speed_b[None, :])
    n = np.where(alive, rng.poisson(est.rate_per_s * WINDOW_S * speed), 0)
    s = rng.binomial(n, p)
    return n.astype(float), s.astype(float), p, canary, starts


def first(mask: np.ndarray) -> float:
    hit = np.flatnonzero(mask)
    return float(hit[0] + 1) if hit.size else math.nan


def run_pooled(n, s, canary, log_thr):
    nb, nc = np.cumsum(n[~canary].sum(0)), np.cumsum(n[canary].sum(0))
    sb, sc_ = np.cumsum(s[~canary].sum(0)), np.cumsum(s[canary].sum(0))
    ok = (nb > 0) & (nc > 0)
    t = bounded.two_sample(sb, np.maximum(nb, 1), sc_, np.maximum(nc, 1), 1.0,
                           TOL.success_rate_drop_pp / 100)
    return (t.log_e_fail >= log_thr) & ok, (t.log_e_pass >= log_thr) & ok


def run_pods(n, s, canary, starts, warmup_s, log_thr):
    t0 = np.arange(n.shape[1]) * WINDOW_S
    warm = t0[None, :] < (starts[:, None] + warmup_s) * (starts[:, None] > 0)
    n_, s_ = np.where(warm, 0.0, n), np.where(warm, 0.0, s)
    tr = pod_track(n_, s_, canary, 1.0, TOL.success_rate_drop_pp / 100, log_threshold=log_thr)
    return tr.log_e_fail >= log_thr, tr.log_e_pass >= log_thr


def sprt_time(n, s, p, canary, delta: float, log_thr: float) -> float:
    tol = TOL.success_rate_drop_pp / 100
    nc, sc_, pc = n[canary], s[canary], np.clip(p[canary], 1e-9, 1 - 1e-9)
    base = np.clip(pc - delta, 1e-9, 1 - 1e-9)  # what a baseline pod in that cell would have
    bound = np.clip(base + tol, 1e-9, 1 - 1e-9)
    # Both decisions are log L(truth) / L(boundary): a fail when the truth is beyond the
    # boundary (mode "fail"), a pass when it is within it (mode "pass").
    llr = sc_ * np.log(pc / bound) + (nc - sc_) * np.log((1 - pc) / (1 - bound))
    return first(np.cumsum(llr.sum(0)) >= log_thr)


def cp_upper(k: int, n: int, level: float = 0.95) -> float:
    return 1.0 if k >= n else float(beta_dist.ppf(level, k + 1, n - k))


def fmt_min(windows: list[float], p90: bool = False) -> str:
    """Median minutes of the decided runs; with `p90`, also the 90th percentile of all runs
    (undecided runs count as never, so it is "–" when more than 10 % never decided)."""
    x = np.array(windows, dtype=float)
    decided = x[np.isfinite(x)]
    if not decided.size:
        return "–"
    text = f"{np.median(decided) * WINDOW_S / 60:.1f}"
    if p90:
        q = np.quantile(np.where(np.isfinite(x), x, np.inf), 0.9, method="higher")
        text += f" [p90 {q * WINDOW_S / 60:.1f}]" if np.isfinite(q) else " [p90 –]"
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--warmup", type=float, default=120.0, help="warm-up left out, seconds")
    ap.add_argument("--move-every", type=float, default=300.0,
                    help="seconds between pods moved to the canary")
    ap.add_argument("--scenario", action="append", help="only these scenarios (by name)")
    ap.add_argument("--balance", type=float, default=10.0,
                    help="cohort-balanced sampling ceiling (probe.cohort_balance_max; 1: off)")
    args = ap.parse_args()
    est = Estate(move_every_s=args.move_every)
    log_thr = math.log(SLOTS / ALPHA)
    tol = TOL.success_rate_drop_pp / 100
    print(f"{args.rollouts} rollouts per row; 12 pods × {est.rate_per_s:g}/s "
          f"(cohort balance up to {args.balance:g}×), a pod moved every "
          f"{est.move_every_s / 60:g} min until {est.canary_pods}, "
          f"{est.hours:g} h, 10 s windows, α = {ALPHA} over {SLOTS} metric slots")
    print("| scenario | A/A fails (95 % upper) | passed in 30 min / 1 h / 4 h | time to pass, "
          "min (SPRT) | wrong passes at 1× / 2× tol | 2× tol failed in 1 h | time to fail "
          "+0.5 pp, min (SPRT) |")
    print("|" + "---|" * 7)
    for sc in SCENARIOS:
        if args.scenario and sc.name not in args.scenario:
            continue
        t_start = time.perf_counter()
        rng = np.random.default_rng([args.seed, SCENARIOS.index(sc)])
        res: dict[str, list[float]] = {k: [] for k in ("ff", "pass", "wrong1", "wrong2",
                                                        "fail2", "fail")}
        sprt_pass: list[float] = []
        sprt_fail: list[float] = []
        for _ in range(args.rollouts):
            for delta, kind in ((0.0, "aa"), (tol, "wrong1"), (2 * tol, "wrong2"),
                                (0.005, "ab")):
                n, s, p, canary, starts = simulate(rng, est, sc, delta, args.balance)
                fail, ok = run_pods(n, s, canary, starts, args.warmup, log_thr)
                tf, tp = first(fail), first(ok)
                if kind == "aa":
                    res["ff"].append(float(not math.isnan(tf)))
                    res["pass"].append(tp if math.isnan(tf) or tp < tf else math.nan)
                    sprt_pass.append(sprt_time(n, s, p, canary, 0.0, log_thr))
                elif kind.startswith("wrong"):
                    res[kind].append(float(not math.isnan(tp) and (math.isnan(tf) or tp < tf)))
                    if kind == "wrong2":
                        res["fail2"].append(float(tf <= 3600 / WINDOW_S))
                else:
                    res["fail"].append(tf)
                    sprt_fail.append(sprt_time(n, s, p, canary, 0.005, log_thr))
        r, k = res, int(sum(res["ff"]))
        within = [np.mean(np.array(r["pass"]) <= m * 60 / WINDOW_S) for m in (30, 60, 240)]
        aa = f"{100 * k / args.rollouts:.1f} % ({100 * cp_upper(k, args.rollouts):.1f} %)"
        if sc.sick_canary:
            aa = f"{100 * k / args.rollouts:.0f} % failed, wanted"
        print(f"| {sc.name} | {aa} | " + " / ".join(f"{100 * w:.0f} %" for w in within)
              + f" | {fmt_min(r['pass'], p90=True)} ({fmt_min(sprt_pass)}) | "
              f"{100 * np.mean(r['wrong1']):.1f} % / {100 * np.mean(r['wrong2']):.1f} % | "
              f"{100 * np.mean(r['fail2']):.0f} % | "
              f"{fmt_min(r['fail'])} ({fmt_min(sprt_fail)}) |", flush=True)
        print(f"<!-- {sc.name}: {time.perf_counter() - t_start:.0f} s -->", file=sys.stderr)


if __name__ == "__main__":
    main()
