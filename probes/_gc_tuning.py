"""Process-wide collector tuning for a long-running probe (opt-in: `skewprobe run` uses it).

Why: a probe holds thousands of long-lived objects (schedules, connections, transports), and
every full collection walks them all: tens of milliseconds at 2,400 endpoints, during which
every due send leaves late (BENCHMARKS.md, "Probe capacity": `gc.freeze()`). So once the
schedule runs, the survivors are frozen (later collections skip them), full collections are
made rare, and the young threshold follows the garbage its collections find
(`probes.measure.gc_policy`). Every collection's pause is exported meanwhile
(`skewprobe_gc_pause_seconds`), and the collector's state is put back when the run ends
(tests run the runner in their own process).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Sequence

from probes._spec import PathSpec
from probes.measure.gc_pauses import watch_gc_pauses
from probes.measure.gc_policy import adaptive_young_threshold

__all__ = ["GC_FULL_EVERY", "GC_WARMUP_EXTRA_S", "CollectorTuning"]

# When the warm-up (first sends, connections opened) is taken to be over: one period and one
# timeout after the first snapshot, plus this margin.
GC_WARMUP_EXTRA_S = 2.0
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

    async def tune(self, started: Callable[[], object], paths: Sequence[PathSpec]) -> None:
        """After `started()` (awaited: the first endpoints are scheduled) and one send period
        and timeout more: collect, freeze the survivors, make full collections rare, and let
        the young threshold follow the garbage found. The freeze is not repeated: frozen
        cyclic garbage is never collected (about 1.5 KB per connection open at the freeze)."""
        await started()  # type: ignore[misc]
        period = max((1.0 / p.rate_per_s for p in paths if p.stream is None), default=1.0)
        timeout = max((p.timeout_s for p in paths), default=1.0)
        await asyncio.sleep(period + timeout + GC_WARMUP_EXTRA_S)
        gc.collect()
        gc.freeze()
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, GC_FULL_EVERY)
        self._hooks.enter_context(adaptive_young_threshold())
