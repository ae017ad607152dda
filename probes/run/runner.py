"""`skewprobe run`: wires discovery → engine → clients → measure → store, and serves the API.

The shape is uvicorn's: startup (bind the API, lock and open the store, build probers),
the main loop (the engine applies discovery snapshots; a flusher closes each window on its
boundary and has it written), then shutdown (stop sending, give in-flight calls their
timeout to finish, write every open window, close the store). SIGTERM and SIGINT trigger
shutdown; a second signal does not skip the final flush. The parts with a job of their own
live beside it: `_window_writer` (writes and retries), `_inventory_task` (the pod inventory
with Kubernetes discovery, and the snapshots every run stores), `_progress` (the lines a
run logs and its summary), `_api_server` (binding and serving the API), `_gc_tuning` (the
collector, opt-in), `_malloc` (freed arrays returned to the system).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from probes._exceptions import SkewprobeError, SourceUnavailable, StoreError
from probes._spec import ApiTlsSpec, Config
from probes._types import CallResult, Endpoint
from probes._verdict_worker import (
    SharedVerdicts,
    VerdictJob,
    VerdictWorker,
    judge_job,
    prometheus_job_settings,
    verdict_key,
)
from probes.api import ApiApp, VerdictQuery
from probes.clients import OpenStream, StreamProber, build_prober
from probes.discovery import DiscoverySource, FileSource, StaticSource
from probes.discovery.changes import RestartTracker
from probes.discovery.shard import ShardSource
from probes.inventory import SkewMetrics
from probes.measure.cost import cpu_limit_cores, estimate
from probes.measure.overload import OVERLOAD_EVENT, OverloadWatch
from probes.measure.window import WindowAggregator
from probes.metrics import (
    DURATION_BUCKETS,
    OVERALL,
    PROMETHEUS_DURATION_BUCKETS,
    ProbeMetrics,
)
from probes.pairs import store_verdict
from probes.run._api_server import bind_api, serve_api
from probes.run._gc_tuning import CollectorTuning, settled_in_flight
from probes.run._inventory_task import EndpointInventory, InventoryKeeper
from probes.run._malloc import return_large_frees
from probes.run._progress import NO_ANSWER, ProgressReporter
from probes.run._window_writer import WindowWriter
from probes.run.engine import Engine, EngineLimits, Prober
from probes.store import Event, Store
from probes.store.lock import WriterLock
from probes.streams import StreamRecorder
from probes.verdict_service import FROM_STORE, JudgingSettings, verdict_time
from probes.verdict_settings import settings_event

__all__ = [
    "ProbeRunner",
    "Recorder",
    "RunOptions",
    "discovery_for",
]

log = logging.getLogger("skewprobe.run")
# The start-up cost line: `skewprobe run` shows it at the default level (probes.cli).
cost_log = logging.getLogger("skewprobe.cost")

class Recorder:
    """The engine's sink: each result goes to the window aggregator and to /metrics."""

    def __init__(
        self, aggregator: WindowAggregator, metrics: ProbeMetrics, overload: OverloadWatch
    ) -> None:
        self.aggregator = aggregator
        self.metrics = metrics
        # Read at every call, so a budget changed on the watch counts from then on.
        self.overload = overload
        self.calls = 0
        self.errors_by_cohort: dict[str, int] = {}
        self.calls_by_cohort: dict[str, int] = {}
        self.dropped_total = 0
        # Sends later than the overload watch's budget (the rule reads it).
        self.lagged = 0
        # Endpoints that answered a call since the progress reporter last took the set.
        self.answered: set[str] = set()

    def record(self, result: CallResult, endpoint: Endpoint) -> None:
        if not self.aggregator.add(result, endpoint.labels):
            # Its window was written and forgotten long ago: count it, never lose it silently.
            self.dropped(result.path, "late")
        self.metrics.observe(result)
        self.calls += 1
        if result.lag_s > self.overload.budget_s:
            self.lagged += 1
        self.calls_by_cohort[result.cohort] = self.calls_by_cohort.get(result.cohort, 0) + 1
        if not result.ok:
            self.errors_by_cohort[result.cohort] = self.errors_by_cohort.get(result.cohort, 0) + 1
            if result.outcome.outcome in NO_ANSWER:
                return
        self.answered.add(endpoint.name)

    def dropped(self, path: str, reason: str, count: int = 1) -> None:
        self.dropped_total += count
        self.metrics.drop(path, reason, count)


def discovery_for(config: Config) -> DiscoverySource:
    if config.kubernetes is not None:
        # Imported here: kubernetes-asyncio takes half a second to import.
        from probes.discovery.kubernetes import KubernetesSource

        return KubernetesSource(config.kubernetes)
    if config.file_targets is not None:
        return FileSource(config.file_targets.path)
    return StaticSource(config.static_targets)


@dataclass
class RunOptions:
    store_path: str
    listen: str | None = "127.0.0.1:9464"
    duration_s: float | None = None
    # The API's bearer token (a secret: kept out of the repr) and TLS (`probes.api_access`).
    token: str | None = field(default=None, repr=False)
    api_tls: ApiTlsSpec | None = None
    on_window: Callable[[Sequence[Any]], None] | None = None
    # (i, n): probe only the endpoints of shard i of n (`--shard i/n`).
    shard: tuple[int, int] | None = None
    # A progress line this often (`probes.run._progress`); "all endpoints down" after half that.
    progress_every_s: float = 60.0


class ProbeRunner:
    """One probe process. `run()` returns when the duration ends or a signal arrives."""

    def __init__(self, config: Config, options: RunOptions) -> None:
        self.config = config
        self.options = options
        self.registry = CollectorRegistry()
        # Judged from Prometheus, the verdict's p99 is read from the exported buckets.
        self.metrics = ProbeMetrics(self.registry, duration_buckets=(
            PROMETHEUS_DURATION_BUCKETS if config.source == "prometheus" else DURATION_BUCKETS))
        grace = max((p.timeout_s for p in config.paths), default=1.0) + 0.5
        self.aggregator = WindowAggregator(length_s=config.window_s, grace_s=grace)
        self.overload = OverloadWatch()
        self.recorder = Recorder(self.aggregator, self.metrics, self.overload)
        # One worker thread for the store's writes: glibc gives each thread its own malloc
        # arena and keeps a freed arena's peak (BENCHMARKS.md D15). Verdicts are computed in
        # a process of their own (`probes._verdict_worker`).
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="skewprobe-worker")
        self.writer = WindowWriter(self.aggregator, self.metrics, on_window=options.on_window,
                                   executor=self.worker)
        self.store: Store | None = None
        self.engine: Engine | None = None
        self.probers: dict[str, Prober] = {}
        self.stopping = asyncio.Event()
        # The API's address once bound (with port 0 in `listen`, the port the system chose).
        self.bound: tuple[str, int] | None = None
        self._api_socket: socket.socket | None = None
        self.collector = CollectorTuning(self.metrics.gc_paused)
        self.source = discovery_for(config)
        if options.shard is not None:
            self.source = ShardSource(self.source, *options.shard)
        self.inventory = (
            InventoryKeeper(config, self.source, self.metrics, SkewMetrics(self.registry))
            if config.kubernetes else None
        )
        # Inventory snapshots in the store, from the pods or else from the endpoints probed.
        self.snapshots = self.inventory or EndpointInventory(
            config, self.metrics, lambda: self.engine.endpoints if self.engine else ())
        self.streams = StreamRecorder(self.aggregator, self.metrics)
        self.stream_prober: StreamProber | None = None
        self._lifetime_at = 0.0
        self.open_at_stop: tuple[OpenStream, ...] = ()
        self.last_verdict: Mapping[str, Any] | None = None
        # Where verdicts are computed (its own verdict cache: only new windows are read), and
        # requests for the same verdict sharing one computation.
        self.verdicts: VerdictWorker | None = None
        self.verdicts_in_process = True  # False: in a thread (BENCHMARKS.md D24 compares)
        self.shared = SharedVerdicts(self.registry)
        # Events made on the loop (overload changes), written with the next window.
        self._events: list[Event] = []
        # Pods back on another proxy version: `restart` events for the report's time axis.
        self.restarts = RestartTracker(config.cohort.by)
        self.progress = ProgressReporter(self, every_s=options.progress_every_s,
                                         down_after_s=options.progress_every_s / 2,
                                         calls=any(p.stream is None for p in config.paths))

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        # Everything that can refuse the run comes before anything is created.
        if self.options.listen:
            self._api_socket = bind_api(self.options.listen)
            self.bound = self._api_socket.getsockname()[:2]
        try:
            # One writer per store: a second probe would replace the first's windows.
            with WriterLock.acquire(self.options.store_path):
                self.store = self.writer.store = Store.open(self.options.store_path)
                try:
                    # A damaged store would take windows it cannot give back: refused
                    # (SQLite's quick_check, about 1 s for a 300 MB store).
                    self.store.check()
                except StoreError:
                    self.store.close()
                    raise
                # How this run judges, so `skewprobe verdict --store` judges alike after it.
                self.store.write_events([settings_event(
                    JudgingSettings.from_config(self.config), time.time())])
                self.snapshots.store = self.store
                self.verdicts = VerdictWorker(self.options.store_path,
                                              in_process=self.verdicts_in_process)
                self.verdicts.start()
                try:
                    await self._main()
                finally:
                    self.worker.shutdown(wait=True)
                    self.verdicts.close()
                    self.store.close()
        finally:
            if self._api_socket is not None:  # not handed to the server
                self._api_socket.close()
                self._api_socket = None
        self.progress.finish(self.options.store_path, self._final_verdict)
        self.writer.raise_if_lost()

    def _final_verdict(self) -> Mapping[str, Any] | None:
        """The verdict on the store as the run left it (the last published one when judged
        from Prometheus); None, logged, when it cannot be computed."""
        if self.config.source == "prometheus":
            return self.last_verdict
        try:
            return store_verdict(self.options.store_path, self.config, now=time.time(),
                                 overload=self.overload.reason).to_json()
        except SkewprobeError as exc:
            log.warning("verdict not computed: %s", exc)
            return None

    async def _main(self) -> None:
        self.probers = {p.name: build_prober(p) for p in self.config.paths if p.stream is None}
        stream_paths = [p for p in self.config.paths if p.stream is not None]
        if stream_paths:
            self.stream_prober = StreamProber(stream_paths, self.streams)
        self.engine = Engine(
            self.config.paths,
            self.probers,
            self.recorder,
            cohort_by=self.config.cohort.by,
            limits=EngineLimits(
                max_in_flight=self.config.max_in_flight,
                max_rate_per_s=self.config.max_rate_per_s,
                cohort_balance_max=self.config.cohort_balance_max,
            ),
            streams=self.stream_prober,
        )
        engine = self.engine
        self.metrics.track_in_flight(lambda: engine.in_flight)
        self.metrics.track_intended_rates(engine.intended_rates)
        restore = self._install_signal_handlers()
        restore_gc = self.collector.save()
        return_large_frees()
        tasks: set[asyncio.Task[Any]] = set()
        api_task: asyncio.Task[None] | None = None
        # Not in `tasks`: every task there ends the run when it returns; this one returns.
        gc_task = asyncio.create_task(self.collector.tune(
            engine.wait_for_endpoints, self.config.paths, lambda: engine.in_flight,
            lambda: settled_in_flight(sum(engine.intended_rates().values()))), name="gc")
        try:
            engine_task = asyncio.create_task(
                self.engine.run(self._cost_logged(self.restarts.wrap(self.source.snapshots()))),
                name="engine",
            )
            tasks.add(engine_task)
            if self.inventory is not None:
                tasks.add(asyncio.create_task(self.inventory.follow(), name="inventory"))
            tasks.add(asyncio.create_task(self._flusher(), name="flusher"))
            tasks.add(asyncio.create_task(self.progress.run(), name="progress"))
            if self._api_socket is not None:
                api_task = asyncio.create_task(self._serve_api(), name="api")
                tasks.add(api_task)
            if self.options.duration_s is not None:
                tasks.add(asyncio.create_task(self._stop_after(self.options.duration_s)))
            stop_wait = asyncio.create_task(self.stopping.wait())
            done, _ = await asyncio.wait({*tasks, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stop_wait and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            stop_wait.cancel()
        finally:
            self.stopping.set()
            # Stop sending, let in-flight calls finish within their timeout, then flush all.
            await self.engine.stop(grace_s=max(p.timeout_s for p in self.config.paths))
            if self.stream_prober is not None:
                # Lingering streams end as client_stopped, their time accounted, then flushed.
                self.open_at_stop = self.stream_prober.open_streams()
                await self.stream_prober.aclose()
            if api_task is not None and not api_task.done():
                # hypercorn shuts down on `stopping`; cancelling it would cut connections.
                await asyncio.wait({api_task}, timeout=3.0)
            for task in (*tasks, gc_task):
                task.cancel()
            await asyncio.gather(*tasks, gc_task, return_exceptions=True)
            await self.shared.aclose()
            await self._write(force=True)
            self.snapshots.snapshot(force=True)
            await asyncio.gather(*(p.aclose() for p in self.probers.values()))
            restore()
            restore_gc()

    async def _cost_logged(
        self, snapshots: AsyncIterator[Sequence[Endpoint]]
    ) -> AsyncIterator[Sequence[Endpoint]]:
        """The snapshots, unchanged; once the engine has scheduled the first endpoints (it
        asks for the next snapshot right after applying one), what they will cost is logged
        once (`probes.measure.cost`), with a warning if it is more than one probe can use."""
        logged = False
        async for snapshot in snapshots:
            yield snapshot
            engine = self.engine
            if not logged and engine is not None and engine.endpoints:
                logged = True
                rates: dict[str, float] = {}
                for (path, _), rate in engine.intended_rates().items():
                    rates[path] = rates.get(path, 0.0) + rate
                cost = estimate(self.config.paths, rates, engine.held_streams(),
                                cgroup_cores=cpu_limit_cores())
                cost_log.info("%s", cost.line())
                if (warning := cost.warning()) is not None:
                    cost_log.warning("%s", warning)

    async def _stop_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.stopping.set()

    def _install_signal_handlers(self) -> Callable[[], None]:
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stopping.set)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass

        def restore() -> None:
            for sig in installed:
                loop.remove_signal_handler(sig)

        return restore

    # -- windows ---------------------------------------------------------------------------

    async def _flusher(self) -> None:
        length = self.config.window_s
        grace = self.aggregator.grace_s
        while True:
            now = time.time()
            next_boundary = math.floor(now / length) * length + length + grace
            await asyncio.sleep(max(0.0, next_boundary - now))
            await self._write(force=False)
            self.snapshots.snapshot(force=False)
            r = self.recorder
            reason = self.overload.update(r.calls, r.lagged, r.dropped_total)
            self.metrics.set_overloaded(reason is not None)
            if self.overload.changed:
                # Written with the next window, so `skewprobe verdict` on the store knows.
                self._events.append(Event(OVERLOAD_EVENT, time.time(), detail={"reason": reason}))
            await self._publish_verdict()

    async def _write(self, *, force: bool) -> None:
        """The windows finished by now, and the events made since the last write."""
        now = time.time()
        if self.stream_prober is not None:
            self.stream_prober.checkpoint(now)  # stream-seconds up to now, before flushing
        events = [*self._events, *self.restarts.drain(), *self.streams.storm_events(now)]
        self._events.clear()
        if self.stream_prober is not None and (force or now - self._lifetime_at >= 300.0):
            # The lifetime check for `skewprobe plan`, every 5 minutes and at the end (the
            # streams open then were captured before the prober closed them).
            held = self.open_at_stop if force else self.stream_prober.open_streams()
            events += self.streams.lifetime_events(held, now)
            self._lifetime_at = now
        await self.writer.write(now, events, force=force)

    @property
    def windows_written(self) -> int:
        return self.writer.windows_written

    @property
    def windows_unwritten(self) -> int:
        return self.writer.windows_unwritten

    @property
    def endpoint_count(self) -> int:
        return 0 if self.engine is None else len(self.engine.endpoints)

    async def _publish_verdict(self) -> None:
        """Refresh the skewprobe_verdict gauges from the store (or Prometheus), once per
        window. A verdict that cannot be computed leaves every gauge inconclusive, never the
        last pass: the MetricTemplate gates on the gauge, and a sharded probe judging from a
        Prometheus it cannot reach would otherwise keep exporting an old pass."""
        try:
            result = await self.verdict_json(VerdictQuery())
        except SkewprobeError as exc:
            log.warning("verdict not computed: %s", exc)
            if self.last_verdict is not None:
                for path in [*self.last_verdict.get("paths", []),
                             *self.last_verdict.get("pairs", [])]:
                    self.metrics.set_verdict(path["path"], "inconclusive")
                self.metrics.set_verdict(OVERALL, "inconclusive")
            return
        self.last_verdict = result
        for path in [*result.get("paths", []), *result.get("pairs", [])]:
            self.metrics.set_verdict(path["path"], path["verdict"])
        self.metrics.set_verdict(OVERALL, result["verdict"])

    async def inventory_json(self) -> Mapping[str, Any]:
        if self.inventory is None:
            raise SourceUnavailable(
                "no pod inventory yet (static targets, or the first list is pending)"
            )
        return await self.inventory.report()

    # -- API -------------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        if self.writer.error:
            return False, f"store: {self.writer.error}"
        if self.config.kubernetes is not None:
            # False while the API is down (the last known pods are still probed): meant for
            # readiness, not liveness, or an API outage becomes a restart loop.
            ok, line = self.source.health()  # type: ignore[attr-defined]
            if not ok:
                return False, line
        if self.engine is None or not self.engine.endpoints:
            return True, "no endpoints discovered yet"
        return True, f"probing {len(self.engine.endpoints)} endpoints"

    async def verdict_json(self, query: VerdictQuery) -> Mapping[str, Any]:
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
            self.options.store_path, JudgingSettings.from_config(self.config),
            {**query_args, "now": now}, overload=overload, cached=at is None,
            prometheus=None if prometheus is None else prometheus_job_settings(prometheus))
        verdicts = self.verdicts
        if verdicts is None:  # not running (a test of the verdict alone): no cache to keep
            return await asyncio.to_thread(judge_job, dataclasses.replace(job, cached=False))
        # The same query and overload state, no window written since, in the same window:
        # the same verdict.
        key = verdict_key(dataclasses.asdict(query), overload, self.writer.windows_written,
                          math.floor(now / self.config.window_s))
        return await self.shared.get(key, lambda: verdicts.judge(job), keep=asked_now)

    async def _serve_api(self) -> None:
        assert self._api_socket is not None
        app = ApiApp(
            self.registry,
            verdict=self.verdict_json,
            health=self.health,
            inventory=self.inventory_json,
            token=self.options.token,
        )
        sock, self._api_socket = self._api_socket, None  # hypercorn takes it over
        await serve_api(sock, app, self.options.api_tls, self.stopping)
