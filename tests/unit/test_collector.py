"""`probes.measure.collector` on the real collector: the pause hook reports real collections,
and only inside its block; the young threshold follows the garbage found (cyclic garbage →
Python's small threshold; none → the large one).
"""

from __future__ import annotations

import gc

import pytest

from probes.measure.collector import adaptive_young_threshold, watch_gc_pauses


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


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def make_garbage(count: int) -> None:
    for _ in range(count):
        Node()


@pytest.fixture
def quiet_gc():
    """Automatic collections off, so only the test's own collections run the hook."""
    threshold = gc.get_threshold()
    enabled = gc.isenabled()
    gc.disable()
    gc.collect()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if enabled:
            gc.enable()


def test_the_threshold_follows_the_garbage_the_last_young_collection_found(quiet_gc):
    _, middle, old = gc.get_threshold()
    with adaptive_young_threshold(small=100, large=4_000):
        assert gc.get_threshold() == (4_000, middle, old)
        make_garbage(2_000)  # each Node and its __dict__: 4,000 objects, a quarter is 1,000
        gc.collect(0)
        assert gc.get_threshold() == (100, middle, old)
        make_garbage(50)  # still at least a quarter of 100
        gc.collect(0)
        assert gc.get_threshold()[0] == 100
        gc.collect(0)  # nothing found: back to rare
        assert gc.get_threshold()[0] == 4_000
        make_garbage(10)  # some, but not a quarter of 4,000
        gc.collect(0)
        assert gc.get_threshold()[0] == 4_000
        gc.collect(1)  # older generations' collections do not decide
        assert gc.get_threshold()[0] == 4_000
    hooks = len(gc.callbacks)
    gc.collect(0)
    assert len(gc.callbacks) == hooks  # the hook is gone after the block


def test_thresholds_must_be_ordered():
    with pytest.raises(ValueError, match="small <= large"), adaptive_young_threshold(10, 5):
        pass
