"""The memory of a long-running probe: the collector tuned after the warm-up (opt-in:
`skewprobe run` uses it).

**The collector.** A probe holds thousands of long-lived objects (schedules, connections,
transports), and every full collection walks them all: tens of milliseconds at 2,400
endpoints, during which every due send leaves late (BENCHMARKS.md, "Probe capacity":
`gc.freeze()`). So once the schedule runs, the survivors are frozen (later collections skip
them), full collections are made rare, and the young threshold follows the garbage its
collections find (`probes.measure.collector`). Every collection's pause is exported
meanwhile (`skewprobe_gc_pause_seconds`), and the collector's state is put back when the run
ends (tests run the runner in their own process).

glibc's malloc, tuned for a long-running probe, is `probes._heap.return_large_frees`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Sequence

from probes.measure.collector import adaptive_young_threshold, watch_gc_pauses
from probes.spec import PathSpec

__all__ = [
    "GC_FULL_EVERY",
    "GC_SETTLE_LIMIT_S",
    "GC_WARMUP_EXTRA_S",
    "CollectorTuning",
    "settled_in_flight",
]


# When the warm-up (first sends, connections opened) may be over: one period and one
# timeout after the first snapshot, plus this margin. Then the freeze waits until the
# start-up backlog is worked off (calls in flight near their steady level), at most this
# much longer: while thousands of late calls are in flight, every young collection walks
# them all (BENCHMARKS.md D15).
GC_WARMUP_EXTRA_S = 2.0
GC_SETTLE_LIMIT_S = 30.0
_SETTLE_POLL_S = 0.5


def settled_in_flight(calls_per_s: float) -> int:
    """Calls in flight at or below which the start-up backlog counts as worked off: the
    intended unary calls per second times 50 ms (a slow answer), and never below 16."""
    return max(16, int(calls_per_s * 0.05))


# After it: a full collection at most every this many middle-generation ones (Python: 10).
GC_FULL_EVERY = 100


class CollectorTuning:
    """`save()` at startup (returns the restore for shutdown); `tune()` once endpoints run."""

    def __init__(self, on_pause: Callable[[int, float], None]) -> None:
        self._on_pause = on_pause
        self._hooks = contextlib.ExitStack()

    def save(self) -> Callable[[], None]:
        """The collector's state now, put back by the function returned; meanwhile every
        collection's pause goes to `on_pause`."""
        threshold = gc.get_threshold()
        self._hooks.enter_context(watch_gc_pauses(self._on_pause))

        def restore() -> None:
            self._hooks.close()
            gc.unfreeze()
            gc.set_threshold(*threshold)

        return restore

    async def tune(self, started: Callable[[], object], paths: Sequence[PathSpec],
                   in_flight: Callable[[], int] | None = None,
                   settled_at: Callable[[], int] | None = None) -> None:
        """After `started()` (awaited: the first endpoints are scheduled) and one send period
        and timeout more, and once `in_flight()` is at most `settled_at()` at two looks in a
        row (or `GC_SETTLE_LIMIT_S` later): collect, freeze the survivors, make full
        collections rare, and let the young threshold follow the garbage found. The freeze
        is not repeated: frozen cyclic garbage is never collected (about 1.5 KB per
        connection open at the freeze)."""
        await started()  # type: ignore[misc]
        period = max((1.0 / p.rate_per_s for p in paths if p.stream is None), default=1.0)
        timeout = max((p.timeout_s for p in paths), default=1.0)
        await asyncio.sleep(period + timeout + GC_WARMUP_EXTRA_S)
        if in_flight is not None and settled_at is not None:
            calm = 0
            for _ in range(int(GC_SETTLE_LIMIT_S / _SETTLE_POLL_S)):
                calm = calm + 1 if in_flight() <= settled_at() else 0
                if calm >= 2:
                    break
                await asyncio.sleep(_SETTLE_POLL_S)
        gc.collect()
        gc.freeze()
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, GC_FULL_EVERY)
        self._hooks.enter_context(adaptive_young_threshold())

