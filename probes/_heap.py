"""glibc's malloc tuned for how a process uses its memory (`mallopt`); nothing changes
elsewhere (musl, macOS), where each function returns False.

- A long-running probe (`return_large_frees`): a verdict allocates numpy arrays of a few
  hundred KiB to tens of MiB and frees them. glibc serves allocations above its mmap
  threshold with mmap and returns them on free, but raises that threshold to the largest
  block freed so far (up to 32 MiB): after the first verdicts their arrays come from the
  heap, and the heap keeps what they freed (a 10-minute run at 2,400 endpoints grew by
  ~200 MiB; BENCHMARKS.md D15). A fixed threshold keeps the RSS flat.
- A one-shot command (`keep_freed_memory`): a cold verdict over a day allocates and frees
  hundreds of MB of arrays a range at a time; mapped afresh and unmapped each time, the
  kernel zeroes and faults every page in again (0.3–0.5 s of system CPU on a day of 50
  paths with 12 pods; D23). Kept in the heap, freed memory serves the next range; the peak
  is the same.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

__all__ = ["MMAP_THRESHOLD_BYTES", "keep_freed_memory", "return_large_frees"]

# mallopt's parameter numbers in glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 * 1024
# Larger than any array a verdict allocates: every one from the heap, none trimmed.
_KEEP_BYTES = 1 << 30


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's `mallopt`, or None (not Linux, or musl, whose mallopt ignores parameters)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
    except (AttributeError, OSError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt  # type: ignore[no-any-return]


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD_BYTES`; False where it cannot be."""
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and keep what is freed, for a process that
    ends after one piece of work; False where either setting was refused."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    settings = [mallopt(option, _KEEP_BYTES) == 1
                for option in (_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD)]
    return all(settings)
