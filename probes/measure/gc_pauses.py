"""The probe's garbage-collection pauses, measured with a `gc.callbacks` hook.

A collection stops the event loop, and every send due meanwhile leaves late: at 2,400
endpoints a full collection of a few hundred milliseconds is what pushes the schedule lag
p99 over its budget (BENCHMARKS.md, "Where the time and memory go"). The lag histogram
says how late the probe was; these pauses say whether the collector is why.

`watch_gc_pauses(sink)` installs the hook for the duration of a `with` block and removes
it after, so a test or a second run in the same process starts clean. The hook costs two
`perf_counter` calls per collection and must stay cheap and lock-free: it runs inside
whatever allocation triggered the collection.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["watch_gc_pauses"]

PauseSink = Callable[[int, float], None]  # (generation, seconds)


@contextlib.contextmanager
def watch_gc_pauses(sink: PauseSink) -> Iterator[None]:
    """Report every collection's generation and pause to `sink` while the block runs."""
    started = 0.0

    def hook(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            sink(info["generation"], time.perf_counter() - started)

    gc.callbacks.append(hook)
    try:
        yield
    finally:
        gc.callbacks.remove(hook)
