"""How often the probe's young generation is collected: rarely while collections find no
garbage, often again as soon as they do.

A young collection walks every tracked object born since the last one that is still
alive, garbage or not. In a healthy steady state the probe makes no cyclic garbage
(an answered HTTP/1.1 call leaves none; measured with `gc.DEBUG_SAVEALL`), so what a young
collection walks is medium-lived state that is alive anyway: each held gRPC stream's
pending read, renewed at every message. Python's default (a collection every 700 net
allocations) then costs ~130 young and ~12 middle-generation collections per 30 s at
2,400 endpoints × 1/s with 2,400 streams, 10–25 ms each, and that is the schedule lag's
p99 (BENCHMARKS.md). At 5,000 the same load has ~6 young collections per 30 s and no
middle ones.

Failing calls do make garbage: each connection that ends in an error leaves asyncio's
transport cycle (~14 objects) behind. At a large threshold a failure storm at 2,400
endpoints would fill the young generation several times a second and every pause would
walk 5,000 objects of it, exactly when the verdict matters. So the threshold follows what
the last young collection found: garbage in it (at least a quarter of the threshold) →
`small`; none worth the name → `large`. The worst case is one large collection as a storm
begins.

The hook runs inside whatever allocation started the collection: it only reads the
collection's numbers and sets the threshold, no lock and no allocation that matters.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

__all__ = ["YOUNG_LARGE", "YOUNG_SMALL", "adaptive_young_threshold"]

YOUNG_SMALL = 700  # Python's default
YOUNG_LARGE = 5_000


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
