"""The C heap of a one-shot command kept for reuse, not handed back to the kernel.

A cold verdict over a day (`skewprobe verdict --store`) allocates and frees hundreds of MB
of arrays a range at a time. glibc maps each large array afresh and unmaps it when freed,
and trims the heap's free top, so the kernel zeroes and faults every page in again: on a
day of 50 paths with 12 pods, 0.3–0.5 s of system CPU (BENCHMARKS.md D23). Kept, the
freed memory serves the next range; the peak is the same. Not for the long-running
probe, whose memory should go back once a verdict is done.
"""

from __future__ import annotations

import ctypes

__all__ = ["keep_freed_memory"]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Larger than any array a verdict allocates: every one from the heap, none trimmed.
_KEEP_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Have the C library serve large allocations from its heap and keep what is freed;
    False where it cannot (a C library without glibc's mallopt): nothing changes then."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(option, _KEEP_BYTES) == 1
               for option in (_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD))
