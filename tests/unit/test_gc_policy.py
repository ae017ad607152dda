"""The young generation's threshold policy (`probes.measure.collector`), on the real
collector: cyclic garbage found → Python's small threshold; none → the large one."""

from __future__ import annotations

import gc

import pytest

from probes.measure.collector import adaptive_young_threshold


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
