"""`release_free_heap` on the real C allocator: freed pages between live chunks go back."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from probes.measure.heap import _malloc_trim

# In a process of its own, so the test's figures are not the test runner's heap. Byte
# strings over 512 bytes come from malloc, not Python's allocator; keeping every 16th
# leaves the freed ones as holes below live chunks, which glibc's automatic trimming (the
# heap's top only) cannot return.
FRAGMENT = textwrap.dedent("""
    import gc, sys
    from probes.measure.heap import release_free_heap

    def rss_mib():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

    gc.disable()
    blocks = [bytes(4000) for _ in range(40_000)]  # ~160 MiB
    kept = blocks[::16]
    del blocks
    before = rss_mib()
    released = release_free_heap()
    after = rss_mib()
    print(before, after, released, len(kept))
""")


@pytest.mark.skipif(_malloc_trim() is None, reason="the C library has no malloc_trim")
def test_freed_memory_between_live_chunks_goes_back_to_the_system() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENT], capture_output=True, text=True, timeout=60,
        check=True,
    ).stdout.split()
    before, after, released = float(out[0]), float(out[1]), out[2]
    assert released == "True"
    # ~150 MiB was freed in 4 KB holes; without the call RSS stays where it was.
    assert before - after > 100, (before, after)

