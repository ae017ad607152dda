"""`skewprobe run`: wires discovery → engine → clients → measure → store, and serves the API.

The shape is uvicorn's: startup (bind the API, lock and open the store, build probers),
the main loop (the engine applies discovery snapshots; a flusher closes each window on its
boundary and has it written), then shutdown (stop sending, give in-flight calls their
timeout to finish, write every open window, close the store). SIGTERM and SIGINT trigger
shutdown; a second signal does not skip the final flush. The parts with a job of their own
live beside it (`probes.run` lists them).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from probes._heap import return_large_frees
from probes.api import ApiApp, VerdictQuery
from probes.clients import StreamProber, build_prober
from probes.discovery import DiscoverySource, FileSource, StaticSource
from probes.discovery.changes import RestartTracker
from probes.discovery.shard import ShardSource
from probes.errors import StoreError
from probes.inventory import SkewMetrics
from probes.measure.overload import OverloadWatch
from probes.measure.window import WindowAggregator
from probes.metrics import DURATION_BUCKETS, PROMETHEUS_DURATION_BUCKETS, ProbeMetrics
from probes.run._api_server import bind_api, serve_api
from probes.run._inventory_task import EndpointInventory, InventoryKeeper
from probes.run._memory import CollectorTuning, settled_in_flight
from probes.run._recording import Recorder, RunEvents
from probes.run._status import ProgressReporter, cost_logged, judge_health
from probes.run._verdict_publish import VerdictGauges, VerdictRoute
from probes.run._window_writer import WindowWriter
from probes.run.engine import Engine, EngineLimits, Prober
from probes.spec import DEFAULT_LISTEN, ApiTlsSpec, Config
from probes.store import Store
from probes.store.lock import WriterLock
from probes.streams import StreamRecorder
from probes.verdict.settings import settings_event

__all__ = ["ProbeRunner", "Recorder", "RunOptions", "discovery_for"]

def discovery_for(config: Config) -> DiscoverySource:
    if config.kubernetes is not None:
        # Imported here: kubernetes-asyncio takes half a second to import.
        from probes.discovery.kubernetes import KubernetesSource

        return KubernetesSource(config.kubernetes)
    if config.file_targets is not None:
        return FileSource(config.file_targets.path)
    return StaticSource(config.static_targets)


def stop_on_signals(stopping: asyncio.Event) -> Callable[[], None]:
    """SIGTERM and SIGINT set `stopping`; returns what takes the handlers off again."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stopping.set)
            installed.append(sig)

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return restore


@dataclass
class RunOptions:
    store_path: str
    listen: str | None = DEFAULT_LISTEN
    duration_s: float | None = None
    # The API's bearer token (a secret: kept out of the repr) and TLS (`resolve_access`).
    token: str | None = field(default=None, repr=False)
    api_tls: ApiTlsSpec | None = None
    on_window: Callable[[Sequence[Any]], None] | None = None
    # (i, n): probe only the endpoints of shard i of n (`--shard i/n`).
    shard: tuple[int, int] | None = None
    # A progress line this often (`probes.run._status`); "all endpoints down" after half that.
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
        self.aggregator = WindowAggregator(length_s=config.judging.window_s, grace_s=grace)
        self.overload = OverloadWatch()
        self.recorder = Recorder(self.aggregator, self.metrics, self.overload)
        # One worker thread for the store's writes: glibc gives each thread its own malloc
        # arena and keeps a freed arena's peak (BENCHMARKS.md D15). Verdicts are computed in
        # a process of their own (`probes.verdict.worker`).
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
        self.verdicts = VerdictRoute(config, options.store_path, self.overload, self.registry,
                                     lambda: self.writer.windows_written)
        self.gauges = VerdictGauges(self.metrics, self.verdicts.judge)
        # Pods back on another proxy version: `restart` events for the report's time axis.
        self.restarts = RestartTracker(config.judging.cohort.by)
        self.events = RunEvents(self.overload, self.metrics, self.restarts, self.streams)
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
                    self.config.judging, time.time())])
                self.snapshots.store = self.store
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
        self.progress.finish(self.options.store_path,
                             lambda: self.verdicts.final(self.gauges.last))
        self.writer.raise_if_lost()

    async def _main(self) -> None:
        self.probers = {p.name: build_prober(p) for p in self.config.paths if p.stream is None}
        stream_paths = [p for p in self.config.paths if p.stream is not None]
        if stream_paths:
            self.stream_prober = StreamProber(stream_paths, self.streams)
        c = self.config
        self.engine = engine = Engine(
            c.paths, self.probers, self.recorder, cohort_by=c.judging.cohort.by,
            limits=EngineLimits(max_in_flight=c.max_in_flight, max_rate_per_s=c.max_rate_per_s,
                                cohort_balance_max=c.cohort_balance_max),
            streams=self.stream_prober)
        self.metrics.track_in_flight(lambda: engine.in_flight)
        self.metrics.track_intended_rates(engine.intended_rates)
        restore = stop_on_signals(self.stopping)
        restore_gc = self.collector.save()
        return_large_frees()
        tasks: set[asyncio.Task[Any]] = set()
        api_task: asyncio.Task[None] | None = None
        # Not in `tasks`: every task there ends the run when it returns; this one returns.
        gc_task = asyncio.create_task(self.collector.tune(
            engine.wait_for_endpoints, self.config.paths, lambda: engine.in_flight,
            lambda: settled_in_flight(sum(engine.intended_rates().values()))), name="gc")
        try:
            snapshots = cost_logged(self.restarts.wrap(self.source.snapshots()), c.paths, engine)
            tasks.add(asyncio.create_task(engine.run(snapshots), name="engine"))
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
                self.events.open_at_stop = self.stream_prober.open_streams()
                await self.stream_prober.aclose()
            if api_task is not None and not api_task.done():
                # hypercorn shuts down on `stopping`; cancelling it would cut connections.
                await asyncio.wait({api_task}, timeout=3.0)
            for task in (*tasks, gc_task):
                task.cancel()
            await asyncio.gather(*tasks, gc_task, return_exceptions=True)
            await self.verdicts.aclose()
            await self._write(force=True)
            self.snapshots.snapshot(force=True)
            await asyncio.gather(*(p.aclose() for p in self.probers.values()))
            restore()
            restore_gc()

    async def _stop_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.stopping.set()

    # -- windows ---------------------------------------------------------------------------

    async def _flusher(self) -> None:
        length = self.config.judging.window_s
        grace = self.aggregator.grace_s
        while True:
            now = time.time()
            next_boundary = math.floor(now / length) * length + length + grace
            await asyncio.sleep(max(0.0, next_boundary - now))
            await self._write(force=False)
            self.snapshots.snapshot(force=False)
            self.events.overload_checked(self.recorder)
            await self.gauges.publish()

    async def _write(self, *, force: bool) -> None:
        """The windows finished by now, and the events made since the last write."""
        now = time.time()
        if self.stream_prober is not None:
            self.stream_prober.checkpoint(now)  # stream-seconds up to now, before flushing
        await self.writer.write(now, self.events.take(now, self.stream_prober, force=force),
                                force=force)

    @property
    def windows_written(self) -> int:
        return self.writer.windows_written

    @property
    def windows_unwritten(self) -> int:
        return self.writer.windows_unwritten

    @property
    def endpoint_count(self) -> int:
        return 0 if self.engine is None else len(self.engine.endpoints)

    @property
    def last_verdict(self) -> Mapping[str, Any] | None:
        return self.gauges.last

    # -- API -------------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        return judge_health(self.writer.error, self.source if self.config.kubernetes else None,
                            self.endpoint_count)

    async def verdict_json(self, query: VerdictQuery) -> Mapping[str, Any]:
        """The verdict (`VerdictRoute.judge`): the API's, the gauges' and the tests'."""
        return await self.verdicts.judge(query)

    async def _serve_api(self) -> None:
        assert self._api_socket is not None
        app = ApiApp(self.registry, verdict=self.verdict_json, health=self.health,
                     inventory=self.snapshots.report, token=self.options.token)
        sock, self._api_socket = self._api_socket, None  # hypercorn takes it over
        await serve_api(sock, app, self.options.api_tls, self.stopping)
