"""`probes.run._memory`: when the probe freezes the collector's survivors (not while the
start-up backlog is in flight, and never later than the settle limit), and glibc's mmap
threshold fixed (a large block is served by mmap even after a larger one was freed: glibc
would otherwise raise its threshold to that size and serve the next ones from the heap,
which keeps what they free). The latter in a fresh interpreter: a heap that earlier tests
left with large free chunks serves a block from them whatever the threshold, so the setting
is only seen where the probe sets it, at its start.
"""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from probes.run._memory import (
    _SETTLE_POLL_S,
    GC_SETTLE_LIMIT_S,
    GC_WARMUP_EXTRA_S,
    CollectorTuning,
    settled_in_flight,
)
from probes.spec import HttpSpec, PathSpec
from tests.unit.virtual_time import virtual_loop

PATHS = [PathSpec("p", 100.0, 0.01, http=HttpSpec(path="/"))]


async def freeze_after(in_flight: list[int], settled_at: int) -> tuple[int, int, float]:
    """Run `tune` (on virtual time) with calls in flight as listed (then the last, repeated);
    how many looks it took, how many objects were frozen, and how long after the start."""
    looks = 0

    def now_in_flight() -> int:
        nonlocal looks
        looks += 1
        return in_flight[min(looks, len(in_flight)) - 1]

    tuning = CollectorTuning(lambda generation, seconds: None)
    restore = tuning.save()
    try:
        async def started() -> None:
            return None

        loop = virtual_loop()
        begun = loop.time()
        await tuning.tune(started, PATHS, now_in_flight, lambda: settled_at)
        return looks, gc.get_freeze_count(), loop.time() - begun
    finally:
        restore()


# The first look: one send period and one timeout of PATHS, and the warm-up margin.
WARMUP_S = 0.01 + 0.01 + GC_WARMUP_EXTRA_S


async def test_the_freeze_waits_for_the_backlog_to_settle() -> None:
    looks, frozen, after = await freeze_after([2400, 900, 10, 700, 12, 9, 3000], settled_at=16)
    assert looks == 6  # two calm looks in a row: the 5th and 6th
    assert after == pytest.approx(WARMUP_S + 5 * _SETTLE_POLL_S)
    assert frozen > 0
    assert gc.get_freeze_count() == 0  # put back


async def test_a_backlog_that_never_settles_freezes_at_the_limit() -> None:
    looks, frozen, after = await freeze_after([5000], settled_at=16)
    assert looks == GC_SETTLE_LIMIT_S / _SETTLE_POLL_S  # every look, then the freeze
    assert after == pytest.approx(WARMUP_S + GC_SETTLE_LIMIT_S)
    assert frozen > 0


def test_the_steady_level_follows_the_intended_rate() -> None:
    assert settled_in_flight(0.0) == 16
    assert settled_in_flight(2400.0) == 120


CHECK = r"""
import ctypes, numpy as np
from probes._heap import MMAP_THRESHOLD_BYTES, return_large_frees

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
info = getattr(libc, "mallinfo2", None)
if info is None or not ({fix} is False or return_large_frees()):
    print("skip")
    raise SystemExit
info.restype = Mallinfo2
big = np.ones(30 * 1024 * 1024 // 8)  # 30 MiB: glibc would raise its threshold to this
del big
libc.malloc_trim(0)
# Larger than all free heap memory (imports leave some, by library version), so only the
# threshold decides whether the block is mmapped.
size = max(4 * MMAP_THRESHOLD_BYTES, info().fordblks + MMAP_THRESHOLD_BYTES)
assert size < 30 * 1024 * 1024, size
before = info().hblkhd
block = np.ones(size // 8)
mapped = info().hblkhd - before
del block
print(mapped, size, info().hblkhd <= before)
"""


def run(fix: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", CHECK.replace("{fix}", str(fix))],
                         capture_output=True, text=True, check=True).stdout.split()
    if out == ["skip"]:
        pytest.skip("not glibc >= 2.33 (no mallopt or mallinfo2)")
    return out


def test_a_large_block_is_mmapped_after_a_larger_one_was_freed() -> None:
    mapped, size, returned = run(fix=True)
    assert int(mapped) >= int(size) and returned == "True"


def test_without_the_fix_glibc_serves_it_from_the_heap() -> None:
    # The premise: what the fix changes is real on this C library.
    mapped, size, _ = run(fix=False)
    assert int(mapped) < int(size)
