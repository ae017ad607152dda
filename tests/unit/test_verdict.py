"""probes.verdict.judge: verdicts, reasons and the Verdict JSON, on simulated windows.

Simulated cohorts at the probe's default rate (300 calls per cohort per 10 s window) with
fixed seeds; the window counts in the power tests come from the method's thresholds with
margin (benchmarks/detection.py measures the distributions).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from probes.errors import BadInput
from probes.measure.histogram import BUCKET_COUNT, index_of
from probes.stats import bounded
from probes.types import PathWindow
from probes.verdict.judge import FAIL, INCONCLUSIVE, PASS, judge

T0 = 1_700_000_000.0
OLD, NEW = "1.20.3", "1.21.0"


def _cohort_windows(
    rng: np.random.Generator, path: str, cohort: str, windows: int, *, n: int = 300,
    err: float = 0.001, scale: float = 1.0, retry: float | None = 0.01,
    resets_per_hour: float | None = None, start: float = T0,
) -> list[PathWindow]:
    out = []
    for i in range(windows):
        e = int(rng.binomial(n, err))
        lat = rng.lognormal(math.log(0.05), 0.5, n) * scale
        hist = np.bincount(index_of(lat), minlength=BUCKET_COUNT)
        kw: dict = {}
        if retry is not None:
            kw.update(attempts_sum=n + int(rng.binomial(4 * n, retry)), attempts_count=n)
        if resets_per_hour is not None:
            kw.update(streams_opened=6, stream_seconds=60.0,
                      stream_resets={"goaway": int(rng.poisson(resets_per_hour / 60))})
        out.append(PathWindow(
            start=start + 10 * i, length=10.0, path=path, cohort=cohort,
            outcomes={"ok": n - e, "http_5xx": e}, latency=tuple(hist.tolist()), **kw,
        ))
    return out


def _pair(seed: int, windows: int, path: str = "checkout", **canary: object) -> list[PathWindow]:
    """Baseline and canary windows of one path; the baseline keeps the defaults except for
    the call rate, and measures attempts / streams exactly when the canary does."""
    rng = np.random.default_rng(seed)
    base_kw: dict[str, object] = {k: v for k, v in canary.items() if k == "n"}
    if canary.get("retry", 0.01) is None:
        base_kw["retry"] = None
    if "resets_per_hour" in canary:
        base_kw["resets_per_hour"] = canary.get("base_resets", 2.0)
        canary = {k: v for k, v in canary.items() if k != "base_resets"}
    return (_cohort_windows(rng, path, OLD, windows, **base_kw)  # type: ignore[arg-type]
            + _cohort_windows(rng, path, NEW, windows, **canary))  # type: ignore[arg-type]


def _now(windows: int) -> float:
    return T0 + 10 * windows + 1


@pytest.mark.parametrize(
    ("canary", "windows", "metric"),
    [
        ({"err": 0.011}, 20, "success_rate"),  # +1 pp errors
        ({"scale": 2.0}, 8, "latency_p99_ms"),  # p99 ×2
        ({"retry": 0.27}, 2, "attempts_per_request"),  # attempts 1.04 → 2.08
    ],
)
def test_clear_regressions_fail_within_stated_windows(canary: dict, windows: int,
                                                      metric: str) -> None:
    v = judge(_pair(1, windows, **canary), now=_now(windows))
    assert v.verdict == FAIL
    path = v.path("checkout")
    assert path is not None and path.verdict == FAIL
    m = path.metric(metric)
    assert m is not None and m.verdict == FAIL and m.e_fail is not None
    assert m.e_fail >= 4 / 0.01  # reached 1/α_share
    assert path.reasons[0] == m.reason
    assert any(r.startswith("checkout: fail: ") for r in v.reasons)


def test_success_reason_reads_as_a_plain_sentence() -> None:
    v = judge(_pair(2, 20, err=0.02), now=_now(20))
    m = v.paths[0].metric("success_rate")
    assert m is not None
    assert re.fullmatch(
        r"success rate \d+(\.\d+)?% vs \d+(\.\d+)?% \(-\d+(\.\d+)? pp; allowed -0\.1 pp\)",
        m.reason,
    ), m.reason


def test_equal_cohorts_pass_only_with_evidence() -> None:
    early = judge(_pair(3, 2, retry=0.01), now=_now(2))
    assert early.verdict == INCONCLUSIVE
    assert "not enough evidence" in " ".join(early.paths[0].reasons)
    # No errors in either cohort: an hour... is more than needed; 60 windows suffice.
    rng = np.random.default_rng(4)
    windows = (_cohort_windows(rng, "checkout", OLD, 60, err=0.0)
               + _cohort_windows(rng, "checkout", NEW, 60, err=0.0))
    late = judge(windows, now=_now(60))
    assert late.verdict == PASS
    assert all(m.verdict == PASS for m in late.paths[0].metrics)
    assert late.paths[0].reasons and all("within tolerance" in r for r in late.paths[0].reasons)


def test_no_data_is_inconclusive() -> None:
    v = judge([], now=T0)
    assert v.verdict == INCONCLUSIVE and v.paths == ()
    assert any("no data" in r for r in v.reasons)
    named = judge([], now=T0, paths=["checkout"])
    assert named.paths[0].verdict == INCONCLUSIVE
    assert named.paths[0].reasons == ("no data for this path",)


def test_one_cohort_is_inconclusive() -> None:
    only = _cohort_windows(np.random.default_rng(5), "checkout", OLD, 30)
    v = judge(only, now=_now(30))
    assert v.verdict == INCONCLUSIVE and v.canary is None
    assert any("need two proxy versions" in r for r in v.reasons)
    named = judge(only, now=_now(30), canary=NEW)
    assert named.verdict == INCONCLUSIVE
    assert "no data from the canary cohort 1.21.0" in named.paths[0].reasons[0]


def test_too_few_samples_is_inconclusive_even_when_it_looks_fine() -> None:
    windows = _pair(6, 60, n=20, err=0.0)
    v = judge(windows, now=_now(60), min_samples=5000)
    assert v.verdict == INCONCLUSIVE
    assert "fewer than min_samples 5000" in v.paths[0].reasons[0]
    assert all(m.verdict == INCONCLUSIVE for m in v.paths[0].metrics)


def test_stale_data_keeps_a_fail_and_never_passes() -> None:
    windows = _pair(7, 20, err=0.05)
    fresh = judge(windows, now=_now(20) + 15)
    assert fresh.verdict == FAIL
    # The newest window ended 26 s ago, more than 2 × 10 s: stale. An anytime-valid fail
    # stands whenever it is read; the reason says the data is stale first.
    stale = judge(windows, now=_now(20) + 25)
    assert stale.verdict == FAIL
    assert stale.paths[0].reasons[0].startswith("data is stale")
    assert stale.paths[0].metric("success_rate").verdict == FAIL  # type: ignore[union-attr]
    rng = np.random.default_rng(4)
    alike = (_cohort_windows(rng, "checkout", OLD, 60, err=0.0)
             + _cohort_windows(rng, "checkout", NEW, 60, err=0.0))
    assert judge(alike, now=_now(60)).verdict == PASS
    held = judge(alike, now=_now(60) + 25)
    assert held.verdict == INCONCLUSIVE
    assert held.paths[0].reasons[0].startswith("data is stale")
    assert all(m.verdict == INCONCLUSIVE for m in held.paths[0].metrics)


def test_overloaded_probe_is_inconclusive() -> None:
    v = judge(_pair(8, 20, err=0.05), now=_now(20), overloaded=True)
    assert v.verdict == INCONCLUSIVE
    assert any("overloaded" in r for r in v.paths[0].reasons)


def test_json_has_exactly_the_documented_shape() -> None:
    v = judge(_pair(9, 12, err=0.03), now=_now(12))
    doc = json.loads(json.dumps(v.to_json(), allow_nan=False))
    assert set(doc) == {"verdict", "baseline", "canary", "window", "paths", "reasons"}
    assert (doc["verdict"], doc["baseline"], doc["canary"]) == ("fail", OLD, NEW)
    assert doc["window"] == {"from": "2023-11-14T22:13:20Z", "to": "2023-11-14T22:15:20Z"}
    (p,) = doc["paths"]
    assert set(p) == {"path", "verdict", "samples", "metrics", "reasons"}
    assert p["samples"] == {"baseline": 3600, "canary": 3600}
    assert set(p["metrics"]) == {"success_rate", "latency_p99_ms", "attempts_per_request"}
    sr = p["metrics"]["success_rate"]
    assert sr["verdict"] == "fail" and 0.95 < sr["canary"] < sr["baseline"] <= 1
    assert sr["lower"]["canary"] <= sr["canary"] <= sr["upper"]["canary"]
    assert sr["counts"]["baseline"]["requests"] == 3600
    assert sr["alpha"] == pytest.approx(0.01 / 4)
    assert sr["tolerance"] == {"max_drop_pp": 0.1}
    assert sr["e_value"]["fail"] >= 400 and sr["p_value"]["fail"] <= 1 / 400
    assert all(isinstance(r, str) and r for r in p["reasons"] + doc["reasons"])


def test_metrics_that_do_not_apply_are_absent_and_half_measured_is_inconclusive() -> None:
    v = judge(_pair(10, 10, retry=None), now=_now(10))
    assert [m.name for m in v.paths[0].metrics] == ["success_rate", "latency_p99_ms"]
    rng = np.random.default_rng(11)
    half = (_cohort_windows(rng, "checkout", OLD, 10)
            + _cohort_windows(rng, "checkout", NEW, 10, retry=None))
    m = judge(half, now=_now(10)).paths[0].metric("attempts_per_request")
    assert m is not None and m.verdict == INCONCLUSIVE and m.e_fail is None
    assert "canary cohort has no data" in m.reason


def test_attempts_beyond_attempts_max_make_the_metric_inconclusive() -> None:
    windows = _pair(12, 5, retry=0.01)
    doubled = [w if w.cohort == OLD else PathWindow(
        start=w.start, length=w.length, path=w.path, cohort=w.cohort, outcomes=w.outcomes,
        latency=w.latency, attempts_sum=w.attempts_count * 7, attempts_count=w.attempts_count,
    ) for w in windows]
    m = judge(doubled, now=_now(5)).paths[0].metric("attempts_per_request")
    assert m is not None and m.verdict == INCONCLUSIVE and "attempts_max 5" in m.reason


def test_stream_resets_fail_a_reset_storm() -> None:
    windows = _pair(13, 30, resets_per_hour=200.0, base_resets=2.0)
    v = judge(windows, now=_now(30))
    m = v.paths[0].metric("stream_resets_per_hour")
    assert m is not None and m.verdict == FAIL and m.unit == "per_hour"
    assert m.canary.estimate is not None and m.canary.estimate > 100


def test_cohorts_are_picked_by_version_not_by_string() -> None:
    rng = np.random.default_rng(14)
    windows = [w for c in ("1.9.0", "1.20.3", "none") for w in _cohort_windows(
        rng, "checkout", c, 5)]
    v = judge(windows, now=_now(5))
    assert (v.baseline, v.canary) == ("1.9.0", "1.20.3")
    assert any("'none'" in r for r in v.reasons)


def test_one_failing_path_fails_the_verdict_and_shares_alpha() -> None:
    windows = _pair(15, 20, path="a") + _pair(16, 20, path="b", err=0.05)
    v = judge(windows, now=_now(20))
    assert v.verdict == FAIL
    assert [p.verdict for p in v.paths] == [INCONCLUSIVE, FAIL]
    assert v.paths[1].metrics[0].alpha == pytest.approx(0.01 / 8)


def test_judge_decides_exactly_on_the_two_sample_e_value() -> None:
    windows = _pair(17, 30, err=0.004)
    v = judge(windows, now=_now(30))
    m = v.paths[0].metric("success_rate")
    assert m is not None
    b, c = m.baseline.counts, m.canary.counts
    ref = bounded.two_sample(b["errors"], b["requests"], c["errors"], c["requests"], 1.0, 0.001)
    assert m.e_fail == pytest.approx(math.exp(float(ref.log_e_fail)), rel=1e-9)
    assert (m.verdict == FAIL) == (float(ref.log_e_fail) >= math.log(400))


def test_since_fixes_the_origin() -> None:
    windows = _pair(18, 30, err=0.05)
    v = judge(windows, now=_now(30), since=T0 + 200)
    assert v.window_from == T0 + 200
    assert v.paths[0].samples_baseline == 10 * 300


def test_store_table_input(tmp_path: Path) -> None:
    from probes.store import Store

    windows = _pair(19, 12, err=0.03)
    with Store.open(tmp_path / "v.db") as store:
        store.write(windows)
        table = store.read_table()
    a, b = judge(windows, now=_now(12)), judge(table, now=_now(12))
    assert a.to_json() == b.to_json()


@pytest.mark.parametrize(
    "kwargs", [{"alpha": 0.0}, {"alpha": 1.5}, {"window_s": 0.0}, {"attempts_max": 1}]
)
def test_bad_parameters_raise_bad_input(kwargs: dict) -> None:
    with pytest.raises(BadInput):
        judge([], now=T0, **kwargs)
