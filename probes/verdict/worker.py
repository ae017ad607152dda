"""The running probe's verdicts, computed off its probing loop and shared (issue 32).

A verdict is tens of milliseconds of CPU, much of it Python: in a thread of the probe's
process it holds the GIL against the loop that sends the calls, and a burst of `/verdict`
requests made the probe's sends late until it judged itself overloaded. So the verdicts are
computed in one child process (`VerdictWorker`), at a lower priority than the probe, with
its own store connection and its own `VerdictCache`; it runs one verdict at a time, so the
cache has one user. BENCHMARKS.md D24 has the measurements (under a flood of distinct
queries a thread left 7.6 % of the probe's sends late, the process 2.96 %).

Requests for the same verdict share one computation (`SharedVerdicts`): the same query and
overload state, with no window written in between and within the same window, is the same
verdict. A verdict asked "now" (no `since`, no `at`) is kept and served again until either
changes; the others are shared only while they are being computed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import signal
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from probes.errors import SourceUnavailable

if TYPE_CHECKING:
    from probes.spec import JudgingSettings, PrometheusSettings
    from probes.verdict.cache import VerdictCache
    from probes.verdict.entry import Query

__all__ = [
    "SharedVerdicts",
    "VerdictJob",
    "VerdictWorker",
    "judge_job",
    "prometheus_job_settings",
    "verdict_key",
]

# How much lower than the probe the worker runs: a verdict waits for a core, never a send.
WORKER_NICENESS = 10
# Verdicts asked "now" kept at once (one per distinct query and overload state).
_KEEP = 32
_PR_SET_PDEATHSIG = 1

# In the worker process: its own verdict cache over the probe's store (`_start`).
_cache: VerdictCache | None = None


@dataclass(frozen=True, slots=True)
class VerdictJob:
    """One verdict to compute, as it crosses to the worker (picklable): from the store at
    `store_path`, or from Prometheus when `prometheus` is set."""

    store_path: str
    settings: JudgingSettings
    query: Query
    overload: Any = None  # the probe's overload reason, or FROM_STORE (`probes.verdict.service`)
    cached: bool = False  # through the worker's verdict cache (asked "now")
    prometheus: PrometheusSettings | None = None


def _start(store_path: str, niceness: int) -> None:
    """The worker process's start: lower priority, its own cache; Ctrl-C is the probe's."""
    from probes.verdict.cache import VerdictCache

    global _cache
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        # Killed with the probe, even by SIGKILL (Linux): no orphan holds the store open.
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.nice(niceness)
    _cache = VerdictCache(store_path)


def judge_job(job: VerdictJob, cache: VerdictCache | None = None) -> dict[str, Any]:
    """The verdict JSON of `job` (in the worker: through its cache when `job.cached`)."""
    from probes.verdict.entry import StoreSource, verdict

    cache = cache if cache is not None else _cache
    source = job.prometheus or StoreSource(job.store_path, overload=job.overload,
                                           cache=cache if job.cached else None)
    return verdict(job.query, job.settings, source).to_json()


def _pooled_rows(cache: VerdictCache | None = None) -> int | None:
    """How many pooled path-window rows the cache holds (None: nothing read yet)."""
    cache = cache if cache is not None else _cache
    windows = None if cache is None else cache._windows
    return None if windows is None else len(windows.sealed.start)


class VerdictWorker:
    """Computes `VerdictJob`s one at a time in a child process (`in_process=False`: in a
    thread of this one, for comparison) holding its own `VerdictCache` over `store_path`."""

    def __init__(self, store_path: str, *, in_process: bool = True) -> None:
        self.store_path = store_path
        self.in_process = in_process
        self._thread_cache: VerdictCache | None = None
        self._pool = self._new_pool()

    def _new_pool(self) -> concurrent.futures.Executor:
        if not self.in_process:
            from probes.verdict.cache import VerdictCache

            self._thread_cache = VerdictCache(self.store_path)
            return concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="skewprobe-verdict")
        # Spawned, not forked: the probe has threads (store writer, gRPC) a fork would copy
        # mid-lock.
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"),
            initializer=_start, initargs=(self.store_path, WORKER_NICENESS))

    def start(self) -> None:
        """Start the worker now, so the first verdict does not wait for it to import."""
        self._pool.submit(os.getpid)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._thread_cache is not None:
            args = (*args, self._thread_cache)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except BrokenProcessPool:
            # The worker died (killed, out of memory): the next verdict starts a new one.
            self._pool.shutdown(wait=False)
            self._pool = self._new_pool()
            raise SourceUnavailable("the verdict worker process died; try again") from None

    async def judge(self, job: VerdictJob) -> Mapping[str, Any]:
        result: Mapping[str, Any] = await self._call(judge_job, job)
        return result

    async def pooled_rows(self) -> int | None:
        """The cache's pooled path-window rows, for tests that check it was read pooled."""
        rows: int | None = await self._call(_pooled_rows)
        return rows

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._thread_cache is not None:
            self._thread_cache.close()


def prometheus_job_settings(prometheus: PrometheusSettings) -> PrometheusSettings:
    """`prometheus` picklable: its headers a plain dict (the config's is read-only)."""
    return dataclasses.replace(prometheus, headers=dict(prometheus.headers))


class SharedVerdicts:
    """One computation per verdict key at a time, and the verdicts asked "now" kept for
    their key; counts the computations in `skewprobe_verdict_computations_total`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.computations = Counter(
            "skewprobe_verdict_computations",
            "Verdicts computed for the API and the verdict gauges; requests for the same "
            "verdict share one.", registry=registry)
        self._running: dict[Hashable, asyncio.Task[Mapping[str, Any]]] = {}
        self._kept: OrderedDict[Hashable, Mapping[str, Any]] = OrderedDict()

    async def get(self, key: Hashable, compute: Callable[[], Awaitable[Mapping[str, Any]]],
                  *, keep: bool) -> Mapping[str, Any]:
        if keep and (kept := self._kept.get(key)) is not None:
            return kept
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(self._compute(key, compute, keep), name="verdict")
            self._running[key] = task
        # Shielded: a client that hangs up must not cancel what the others wait for.
        return await asyncio.shield(task)

    async def _compute(self, key: Hashable, compute: Callable[[], Awaitable[Mapping[str, Any]]],
                       keep: bool) -> Mapping[str, Any]:
        try:
            self.computations.inc()
            result = await compute()
        finally:
            del self._running[key]
        if keep:
            self._kept[key] = result
            while len(self._kept) > _KEEP:
                self._kept.popitem(last=False)
        return result

    async def aclose(self) -> None:
        """Cancel what is still being computed and wait for it (at shutdown)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def verdict_key(query: Mapping[str, Any], *state: Hashable) -> Hashable:
    """The key of a verdict: its query's fields and `state` (overload, windows written, the
    window it was asked in)."""
    return (tuple(sorted(query.items())), *state)

