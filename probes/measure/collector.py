"""The probe's garbage collector: its pauses measured, and its young threshold following the
garbage it finds.

**Pauses** (`watch_gc_pauses`, a `gc.callbacks` hook). A collection stops the event loop,
and every send due meanwhile leaves late: at 2,400 endpoints a full collection of a few
hundred milliseconds is what pushes the schedule lag p99 over its budget (BENCHMARKS.md,
"Where the time and memory go"). The lag histogram says how late the probe was; these pauses
say whether the collector is why. `watch_gc_pauses(sink)` installs the hook for the duration
of a `with` block and removes it after, so a test or a second run in the same process starts
clean. The hook costs two `perf_counter` calls per collection and must stay cheap and
lock-free: it runs inside whatever allocation triggered the collection.

**The young threshold** (`adaptive_young_threshold`): collected rarely while collections
find no garbage, often again as soon as they do. A young collection walks every tracked
object born since the last one that is still alive, garbage or not. In a healthy steady
state the probe makes no cyclic garbage (an answered HTTP/1.1 call leaves none; measured
with `gc.DEBUG_SAVEALL`), so what a young collection walks is medium-lived state that is
alive anyway: each held gRPC stream's pending read (~19 objects of grpc.aio's, renewed at
every message). At 2,400 streams with a message every 10 s that is ~45,000 objects whatever
the threshold, 35–60 ms a collection (a census of the young generation, BENCHMARKS.md): the
number of collections is what costs, not their size. Python's default (a collection every
700 net allocations) gave ~130 young and ~12 middle-generation collections per 30 s; 5,000
gave one young collection per 10 s window; at 50,000 a 30-minute run had none after the
warm-up.

Failing calls do make garbage: each connection that ends in an error leaves asyncio's
transport cycle (~14 objects) behind. At a large threshold a failure storm at 2,400
endpoints would fill the young generation several times a second and every pause would
walk 50,000 objects of it, exactly when the verdict matters. So the threshold follows what
the last young collection found: garbage in it (at least a quarter of the threshold) →
`small`; none worth the name → `large`. The worst case is one large collection as a storm
begins (up to 50,000 objects of garbage beside the streams' ~45,000).

Both hooks run inside whatever allocation started the collection: they only read the
collection's numbers (and set the threshold), no lock and no allocation that matters.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["YOUNG_LARGE", "YOUNG_SMALL", "adaptive_young_threshold", "watch_gc_pauses"]


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


YOUNG_SMALL = 700  # Python's default
YOUNG_LARGE = 50_000


@contextlib.contextmanager
def adaptive_young_threshold(
    small: int = YOUNG_SMALL, large: int = YOUNG_LARGE
) -> Iterator[None]:
    """While the block runs, set the young threshold after every young collection from
    the garbage it found; the older generations' thresholds are left as they are."""
    if not 0 < small <= large:
        raise ValueError("thresholds must satisfy 0 < small <= large")

    def hook(phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != 0:
            return
        young, middle, old = gc.get_threshold()
        wanted = small if info["collected"] * 4 >= young else large
        if wanted != young:
            gc.set_threshold(wanted, middle, old)

    _, middle, old = gc.get_threshold()
    gc.set_threshold(large, middle, old)
    gc.callbacks.append(hook)
    try:
        yield
    finally:
        gc.callbacks.remove(hook)
