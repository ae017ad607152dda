"""Verdicts on simulated estates: false fails, wrong passes and times to decide, per scenario.

What real estates do, each as a scenario of its own and some together (`SCENARIOS`):

- independent: every call independent, every pod alike;
- one-pod canary: the canary stuck at one pod for the whole run;
- pod spread σ 0.5: each pod instance draws its own error rate, × lognormal(σ 0.5, mean 1)
  around 0.1 % (τ ≈ 0.053 pp between pods); a restarted pod draws anew; with a one-pod
  canary too;
- sick pods: spread σ 0.3 and one pod instance at 10× the errors (a baseline pod, the first
  or the third canary pod);
- cold start: a pod's first 2 minutes after it starts have 3× the errors;
- shared bursts: two 30 s dependency outages in 4 h hit every pod of both cohorts (30 %
  errors);
- all: spread σ 0.5, cold starts and bursts together;
- bad nodes: two nodes fail 10 % of calls, whatever runs there: the first pod to move to
  the canary and one pod that stays on the baseline (as the fleet test does on loopback);
- two-pod start: "independent", with two pods moving to the canary at once at the start.

A rollout: 12 pods at 5 calls/s each (10 s windows), 4 hours; one pod restarts into the canary
cohort every `--move-every` (5 min) until 6 of 12 have, the first at the start (a restart is
a new pod instance: it starts cold and draws a new rate). The verdict is asked after every
window, with α = 1 % shared over a path's four metric slots as `judge()` does (α/4 per metric).

Methods on the same data (the verdict's: each restarted pod's first `--warmup` seconds left
out):
- verdict: `probes.stats.pods.pod_track`, pods × windows (what the verdict core does);
- SPRT: Wald's SPRT on the canary's calls knowing every cell's true rate, H0 the tolerance
  boundary against H1 the truth (time to fail), or the truth against the boundary (time to
  pass): the optimum for calls that are independent, and beside it the same on every call,
  warm-up included ("all calls");
- pod oracle: the optimum for what the pods carry when pods differ, Wald's SPRT with each
  canary pod's likelihood integrated over its random effect (pods are random effects: the
  oracle knows the spread they are drawn from, hence τ², the baseline's mean and each pod's
  calls, not the pod's own draw). It is sound whatever the pods do and no real test is
  faster: a real one must also learn the baseline and τ². With no spread (τ = 0) it is the
  SPRT. It also uses the lognormal's bounded lower tail, so its passes are optimistic;
- pod oracle, baseline learned (`learned_time`): normal pod counts, τ² known, the
  baseline's level learned from every pod: the reference for passes (its fails are
  optimistic, the normal's upper tail being too light).
"Sick" and "bad-node" pods are fixed effects the oracles know.

Reported per scenario: A/A false-fail rate (with its 95 % Clopper–Pearson upper bound) and
wrong passes (passed before any fail) at once and twice the tolerance, for the verdict; for
each method, the share of healthy canaries passed within 30 min / 1 h (and 4 h for the
verdict) and the median time to pass of those that passed (the verdict's p90 over all runs,
"–" when more than 10 % never passed), the share of canaries at twice the tolerance failed
within 1 h, and the median time to fail +0.5 pp. `--floors` prints the limits that hold
with unlimited calls (`floors`); `--edge`, wrong passes of a canary at the tolerance over
the pods' spreads (`edge_sweep`).

    .venv/bin/python benchmarks/verdict_sim.py                    # 300 rollouts per row
    .venv/bin/python benchmarks/verdict_sim.py --rollouts 60      # a quick look
    .venv/bin/python benchmarks/verdict_sim.py --verdict-only     # the verdict's columns
    .venv/bin/python benchmarks/verdict_sim.py --floors
    .venv/bin/python benchmarks/verdict_sim.py --edge --rollouts 600   # wrong passes by σ
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.spec import Tolerances
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


@dataclass(frozen=True)
class Rollout:
    """One simulated rollout, per pod instance × window. A cell's true error rate is
    a·L + b + g·δ (clipped to [0, 1]), with L the instance's random effect (its draw from
    the pods' lognormal spread, 1 without spread) and δ the version's shift: the optima
    below re-evaluate it at other L and δ."""

    n: np.ndarray  # calls
    s: np.ndarray  # errors
    a: np.ndarray  # the cell's rate per unit of L (base rate × sick, bad-node and cold factors)
    b: np.ndarray  # the part L does not scale (a shared outage's share)
    g: np.ndarray  # the share of δ the cell carries (0 off the canary, less during outages)
    effect: np.ndarray  # (instances,) L
    canary: np.ndarray
    starts: np.ndarray

    def rate(self, effect: np.ndarray, delta: float) -> np.ndarray:
        """True rates (instances, nodes, windows) with L at `effect` (instances, nodes)."""
        p = (self.a[:, None, :] * effect[:, :, None] + self.b[:, None, :]
             + self.g[:, None, :] * delta)
        return np.clip(p, 1e-9, 1 - 1e-9)


def simulate(rng: np.random.Generator, est: Estate, sc: Scenario, delta: float,
             balance: float = 1.0) -> Rollout:
    """One rollout with the canary's version shifted by `delta` (module docstring)."""
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
    level = np.full(n_inst, est.base_error)
    effect = np.ones(n_inst)
    if sc.spread:
        effect = rng.lognormal(-sc.spread ** 2 / 2, sc.spread, n_inst)
    if sc.sick:
        sick = {"baseline": est.pods - 1, "first canary": est.pods,
                "third canary": est.pods + 2}[sc.sick]
        if sick < n_inst:
            level[sick] *= 10.0
    t0 = np.arange(t_len) * WINDOW_S
    alive = (t0[None, :] >= starts[:, None]) & (t0[None, :] < ends[:, None])
    if sc.bad_nodes:
        # The first canary instance (on pod 0's node) and a baseline pod that never moves.
        level[[est.pods, est.pods - 1]] = 0.1
        effect[[est.pods, est.pods - 1]] = 1.0
    a = np.broadcast_to(level[:, None], (n_inst, t_len)).copy()
    if sc.cold:
        cold = alive & (t0[None, :] < starts[:, None] + est.cold_s) & (starts[:, None] > 0)
        a = np.where(cold, a * est.cold_factor, a)
    frac = np.zeros(t_len)
    if sc.bursts:
        for b_start in rng.uniform(0, t_len * WINDOW_S - est.burst_s, est.bursts):
            hit = (t0 >= b_start - WINDOW_S) & (t0 < b_start + est.burst_s)
            frac = 1 - (1 - frac) * (1 - np.clip((np.minimum(t0 + WINDOW_S, b_start + est.burst_s)
                                                 - np.maximum(t0, b_start)) / WINDOW_S, 0, 1) * hit)
    a = a * (1 - frac)
    b = np.broadcast_to(est.burst_error * frac, (n_inst, t_len))
    g = canary[:, None] * (1 - frac)[None, :]
    p = np.clip(a * effect[:, None] + b + g * delta, 0, 1)
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
    return Rollout(n.astype(float), s.astype(float), a, b, g, effect, canary, starts)


def first(mask: np.ndarray) -> float:
    hit = np.flatnonzero(mask)
    return float(hit[0] + 1) if hit.size else math.nan


def warm_only(r: Rollout, warmup_s: float) -> Rollout:
    """The rollout without each restarted pod's first `warmup_s`: the calls the verdict sees."""
    t0 = np.arange(r.n.shape[1]) * WINDOW_S
    cold = t0[None, :] < (r.starts[:, None] + warmup_s) * (r.starts[:, None] > 0)
    return replace(r, n=np.where(cold, 0.0, r.n), s=np.where(cold, 0.0, r.s))


def run_pods(r: Rollout, log_thr: float) -> tuple[np.ndarray, np.ndarray]:
    tr = pod_track(r.n, r.s, r.canary, 1.0, TOL.success_rate_drop_pp / 100, log_threshold=log_thr)
    return tr.log_e_fail >= log_thr, tr.log_e_pass >= log_thr


def effect_prior(spread: float, normal: bool = False, nodes: int = 121
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The pods' random effect L (mean 1) as nodes and log weights, on an even grid over
    ±6 standard deviations, where the trapezoid rule is exact to far below what the
    likelihood's width (a few % of L after an hour's calls) needs: L ~ lognormal(−σ²/2, σ)
    as simulated, or with `normal` L ~ normal(1, e^σ² − 1), the same mean and τ² and no
    more (a lognormal's bounded lower tail lets a test that knows it pass on any pod seen
    well below the tolerance, which no estate's pods promise). σ = 0: L = 1."""
    if not spread:
        return np.ones(1), np.zeros(1)
    z = np.linspace(-6.0, 6.0, nodes)
    log_w = -z * z / 2
    effect = (1 + math.sqrt(math.expm1(spread ** 2)) * z if normal
              else np.exp(-spread ** 2 / 2 + spread * z))
    return effect, log_w - np.logaddexp.reduce(log_w)


def optimum_time(r: Rollout, effect: np.ndarray, log_w: np.ndarray, delta: float,
                 log_thr: float) -> float:
    """Wald's SPRT on the canary pods' calls, truth δ = `delta` against the boundary
    δ = tolerance, each pod's likelihood integrated over its random effect L (nodes
    `effect`, (canary pods, nodes), with `log_w`): the first window at which log L(truth) −
    log L(boundary) reaches `log_thr`. Pods are independent given δ, so the product of
    their marginal likelihood ratios is a martingale under the boundary (Ville: sound at
    exp(−log_thr)); the baseline's pods carry nothing the test does not already know.
    With L known (one node, the pod's own draw) this is the call-level SPRT."""
    tol = TOL.success_rate_drop_pp / 100
    c = r.canary
    n, s = r.n[c][:, None, :], r.s[c][:, None, :]
    sub = Rollout(r.n[c], r.s[c], r.a[c], r.b[c], r.g[c], r.effect[c], c[c], r.starts[c])
    log_lik = []
    for d in (delta, tol):
        p = sub.rate(effect, d)
        ll = np.cumsum(s * np.log(p) + (n - s) * np.log1p(-p), axis=-1)
        log_lik.append(np.logaddexp.reduce(ll + log_w[..., None], axis=1))
    return first((log_lik[0] - log_lik[1]).sum(0) >= log_thr)


def sprt_time(r: Rollout, delta: float, log_thr: float) -> float:
    """The call-level SPRT: every canary pod's L known (no spread left to integrate)."""
    return optimum_time(r, r.effect[r.canary][:, None], np.zeros((1,)), delta, log_thr)


def oracle_time(r: Rollout, spread: float, delta: float, log_thr: float,
                normal: bool = False) -> float:
    """The pod-level oracle: the pods' spread (`effect_prior`) and each pod's calls known,
    each canary pod's own L not."""
    nodes, log_w = effect_prior(spread, normal)
    return optimum_time(r, np.broadcast_to(nodes, (int(r.canary.sum()), nodes.size)), log_w,
                        delta, log_thr)


def learned_time(r: Rollout, spread: float, delta: float, log_thr: float) -> float:
    """The pod-level oracle that must learn the baseline: each pod's error count S_i is
    normal around θ·A_i + B_i + δ·G_i (A, B, G: the cells' a, b, g summed over its calls),
    with variance its sampling's at δ plus its random effect's, (e^σ² − 1)·A_i², both
    known; θ, the baseline's level, is not (1 in truth). θ is integrated out under a flat
    prior, which makes the likelihood ratio that of what does not depend on θ (Cox's
    invariant SPRT): a martingale under the boundary, so sound at exp(−log_thr) where the
    normal holds. Every pod counts, the baseline's to learn θ. At 0.1 % errors the normal
    itself needs about 1.2× the binomial SPRT's calls (its likelihood is quadratic)."""
    tol = TOL.success_rate_drop_pp / 100
    live = r.n.sum(axis=1) > 0
    n, s, a, b, g = (x[live] for x in (r.n, r.s, r.a, r.b, r.g))
    a_, b_, g_, s_ = (np.cumsum(x, axis=1) for x in (n * a, n * b, n * g, s))
    log_m = []
    for d in (delta, tol):
        p = np.clip(a + b + g * d, 1e-9, 1 - 1e-9)
        v = np.cumsum(n * p * (1 - p), axis=1) + math.expm1(spread ** 2) * a_ ** 2
        has = v > 0
        w = np.where(has, 1.0 / np.where(has, v, 1.0), 0.0)
        res = s_ - b_ - d * g_
        saa, sar, srr = (w * a_ * a_).sum(0), (w * a_ * res).sum(0), (w * res * res).sum(0)
        with np.errstate(divide="ignore", invalid="ignore"):
            fit = np.where(saa > 0, sar * sar / saa, 0.0)
            log_m.append(-0.5 * (np.where(has, np.log(np.where(has, v, 1.0)), 0.0).sum(0)
                                 + np.log(np.where(saa > 0, saa, 1.0)) + srr - fit))
    return first(log_m[0] - log_m[1] >= log_thr)


def passed_first(t_fail: float, t_pass: float) -> bool:
    """Whether a run passed before any fail (times in windows, nan: never)."""
    return not math.isnan(t_pass) and (math.isnan(t_fail) or t_pass < t_fail)


# The pods' spreads (lognormal σ) the edge sweep runs: τ² from nothing the baseline's pods
# can show beside their sampling, through undetectable for an hour, to plainly apart.
EDGE_SPREADS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5)


def edge_passes(rng: np.random.Generator, est: Estate, sc: Scenario, rollouts: int,
                log_thr: float, delta: float | None = None, balance: float = 10.0,
                warmup_s: float = 120.0) -> int:
    """Rollouts of a canary `delta` worse (default: exactly at the tolerance) that passed
    before any fail: a pass that treats τ² more sharply must hold this at every spread,
    the ones the baseline's pods cannot yet tell from none included (`edge_sweep`)."""
    shift = TOL.success_rate_drop_pp / 100 if delta is None else delta
    wrong = 0
    for _ in range(rollouts):
        fail, ok = run_pods(warm_only(simulate(rng, est, sc, shift, balance), warmup_s),
                            log_thr)
        wrong += passed_first(first(fail), first(ok))
    return wrong


def edge_sweep(rollouts: int, seed: int, est: Estate) -> None:
    """Wrong passes at H0's edge over the pods' spreads `EDGE_SPREADS`, a canary of one pod
    and the usual ramp to six, `est.hours` each."""
    log_thr = math.log(SLOTS / ALPHA)
    print(f"A canary at the tolerance, {rollouts} rollouts per cell of {est.hours:g} h: "
          "passed before any fail, by the pods' spread σ\n")
    print("| canary | " + " | ".join(f"σ {s:g}" for s in EDGE_SPREADS) + " |")
    print("|---|" + "---|" * len(EDGE_SPREADS))
    for one in (True, False):
        cells = []
        for i, spread in enumerate(EDGE_SPREADS):
            rng = np.random.default_rng([seed, 77, i, int(one)])
            k = edge_passes(rng, est, Scenario("edge", spread=spread, one_pod=one), rollouts,
                            log_thr)
            cells.append(f"{100 * k / rollouts:.1f} % ({100 * cp_upper(k, rollouts):.1f} %)")
        print(f"| {'one pod' if one else 'one to six pods'} | " + " | ".join(cells) + " |",
              flush=True)


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


def np_power(canary_pods: int, spread: float, h0: float, h1: float, alpha: float,
             draws: int = 400_000, seed: int = 1) -> float:
    """With unlimited calls each canary pod's rate is known: base·L + δ, L lognormal(σ).
    The power of the most powerful level-`alpha` test of δ = `h0` against δ = `h1` from
    `canary_pods` such rates (Neyman–Pearson: the likelihood ratio, its threshold drawn
    under H0), the baseline's mean and the spread known: no test on these pods does better."""
    base = Estate().base_error
    rng = np.random.default_rng(seed)

    def log_lr(x: np.ndarray) -> np.ndarray:
        def log_f(y: np.ndarray) -> np.ndarray:  # the density of base·L at y, up to a constant
            with np.errstate(divide="ignore", invalid="ignore"):
                u = np.log(np.where(y > 0, y / base, np.nan))
            out = -u - (u + spread ** 2 / 2) ** 2 / (2 * spread ** 2)
            return np.where(np.isnan(out), -np.inf, out)
        return np.asarray((log_f(x - h1) - log_f(x - h0)).sum(axis=-1))

    def rates(delta: float) -> np.ndarray:
        return base * rng.lognormal(-spread ** 2 / 2, spread, (draws, canary_pods)) + delta

    under_h0 = log_lr(rates(h0))
    cut = np.quantile(under_h0, 1 - alpha, method="higher")
    return float(np.mean(log_lr(rates(h1)) > cut))


def floors() -> None:
    """The limits with unlimited calls, for the goals D21 leaves unmet (BENCHMARKS.md)."""
    tol = TOL.success_rate_drop_pp / 100
    base, sigma = Estate().base_error, 0.5
    tau = base * math.sqrt(math.expm1(sigma ** 2))
    print(f"pods' spread σ {sigma}: τ = {100 * tau:.4f} pp between pods")
    for alpha in (ALPHA / SLOTS, ALPHA):
        z = float(norm.isf(alpha))
        one = np_power(1, sigma, tol, 2 * tol, alpha)
        # A pod beyond the baseline pods' own level-α bound (their 1 − α quantile).
        q = base * math.exp(-sigma ** 2 / 2 + sigma * z)
        beyond = float(norm.sf((math.log((q - 2 * tol) / base) + sigma ** 2 / 2) / sigma))
        six = np_power(6, sigma, tol, 0.0, alpha)
        learned = {k: float(norm.sf(z - tol / (tau * math.sqrt(1 / 6 + 1 / k)))) for k in (6, 12)}
        print(f"α {alpha:g}: one canary pod at 2× tol failed, best test: {100 * one:.1f} % "
              f"(beyond the baseline pods' own 1 − α bound: {100 * beyond:.1f} %); "
              f"six healthy canary pods passed, baseline mean known: {100 * six:.1f} %, "
              f"learned from 6 / 12 baseline pods (normal, τ known): "
              f"{100 * learned[6]:.1f} % / {100 * learned[12]:.1f} %")


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
    ap.add_argument("--verdict-only", action="store_true",
                    help="the verdict's columns alone (the optima do not depend on it)")
    ap.add_argument("--floors", action="store_true",
                    help="print the limits with unlimited calls (`floors`) and stop")
    ap.add_argument("--edge", action="store_true",
                    help="wrong passes at the tolerance over the pods' spreads (`edge_sweep`), "
                         "2 h rollouts, and stop")
    args = ap.parse_args()
    if args.floors:
        floors()
        return
    est = Estate(move_every_s=args.move_every)
    if args.edge:
        edge_sweep(args.rollouts, args.seed, replace(est, hours=2.0))
        return
    log_thr = math.log(SLOTS / ALPHA)
    tol = TOL.success_rate_drop_pp / 100
    print(f"{args.rollouts} rollouts per row; 12 pods × {est.rate_per_s:g}/s "
          f"(cohort balance up to {args.balance:g}×), a pod moved every "
          f"{est.move_every_s / 60:g} min until {est.canary_pods}, "
          f"{est.hours:g} h, 10 s windows, α = {ALPHA} over {SLOTS} metric slots")
    methods = "verdict; SPRT; pod oracle; pod oracle, baseline learned"
    print(f"| scenario | A/A fails (95 % upper) | wrong passes at 1× / 2× tol | passed in "
          f"30 min / 1 h / 4 h: {methods} | time to pass, min: {methods} [SPRT, all calls] | "
          f"2× tol failed in 1 h: {methods} [SPRT, all calls] | time to fail +0.5 pp, min: "
          f"{methods} [SPRT, all calls] |")
    print("|" + "---|" * 7)
    hour = 3600 / WINDOW_S
    for sc in SCENARIOS:
        if args.scenario and sc.name not in args.scenario:
            continue
        t_start = time.perf_counter()
        rng = np.random.default_rng([args.seed, SCENARIOS.index(sc)])
        res: dict[str, list[float]] = {k: [] for k in ("ff", "wrong1", "wrong2")}
        # Times in windows (nan: never) per method: the verdict, the SPRT and the pod oracle
        # (baseline known, learned) on the verdict's (warm) calls, and the SPRT on every call.
        times: dict[str, list[list[float]]] = {k: [[] for _ in range(5)]
                                               for k in ("pass", "fail2", "fail")}
        for _ in range(args.rollouts):
            for delta, kind in ((0.0, "aa"), (tol, "wrong1"), (2 * tol, "wrong2"),
                                (0.005, "ab")):
                full = simulate(rng, est, sc, delta, args.balance)
                r = warm_only(full, args.warmup)
                fail, ok = run_pods(r, log_thr)
                tf, tp = first(fail), first(ok)
                if kind == "wrong1":
                    res[kind].append(float(passed_first(tf, tp)))
                    continue
                if kind == "aa":
                    res["ff"].append(float(not math.isnan(tf)))
                    key, mine = "pass", tp if math.isnan(tf) or tp < tf else math.nan
                else:
                    key, mine = ("fail2" if kind == "wrong2" else "fail"), tf
                    if kind == "wrong2":
                        res[kind].append(float(passed_first(tf, tp)))
                optima = (() if args.verdict_only else (
                    sprt_time(r, delta, log_thr), oracle_time(r, sc.spread, delta, log_thr),
                    learned_time(r, sc.spread, delta, log_thr), sprt_time(full, delta, log_thr)))
                for row, x in zip(times[key], (mine, *optima), strict=False):
                    row.append(x)
        k = int(sum(res["ff"]))
        aa = f"{100 * k / args.rollouts:.1f} % ({100 * cp_upper(k, args.rollouts):.1f} %)"
        if sc.sick_canary:
            aa = f"{100 * k / args.rollouts:.0f} % failed, wanted"
        shown = 1 if args.verdict_only else 4
        shares = "; ".join(" / ".join(f"{100 * within(x, m * hour):.0f} %"
                                      for m in ((0.5, 1, 4) if i == 0 else (0.5, 1)))
                           for i, x in enumerate(times["pass"][:shown]))
        passes, fails2, fails = ("; ".join(f(x, i) for i, x in enumerate(times[key][:shown]))
                                 + ("" if args.verdict_only else f" [{f(times[key][4], 1)}]")
                                 for key, f in (
            ("pass", lambda x, i: fmt_min(x, p90=i == 0)),
            ("fail2", lambda x, i: f"{100 * within(x, hour):.0f} %"),
            ("fail", lambda x, i: fmt_min(x))))
        print(f"| {sc.name} | {aa} | {100 * np.mean(res['wrong1']):.1f} % / "
              f"{100 * np.mean(res['wrong2']):.1f} % | {shares} | {passes} | {fails2} | "
              f"{fails} |", flush=True)
        print(f"<!-- {sc.name}: {time.perf_counter() - t_start:.0f} s -->", file=sys.stderr)


def within(windows: list[float], limit: float) -> float:
    """The share of runs decided within `limit` windows (undecided runs count as never)."""
    return float(np.mean(np.array(windows, dtype=float) <= limit))


if __name__ == "__main__":
    main()
