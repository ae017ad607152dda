"""probes.stats.series: the comparison span and per-cohort totals, from windows or columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from probes.measure.histogram import BUCKET_COUNT
from probes.stats.series import columns, overlapping, path_series
from probes.types import PathWindow


def _w(start: float, cohort: str, ok: int, errors: int = 0, path: str = "checkout",
       bucket: int = 900, **kw: object) -> PathWindow:
    latency = [0] * BUCKET_COUNT
    latency[bucket] = ok + errors
    return PathWindow(
        start=start, length=10.0, path=path, cohort=cohort,
        outcomes={"ok": ok, "http_5xx": errors, **kw.pop("extra", {})},  # type: ignore[dict-item]
        latency=tuple(latency), **kw,  # type: ignore[arg-type]
    )


def test_span_starts_where_both_cohorts_have_data_and_ends_at_the_last_common_window() -> None:
    windows = [
        _w(0, "1.20.3", 100),  # before the canary appears: not compared
        _w(10, "1.20.3", 100, 1), _w(10, "1.21.0", 50, 2),
        _w(20, "1.20.3", 100), _w(20, "1.21.0", 50),
        _w(30, "1.20.3", 100),  # canary window not written yet: not compared
    ]
    (s,) = path_series(columns(windows), "1.20.3", "1.21.0")
    assert s.span == (10.0, 30.0)
    assert s.baseline is not None and s.canary is not None
    assert (s.baseline.requests, s.baseline.errors, s.baseline.windows) == (201, 1, 2)
    assert (s.canary.requests, s.canary.errors) == (102, 2)
    assert int(s.canary.latency.sum()) == 102
    assert s.newest_end == {"1.20.3": 40.0, "1.21.0": 30.0}


def test_since_moves_the_origin_and_unknown_paths_are_listed_empty() -> None:
    windows = [_w(t, c, 10) for t in (0, 10, 20) for c in ("a1", "b1")]
    (s, missing) = path_series(columns(windows), "a1", "b1", since=10, paths=["checkout", "x"])
    assert s.span == (10.0, 30.0)
    assert missing.path == "x" and missing.cohorts == () and missing.span is None


def test_probe_errors_count_neither_as_requests_nor_errors() -> None:
    windows = [_w(0, "a1", 90, 5, extra={"probe_error": 7}), _w(0, "b1", 90)]
    (s,) = path_series(columns(windows), "a1", "b1")
    assert s.baseline is not None and (s.baseline.requests, s.baseline.errors) == (95, 5)


def test_no_common_window_gives_no_span() -> None:
    windows = [_w(0, "a1", 10), _w(10, "b1", 10)]
    (s,) = path_series(columns(windows), "a1", "b1")
    assert s.span is None and s.baseline is None and s.cohorts == ("a1", "b1")


def test_store_table_gives_the_same_totals(tmp_path: Path) -> None:
    """The columnar WindowTable read back from the store pools to the same totals."""
    from probes.store import Store

    windows = [
        _w(t, c, 100 + int(t), int(t) % 3, attempts_sum=120, attempts_count=100,
           bucket=800 + int(t), extra={"probe_error": 1})
        for t in (0.0, 10.0, 20.0) for c in ("1.20.3", "1.21.0")
    ]
    with Store.open(tmp_path / "s.db") as store:
        store.write(windows)
        table = store.read_table()
    a = path_series(columns(windows), "1.20.3", "1.21.0")[0]
    b = path_series(columns(table), "1.20.3", "1.21.0")[0]
    assert a.span == b.span == (0.0, 30.0)
    for x, y in ((a.baseline, b.baseline), (a.canary, b.canary)):
        assert x is not None and y is not None
        assert (x.requests, x.errors, x.attempts_sum, x.windows) == (
            y.requests, y.errors, y.attempts_sum, y.windows)
        assert x.requests == 3 * 100 + 30 + 3  # probe errors left out
        assert np.array_equal(x.latency, y.latency)


def test_overlapping_windows_share_time_with_a_span_whatever_their_length() -> None:
    start = np.array([0.0, 10.0, 20.0, 30.0])
    # A span from 5 s into the first window to the start of the third: windows 0 and 1.
    assert overlapping(start, 10.0, [(5.0, 20.0)]).tolist() == [True, True, False, False]
    # Strata of 20 s: the span inside the second half of the first stratum touches it only.
    assert overlapping(start[[0, 2]], 20.0, [(12.0, 18.0)]).tolist() == [True, False]
    # An open-ended span (the probe still overloaded at its last event).
    assert overlapping(start, np.full(4, 10.0), [(25.0, np.inf)]).tolist() == [
        False, False, True, True]
    assert not overlapping(start, 10.0, []).any()
