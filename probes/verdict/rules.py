"""The verdict's rules, written once: the states, the gates, how states combine, and which test
judges each metric.

Everything here works on arrays with one entry per *look* (a moment the verdict is asked
for): `probes.verdict.judge` calls it with one look (now), `probes.verdict.replay` with every
look of a past rollout, so the live verdict and the report's replay cannot drift apart.

- `State`: pass, fail, inconclusive and n/a (no comparison), spelled as the verdict JSON
  spells them; `CODES` gives the int8 codes that arrays of looks hold, "worse" larger.
- `decide`: a metric fails when E_fail ≥ 1/α_share, passes when E_pass ≥ 1/α_share.
- `gates`: what keeps a look from passing whatever the e-values say (no comparison, fewer
  than min_samples requests, stale data, an overloaded probe).
- `combine`: metric states into a path's, paths' into the verdict's: fail if any fails, pass
  only if every one that applies passes, else inconclusive.
- `applies` / `measured` and the four `*_test` functions: which totals make a metric apply,
  and the two-sample test (with its tolerance) that judges it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from probes.stats import bounded, quantile, rates

__all__ = [
    "ATTEMPTS",
    "CODES",
    "LATENCY_P99",
    "METRICS",
    "STALE_WINDOWS",
    "STATES",
    "STREAM_RESETS",
    "SUCCESS_RATE",
    "Gates",
    "State",
    "TolerancesLike",
    "applies",
    "attempts_out_of_range",
    "attempts_scaled",
    "attempts_test",
    "codes_of",
    "combine",
    "combine_codes",
    "decide",
    "gates",
    "hold",
    "latency_test",
    "log_threshold",
    "measured",
    "path_states",
    "resets_test",
    "stale",
    "success_test",
]

F64 = npt.NDArray[np.float64]
I8 = npt.NDArray[np.int8]
Bools = npt.NDArray[np.bool_]

SUCCESS_RATE = "success_rate"
LATENCY_P99 = "latency_p99_ms"
ATTEMPTS = "attempts_per_request"
STREAM_RESETS = "stream_resets_per_hour"
METRICS = (SUCCESS_RATE, LATENCY_P99, ATTEMPTS, STREAM_RESETS)


class State(enum.StrEnum):
    """A metric's, a path's or the verdict's state; the value is the JSON string."""

    NOT_APPLICABLE = "n/a"
    INCONCLUSIVE = "inconclusive"
    PASS = "pass"
    FAIL = "fail"


# The one place states become int8 codes: the enum's order, so "worse" is larger.
STATES: tuple[State, ...] = tuple(State)
CODES: Mapping[State, int] = {s: i for i, s in enumerate(STATES)}
_NA, _INC, _PASS, _FAIL = (CODES[s] for s in STATES)
# Data can be 2 windows old before it is stale; the slack absorbs float rounding of times.
STALE_WINDOWS = 2
_TIME_SLACK_S = 1e-6


def codes_of(states: Iterable[str] | npt.NDArray[np.str_]) -> I8:
    """The int8 codes of states given by value ("pass", ...); anything else is inconclusive
    (never a pass by accident)."""
    names = np.asarray(states if isinstance(states, np.ndarray) else list(states), dtype=object)
    out = np.full(names.shape, _INC, dtype=np.int8)
    for state, code in CODES.items():
        out[names == state.value] = code
    return out


def decide(log_e_fail: npt.ArrayLike, log_e_pass: npt.ArrayLike, log_threshold: float) -> I8:
    """Fail where log E_fail reaches the threshold, else pass where log E_pass does."""
    f, p = np.asarray(log_e_fail), np.asarray(log_e_pass)
    return np.where(f >= log_threshold, _FAIL,
                    np.where(p >= log_threshold, _PASS, _INC)).astype(np.int8)


def combine_codes(codes: npt.ArrayLike) -> I8:
    """(members, looks) codes → one per look: fail if any fails; pass if at least one applies
    and every one that applies passes; else inconclusive (so too with no members)."""
    c = np.asarray(codes, dtype=np.int8)
    applies = c != _NA
    fail = (c == _FAIL).any(axis=0)
    all_pass = applies.any(axis=0) & ((c == _PASS) | ~applies).all(axis=0)
    return np.where(fail, _FAIL, np.where(all_pass, _PASS, _INC)).astype(np.int8)


def combine(states: Iterable[str]) -> State:
    """`combine_codes` for one look: metric states into a path's, path states into the
    verdict's."""
    return STATES[int(combine_codes(codes_of(states).reshape(-1, 1))[0])]


def hold(codes: npt.ArrayLike, blocked: npt.ArrayLike, stale: npt.ArrayLike = False) -> I8:
    """States held at inconclusive where a gate blocks the look (n/a stays n/a), and passes
    where the data is `stale` only: a fail's e-value crossed 1/α on the data there is, and
    an anytime-valid rejection stands whenever it is read; a pass needs data still coming."""
    c = np.asarray(codes, dtype=np.int8)
    out = np.where(np.asarray(blocked, dtype=bool) & (c != _NA), _INC, c)
    return np.where(np.asarray(stale, dtype=bool) & (out == _PASS), _INC, out).astype(np.int8)


def path_states(metric_codes: npt.ArrayLike, blocked: npt.ArrayLike,
                stale: npt.ArrayLike = False) -> tuple[I8, I8]:
    """A path at each look from its (metrics, looks) codes and its gates: the metrics'
    states (`hold`) and the path's (inconclusive where blocked, else `combine_codes` of
    the held states, so stale data keeps a fail and never passes)."""
    held = hold(metric_codes, blocked, stale)
    path = np.where(np.asarray(blocked, dtype=bool), _INC, combine_codes(held))
    return path.astype(np.int8), held


def stale(age_s: npt.ArrayLike, window_s: float) -> Bools:
    """Whether a cohort's newest window, ended `age_s` ago, is too old to judge on."""
    return np.asarray(np.asarray(age_s, dtype=np.float64)
                      > STALE_WINDOWS * window_s + _TIME_SLACK_S)


@dataclass(frozen=True, slots=True, eq=False)
class Gates:
    """Per look, each reason a path cannot pass whatever its statistics say."""

    apart: Bools  # the cohorts have no data in common: nothing to compare
    few_baseline: Bools  # fewer than min_samples requests (while either has requests)
    few_canary: Bools
    stale_baseline: Bools
    stale_canary: Bools
    overloaded: Bools

    def blocked(self) -> Bools:
        """Where no decision is made: nothing to compare, too few requests, an overloaded
        probe (stale data holds passes only: `stale`)."""
        return np.asarray(self.apart | self.few_baseline | self.few_canary | self.overloaded)

    def stale(self) -> Bools:
        """Where either cohort's data is stale: a fail stands, a pass is held (`hold`)."""
        return np.asarray(self.stale_baseline | self.stale_canary)


def gates(requests_b: npt.ArrayLike, requests_c: npt.ArrayLike, *, both: npt.ArrayLike,
          min_samples: int, window_s: float, age_b: npt.ArrayLike | None = None,
          age_c: npt.ArrayLike | None = None, overloaded: npt.ArrayLike = False) -> Gates:
    """The gates at each look from the cohorts' cumulative requests, whether `both` have
    data, their newest windows' ages (None: fresh) and the probe's overload."""
    rb = np.asarray(requests_b, dtype=np.float64)
    rc = np.asarray(requests_c, dtype=np.float64)
    some = (rb > 0) | (rc > 0)
    shape = rb.shape

    def old(age: npt.ArrayLike | None) -> Bools:
        return np.zeros(shape, dtype=bool) if age is None else stale(age, window_s)

    return Gates(
        apart=~np.broadcast_to(np.asarray(both, dtype=bool), shape),
        few_baseline=some & (rb < min_samples), few_canary=some & (rc < min_samples),
        stale_baseline=old(age_b), stale_canary=old(age_c),
        overloaded=np.broadcast_to(np.asarray(overloaded, dtype=bool), shape),
    )


# Which totals make a metric apply (either cohort has them) and be measured (both need
# them). Totals are any object with the store's sums as attributes, scalars or per look.
def applies(metric: str, t: Any) -> Bools:
    if metric == STREAM_RESETS:
        return np.asarray((np.asarray(t.stream_seconds) > 0)
                          | (np.asarray(t.streams_opened) > 0))
    return measured(metric, t)


def measured(metric: str, t: Any) -> Bools:
    return np.asarray(_MEASURED[metric](t) > 0)


_MEASURED = {
    SUCCESS_RATE: lambda t: np.asarray(t.requests),
    LATENCY_P99: lambda t: np.asarray(t.latency).sum(axis=-1),
    ATTEMPTS: lambda t: np.asarray(t.attempts_count),
    STREAM_RESETS: lambda t: np.asarray(t.stream_seconds),
}


def attempts_out_of_range(attempts_sum: npt.ArrayLike, attempts_count: npt.ArrayLike,
                          attempts_max: int) -> Bools:
    """Counts no calls of 1 to attempts_max attempts can give: the attempts test's bound
    does not hold, so the metric is not judged."""
    s, n = np.asarray(attempts_sum), np.asarray(attempts_count)
    return np.asarray((n > 0) & ~((n <= s) & (s <= attempts_max * n)))


class TolerancesLike(Protocol):
    """`probes.spec.Tolerances`, as the tests read it."""

    @property
    def success_rate_drop_pp(self) -> float: ...
    @property
    def latency_p99_ratio(self) -> float: ...
    @property
    def latency_p99_margin_ms(self) -> float: ...
    @property
    def attempts_ratio(self) -> float: ...
    @property
    def stream_resets_ratio(self) -> float: ...
    @property
    def stream_resets_margin_per_hour(self) -> float: ...


def success_test(req_b: F64, err_b: F64, req_c: F64, err_c: F64,
                 tol: TolerancesLike) -> bounded.TwoSample:
    """Error rates: H0 canary's ≤ baseline's + the allowed drop in success rate."""
    return bounded.two_sample(err_b, req_b, err_c, req_c, 1.0, tol.success_rate_drop_pp / 100.0)


def latency_test(cum_b: F64, cum_c: F64, layout: quantile.Layout, tol: TolerancesLike,
                 log_threshold: float) -> bounded.TwoSample:
    """p99 from cumulative bucket counts: H0 canary's ≤ ratio × baseline's + margin."""
    return quantile.two_sample(cum_b, cum_c, layout, 0.99, tol.latency_p99_ratio,
                               tol.latency_p99_margin_ms / 1000.0, log_threshold)


def attempts_scaled(attempts_sum: F64, attempts_count: F64, attempts_max: int) -> F64:
    """Each call's attempts A in [1, attempts_max] as Y = (A − 1)/(attempts_max − 1), summed."""
    return np.asarray((attempts_sum - attempts_count) / float(attempts_max - 1))


def attempts_test(sum_b: F64, count_b: F64, sum_c: F64, count_c: F64, tol: TolerancesLike,
                  attempts_max: int) -> bounded.TwoSample:
    """Mean attempts 1 + (A_max − 1)·μ_c ≤ r·(1 + (A_max − 1)·μ_b) is the linear null
    μ_c ≤ r·μ_b + (r − 1)/(A_max − 1) on the scaled attempts."""
    span = float(attempts_max - 1)
    r = tol.attempts_ratio
    return bounded.two_sample(attempts_scaled(sum_b, count_b, attempts_max), count_b,
                              attempts_scaled(sum_c, count_c, attempts_max), count_c, r,
                              min((r - 1.0) / span, 1 - 1e-12))


def resets_test(resets_b: F64, seconds_b: F64, resets_c: F64, seconds_c: F64,
                tol: TolerancesLike) -> bounded.TwoSample:
    """Resets per stream-hour: H0 canary's ≤ ratio × baseline's + margin."""
    return rates.two_sample(resets_b, seconds_b / 3600.0, resets_c, seconds_c / 3600.0,
                            tol.stream_resets_ratio, tol.stream_resets_margin_per_hour)


def log_threshold(alpha_share: float) -> float:
    """log(1/α_share), the level both e-values are held to."""
    return math.log(1.0 / alpha_share)
