"""Sparse id -> count maps as raw fixed-width records: the store's histogram columns.

The store keeps one latency histogram per window (864,000 a day at 50 paths x 2 cohorts), so
how fast a column of them decodes decides how fast a day loads. A blob is nothing but
little-endian records, ids ascending, no header: a column decodes by joining the blobs and
viewing the bytes as a record array, with no per-blob work.

- `LATENCY` records are (bucket u16, count u8): 3 bytes per non-empty bucket. A count above
  255 is split over several records of the same bucket.
- `COUNTS` records are (id u16, count u32), for outcome and reset-reason counts.

Because of splitting, an id may repeat within a blob: readers sum repeated ids
(`np.add.at`, `np.bincount`), which every reader here does.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "COUNTS",
    "ID_LIMIT",
    "LATENCY",
    "decode",
    "decode_many",
    "encode",
    "encode_latency_map",
    "encode_map",
]

LATENCY: Final = np.dtype([("i", "<u2"), ("c", "u1")])
COUNTS: Final = np.dtype([("i", "<u2"), ("c", "<u4")])
ID_LIMIT: Final = 2**16

I64 = npt.NDArray[np.int64]


def encode(ids: npt.ArrayLike, counts: npt.ArrayLike, record: np.dtype[Any]) -> bytes:
    """Records for strictly increasing `ids` (< 65536) and non-negative `counts`."""
    i = np.asarray(ids, dtype=np.int64).ravel()
    c = np.asarray(counts, dtype=np.int64).ravel()
    if i.shape != c.shape:
        raise ValueError("ids and counts differ in length")
    if c.size and int(c.min()) < 0:
        raise ValueError("counts must not be negative")
    nz = c > 0
    i, c = i[nz], c[nz]
    if i.size and (int(i[0]) < 0 or int(i[-1]) >= ID_LIMIT or np.any(np.diff(i) <= 0)):
        raise ValueError("ids must be strictly increasing and lie in [0, 65535]")
    cap = int(np.iinfo(record["c"]).max)
    if c.size and int(c.max()) > cap:
        parts = (c + cap - 1) // cap
        entry = np.repeat(np.arange(i.size), parts)
        k = np.arange(entry.size) - np.repeat(np.cumsum(parts) - parts, parts)
        i, c = i[entry], np.minimum(cap, c[entry] - cap * k)
    rec = np.empty(i.size, dtype=record)
    rec["i"] = i
    rec["c"] = c
    return rec.tobytes()


def encode_map(counts: Mapping[int, int], record: np.dtype[Any] = COUNTS) -> bytes:
    """`encode` for a {id: count} mapping."""
    items = sorted(counts.items())
    return encode([k for k, _ in items], [v for _, v in items], record)


_LATENCY_RECORD = struct.Struct("<HB")  # LATENCY's layout, packed


def encode_latency_map(counts: Mapping[int, int]) -> bytes:
    """`encode_map(counts, LATENCY)` in plain Python, for the few buckets of one endpoint's
    window: the store writes 4,800 of them per window at 2,400 endpoints, and numpy's
    per-call overhead would be most of that write."""
    pack = _LATENCY_RECORD.pack
    out = []
    for i in sorted(counts):
        c = counts[i]
        if c < 0 or not 0 <= i < ID_LIMIT:
            raise ValueError("ids must lie in [0, 65535] and counts must not be negative")
        while c > 255:
            out.append(pack(i, 255))
            c -= 255
        if c:
            out.append(pack(i, c))
    return b"".join(out)


def decode(
    blob: bytes, record: np.dtype[Any], limit: int = ID_LIMIT
) -> tuple[npt.NDArray[np.uint16], npt.NDArray[Any]]:
    """(ids, counts) of one blob; ids may repeat. ValueError if malformed or an id >= limit."""
    _, ids, counts = decode_many([blob], record, limit)
    return ids, counts


def decode_many(
    blobs: Sequence[bytes], record: np.dtype[Any], limit: int = ID_LIMIT
) -> tuple[I64, npt.NDArray[np.uint16], npt.NDArray[Any]]:
    """Decode a column of blobs into compressed-row form `(ptr, ids, counts)`.

    Row r's entries are `ids[ptr[r]:ptr[r+1]]` and `counts[ptr[r]:ptr[r+1]]`; ids are
    uint16 and counts keep the record's width (uint8 for LATENCY). Raises ValueError on a
    blob that is not whole records or names an id >= `limit`.
    """
    n = len(blobs)
    lengths = np.fromiter(map(len, blobs), dtype=np.int64, count=n)
    if n and np.any(lengths % record.itemsize):
        raise ValueError("sparse blob is not a whole number of records")
    rec = np.frombuffer(b"".join(blobs), dtype=record)
    ids = rec["i"].astype(np.uint16)
    if ids.size and int(ids.max()) >= limit:
        raise ValueError("sparse blob names an id outside its range")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths // record.itemsize, out=ptr[1:])
    return ptr, ids, rec["c"].copy()
