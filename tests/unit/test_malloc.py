"""`probes.run._memory`: with glibc's mmap threshold fixed, a large block is served by mmap even
after a larger one was freed (glibc would otherwise raise its threshold to that size and
serve the next ones from the heap, which keeps what they free). In a fresh interpreter: a
heap that earlier tests left with large free chunks serves a block from them whatever the
threshold, so the setting is only seen where the probe sets it, at its start."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = r"""
import ctypes, numpy as np
from probes.run._memory import MMAP_THRESHOLD_BYTES, return_large_frees

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
