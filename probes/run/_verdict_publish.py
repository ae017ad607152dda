"""`skewprobe run`'s verdicts and where they go: the API's and the skewprobe_verdict gauges'.

`VerdictRoute` judges them in a worker process of their own (`probes.verdict.worker`, with
its own verdict cache: only new windows are read), requests for the same verdict sharing one
computation; the final one, for the summary, on the store as the run left it.
`VerdictGauges` publishes one to the gauges once per window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from probes.api import VerdictQuery
from probes.errors import SkewprobeError
from probes.measure.overload import OverloadWatch
from probes.metrics import OVERALL, ProbeMetrics
from probes.spec import Config
from probes.verdict.entry import Query, StoreSource, verdict
from probes.verdict.service import FROM_STORE, verdict_time
from probes.verdict.worker import (
    SharedVerdicts,
    VerdictJob,
    VerdictWorker,
    judge_job,
    prometheus_job_settings,
    verdict_key,
)

__all__ = ["VerdictGauges", "VerdictRoute"]


log = logging.getLogger("skewprobe.run")


class VerdictRoute:
    """`start()` once the store is open, `judge()` for each request, `close()` and
    `aclose()` at shutdown."""

    def __init__(self, config: Config, store_path: str, overload: OverloadWatch,
                 registry: CollectorRegistry, windows_written: Callable[[], int]) -> None:
        self.config = config
        self.store_path = store_path
        self.overload = overload
        self.windows_written = windows_written
        self.worker: VerdictWorker | None = None
        self.in_process = True  # False: in a thread (BENCHMARKS.md D24 compares)
        self.shared = SharedVerdicts(registry)

    def start(self) -> None:
        self.worker = VerdictWorker(self.store_path, in_process=self.in_process)
        self.worker.start()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()

    async def aclose(self) -> None:
        await self.shared.aclose()

    async def judge(self, query: VerdictQuery) -> Mapping[str, Any]:
        """The verdict from the store; while the probe is overloaded (`OverloadWatch`) the
        reason comes first, and p99 leaves out the windows of its late sends. With
        `source: prometheus`, from every probe's series in Prometheus (each probe's overload
        is read there); SourceUnavailable (HTTP 503) when Prometheus does not answer. With
        `at`, the verdict as it stood then, the probe's overload state then read from the
        store, as `skewprobe verdict --at` does."""
        # VerdictQuery's fields but `at` are the verdict functions' query keywords.
        query_args: dict[str, Any] = dataclasses.asdict(query)
        at = query_args.pop("at")
        now = verdict_time(at, now=time.time())
        overload = self.overload.reason if at is None else FROM_STORE
        asked_now = at is None and query.since is None
        prometheus = self.config.prometheus if self.config.source == "prometheus" else None
        job = VerdictJob(
            self.store_path, self.config.judging,
            Query(now=now, **query_args), overload=overload, cached=at is None,
            prometheus=None if prometheus is None else prometheus_job_settings(prometheus))
        worker = self.worker
        if worker is None:  # not running (a test of the verdict alone): no cache to keep
            return await asyncio.to_thread(judge_job, dataclasses.replace(job, cached=False))
        # The same query and overload state, no window written since, in the same window:
        # the same verdict.
        key = verdict_key(dataclasses.asdict(query), overload, self.windows_written(),
                          math.floor(now / self.config.judging.window_s))
        return await self.shared.get(key, lambda: worker.judge(job), keep=asked_now)

    def final(self, last: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The verdict on the store as the run left it (`last`, the last published one,
        when judged from Prometheus); None, logged, when it cannot be computed."""
        if self.config.source == "prometheus":
            return last
        try:
            return verdict(Query(now=time.time()), self.config.judging,
                           StoreSource(self.store_path, overload=self.overload.reason)).to_json()
        except SkewprobeError as exc:
            log.warning("verdict not computed: %s", exc)
            return None


class VerdictGauges:
    """`publish()` once per window; `last` is the verdict last published."""

    def __init__(self, metrics: ProbeMetrics,
                 judge: Callable[[VerdictQuery], Awaitable[Mapping[str, Any]]]) -> None:
        self.metrics = metrics
        self.judge = judge
        self.last: Mapping[str, Any] | None = None

    async def publish(self) -> None:
        """Set the gauges from the verdict now. One that cannot be computed leaves every
        gauge inconclusive, never the last pass: the MetricTemplate gates on the gauge, and a
        sharded probe judging from a Prometheus it cannot reach would otherwise keep
        exporting an old pass."""
        try:
            result = await self.judge(VerdictQuery())
        except SkewprobeError as exc:
            log.warning("verdict not computed: %s", exc)
            if self.last is not None:
                for path in [*self.last.get("paths", []), *self.last.get("pairs", [])]:
                    self.metrics.set_verdict(path["path"], "inconclusive")
                self.metrics.set_verdict(OVERALL, "inconclusive")
            return
        self.last = result
        for path in [*result.get("paths", []), *result.get("pairs", [])]:
            self.metrics.set_verdict(path["path"], path["verdict"])
        self.metrics.set_verdict(OVERALL, result["verdict"])
