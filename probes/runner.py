"""`skewprobe run`: wires discovery → engine → clients → measure → store, and serves the API.

The shape is uvicorn's: startup (open the store, build probers, bind the API), the main loop
(the engine applies discovery snapshots; a flusher closes each window on its boundary and
writes it), then shutdown (stop sending, give in-flight calls their timeout to finish, write
every open window, close the store). SIGTERM and SIGINT trigger shutdown; a second signal
does not skip the final flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import math
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig
from prometheus_client import CollectorRegistry

from probes._exceptions import BadInput, SkewprobeError, SourceUnavailable, StoreError
from probes._spec import ApiTlsSpec, Config
from probes._types import CallResult, Endpoint, PathWindow
from probes.api import ApiApp, VerdictQuery
from probes.api_access import apply_tls
from probes.clients import OpenStream, StreamProber, build_prober
from probes.discovery import DiscoverySource, FileSource, StaticSource
from probes.discovery.changes import RestartTracker
from probes.discovery.shard import ShardSource
from probes.engine import Engine, EngineLimits, Prober
from probes.inventory import SkewMetrics, inventory_rows, report_from_pods
from probes.inventory_cli import CONTROL_PLANE_EVENT
from probes.measure.gc_pauses import watch_gc_pauses
from probes.measure.gc_policy import adaptive_young_threshold
from probes.measure.overload import OVERLOAD_EVENT, OverloadWatch
from probes.measure.window import Taken, WindowAggregator
from probes.metrics import OVERALL, ProbeMetrics
from probes.store import Event, Store
from probes.store.lock import WriterLock
from probes.streams import StreamRecorder
from probes.verdict_service import compute_prometheus_verdict, compute_verdict

__all__ = [
    "PENDING_WINDOWS",
    "ProbeRunner",
    "Recorder",
    "RunOptions",
    "bind_api",
    "discovery_for",
    "parse_listen",
]

log = logging.getLogger("skewprobe.run")

# How many flushes' worth of windows are held while the store cannot be written (1 h of 10 s).
PENDING_WINDOWS = 360

# When the warm-up (first sends, connections opened) is taken to be over: one period and one
# timeout after the first snapshot, plus this margin.
GC_WARMUP_EXTRA_S = 2.0
# After it: a full collection at most every this many middle-generation ones (Python: 10).
GC_FULL_EVERY = 100


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


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise BadInput(f"--listen {listen!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


def bind_api(listen: str) -> socket.socket:
    """The API's listening socket, bound before anything else starts, so a port another
    process holds is bad input (exit 2) before the store is created. Options as hypercorn
    sets them on the sockets it binds itself."""
    host, port = parse_listen(listen)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        problem = (exc.strerror or str(exc)).lower()
        raise BadInput(
            f"cannot listen on {listen}: {problem} (set another address with --listen or the"
            " config's listen:, or --listen none)"
        ) from None
    return sock


@dataclass
class RunOptions:
    store_path: str
    listen: str | None = "127.0.0.1:9464"
    duration_s: float | None = None
    # The API's bearer token (a secret: kept out of the repr) and TLS (`probes.api_access`).
    token: str | None = field(default=None, repr=False)
    api_tls: ApiTlsSpec | None = None
    on_window: Callable[[Sequence[Any]], None] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    # (i, n): probe only the endpoints of shard i of n (`--shard i/n`).
    shard: tuple[int, int] | None = None


class ProbeRunner:
    """One probe process. `run()` returns when the duration ends or a signal arrives."""

    def __init__(self, config: Config, options: RunOptions) -> None:
        self.config = config
        self.options = options
        self.registry = CollectorRegistry()
        self.metrics = ProbeMetrics(self.registry)
        grace = max((p.timeout_s for p in config.paths), default=1.0) + 0.5
        self.aggregator = WindowAggregator(length_s=config.window_s, grace_s=grace)
        self.overload = OverloadWatch()
        self.recorder = Recorder(self.aggregator, self.metrics, self.overload)
        self._writing: asyncio.Task[tuple[list[PathWindow], str | None]] | None = None
        self.store: Store | None = None
        self.engine: Engine | None = None
        self.probers: dict[str, Prober] = {}
        self.stopping = asyncio.Event()
        # The API's address once bound (with port 0 in `listen`, the port the system chose).
        self.bound: tuple[str, int] | None = None
        self._api_socket: socket.socket | None = None
        self._store_error: str | None = None
        self.windows_written = 0
        # The gc hooks of a run (pause metrics, the young threshold's policy), removed at its end.
        self._gc_hooks = contextlib.ExitStack()
        self.source = discovery_for(config)
        if options.shard is not None:
            self.source = ShardSource(self.source, *options.shard)
        self.skew_metrics = SkewMetrics(self.registry) if config.kubernetes else None
        self._inventory_report: Mapping[str, Any] | None = None
        self._inventory_written: tuple[float, frozenset[tuple[str, str, str, int]]] = (
            0.0, frozenset()
        )
        self.streams = StreamRecorder(self.aggregator, self.metrics)
        self.stream_prober: StreamProber | None = None
        self.open_at_stop: tuple[OpenStream, ...] = ()
        # Windows the store refused (full disk): retried every window, oldest dropped last.
        self._pending: deque[tuple[list[PathWindow], Taken, list[Event]]] = deque(
            maxlen=PENDING_WINDOWS
        )
        self.last_verdict: Mapping[str, Any] | None = None
        # Events made on the loop (overload changes), written with the next window.
        self._events: list[Event] = []
        # Pods back on another proxy version: `restart` events for the report's time axis.
        self.restarts = RestartTracker(config.cohort.by)

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        # Everything that can refuse the run comes before anything is created.
        if self.options.listen:
            self._api_socket = bind_api(self.options.listen)
            self.bound = self._api_socket.getsockname()[:2]
        try:
            # One writer per store: a second probe would replace the first's windows.
            with WriterLock.acquire(self.options.store_path):
                self.store = Store.open(self.options.store_path)
                try:
                    await self._main()
                finally:
                    self.store.close()
        finally:
            if self._api_socket is not None:  # not handed to the server
                self._api_socket.close()
                self._api_socket = None

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
        restore_gc = self._save_gc()
        tasks: set[asyncio.Task[Any]] = set()
        api_task: asyncio.Task[None] | None = None
        # Not in `tasks`: every task there ends the run when it returns; this one returns.
        gc_task = asyncio.create_task(self._tune_gc(), name="gc")
        try:
            engine_task = asyncio.create_task(
                self.engine.run(self.restarts.wrap(self.source.snapshots())), name="engine"
            )
            tasks.add(engine_task)
            if self.config.kubernetes is not None:
                tasks.add(asyncio.create_task(self._inventory(), name="inventory"))
            tasks.add(asyncio.create_task(self._flusher(), name="flusher"))
            if self.options.listen:
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
            await self._write(force=True)
            self._snapshot_inventory(force=True)
            await asyncio.gather(*(p.aclose() for p in self.probers.values()))
            restore()
            restore_gc()

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

    # -- garbage collection ----------------------------------------------------------------

    def _save_gc(self) -> Callable[[], None]:
        """The collector's state now, to be put back when the run ends (tests run the
        runner in their own process); meanwhile every collection's pause is exported
        (`skewprobe_gc_pause_seconds`)."""
        threshold = gc.get_threshold()
        self._gc_hooks.enter_context(watch_gc_pauses(self.metrics.gc_paused))

        def restore() -> None:
            self._gc_hooks.close()
            gc.unfreeze()
            gc.set_threshold(*threshold)

        return restore

    async def _tune_gc(self) -> None:
        """Once the schedule runs: collect, freeze the survivors, make full collections rare
        and young ones as rare as the garbage allows (`probes.measure.gc_policy`).

        Frozen objects (`gc.freeze`) are skipped by every later collection: thousands of
        endpoints' sessions, connections and tasks made full collections take 36–48 ms at
        1,800 endpoints. What is newer is mostly medium-lived (aiohttp keeps a connection's
        last response parser and reader until the next call, a period later), so it reaches
        the old generation, and after a freeze Python would start a full collection (20–40
        ms at 2,400 endpoints) after every 10 middle-generation ones, ~1.5 s apart; at 100
        it is every ~15 s, a pause that delays ~0.2 % of calls. (That was measured with
        aiohttp; the HTTP/1.1 transport now keeps nothing between calls.) The young
        threshold follows the garbage the last young collection found: 50,000 while there
        is none, Python's 700 when failing calls make some.

        Frozen cyclic garbage is never collected: the one cycle seen (asyncio's socket
        transport and its bound read callback, 5 objects when a connection closes) costs
        ~1.5 KB per connection open at the freeze, once. Later objects are collected as
        usual, which is why the freeze is not repeated. BENCHMARKS.md has the figures.
        """
        assert self.engine is not None
        await self.engine.wait_for_endpoints()
        period = max((1.0 / p.rate_per_s for p in self.config.paths if p.stream is None),
                     default=1.0)
        timeout = max((p.timeout_s for p in self.config.paths), default=1.0)
        await asyncio.sleep(period + timeout + GC_WARMUP_EXTRA_S)
        gc.collect()
        gc.freeze()
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, GC_FULL_EVERY)
        self._gc_hooks.enter_context(adaptive_young_threshold())

    # -- windows ---------------------------------------------------------------------------

    async def _flusher(self) -> None:
        length = self.config.window_s
        grace = self.aggregator.grace_s
        while True:
            now = time.time()
            next_boundary = math.floor(now / length) * length + length + grace
            await asyncio.sleep(max(0.0, next_boundary - now))
            await self._write(force=False)
            self._snapshot_inventory(force=False)
            r = self.recorder
            reason = self.overload.update(r.calls, r.lagged, r.dropped_total)
            self.metrics.set_overloaded(reason is not None)
            if self.overload.changed:
                # Written with the next window, so `skewprobe verdict` on the store knows.
                self._events.append(Event(OVERLOAD_EVENT, time.time(), detail={"reason": reason}))
            await self._publish_verdict()

    async def _write(self, *, force: bool) -> None:
        """Take the finished windows on the loop; build and write them in a worker thread.

        The write is a task of its own, shielded: cancelling the flusher (shutdown) never
        leaves a write running unseen, and the next `_write` waits for it first, so the
        pending queue has one writer at a time.
        """
        if self._writing is not None:
            # A write whose flusher was cancelled (shutdown): let it end, count what it did.
            await asyncio.wait({self._writing})
            self._wrote(*self._writing.result())
        now = time.time()
        if self.stream_prober is not None:
            self.stream_prober.checkpoint(now)  # stream-seconds up to now, before flushing
        taken = self.aggregator.take(now, force=force)
        events = [*self._events, *self.restarts.drain(), *self.streams.storm_events(now)]
        self._events.clear()
        self._writing = asyncio.create_task(
            asyncio.to_thread(self._store_pending, taken, events), name="store-write"
        )
        self._wrote(*await asyncio.shield(self._writing))

    def _wrote(self, written: list[PathWindow], error: str | None) -> None:
        self._writing = None
        if error is not None:
            # Keep probing; what could not be written is retried next window (bounded by
            # the deque), and /healthz says why.
            self._store_error = error
            self.metrics.store_error()
            return
        self._store_error = None
        if not written:
            return
        self.windows_written += len(written)
        self.metrics.windows_written(len(written))
        if self.options.on_window is not None:
            self.options.on_window(written)

    def _store_pending(
        self, taken: Taken, events: list[Event]
    ) -> tuple[list[PathWindow], str | None]:
        """Worker thread: build the taken windows, queue them, write the queue in order.

        Returns the path windows written and the store's error, if any. Touches only the
        pending queue (one writer at a time, see `_write`) and the thread-safe store.
        """
        path_windows = taken.path_windows()
        if taken or events:
            # The endpoint windows stay in `taken` until written, and are made one at a
            # time as the store writes them (see `Taken`).
            self._pending.append((path_windows, taken, events))
        assert self.store is not None
        written: list[PathWindow] = []
        try:
            while self._pending:
                pws, unwritten, evs = self._pending[0]
                self.store.write(pws, unwritten.endpoint_windows())
                if evs:
                    self.store.write_events(evs)
                written += pws
                self._pending.popleft()
        except StoreError as exc:
            log.error("store write failed, %d windows kept for retry: %s",
                      sum(len(p[0]) for p in self._pending), exc)
            return written, str(exc)
        return written, None

    async def _publish_verdict(self) -> None:
        """Refresh the skewprobe_verdict gauges from the store, once per window."""
        try:
            result = await self.verdict_json(VerdictQuery())
        except SkewprobeError as exc:
            log.warning("verdict not computed: %s", exc)
            return
        self.last_verdict = result
        for path in result.get("paths", []):
            self.metrics.set_verdict(path["path"], path["verdict"])
        self.metrics.set_verdict(OVERALL, result["verdict"])

    # -- inventory (Kubernetes discovery only) ----------------------------------------------

    async def _inventory(self) -> None:
        """Metrics on every inventory change; the control plane to the store when it changes."""
        spec = self.config.kubernetes
        assert spec is not None and self.skew_metrics is not None
        planes_seen = None
        async for state in self.source.inventory_updates():  # type: ignore[attr-defined]
            self.metrics.set_inventory(inventory_rows(state.pods, state.at))
            report = report_from_pods(state.pods, state.control_planes, spec.supported_skew,
                                      now=state.at, mesh=state.mesh)
            self.skew_metrics.update(report)
            self._inventory_report = report
            planes = [{"version": p.version, "revision": p.revision, "source": p.source}
                      for p in state.control_planes]
            if planes != planes_seen:
                planes_seen = planes
                self._store_call(self._write_control_plane, state.at, planes)

    def _write_control_plane(self, at: float, planes: list[dict[str, Any]]) -> None:
        assert self.store is not None
        self.store.write_events([Event(CONTROL_PLANE_EVENT, at, detail={"versions": planes})])

    def _store_call(self, fn: Callable[..., None], *args: Any) -> bool:
        try:
            fn(*args)
        except StoreError as exc:
            self.metrics.store_error()
            log.error("store write failed: %s", exc)
            return False
        return True

    def _snapshot_inventory(self, *, force: bool) -> None:
        """After each window (and at shutdown): a store snapshot when pod counts changed,
        at most every `inventory_every_s`, so the store stays small."""
        if self.config.kubernetes is None:
            return
        state = self.source.state()  # type: ignore[attr-defined]
        if not state.synced:
            return
        rows = inventory_rows(state.pods, state.at)
        self.metrics.set_inventory(rows)  # keeps the age gauges current between changes
        key = frozenset((r.namespace, r.workload, r.proxy_version, r.pods) for r in rows)
        last_at, last_key = self._inventory_written
        if key == last_key or (not force and state.at - last_at < self.config.inventory_every_s):
            return
        assert self.store is not None
        if self._store_call(self.store.write_inventory, state.at, rows):
            self._inventory_written = (state.at, key)

    async def inventory_json(self) -> Mapping[str, Any]:
        if self._inventory_report is None:
            raise SourceUnavailable(
                "no pod inventory yet (static targets, or the first list is pending)"
            )
        return self._inventory_report

    # -- API -------------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        if self._store_error:
            return False, f"store: {self._store_error}"
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
        """The verdict from the store; inconclusive, with the reason first, while the probe
        is overloaded (`OverloadWatch`). With `source: prometheus`, from every probe's series
        in Prometheus (each probe's overload is read there); SourceUnavailable (HTTP 503)
        when Prometheus does not answer."""
        # VerdictQuery's fields are the verdict functions' query keywords.
        query_args = {**dataclasses.asdict(query), "now": time.time()}
        if self.config.source == "prometheus":
            assert self.config.prometheus is not None  # the schema requires it
            return await asyncio.to_thread(functools.partial(
                compute_prometheus_verdict, self.config.prometheus, self.config, **query_args
            ))
        return await asyncio.to_thread(functools.partial(
            compute_verdict, self.options.store_path, self.config,
            overload=self.overload.reason, **query_args,
        ))

    async def _serve_api(self) -> None:
        assert self._api_socket is not None
        app = ApiApp(
            self.registry,
            verdict=self.verdict_json,
            health=self.health,
            inventory=self.inventory_json,
            token=self.options.token,
        )
        hconfig = HypercornConfig()
        # The socket `run` bound: hypercorn takes it over (and closes it) by its descriptor.
        hconfig.bind = [f"fd://{self._api_socket.detach()}"]
        self._api_socket = None
        hconfig.accesslog = None
        hconfig.errorlog = None
        hconfig.graceful_timeout = 1.0
        apply_tls(hconfig, self.options.api_tls)
        await serve(app, hconfig, shutdown_trigger=self.stopping.wait)  # type: ignore[arg-type]
