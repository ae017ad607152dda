"""probes.measure.collector: the hook reports real collections, and only inside its block."""

from __future__ import annotations

import gc

from probes.measure.collector import watch_gc_pauses


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_reports_each_collection_with_its_generation_and_pause_then_leaves() -> None:
    before = list(gc.callbacks)
    seen: list[tuple[int, float]] = []
    with watch_gc_pauses(lambda generation, s: seen.append((generation, s))):
        assert len(gc.callbacks) == len(before) + 1
        started = len(seen)
        for _ in range(1000):
            _Cycle()  # cyclic garbage: only a collection frees it
        gc.collect(0)
        gc.collect()
        ours = seen[started:]
    # At least the two explicit ones, young then full, each a positive duration.
    assert [g for g, _ in ours][-2:] == [0, 2]
    assert all(s > 0 for _, s in ours)
    assert gc.callbacks == before
    after = len(seen)
    gc.collect()
    assert len(seen) == after  # removed: nothing reported once the block is left


def test_the_hook_is_removed_when_the_block_raises() -> None:
    before = list(gc.callbacks)
    try:
        with watch_gc_pauses(lambda generation, s: None):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.callbacks == before
