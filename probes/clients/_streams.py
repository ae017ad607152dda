"""Long-lived gRPC streams: K server-streaming calls held per (path, endpoint), re-opened.

`StreamProber` is the engine's `StreamHolder`: the engine runs one `hold(path, endpoint,
cohort)` task per (stream path, endpoint) and cancels it when the endpoint leaves discovery.
Each of the path's `per_endpoint` slots opens a server-streaming call (the path's method with
raw request bytes, or `grpc.health.v1.Health/Watch`), reads it until it ends, reports how it
ended, waits a backoff and opens the next one, as a well-behaved client does.

Why the pieces are shaped this way:

* A stream is its own task, not a child of `hold()`. A restarting pod leaves the endpoint
  list *before* it drains (Kubernetes marks it not ready first), so the engine cancels
  `hold()` while the pod still serves. Cutting the streams then would hide exactly the
  resets the drain is about to cause, so a cancelled `hold()` only stops re-opening: its open
  streams *linger* until they end on their own (the drain's reset is counted) or
  `linger_s` passes (then the probe closes them: `client_stopped`, not a reset).
* How a stream ended is classified once, from the status code and grpc core's detail text
  (`_stream_types.classify_stream_end`); `EndReason` says which classes are resets.
* Held time is reported to the sink per slice (`checkpoint()` and at the end), so windows
  get their stream-seconds while a stream is still open hours later.
* Backoff: the first re-open after a healthy stream waits `initial_backoff_s` (jittered);
  consecutive failures double it up to `max_backoff_s`, each delay drawn from [d/2, d].
  A stream is healthy once it received a message or lived `stable_s`.
* Client-side rotation: with `max_lifetime_s`, the probe closes a stream after that long
  (x U(0.9, 1.0), so rotations do not synchronise) and re-opens after the initial backoff:
  `client_rotated`, not a reset.
* Channels: one per (path, endpoint), shared by its K streams (a client multiplexes them on
  one connection, so a connection loss ends them together, as it would for real callers);
  `_connection`'s channel options plus HTTP/2 keepalive every 5 min (gRPC servers answer more
  frequent pings with a too_many_pings GOAWAY), so a black-holed pod ends its streams.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2

from probes.clients._base import host_port
from probes.clients._connection import EndpointPool, channel_options, grpc_credentials
from probes.clients._grpc import _serving_status
from probes.clients._stream_types import (
    EndReason,
    OpenStream,
    StreamEnd,
    StreamSink,
    classify_stream_end,
)
from probes.errors import BadInput
from probes.measure.histogram import MIDPOINT, index_of
from probes.spec import GrpcSpec, PathSpec, StreamSpec
from probes.types import Endpoint

__all__ = ["HEALTH_WATCH", "StreamPolicy", "StreamProber"]

log = logging.getLogger("skewprobe.streams")

HEALTH_WATCH = "/grpc.health.v1.Health/Watch"


@dataclass(frozen=True, slots=True)
class StreamPolicy:
    """Re-open, rotation and linger behaviour (see the module docstring)."""

    initial_backoff_s: float = 0.1
    max_backoff_s: float = 10.0
    multiplier: float = 2.0
    open_spread_s: float = 1.0
    stable_s: float = 1.0
    linger_s: float = 30.0
    keepalive_s: float = 300.0

    def __post_init__(self) -> None:
        if min(self.initial_backoff_s, self.max_backoff_s, self.open_spread_s, self.stable_s,
               self.linger_s) < 0 or self.multiplier < 1 or self.keepalive_s <= 0:
            raise BadInput("stream policy: times must be >= 0, multiplier >= 1, keepalive > 0")

    def backoff(self, failures: int, rng: random.Random) -> float:
        """Delay before the next open after `failures` consecutive unhealthy streams."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**failures)
        return ceiling * rng.uniform(0.5, 1.0)


_Client = tuple[grpc.aio.Channel, grpc.aio.UnaryStreamMultiCallable]


@dataclass(frozen=True, slots=True)
class _PathConf:
    name: str
    spec: StreamSpec
    port: str | int | None
    method: str
    request: bytes
    metadata: tuple[tuple[str, str], ...]
    open_timeout_s: float
    cohort_key: str | None
    credentials: grpc.ChannelCredentials | None
    options: tuple[tuple[str, str | int], ...]

    @property
    def health(self) -> bool:
        return self.spec.health_service is not None


class _Stream:
    """One attempt's mutable state; owned by the prober, reported as OpenStream/StreamEnd."""

    __slots__ = (
        "accounted_to", "cohort", "conf", "endpoint", "gaps", "health", "last_message", "linger",
        "messages", "opened", "opened_wall", "slot", "started", "started_wall", "stop_reason",
        "task",
    )

    def __init__(self, conf: _PathConf, endpoint: Endpoint, cohort: str, slot: int,
                 now: float, wall: float) -> None:
        self.conf = conf
        self.endpoint = endpoint
        self.cohort = cohort
        self.slot = slot
        self.started = now
        self.started_wall = wall
        self.opened: float | None = None
        self.opened_wall: float | None = None
        self.accounted_to = wall
        self.messages = 0
        self.last_message: float | None = None
        self.gaps: dict[int, int] = {}
        self.health: str | None = None
        self.stop_reason: str | None = None
        self.linger: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[StreamEnd] | None = None

    def gap_p99(self) -> float | None:
        total = sum(self.gaps.values())
        if total == 0:
            return None
        rank = max(1, -(-99 * total // 100))  # ceil(0.99 n), the inverted-CDF rule
        seen = 0
        for index in sorted(self.gaps):
            seen += self.gaps[index]
            if seen >= rank:
                return float(MIDPOINT[index])
        raise AssertionError("unreachable: rank <= total")


class _Slot:
    """One of a (path, endpoint)'s K slots: open a stream, read it to the end, back off,
    open the next. Driven by the stream task's done callback and a timer rather than a task
    of its own: at 2,400 held streams a waiting task per slot (with its asyncio.wait) cost
    more memory than the stream's Python side needs (BENCHMARKS.md, "Memory")."""

    __slots__ = ("cohort", "conf", "endpoint", "failures", "index", "prober", "released",
                 "stream", "timer")

    def __init__(self, prober: StreamProber, conf: _PathConf, endpoint: Endpoint,
                 cohort: str, index: int) -> None:
        self.prober = prober
        self.conf = conf
        self.endpoint = endpoint
        self.cohort = cohort
        self.index = index
        self.failures = 0
        self.released = False
        self.stream: _Stream | None = None
        self.timer: asyncio.TimerHandle | None = None

    def open_after(self, delay: float) -> None:
        self.timer = asyncio.get_running_loop().call_later(delay, self._open)

    def _open(self) -> None:
        self.timer = None
        if self.released or self.prober._closed:
            return
        stream = self.prober._start(self.conf, self.endpoint, self.cohort, self.index)
        self.stream = stream
        assert stream.task is not None
        stream.task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[StreamEnd]) -> None:
        self.stream = None
        if self.released or self.prober._closed or task.cancelled():
            return
        end = task.result()
        policy = self.prober._policy
        healthy = end.established and (end.messages > 0 or end.lifetime_s >= policy.stable_s)
        self.failures = 0 if healthy else self.failures + 1
        self.open_after(policy.backoff(self.failures, self.prober._rng))

    def release(self) -> None:
        """The endpoint left (or the probe stops): open no more; an open stream lingers,
        one still opening is stopped (never open a removed endpoint)."""
        self.released = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        stream = self.stream
        if stream is not None:
            if stream.opened is None:
                self.prober._stop(stream, EndReason.CLIENT_STOPPED)
            else:
                self.prober._linger(stream)


class StreamProber:
    """Holds the long-lived streams of every stream path (the engine's `StreamHolder`)."""

    def __init__(
        self,
        paths: Sequence[PathSpec],
        sink: StreamSink,
        *,
        policy: StreamPolicy = StreamPolicy(),
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self._sink = sink
        self._policy = policy
        self._wall = wall
        self._rng = rng or random.Random()
        self._paths: dict[str, _PathConf] = {}
        self._pools: dict[str, EndpointPool[_Client]] = {}
        self._live: set[_Stream] = set()
        self._tasks: set[asyncio.Task[StreamEnd]] = set()
        self._holding: set[asyncio.Future[None]] = set()
        self._closed = False
        for path in paths:
            if path.stream is not None:
                self._conf(path)

    # -- the engine's StreamHolder ---------------------------------------------------------

    async def hold(self, path: PathSpec, endpoint: Endpoint, cohort: str) -> None:
        """Keep the path's K streams open on `endpoint` until cancelled; then let the open
        ones linger (see the module docstring)."""
        conf = self._conf(path)
        if self._closed:
            return
        try:
            endpoint.port_for(conf.port)
        except LookupError as exc:
            log.warning("stream path %s cannot run on %s: %s", conf.name, endpoint.name, exc)
            return
        loop = asyncio.get_running_loop()
        slots = [_Slot(self, conf, endpoint, cohort, i)
                 for i in range(max(1, conf.spec.per_endpoint))]
        for slot in slots:
            slot.open_after(self._rng.uniform(0.0, self._policy.open_spread_s))
        until_closed = loop.create_future()
        self._holding.add(until_closed)
        try:
            await until_closed
        finally:
            self._holding.discard(until_closed)
            for slot in slots:
                slot.release()
            # Closed once its lingering streams have ended.
            self._pools[conf.name].forget(endpoint)

    # -- state for the recorder, the lifetime check and shutdown ---------------------------

    def checkpoint(self, now: float | None = None) -> None:
        """Report the held time of every open stream up to `now` (call before flushing
        windows, so each window gets its stream-seconds while streams are still open)."""
        now = self._wall() if now is None else now
        # Grouped: every stream reported at the last checkpoint shares its start, and one
        # report per stream (2,400 of them) held the event loop for ~15 ms every window.
        groups: dict[tuple[str, str, float], int] = {}
        for stream in self._live:
            if stream.opened is not None and now > stream.accounted_to:
                key = (stream.conf.name, stream.cohort, stream.accounted_to)
                groups[key] = groups.get(key, 0) + 1
                stream.accounted_to = now
        for (path, cohort, start), count in groups.items():
            self._sink.streams_held(path, cohort, start, now, count)

    def open_streams(self) -> tuple[OpenStream, ...]:
        """Every established stream now, with its age."""
        now = asyncio.get_running_loop().time()
        return tuple(self._snapshot(s, now) for s in self._live if s.opened is not None)

    @property
    def channels(self) -> int:
        """Channels new streams would use (one per path x endpoint held; a removed
        endpoint's channel closes once its lingering streams end): 0 after `aclose()`."""
        return sum(len(pool) for pool in self._pools.values())

    @property
    def tasks(self) -> int:
        """Stream tasks alive (open, opening or lingering): 0 after `aclose()`."""
        return len(self._tasks)

    async def aclose(self) -> None:
        """Close every stream now (`client_stopped`) and every channel."""
        self._closed = True
        for until_closed in self._holding:
            if not until_closed.done():
                until_closed.set_result(None)
        for stream in list(self._live):
            self._stop(stream, EndReason.CLIENT_STOPPED)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(pool.aclose() for pool in self._pools.values()))

    # -- one stream ------------------------------------------------------------------------

    def _start(self, conf: _PathConf, endpoint: Endpoint, cohort: str, slot: int) -> _Stream:
        loop = asyncio.get_running_loop()
        stream = _Stream(conf, endpoint, cohort, slot, loop.time(), self._wall())
        task = loop.create_task(self._run(stream), name=f"stream {conf.name}@{endpoint.name}")
        stream.task = task
        self._live.add(stream)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return stream

    def _linger(self, stream: _Stream) -> None:
        if stream.task is None or stream.task.done() or stream.linger is not None:
            return
        stream.linger = asyncio.get_running_loop().call_later(
            self._policy.linger_s, self._stop, stream, EndReason.CLIENT_STOPPED
        )

    def _stop(self, stream: _Stream, reason: str) -> None:
        if stream.task is None or stream.task.done() or stream.stop_reason is not None:
            return
        stream.stop_reason = reason
        stream.task.cancel()

    async def _run(self, stream: _Stream) -> StreamEnd:
        conf = stream.conf
        call: grpc.aio.UnaryStreamCall | None = None
        pool = self._pools[conf.name]
        try:
            lease = pool.acquire(stream.endpoint)
            try:
                channel, method = lease.client
                metadata = (*conf.metadata, ("x-request-id", uuid.uuid4().hex))
                call = method(conf.request, metadata=metadata, wait_for_ready=False)
                return await self._drive(stream, channel, call)
            finally:
                pool.release(lease)
        except asyncio.CancelledError:
            if call is not None:
                call.cancel()
            if stream.stop_reason is None:
                self._finish(stream, EndReason.CLIENT_STOPPED, "", "cancelled")
                raise
            return self._finish(stream, stream.stop_reason, "", "closed by the probe")
        except Exception as exc:  # a bug here must not kill the slot: count it, log it
            log.exception("stream %s on %s failed", conf.name, stream.endpoint.name)
            if call is not None:
                call.cancel()
            return self._finish(stream, EndReason.PROBE_ERROR, "", f"{type(exc).__name__}: {exc}")

    async def _drive(
        self, stream: _Stream, channel: grpc.aio.Channel, call: grpc.aio.UnaryStreamCall
    ) -> StreamEnd:
        conf = stream.conf
        loop = asyncio.get_running_loop()
        opened = await self._open(stream, channel, call)
        if isinstance(opened, StreamEnd):
            return opened
        self._opened(stream, opened, loop.time())
        rotate_at = None
        if conf.spec.max_lifetime_s:
            rotate_at = loop.time() + conf.spec.max_lifetime_s * self._rng.uniform(0.9, 1.0)
        try:
            async with asyncio.timeout_at(rotate_at):
                while True:
                    message = await call.read()
                    if message is grpc.aio.EOF:
                        break
                    self._message(stream, bytes(message), loop.time())
        except TimeoutError:
            call.cancel()
            return self._finish(stream, EndReason.CLIENT_ROTATED, "",
                                f"rotated after max_lifetime {conf.spec.max_lifetime_s:g}s")
        except grpc.aio.AioRpcError:
            pass  # the status is read below, as for an orderly end
        return await self._ended(stream, call, established=True)

    async def _open(
        self, stream: _Stream, channel: grpc.aio.Channel, call: grpc.aio.UnaryStreamCall
    ) -> str | StreamEnd:
        """Wait for the response headers (or the open timeout): the stream's cohort, or how
        it ended before it opened. Its own frame, so the headers task is not kept for the
        stream's hours-long life."""
        conf = stream.conf
        headers = asyncio.ensure_future(call.initial_metadata())
        headers.add_done_callback(_retrieve)
        await asyncio.wait({headers}, timeout=conf.open_timeout_s)
        if call.done():
            code = await call.code()
            if code is not grpc.StatusCode.OK:  # failed before it opened (trailers-only)
                return await self._ended(stream, call, established=False)
        elif not headers.done():
            state = channel.get_state(try_to_connect=False)
            if state is not grpc.ChannelConnectivity.READY:
                call.cancel()
                return self._finish(
                    stream, EndReason.REFUSED, "",
                    f"no connection within {conf.open_timeout_s:g}s (channel {state.name})",
                )
            # Connected and the server took the stream; it just sends no headers yet.
        if conf.cohort_key and headers.done() and not headers.cancelled():
            return _lookup(conf.cohort_key, headers.result()) or stream.cohort
        return stream.cohort

    def _opened(self, stream: _Stream, cohort: str, now: float) -> None:
        stream.cohort = cohort
        stream.opened = now
        stream.opened_wall = stream.accounted_to = self._wall()
        self._sink.stream_opened(self._snapshot(stream, now), stream.endpoint)

    def _message(self, stream: _Stream, message: bytes, now: float) -> None:
        stream.messages += 1
        if stream.conf.health:
            stream.health = _serving_status(message)
        if stream.last_message is not None:
            gap = now - stream.last_message
            index = index_of(gap)
            stream.gaps[index] = stream.gaps.get(index, 0) + 1
            self._sink.stream_message(stream.conf.name, stream.cohort, gap)
        stream.last_message = now

    async def _ended(
        self, stream: _Stream, call: grpc.aio.UnaryStreamCall, *, established: bool
    ) -> StreamEnd:
        code = await call.code()
        details = " ".join((await call.details() or "").split())
        reason = classify_stream_end(code.name, details, established=established)
        return self._finish(stream, reason, code.name, details)

    def _finish(self, stream: _Stream, reason: str, code: str, detail: str) -> StreamEnd:
        now = asyncio.get_running_loop().time()
        wall = self._wall()
        self._live.discard(stream)
        if stream.linger is not None:
            stream.linger.cancel()
        if stream.health is not None:
            # A drain shows here: health turns NOT_SERVING before the pod cuts its streams.
            detail = f"{detail}; last health status {stream.health}".lstrip("; ")
        if stream.opened is not None and wall > stream.accounted_to:
            self._sink.stream_held(stream.conf.name, stream.cohort, stream.endpoint.name,
                                   stream.accounted_to, wall)
            stream.accounted_to = wall
        end = StreamEnd(
            path=stream.conf.name,
            endpoint=stream.endpoint.name,
            cohort=stream.cohort,
            slot=stream.slot,
            started_at=stream.started_wall,
            opened_at=stream.opened_wall,
            ended_at=wall,
            lifetime_s=0.0 if stream.opened is None else now - stream.opened,
            messages=stream.messages,
            gap_p99_s=stream.gap_p99(),
            reason=reason,
            code=code,
            detail=detail,
        )
        self._sink.stream_ended(end, stream.endpoint)
        return end

    def _snapshot(self, stream: _Stream, now: float) -> OpenStream:
        return OpenStream(
            path=stream.conf.name,
            endpoint=stream.endpoint.name,
            cohort=stream.cohort,
            slot=stream.slot,
            opened_at=stream.opened_wall or stream.started_wall,
            age_s=0.0 if stream.opened is None else now - stream.opened,
            messages=stream.messages,
            lingering=stream.linger is not None,
        )

    # -- per-path configuration ------------------------------------------------------------

    def _conf(self, path: PathSpec) -> _PathConf:
        conf = self._paths.get(path.name)
        if conf is not None:
            return conf
        spec = path.stream
        if spec is None:
            raise BadInput(f"path {path.name}: not a stream path")
        health = spec.health_service is not None
        method = HEALTH_WATCH if health else spec.method
        if not method.startswith("/") or method.count("/") != 2:
            raise BadInput(f"path {path.name}: stream.method must look like /pkg.Service/Method")
        if spec.max_lifetime_s is not None and not spec.max_lifetime_s > 0:
            raise BadInput(f"path {path.name}: stream.max_lifetime must be positive")
        where = f"path {path.name}"
        options = [
            *channel_options(GrpcSpec(tls=spec.tls)),
            ("grpc.keepalive_time_ms", int(self._policy.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", 20_000),
        ]
        conf = _PathConf(
            name=path.name,
            spec=spec,
            port=path.port,
            method=method,
            request=(
                health_pb2.HealthCheckRequest(service=spec.health_service).SerializeToString()
                if spec.health_service is not None
                else spec.request
            ),
            metadata=tuple((k.lower(), v) for k, v in spec.metadata.items()),
            open_timeout_s=path.timeout_s,
            cohort_key=path.cohort_header.lower() if path.cohort_header else None,
            credentials=grpc_credentials(spec.tls, where=where) if spec.tls else None,
            options=tuple(options),
        )
        self._paths[path.name] = conf
        self._pools[path.name] = EndpointPool(
            lambda endpoint: self._connect(conf, endpoint), _disconnect
        )
        return conf

    @staticmethod
    def _connect(conf: _PathConf, endpoint: Endpoint) -> _Client:
        target = host_port(endpoint.host, endpoint.port_for(conf.port))
        options = list(conf.options)
        if conf.credentials is not None:
            channel = grpc.aio.secure_channel(target, conf.credentials, options=options)
        else:
            channel = grpc.aio.insecure_channel(target, options=options)
        return channel, channel.unary_stream(conf.method)


async def _disconnect(client: _Client) -> None:
    await client[0].close()


def _retrieve(task: asyncio.Future[object]) -> None:
    # The headers future may fail or be abandoned with its call; never log it as lost.
    if not task.cancelled():
        task.exception()


def _lookup(key: str, metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for name, value in metadata or ():
        if name == key:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None
