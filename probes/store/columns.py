"""Row algebra on the store's column dataclasses (`WindowTable`, `EndpointColumns`): take
rows, join two reads into one, and sum rows into groups, whatever fields a class has.

A class is read field by field, so a column another change adds flows through untouched:

- a `tuple` field is a name table (`paths`, `cohorts`, `endpoints`, `outcome_names`, ...);
- a row field named in `CODED` holds indices into a name table (`path` into `paths`), and a
  matrix field named in `NAMED` has one column per name (`outcomes` by `outcome_names`):
  joining two reads re-indexes both into the union of their names;
- `X_ptr` with the fields `X_*` whose length is its last entry is a compressed-row array
  (the latency counts: one row's entries are `X_*[ptr[r]:ptr[r + 1]]`);
- any other array whose first axis is the rows is a row column; anything else (a
  table's bucket edges) must be the same in both parts of a join, except a nested table
  of records (`EndpointColumns.latency`): it is not joined here, so both must be empty.

Summing rows into groups (`reduce`) adds every row column (counts are additive), takes the
last row's value for the fields in `LAST` (a group's window is its newest: `start`,
`length`), the largest for `MAX`, the first for keys and `FIRST` (per-endpoint facts), and
pools the compressed rows. A new column that is not a count needs its rule added here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["CODED", "FIRST", "LAST", "MAX", "NAMED", "concat", "reduce", "rows_of", "take"]

T = TypeVar("T")

CODED: Mapping[str, str] = {"path": "paths", "cohort": "cohorts", "endpoint": "endpoints"}
NAMED: Mapping[str, str] = {"outcomes": "outcome_names", "stream_resets": "reset_reasons"}
LAST = frozenset({"start", "length"})
MAX = frozenset({"lag_max_s"})
FIRST = frozenset({"started"})
REDUCE_SLICE = 1 << 20  # entries of compressed rows `reduce` pools at once
# Groups × entry ids up to which `reduce` pools compressed rows into a dense array (a few
# hundred pooled rows × the latency buckets): a bincount, not a sort of every entry.
DENSE_MAX = 1 << 22


def rows_of(cols: Any) -> int:
    return int(np.shape(cols.start)[0])


def _csr(cols: Any) -> dict[str, list[str]]:
    """Each compressed-row array's pointer field and its entry fields."""
    names = [f.name for f in dataclasses.fields(cols)]
    out: dict[str, list[str]] = {}
    for ptr in (n for n in names if n.endswith("_ptr")):
        stem = ptr[: -len("ptr")]
        size = int(getattr(cols, ptr)[-1])
        out[ptr] = [n for n in names if n.startswith(stem) and n != ptr
                    and np.shape(getattr(cols, n))[:1] == (size,)]
    return out


def _kinds(cols: Any) -> tuple[list[str], list[str], dict[str, list[str]], list[str]]:
    """(name tables, row columns, compressed rows, other fields) of a column dataclass."""
    rows = rows_of(cols)
    csr = _csr(cols)
    entries = {e for es in csr.values() for e in es}
    names, row_cols, other = [], [], []
    for f in dataclasses.fields(cols):
        value = getattr(cols, f.name)
        if f.name in csr or f.name in entries:
            continue
        if isinstance(value, tuple):
            names.append(f.name)
        elif isinstance(value, np.ndarray) and value.ndim and value.shape[0] == rows:
            row_cols.append(f.name)
        else:
            other.append(f.name)
    return names, row_cols, csr, other


def _entries(ptr: npt.NDArray[np.int64], idx: npt.NDArray[np.int64]
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The new pointer and the entry positions of rows `idx`, in that order."""
    counts = np.diff(ptr)[idx]
    new = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(counts, out=new[1:])
    at = np.repeat(ptr[idx] - new[:-1], counts) + np.arange(int(new[-1]), dtype=np.int64)
    return new, at


def take(cols: T, rows: npt.ArrayLike) -> T:
    """The rows given (a boolean mask or indices, in the order given), names unchanged."""
    r = np.asarray(rows)
    idx = np.flatnonzero(r) if r.dtype == bool else r.astype(np.int64)
    _, row_cols, csr, _ = _kinds(cols)
    out: dict[str, Any] = {n: getattr(cols, n)[idx] for n in row_cols}
    for ptr, entries in csr.items():
        out[ptr], at = _entries(getattr(cols, ptr), idx)
        out.update({e: getattr(cols, e)[at] for e in entries})
    return dataclasses.replace(cols, **out)  # type: ignore[type-var]


def concat(a: T, b: T) -> T:
    """The rows of `a`, then those of `b`, over the union of their names."""
    if rows_of(b) == 0:
        return a
    if rows_of(a) == 0:
        return b
    names, row_cols, csr, other = _kinds(a)
    for n in other:
        x, y = getattr(a, n), getattr(b, n)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            same = len(x) == 0 and len(y) == 0  # type: ignore[arg-type]
        else:
            same = (np.array_equal(np.asarray(x, dtype=object), np.asarray(y, dtype=object))
                    if isinstance(x, tuple | list | np.ndarray) else x == y)
        if not same:
            raise ValueError(f"cannot join reads whose {n} differ")
    out: dict[str, Any] = {}
    recode: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}
    for n in names:
        union = tuple(sorted({*getattr(a, n), *getattr(b, n)}))
        where = {name: i for i, name in enumerate(union)}
        out[n] = union
        recode[n] = tuple(  # type: ignore[assignment]
            np.array([where[x] for x in getattr(part, n)], dtype=np.int64) for part in (a, b))
    for n in row_cols:
        x, y = getattr(a, n), getattr(b, n)
        if n in CODED and CODED[n] in recode:
            ra, rb = recode[CODED[n]]
            x, y = ra[x].astype(x.dtype), rb[y].astype(y.dtype)
        elif n in NAMED and NAMED[n] in recode:
            ra, rb = recode[NAMED[n]]
            width = len(out[NAMED[n]])
            xa = np.zeros((x.shape[0], width), dtype=x.dtype)
            xa[:, ra] = x
            yb = np.zeros((y.shape[0], width), dtype=y.dtype)
            yb[:, rb] = y
            x, y = xa, yb
        out[n] = np.concatenate([x, y])
    for ptr, entries in csr.items():
        pa, pb = getattr(a, ptr), getattr(b, ptr)
        out[ptr] = np.concatenate([pa, pb[1:] + pa[-1]])
        out.update({e: np.concatenate([getattr(a, e), getattr(b, e)]) for e in entries})
    return dataclasses.replace(a, **out)  # type: ignore[type-var]


def reduce(cols: T, group: npt.ArrayLike, n_groups: int) -> T:
    """One row per group (`group[row]` in [0, n_groups); every group must have a row), in
    group order: the rules of the module docstring. Rows are taken in their order, so
    "last" is the last row of the group as `cols` holds them (the store's: by start)."""
    g = np.asarray(group, dtype=np.int64)
    order = np.argsort(g, kind="stable")
    gs = g[order]
    bounds = np.searchsorted(gs, np.arange(n_groups + 1))
    if np.any(np.diff(bounds) == 0):
        raise ValueError("every group must have a row")
    first, last = order[bounds[:-1]], order[bounds[1:] - 1]
    _, row_cols, csr, _ = _kinds(cols)
    out: dict[str, Any] = {}
    for n in row_cols:
        x = getattr(cols, n)
        if n in LAST:
            out[n] = x[last]
        elif n in CODED or n in FIRST:
            out[n] = x[first]
        elif n in MAX:
            out[n] = np.maximum.reduceat(x[order], bounds[:-1], axis=0)
        else:
            out[n] = np.add.reduceat(x[order], bounds[:-1], axis=0).astype(x.dtype)
    for ptr, entries in csr.items():
        p = getattr(cols, ptr)
        ids, counts = (getattr(cols, e) for e in entries)
        width = int(ids.max(initial=0)) + 1
        if n_groups * width <= DENSE_MAX:
            out[ptr], out[entries[0]], out[entries[1]] = _dense(p, g, ids, counts, n_groups,
                                                                 width)
            continue
        # Entries pooled a slice of rows at a time, then the slices' sums pooled: a day's
        # path windows are tens of millions of entries, and pooling them at once took
        # gigabytes of int64 keys (BENCHMARKS.md D23). Float sums of counts are exact.
        keys, sums = [], []
        for lo, hi, row in _slices(p):
            k, inv = np.unique(g[row] * width + ids[lo:hi], return_inverse=True)
            keys.append(k)
            sums.append(np.bincount(inv.ravel(), weights=counts[lo:hi], minlength=k.size))
        uniq, inv = np.unique(np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64),
                              return_inverse=True)
        pooled = np.bincount(inv.ravel(), weights=np.concatenate(sums) if sums else None,
                             minlength=uniq.size)
        grp = uniq // width
        out[ptr] = np.searchsorted(grp, np.arange(n_groups + 1)).astype(np.int64)
        out[entries[0]] = (uniq % width).astype(ids.dtype)
        # Pooled counts outgrow a window's entry width: keep them exact in int64.
        out[entries[1]] = np.rint(pooled).astype(np.int64)
    return dataclasses.replace(cols, **out)  # type: ignore[type-var]


def _dense(ptr: npt.NDArray[np.int64], g: npt.NDArray[np.int64], ids: npt.NDArray[Any],
           counts: npt.NDArray[Any], n_groups: int, width: int
           ) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any], npt.NDArray[np.int64]]:
    """`reduce`'s pooling of one compressed-row array through a dense groups × ids array:
    the same entries (every id a group's rows hold, by group and id, zero sums kept)."""
    sums = np.zeros(n_groups * width)
    seen = np.zeros(n_groups * width, dtype=bool)
    for lo, hi, row in _slices(ptr):
        key = g[row] * width + ids[lo:hi]
        sums += np.bincount(key, weights=counts[lo:hi], minlength=sums.size)
        seen[key] = True
    keys = np.flatnonzero(seen)
    new_ptr = np.searchsorted(keys // width, np.arange(n_groups + 1)).astype(np.int64)
    # Float sums of counts are exact below 2**53.
    return new_ptr, (keys % width).astype(ids.dtype), np.rint(sums[keys]).astype(np.int64)


def _slices(ptr: npt.NDArray[np.int64]) -> Iterator[tuple[int, int, npt.NDArray[np.int64]]]:
    """A compressed-row array's entries about `REDUCE_SLICE` at a time, by whole rows: each
    slice's first and last entry (exclusive), and each entry's row."""
    if not int(ptr[-1]):
        return  # no entries (windows without latency)
    cuts = np.unique(np.searchsorted(ptr, np.arange(0, int(ptr[-1]), REDUCE_SLICE),
                                     side="right") - 1)
    for r0, r1 in zip(cuts.tolist(), [*cuts[1:].tolist(), ptr.size - 1], strict=True):
        yield int(ptr[r0]), int(ptr[r1]), np.repeat(np.arange(r0, r1), np.diff(ptr[r0:r1 + 1]))
