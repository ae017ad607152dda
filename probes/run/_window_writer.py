"""Writing closed windows to the store, off the event loop, without losing any.

Windows are taken on the loop (the aggregator is not thread-safe), then built and written
in a worker thread so a slow disk never delays a send. A write the store refuses (full disk,
locked past the busy timeout) is kept and retried with the next window, oldest first, up to
`PENDING_WINDOWS` flushes; meanwhile probing goes on and `/healthz` says why. Windows
still unwritten at the end, or pushed out of that queue, are counted (`windows_unwritten`):
the run then ends with an error saying how many, never silently. Each write also rolls up
the endpoint windows' minutes past the aggregator's rewrite horizon (`Store.write`'s
`roll_before`), in the same transaction: a cold verdict reads a day's minutes from them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from probes.errors import StoreError
from probes.measure.window import Taken, WindowAggregator
from probes.metrics import ProbeMetrics
from probes.store import Event, Store
from probes.types import PathWindow

__all__ = ["PENDING_WINDOWS", "WindowWriter"]

log = logging.getLogger("skewprobe.run")

# How many flushes' worth of windows are held while the store cannot be written (1 h of 10 s).
PENDING_WINDOWS = 360


class WindowWriter:
    """`write()` after each window boundary (and once more with `force` at shutdown)."""

    def __init__(self, aggregator: WindowAggregator, metrics: ProbeMetrics, *,
                 on_window: Callable[[Sequence[Any]], None] | None = None,
                 executor: Executor | None = None) -> None:
        self.aggregator = aggregator
        self.executor = executor  # the worker thread (None: asyncio's default executor)
        self.metrics = metrics
        self.on_window = on_window
        self.store: Store | None = None
        self.error: str | None = None  # the store's last refusal, until a write succeeds
        self.last_error: str | None = None  # ... and kept after one does
        self.windows_written = 0
        self._evicted = 0  # path windows pushed out of a full pending queue: lost
        self._writing: asyncio.Task[tuple[list[PathWindow], str | None]] | None = None
        self._pending: deque[tuple[list[PathWindow], Taken, list[Event]]] = deque(
            maxlen=PENDING_WINDOWS
        )

    async def write(self, now: float, events: list[Event], *, force: bool) -> None:
        """Take the windows finished by `now` on the loop; build and write them, with
        `events`, in a worker thread.

        The write is a task of its own, shielded: cancelling the caller (shutdown) never
        leaves a write running unseen, and the next `write` waits for it first, so the
        pending queue has one writer at a time.
        """
        if self._writing is not None:
            # A write whose caller was cancelled (shutdown): let it end, count what it did.
            await asyncio.wait({self._writing})
            self._wrote(*self._writing.result())
        taken = self.aggregator.take(now, force=force)
        self._writing = asyncio.create_task(self._in_worker(taken, events), name="store-write")
        self._wrote(*await asyncio.shield(self._writing))

    async def _in_worker(self, taken: Taken, events: list[Event]
                         ) -> tuple[list[PathWindow], str | None]:
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self._store_pending, taken, events)

    @property
    def windows_unwritten(self) -> int:
        """Path windows not written: still pending, or pushed out of the queue."""
        return self._evicted + sum(len(p[0]) for p in self._pending)

    def raise_if_lost(self) -> None:
        """StoreError (exit 4) saying how many windows were not written, if any were not."""
        if lost := self.windows_unwritten:
            assert self.store is not None
            raise StoreError(f"{self.store.path}: {lost:,} windows could not be written and "
                             f"are lost ({self.last_error})")

    def _wrote(self, written: list[PathWindow], error: str | None) -> None:
        self._writing = None
        if error is not None:
            self.error = self.last_error = error
            self.metrics.store_error()
            return
        self.error = None
        if not written:
            return
        self.windows_written += len(written)
        self.metrics.windows_written(len(written))
        if self.on_window is not None:
            self.on_window(written)

    def _horizon(self, windows: Sequence[PathWindow]) -> float | None:
        """Before when no window is written again once `windows` are: the newest one's
        start less the aggregator's rewrite horizon and a window (None: no windows)."""
        if not windows:
            return None
        return self.aggregator.settled_before(max(w.start for w in windows))

    def _store_pending(
        self, taken: Taken, events: list[Event]
    ) -> tuple[list[PathWindow], str | None]:
        """Worker thread: build the taken windows, queue them, write the queue in order.

        Returns the path windows written and the store's error, if any. Touches only the
        pending queue (one writer at a time, see `write`) and the thread-safe store.
        """
        path_windows = taken.path_windows()
        if taken or events:
            if len(self._pending) == self._pending.maxlen:
                self._evicted += len(self._pending[0][0])
            # The endpoint windows stay in `taken` until written, and are made one at a
            # time as the store writes them (see `Taken`).
            self._pending.append((path_windows, taken, events))
        assert self.store is not None
        written: list[PathWindow] = []
        try:
            while self._pending:
                pws, unwritten, evs = self._pending[0]
                # Events first: a pod's start events are in the store before any of its
                # windows, so a verdict never reads the windows without them
                # (`probes.store.records.known_starts`); written again on a retry, they are
                # kept once.
                if evs:
                    self.store.write_events(evs)
                self.store.write(pws, unwritten.endpoint_windows(),
                                 roll_before=self._horizon(pws))
                written += pws
                self._pending.popleft()
        except StoreError as exc:
            log.error("store write failed, %d windows kept for retry: %s",
                      sum(len(p[0]) for p in self._pending), exc)
            return written, str(exc)
        return written, None
