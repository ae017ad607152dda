"""The one latency bucket layout of skewprobe, and a mergeable histogram over it.

Every latency the probe records, in memory, in the store and in windows read back, is a
vector of counts over the same fixed buckets, so histograms from any window, cohort or probe
merge by plain addition and a pooled p99 is read from the pooled counts (never averaged from
per-window percentiles).

The layout is HdrHistogram's log-linear one: each power of two (octave) from 2**-20 s
(≈ 0.95 µs) to 2**10 s (1024 s) is cut into `SUB_BUCKETS` = 64 equal-width buckets. A bucket
is therefore at most 1/64 of its lower bound wide, and reading a quantile returns the bucket's
midpoint, which lies within 1/128 (0.78 %) of any value in the bucket: every quantile read
here is within 1 % of the true sample value of that rank. Values below the range (including
0 and negatives) are counted in the first bucket and values above it in the last; those two
buckets carry no accuracy promise.

Quantiles use the "inverted CDF" rule: the q-quantile of n samples is the sample of rank
max(1, ceil(q·n)), so p99 of 100 samples is the 99th smallest. q·n is rounded to 9 decimals
first, so 0.07 x 2900 is rank 203 (numpy's `method="inverted_cdf"` agrees except where float
noise in q·n crosses an integer; it takes 204 there).

The store keeps these counts as raw records (`probes.measure.sparse`); `to_sparse` gives a
{bucket: count} dict for JSON and tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, overload

import numpy as np
import numpy.typing as npt

from probes.measure import sparse

__all__ = [
    "BUCKET_COUNT",
    "LOWER",
    "MAX_VALUE",
    "MIDPOINT",
    "MIN_EXPONENT",
    "MIN_VALUE",
    "SUB_BUCKETS",
    "UPPER",
    "Histogram",
    "bucket_lower",
    "bucket_upper",
    "counts_from_tuple",
    "index_of",
    "sparse_from_tuple",
    "tuple_from_sparse",
]

SUB_BUCKETS: Final = 64
MIN_EXPONENT: Final = -20
MAX_EXPONENT: Final = 10
BUCKET_COUNT: Final = (MAX_EXPONENT - MIN_EXPONENT) * SUB_BUCKETS
MIN_VALUE: Final = 2.0**MIN_EXPONENT
MAX_VALUE: Final = 2.0**MAX_EXPONENT
_LAST: Final = BUCKET_COUNT - 1
_BELOW_MAX: Final = math.nextafter(MAX_VALUE, 0.0)


def _bounds() -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    i = np.arange(BUCKET_COUNT)
    base = np.ldexp(1.0, MIN_EXPONENT + i // SUB_BUCKETS)
    sub = i % SUB_BUCKETS
    # Powers of two times small integers over 64: every bound is exact in binary.
    lower = base * (SUB_BUCKETS + sub) / SUB_BUCKETS
    upper = base * (SUB_BUCKETS + sub + 1) / SUB_BUCKETS
    lower.setflags(write=False)
    upper.setflags(write=False)
    return lower, upper


LOWER, UPPER = _bounds()
MIDPOINT: Final = (LOWER + UPPER) / 2
MIDPOINT.setflags(write=False)


def bucket_lower(i: int) -> float:
    """The inclusive lower bound of bucket `i`, in seconds."""
    return float(LOWER[i])


def bucket_upper(i: int) -> float:
    """The exclusive upper bound of bucket `i`, in seconds."""
    return float(UPPER[i])


@overload
def index_of(seconds: float) -> int: ...
@overload
def index_of(seconds: npt.ArrayLike) -> npt.NDArray[np.intp]: ...


def index_of(seconds: float | npt.ArrayLike) -> int | npt.NDArray[np.intp]:
    """The bucket holding `seconds`: an int for a scalar, an index array for an array.

    `frexp` splits v = m·2**e with m in [0.5, 1) exactly, so the octave is e and the linear
    sub-bucket is floor((m - 0.5)·128): no logarithm, no rounding at the bucket edges.
    """
    if isinstance(seconds, float | int):
        v = float(seconds)
        if not v >= MIN_VALUE:  # also catches NaN
            return 0
        if v >= MAX_VALUE:
            return _LAST
        m, e = math.frexp(v)
        return (e - 1 - MIN_EXPONENT) * SUB_BUCKETS + int((m - 0.5) * (2 * SUB_BUCKETS))
    arr = np.asarray(seconds, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        safe = np.clip(np.nan_to_num(arr, nan=MIN_VALUE), MIN_VALUE, _BELOW_MAX)
    mant, expo = np.frexp(safe)
    idx = (expo.astype(np.intp) - 1 - MIN_EXPONENT) * SUB_BUCKETS + (
        (mant - 0.5) * (2 * SUB_BUCKETS)
    ).astype(np.intp)
    idx[arr >= MAX_VALUE] = _LAST
    return idx


def counts_from_tuple(latency: Sequence[int]) -> npt.NDArray[np.int64]:
    """`PathWindow.latency` (a dense tuple of BUCKET_COUNT ints) as an int64 array (~20 µs)."""
    if len(latency) != BUCKET_COUNT:
        raise ValueError(f"latency has {len(latency)} buckets, the layout has {BUCKET_COUNT}")
    return np.fromiter(latency, dtype=np.int64, count=BUCKET_COUNT)


def sparse_from_tuple(latency: Sequence[int]) -> bytes:
    """`PathWindow.latency` as the store's blob (`sparse.LATENCY` records; ~30 µs)."""
    counts = counts_from_tuple(latency)
    idx = np.flatnonzero(counts)
    return sparse.encode(idx, counts[idx], sparse.LATENCY)


def tuple_from_sparse(counts: Mapping[int, int]) -> tuple[int, ...]:
    """A dense `PathWindow.latency` tuple from a {bucket: count} mapping."""
    dense = [0] * BUCKET_COUNT
    for i, c in counts.items():
        dense[i] += c
    return tuple(dense)


class Histogram:
    """Counts over the shared layout. Mergeable by `+`; quantiles within 1 % of the sample.

    Empty histograms have no quantiles: `quantile` raises ValueError, so a caller cannot
    mistake "no data" for a latency. Check `count` first.
    """

    __slots__ = ("_counts",)

    def __init__(self, counts: npt.ArrayLike | None = None) -> None:
        if counts is None:
            self._counts = np.zeros(BUCKET_COUNT, dtype=np.int64)
            return
        arr = np.array(counts, dtype=np.int64)
        if arr.shape != (BUCKET_COUNT,):
            raise ValueError(f"counts must have shape ({BUCKET_COUNT},), got {arr.shape}")
        if arr.size and int(arr.min()) < 0:
            raise ValueError("counts must not be negative")
        self._counts = arr

    @classmethod
    def from_values(cls, values: npt.ArrayLike) -> Histogram:
        h = cls()
        h.add_many(values)
        return h

    @classmethod
    def from_window(cls, latency: Sequence[int]) -> Histogram:
        """From `PathWindow.latency`."""
        return cls(counts_from_tuple(latency))

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        """A read-only view of the bucket counts."""
        view = self._counts.view()
        view.setflags(write=False)
        return view

    @property
    def count(self) -> int:
        return int(self._counts.sum())

    def add(self, seconds: float, n: int = 1) -> None:
        self._counts[index_of(float(seconds))] += n

    def add_many(self, values: npt.ArrayLike) -> None:
        idx = index_of(np.asarray(values, dtype=np.float64).ravel())
        self._counts += np.bincount(idx, minlength=BUCKET_COUNT)

    def merge(self, other: Histogram) -> Histogram:
        """A new histogram holding both sets of counts."""
        return Histogram(self._counts + other._counts)

    def __add__(self, other: object) -> Histogram:
        if not isinstance(other, Histogram):
            return NotImplemented
        return self.merge(other)

    def __iadd__(self, other: object) -> Histogram:
        if not isinstance(other, Histogram):
            return NotImplemented
        self._counts += other._counts
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return bool(np.array_equal(self._counts, other._counts))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Histogram(count={self.count})"

    def quantiles(self, qs: Iterable[float]) -> npt.NDArray[np.float64]:
        """Several quantiles (each q in [0, 1]) in one pass, in seconds."""
        q = np.asarray(list(qs), dtype=np.float64)
        if q.size and (not np.all(q >= 0.0) or not np.all(q <= 1.0)):
            raise ValueError("quantiles must lie in [0, 1]")
        cum = np.cumsum(self._counts)
        n = int(cum[-1])
        if n == 0:
            raise ValueError("quantile of an empty histogram")
        # Round q·n before ceil so 0.07·100 = 7.000000000000001 still means rank 7.
        rank = np.maximum(1, np.ceil(np.round(q * n, 9)))
        return np.asarray(MIDPOINT[np.searchsorted(cum, rank, side="left")], dtype=np.float64)

    def quantile(self, q: float) -> float:
        """The q-quantile in seconds (inverted-CDF rank; bucket midpoint)."""
        return float(self.quantiles((q,))[0])

    def mean(self) -> float:
        """The mean from bucket midpoints (within 0.78 % for in-range values)."""
        n = self.count
        if n == 0:
            raise ValueError("mean of an empty histogram")
        return float(self._counts @ MIDPOINT) / n

    def to_window(self) -> tuple[int, ...]:
        """As `PathWindow.latency`."""
        return tuple(self._counts.tolist())

    def to_sparse(self) -> dict[int, int]:
        """{bucket: count} of the non-empty buckets (JSON-friendly once keys are strings)."""
        idx = np.flatnonzero(self._counts)
        return dict(zip(idx.tolist(), self._counts[idx].tolist(), strict=True))

    @classmethod
    def from_sparse(cls, counts: Mapping[int, int]) -> Histogram:
        """Inverse of `to_sparse`. Raises ValueError for a bucket outside the layout."""
        h = cls()
        for i, c in counts.items():
            b = int(i)
            if not 0 <= b < BUCKET_COUNT or c < 0:
                raise ValueError(f"bucket {i} count {c} does not fit the layout")
            h._counts[b] += c
        return h

