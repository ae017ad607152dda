"""`probes._heap.keep_freed_memory`: a large array freed and allocated again comes back
from the heap, not from pages the kernel maps and faults in afresh."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Minor page faults while a 128 MB array is allocated and filled a second time, in a fresh
# interpreter, after the first was freed (printed by the child).
_CHILD = """
import resource, sys
import numpy as np
from probes._heap import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    print("unsupported")
    raise SystemExit
a = np.ones(16 << 20)
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.ones(16 << 20)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> str:
    return subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_a_freed_array_is_allocated_again_from_the_heap() -> None:
    kept = _faults("keep")
    if kept == "unsupported":
        pytest.skip("no glibc mallopt, or it refused the settings")
    # Without it, the array's pages are mapped and faulted in again: at least one fault
    # per 2 MB huge page (64), 32,768 with 4 KB pages.
    assert int(_faults("default")) >= 64
    assert int(kept) < 16
