"""The shared bucket layout, the histogram over it, and the store's sparse codec."""

from __future__ import annotations

import math

import numpy as np
import pytest

from probes.measure import sparse
from probes.measure.histogram import (
    BUCKET_COUNT,
    LOWER,
    MAX_VALUE,
    MIDPOINT,
    MIN_VALUE,
    SUB_BUCKETS,
    UPPER,
    Histogram,
    bucket_lower,
    bucket_upper,
    counts_from_tuple,
    index_of,
    sparse_from_tuple,
    tuple_from_sparse,
)

# The midpoint of a bucket at most 1/64 of its lower bound wide is within 1/128 of any value
# in it: the bound every quantile must meet (stricter than the 1 % promised).
MIDPOINT_BOUND = 1 / (2 * SUB_BUCKETS)


def test_layout_covers_1us_to_600s_contiguously_and_narrowly() -> None:
    assert BUCKET_COUNT == LOWER.size == UPPER.size
    assert LOWER[0] <= 1e-6 and UPPER[-1] >= 600.0
    assert np.array_equal(UPPER[:-1], LOWER[1:])
    width = (UPPER - LOWER) / LOWER
    assert width.max() <= 1 / SUB_BUCKETS
    assert bucket_lower(5) == LOWER[5] and bucket_upper(5) == UPPER[5]


def test_index_of_is_exact_at_every_bucket_edge() -> None:
    below_upper = np.nextafter(UPPER, 0.0)
    for i in range(BUCKET_COUNT):
        assert index_of(float(LOWER[i])) == i
        assert index_of(float(below_upper[i])) == i
    expected = np.arange(BUCKET_COUNT)
    assert np.array_equal(index_of(LOWER), expected)
    assert np.array_equal(index_of(below_upper), expected)


def test_scalar_and_vector_index_agree_including_out_of_range() -> None:
    rng = np.random.default_rng(11)
    values = np.concatenate([
        np.exp(rng.uniform(np.log(1e-8), np.log(5e3), 50_000)),
        [0.0, -1.0, math.nan, math.inf, -math.inf, MIN_VALUE, MAX_VALUE, 600.0, 1e-7],
    ])
    vec = index_of(values)
    assert [index_of(float(v)) for v in values] == vec.tolist()
    assert index_of(0.0) == index_of(-3.0) == index_of(math.nan) == index_of(1e-9) == 0
    assert index_of(MAX_VALUE) == index_of(1e6) == index_of(math.inf) == BUCKET_COUNT - 1
    assert index_of(600.0) < BUCKET_COUNT - 1  # 600 s is inside the range, not clamped


@pytest.mark.parametrize("seed", range(30))
def test_quantiles_within_1_percent_of_the_sample_of_that_rank(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 20_000))
    kind = seed % 3
    if kind == 0:
        values = rng.lognormal(np.log(0.002), 1.5, n)
    elif kind == 1:
        values = np.exp(rng.uniform(np.log(2e-6), np.log(500.0), n))
    else:  # a bimodal mix with ties: fast hits and timeouts
        values = np.where(rng.random(n) < 0.9, rng.normal(0.001, 1e-4, n).clip(1e-5), 1.0)
    h = Histogram.from_values(values)
    qs = np.concatenate([np.linspace(0, 1, 401), [0.07, 0.5, 0.9, 0.99, 0.999, 0.9999]])
    got = h.quantiles(qs)
    truth = _true_quantiles(values, qs)
    rel = np.abs(got - truth) / truth
    assert rel.max() <= MIDPOINT_BOUND + 1e-12
    # Stronger: the reported value is the midpoint of the very bucket holding the sample.
    assert np.array_equal(index_of(got), index_of(truth))


def _true_quantiles(values: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """The sample of rank max(1, ceil(q*n)) with q*n taken exactly (numpy's inverted_cdf
    rounds up float noise: it takes rank 204 for q=0.07, n=2900)."""
    ordered = np.sort(values)
    rank = np.maximum(1, np.ceil(np.round(qs * ordered.size, 9))).astype(np.int64)
    return ordered[rank - 1]


def test_quantiles_match_numpy_where_the_rank_is_not_float_noise() -> None:
    rng = np.random.default_rng(21)
    values = rng.lognormal(-5, 1, 1000)  # n = 1000: q*n on a 1/1000 grid is exact enough
    qs = np.array([0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0])
    expected = np.quantile(values, qs, method="inverted_cdf")
    assert np.array_equal(_true_quantiles(values, qs), expected)


def test_quantile_rank_rule_on_small_samples() -> None:
    values = [0.001 * 1.5**k for k in range(100)]  # distinct buckets
    h = Histogram.from_values(values)
    assert h.quantile(0.99) == MIDPOINT[index_of(values[98])]  # the 99th smallest
    assert h.quantile(0.0) == MIDPOINT[index_of(values[0])]
    assert h.quantile(1.0) == MIDPOINT[index_of(values[-1])]
    assert h.quantile(0.07) == MIDPOINT[index_of(values[6])]  # 0.07*100 is 7.000000000000001
    one = Histogram.from_values([0.25])
    assert one.quantile(0.0) == one.quantile(0.5) == one.quantile(1.0) == MIDPOINT[index_of(0.25)]


def test_empty_and_bad_quantiles_raise() -> None:
    with pytest.raises(ValueError, match="empty"):
        Histogram().quantile(0.5)
    with pytest.raises(ValueError, match="empty"):
        Histogram().mean()
    with pytest.raises(ValueError):
        Histogram.from_values([1.0]).quantile(1.5)


def test_merge_is_addition() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(-6, 1, 3000), rng.lognormal(-4, 0.5, 5000)
    ha, hb = Histogram.from_values(a), Histogram.from_values(b)
    both = Histogram.from_values(np.concatenate([a, b]))
    assert ha + hb == both
    assert ha.merge(hb) == both and ha.count == 3000  # merge does not mutate
    ha += hb
    assert ha == both and ha.count == 8000
    one = Histogram()
    for v in a:
        one.add(float(v))
    assert one == Histogram.from_values(a)
    assert abs(both.mean() - np.concatenate([a, b]).mean()) / both.mean() < MIDPOINT_BOUND


def test_counts_are_read_only_and_validated() -> None:
    h = Histogram.from_values([0.01])
    with pytest.raises(ValueError):
        h.counts[0] = 5
    with pytest.raises(ValueError):
        Histogram(np.zeros(10))
    with pytest.raises(ValueError):
        Histogram(-np.ones(BUCKET_COUNT))


def test_window_tuple_and_sparse_round_trips() -> None:
    rng = np.random.default_rng(5)
    h = Histogram.from_values(rng.lognormal(-5, 1, 1000))
    window = h.to_window()
    assert len(window) == BUCKET_COUNT and sum(window) == 1000
    assert np.array_equal(counts_from_tuple(window), h.counts)
    assert Histogram.from_window(window) == h
    assert Histogram.from_sparse(h.to_sparse()) == h
    assert tuple_from_sparse(h.to_sparse()) == window
    with pytest.raises(ValueError):
        counts_from_tuple((1, 2, 3))
    with pytest.raises(ValueError):
        Histogram.from_sparse({BUCKET_COUNT: 1})


def test_sparse_codec_round_trips_with_split_counts() -> None:
    rng = np.random.default_rng(9)
    blobs, truth = [], []
    for k in range(400):
        size = int(rng.integers(0, 80))
        ids = np.sort(rng.choice(BUCKET_COUNT, size, replace=False))
        counts = rng.integers(1, [3, 300, 70_000][k % 3], size)
        blobs.append(sparse.encode(ids, counts, sparse.LATENCY))
        dense = np.zeros(BUCKET_COUNT, dtype=np.int64)
        dense[ids] = counts
        truth.append(dense)
    ptr, ids, counts = sparse.decode_many(blobs, sparse.LATENCY, BUCKET_COUNT)
    assert ptr.size == len(blobs) + 1 and ids.dtype == np.uint16 and counts.dtype == np.uint8
    for r, dense in enumerate(truth):
        got = np.zeros(BUCKET_COUNT, dtype=np.int64)
        np.add.at(got, ids[ptr[r] : ptr[r + 1]], counts[ptr[r] : ptr[r + 1]].astype(np.int64))
        assert np.array_equal(got, dense)
    # Three bytes per non-empty bucket when counts fit a byte.
    assert len(sparse_from_tuple(tuple(truth[0].tolist()))) == 3 * np.count_nonzero(truth[0])
    big = sparse.encode_map({3: 5_000_000_000, 7: 1})
    i, c = sparse.decode(big, sparse.COUNTS)
    assert i.tolist() == [3, 3, 7] and c.astype(np.int64).sum() == 5_000_000_001


def test_sparse_codec_rejects_malformed_input() -> None:
    with pytest.raises(ValueError):
        sparse.decode(b"\x01\x02", sparse.LATENCY)  # not whole records
    with pytest.raises(ValueError):
        sparse.decode(sparse.encode([1999], [1], sparse.LATENCY), sparse.LATENCY, BUCKET_COUNT)
    with pytest.raises(ValueError):
        sparse.encode([5, 5], [1, 1], sparse.LATENCY)
    with pytest.raises(ValueError):
        sparse.encode([70_000], [1], sparse.COUNTS)
    with pytest.raises(ValueError):
        sparse.encode([1], [-1], sparse.COUNTS)
