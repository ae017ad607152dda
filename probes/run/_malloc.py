"""Freed large arrays go back to the system (glibc), so the probe's RSS stays flat.

A verdict allocates numpy arrays of a few hundred KiB to tens of MiB and frees them. glibc
serves allocations above its mmap threshold with mmap and returns them on free, but raises
that threshold to the largest block freed so far (up to 32 MiB): after the first verdicts,
their arrays come from the heap, and the heap keeps what they freed (a 10-minute run at
2,400 endpoints grew by ~200 MiB of freed memory; BENCHMARKS.md D15). A fixed threshold
stops that. Elsewhere (musl, macOS) nothing is changed.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["MMAP_THRESHOLD_BYTES", "return_large_frees"]

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
MMAP_THRESHOLD_BYTES = 256 * 1024


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD_BYTES`; False where it cannot be."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        gnu = libc.gnu_get_libc_version  # glibc only: musl's mallopt ignores the parameter
    except (AttributeError, OSError):
        return False
    del gnu
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
