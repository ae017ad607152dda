"""HTTP/2 on an `asyncio.Protocol`: the lean HTTP/2 client (HTTP/2 and gRPC unary paths).

As `_h1` did for HTTP/1.1 (BENCHMARKS.md, D6 and D15): a connection keeps its socket, its
framing state and the streams in flight; a request's header list is built once per
endpoint. One connection per endpoint carries every concurrent call (a second one opens only
when the server's stream limit is reached, or the first has been told to go away). Two
framings, picked by `H2Settings.framing`: the probe's own (`_h2own.OwnConnection`, the
default: the header block HPACK-encoded once per endpoint) or h2's state machine
(`_Connection` below, client name `lean-h2`: 1.7× the CPU). This module holds the client
and the h2-based connection; the errors, settings and answer both share are in `_h2base`;
the notes below hold for both.

What the wire says is kept honest, more so than through httpcore (`_h2`'s notes):

* GOAWAY is taken off the byte stream before h2 sees it (h2 moves to CLOSED on GOAWAY and
  then rejects the answers of the streams the server still processes): streams above
  last-stream-id fail at once as provably unprocessed (`Replay.UNPROCESSED`); the others
  are read to their end when the GOAWAY is graceful, and fail as `Replay.LOST` only if the
  connection closes first; a GOAWAY with an error code ends them all with that code;
* REFUSED_STREAM is unprocessed; any other RST_STREAM is the stream's reset;
* a connection that answered before and closes without GOAWAY before a stream's answer
  lost that stream (`Replay.LOST`); an idle connection the server closed is seen closed by
  the protocol at once and never used again (httpcore only learns it by sending on it);
* a frame above the max frame size, or an answer in HTTP/1.x, ends the connection at its
  first bytes (h2 would buffer 16 MiB before complaining);
* past `body_limit` the stream is reset (CANCEL) and the connection kept;
* a call cancelled by the engine's deadline resets its stream, not the connection.

Errors, mapped to outcome classes by `_classify`; `replay` says whether and why the request
may be re-sent (None: it may not):

    H2Error                 `replay`: (Replay, reason) or None
    ├── ConnectFailed       TCP or TLS set-up failed (the OSError or SSLError is the cause)
    │   └── ConnectTimedOut
    ├── Disconnected        the connection closed or was reset before the answer ended
    ├── ReadTimedOut        no byte from the server for the read budget
    │   └── DeadlineExceeded  the call's deadline passed (gRPC, own framing)
    ├── StreamReset         RST_STREAM, or GOAWAY with an error code (`code`)
    └── MalformedAnswer     not HTTP/2 (h2's protocol error is the cause)
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from probes.clients import _h2frames, _h2own
from probes.clients._h2base import (
    REFUSED_STREAM,
    WINDOW,
    ConnectFailed,
    ConnectTimedOut,
    Disconnected,
    H2Answer,
    H2Error,
    H2Settings,
    Header,
    MalformedAnswer,
    ReadTimedOut,
    StreamReset,
    code_name,
)
from probes.clients._wire import Replay

_FRAME_HEADER = 9
_GOAWAY = 0x7
_HEADERS = 0x1
_MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE as this client announces it (h2's default)
_CANCEL = h2.errors.ErrorCodes.CANCEL


class FrameFilter:
    """Follows frame boundaries in the server's bytes, takes GOAWAY frames out of them and
    notes the facts h2 reports late or never (an answer in HTTP/1.x, an oversized frame).

    Reads 9-byte frame headers only; payloads are passed through by length, so the usual
    read (whole frames, no GOAWAY) comes back as the same bytes object.
    """

    __slots__ = ("_drop", "_pending", "_seen", "_skip", "answered_http1", "goaways", "oversized")

    def __init__(self) -> None:
        self._pending = b""
        self._skip = 0  # payload bytes still to pass through
        self._drop = 0  # GOAWAY bytes still to leave out
        self._seen = 0
        self.answered_http1 = False
        self.oversized = 0
        self.goaways: list[tuple[int, int]] = []

    def feed(self, data: bytes) -> bytes:
        if self._pending:
            data = self._pending + data
            self._pending = b""
        if self._seen < 5:
            self._seen = min(len(data), 5)
            self.answered_http1 = data[:5] == b"HTTP/"
        pos, end = 0, len(data)
        kept: list[bytes] | None = None
        start = 0  # start of the bytes to keep that are not yet in `kept`
        while pos < end:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                continue
            if self._drop:
                step = min(self._drop, end - pos)
                self._drop -= step
                pos += step
                start = pos
                continue
            if end - pos < _FRAME_HEADER:
                self._pending = data[pos:]
                end = pos
                break
            length = int.from_bytes(data[pos : pos + 3], "big")
            if length > _MAX_FRAME:
                self.oversized = length
                return b""
            if data[pos + 3] != _GOAWAY:
                pos += _FRAME_HEADER
                self._skip = length
                continue
            if end - pos < _FRAME_HEADER + 8:
                self._pending = data[pos:]
                end = pos
                break
            body = pos + _FRAME_HEADER
            last = int.from_bytes(data[body : body + 4], "big") & 0x7FFFFFFF
            code = int.from_bytes(data[body + 4 : body + 8], "big")
            self.goaways.append((last, code))
            if kept is None:
                kept = []
            kept.append(data[start:pos])
            self._drop = _FRAME_HEADER + length
        if kept is None:
            return data if end == len(data) and start == 0 else data[start:end]
        kept.append(data[start:end])
        return b"".join(kept)


class _Stream:
    __slots__ = ("answered", "body", "head_only", "headers", "received", "reused", "sent",
                 "status", "trailers", "waiter")

    def __init__(
        self, waiter: asyncio.Future[H2Answer], *, reused: bool, head_only: bool, sent: float
    ) -> None:
        self.waiter = waiter
        self.sent = sent
        self.reused = reused
        self.head_only = head_only
        self.status = 0
        self.answered = False
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}
        self.received = 0
        self.body: list[bytes] = []


_CONFIG = h2.config.H2Configuration(
    client_side=True,
    header_encoding=None,
    # The request's headers are checked once per path (`check_headers`), not per call.
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    validate_inbound_headers=True,
    normalize_inbound_headers=False,
)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the streams in flight on it."""

    __slots__ = ("_filter", "_last_read", "_loop", "_settings", "_timer", "_transport",
                 "_window_waiters", "answered_before", "closed", "conn", "goaway", "idle_since",
                 "max_streams", "silent", "streams")

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: H2Settings) -> None:
        self._loop = loop
        self._settings = settings
        self._transport: asyncio.Transport | None = None
        self._filter = FrameFilter()
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self.conn = h2.connection.H2Connection(config=_CONFIG)
        self.streams: dict[int, _Stream] = {}
        self.goaway: tuple[int, int] | None = None
        self.closed = False
        self.answered_before = False
        self.idle_since = loop.time()
        self.max_streams = 100  # until the server's SETTINGS say
        # The server sent nothing for a read budget: no new stream goes to this connection.
        self.silent = False
        self._window_waiters: list[asyncio.Future[None]] = []

    # -- the caller's side -----------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return (not self.closed and self.goaway is None and not self.silent
                and len(self.streams) < self.max_streams)

    async def exchange(self, headers: list[Header], body: bytes | None, *,
                       head_only: bool) -> H2Answer:
        transport = self._transport
        if transport is None or self.closed:
            raise Disconnected("connection closed before the request was sent")
        conn = self.conn
        stream_id = conn.get_next_available_stream_id()
        waiter: asyncio.Future[H2Answer] = self._loop.create_future()
        stream = _Stream(
            waiter, reused=self.answered_before, head_only=head_only, sent=self._loop.time()
        )
        self.streams[stream_id] = stream
        try:
            conn.send_headers(stream_id, headers, end_stream=not body)
            if body:
                await self._send_body(stream_id, body)
            transport.write(conn.data_to_send())
            if self._timer is None:
                self._timer = self._loop.call_at(
                    stream.sent + self._settings.read_budget_s, self._check_read
                )
            return await waiter
        except BaseException:
            # Failed, or cancelled by the caller's deadline: end this stream, keep the rest.
            self._reset(stream_id)
            raise
        finally:
            del self.streams[stream_id]
            if not self.streams:
                self.idle_since = self._loop.time()
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if self.goaway is not None or self.silent:
                    self.abort()  # drained: nothing more will be sent on it
            # frame → future → error → traceback → frame would be a cycle for the GC.
            del waiter, stream

    async def _send_body(self, stream_id: int, body: bytes) -> None:
        conn = self.conn
        view = memoryview(body)
        while view:
            window = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
            if window <= 0:
                # Rare for a probe's small bodies: wait for the server's WINDOW_UPDATE.
                assert self._transport is not None
                self._transport.write(conn.data_to_send())
                waiter = self._loop.create_future()
                self._window_waiters.append(waiter)
                await waiter
                continue
            chunk, view = view[:window], view[window:]
            conn.send_data(stream_id, chunk.tobytes(), end_stream=not view)

    def abort(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.abort()

    def _reset(self, stream_id: int) -> None:
        if self.closed:
            return
        try:
            self.conn.reset_stream(stream_id, _CANCEL)
        except h2.exceptions.H2Error:
            return  # the stream had ended already
        if self._transport is not None:
            self._transport.write(self.conn.data_to_send())

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        # As httpcore: no server push, a bound on the header list, 16 MiB of flow-control
        # window for the connection. Each stream's window is the body limit, announced once
        # in SETTINGS (httpcore sends a WINDOW_UPDATE of 16 MiB per stream instead): a
        # server sends no more than the probe reads before it resets the stream.
        self.conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 65536,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: min(
                    max(self._settings.body_limit, 65535), WINDOW
                ),
            },
        )
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(WINDOW)
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        filtered = self._filter.feed(data)
        if self._filter.answered_http1:
            self._fail_all(MalformedAnswer(
                "the server answered in HTTP/1.x: it does not speak HTTP/2 on this port"
            ))
            return
        if self._filter.oversized:
            self._fail_all(MalformedAnswer(
                f"frame of {self._filter.oversized} bytes exceeds the max frame size "
                f"{_MAX_FRAME} (FRAME_SIZE_ERROR)"
            ))
            return
        conn = self.conn
        try:
            events = conn.receive_data(filtered) if filtered else ()
        except h2.exceptions.ProtocolError as exc:
            error = MalformedAnswer(f"{type(exc).__name__}: {exc}")
            error.__cause__ = exc.with_traceback(None)
            self._fail_all(error)
            return
        streams = self.streams
        for event in events:
            stream_id = getattr(event, "stream_id", None)
            stream = streams.get(stream_id) if stream_id is not None else None
            if isinstance(event, h2.events.DataReceived):
                if event.flow_controlled_length:
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if stream is not None:
                    stream.received += len(event.data)
                    if self._settings.keep_body:
                        stream.body.append(event.data)
                    if stream.received >= self._settings.body_limit:
                        self._finish(stream)
                        self._reset_quietly(event.stream_id)
            elif isinstance(event, h2.events.ResponseReceived):
                if stream is not None:
                    self._on_headers(stream, event.headers)
            elif isinstance(event, h2.events.StreamEnded):
                if stream is not None:
                    self._finish(stream)
            elif isinstance(event, h2.events.TrailersReceived):
                if stream is not None:
                    wanted = self._settings.wanted
                    for name, value in event.headers:
                        if name in wanted:
                            stream.trailers[name.decode("latin-1")] = value.decode("latin-1")
            elif isinstance(event, h2.events.StreamReset):
                if stream is not None:
                    self._on_reset(stream, event.stream_id, int(event.error_code))
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                changed = event.changed_settings.get(
                    h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
                )
                if changed is not None:
                    self.max_streams = changed.new_value
            elif isinstance(event, h2.events.WindowUpdated):
                waiters, self._window_waiters = self._window_waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        if self._filter.goaways:
            goaways = self._filter.goaways
            self._filter.goaways = []
            for last, code in goaways:
                self._on_goaway(last, code)
        out = conn.data_to_send()
        if out and self._transport is not None and not self.closed:
            self._transport.write(out)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost says the rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for waiter in self._window_waiters:
            if not waiter.done():
                waiter.set_exception(Disconnected("connection closed while sending the body"))
        if not self.streams:
            return
        message = "server disconnected before answering"
        if exc is not None:
            message = f"{message} ({type(exc).__name__}: {exc})"
        goaway = self.goaway
        for stream_id, stream in list(self.streams.items()):
            error = Disconnected(
                message.replace("before answering", "before the answer ended")
                if stream.answered else message
            )
            error.__cause__ = exc
            if stream.answered:
                pass
            elif goaway is not None and goaway[1] == 0 and stream_id <= goaway[0]:
                error.replay = (Replay.LOST, (
                    f"graceful GOAWAY (last_stream_id={goaway[0]}); stream {stream_id} lost "
                    "its answer when the connection closed"
                ))
            elif goaway is None and stream.reused:
                error.replay = (
                    Replay.LOST, "reused HTTP/2 connection closed without GOAWAY before an answer"
                )
            self._cut(stream, error)

    # -- events ------------------------------------------------------------------------------

    def _on_headers(self, stream: _Stream, headers: list[Header]) -> None:
        self.answered_before = True
        wanted = self._settings.wanted
        for name, value in headers:
            if name == b":status":
                stream.status = int(value)
            elif name in wanted:
                stream.headers[name.decode("latin-1")] = value.decode("latin-1")
        stream.answered = True

    def _on_reset(self, stream: _Stream, stream_id: int, code: int) -> None:
        name = code_name(code)
        error = StreamReset(f"stream {stream_id} reset by the server ({name})", code)
        if code == REFUSED_STREAM and not stream.answered:
            error.replay = (Replay.UNPROCESSED, f"stream {stream_id} refused (REFUSED_STREAM)")
        self._cut(stream, error)

    def _on_goaway(self, last: int, code: int) -> None:
        self.goaway = (last, code)
        for stream_id, stream in list(self.streams.items()):
            if stream_id > last:
                error = Disconnected(f"GOAWAY ({code_name(code)}) with last_stream_id={last}")
                error.replay = (
                    Replay.UNPROCESSED, f"GOAWAY last_stream_id={last} below stream {stream_id}"
                )
                self._cut(stream, error)
            elif code != 0:
                self._cut(stream, StreamReset(
                    f"connection ended by GOAWAY ({code_name(code)}, last_stream_id={last})",
                    code,
                ))
        if not self.streams or all(s.waiter.done() for s in self.streams.values()):
            self.abort()

    def _finish(self, stream: _Stream, received: BaseException | None = None) -> None:
        if not stream.waiter.done():
            stream.waiter.set_result(H2Answer(
                stream.status, stream.headers, received or stream.received, stream.trailers,
                b"".join(stream.body) if stream.body else b"",
            ))

    def _cut(self, stream: _Stream, error: H2Error) -> None:
        """After the status, the error cut the body (the answer stands); before, there is none."""
        if stream.waiter.done():
            return
        if stream.answered:
            self._finish(stream, error)
        else:
            stream.waiter.set_exception(error)

    def _fail_all(self, error: H2Error) -> None:
        for stream in self.streams.values():
            self._cut(stream, error)
        self.abort()

    def _reset_quietly(self, stream_id: int) -> None:
        with contextlib.suppress(h2.exceptions.H2Error):
            self.conn.reset_stream(stream_id, _CANCEL)

    def _check_read(self) -> None:
        self._timer = None
        if not self.streams or self.closed:
            return
        budget = self._settings.read_budget_s
        now = self._loop.time()
        next_due = 0.0
        for stream in list(self.streams.values()):
            if stream.waiter.done():
                continue
            due = max(self._last_read, stream.sent) + budget
            if now >= due:
                # Nothing from the server since this stream was sent: the connection is
                # silent; its other streams keep their own budgets, no new one is sent on it.
                self.silent = True
                self._cut(stream, ReadTimedOut(f"no byte from the server for {budget:g}s"))
            elif not next_due or due < next_due:
                next_due = due
        if next_due:
            self._timer = self._loop.call_at(next_due, self._check_read)


class H2Client:
    """One endpoint: its request headers and its connection(s)."""

    __slots__ = ("_block", "_body", "_closed", "_connecting", "_conns", "_headers", "_host",
                 "_port", "_server_name", "_settings", "_ssl")

    def __init__(
        self,
        host: str,
        port: int,
        headers: list[Header],
        body: bytes | None,
        settings: H2Settings,
        *,
        ssl_context: ssl.SSLContext | None,
        server_name: str | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._headers = headers
        self._body = body
        self._settings = settings
        self._ssl = ssl_context
        self._server_name = server_name if ssl_context is not None else None
        # The request's header block, HPACK-encoded once (own framing).
        self._block = _h2frames.encode_block(headers) if settings.framing == "own" else b""
        self._conns: list[_Connection | _h2own.OwnConnection] = []
        # A connection being opened: calls that arrive meanwhile share it.
        self._connecting: asyncio.Task[_Connection | _h2own.OwnConnection] | None = None
        self._closed = False

    @property
    def connections(self) -> int:
        return len(self._conns)

    @property
    def keeps_deadlines(self) -> bool:
        """Whether `request(deadline=)` is kept by the connection (own framing only)."""
        return self._settings.framing == "own"

    async def request(
        self, extra: list[Header], *, head_only: bool = False, deadline: float = 0.0
    ) -> H2Answer:
        """One request on the endpoint's connection, or a new one; raises `H2Error`."""
        if self._closed:
            raise Disconnected("client closed")
        conn = self._take()
        if conn is None:
            connecting = self._connecting
            if connecting is None:
                connecting = self._connecting = asyncio.ensure_future(self._connect())
                connecting.add_done_callback(self._connected)
            # Shielded: one caller's deadline does not end the others' connection.
            conn = await asyncio.shield(connecting)
        if isinstance(conn, _h2own.OwnConnection):
            return await conn.exchange(self._block, extra, self._body, head_only=head_only,
                                       deadline=deadline)
        return await conn.exchange([*self._headers, *extra], self._body, head_only=head_only)

    async def aclose(self) -> None:
        self._closed = True
        for conn in self._conns:
            conn.abort()
        self._conns.clear()

    def _take(self) -> _Connection | _h2own.OwnConnection | None:
        conns = self._conns
        if not conns:
            return None
        now = asyncio.get_running_loop().time()
        keepalive = self._settings.keepalive_s
        for conn in list(conns):
            if conn.closed or (conn.goaway is not None and not conn.streams):
                conns.remove(conn)
            elif not conn.streams and now - conn.idle_since > keepalive:
                conn.abort()
                conns.remove(conn)
            elif conn.usable:
                return conn
        return None

    def _connected(self, task: asyncio.Task[_Connection | _h2own.OwnConnection]) -> None:
        self._connecting = None
        if not task.cancelled():
            task.exception()  # retrieved here too: every caller may have been cancelled

    async def _connect(self) -> _Connection | _h2own.OwnConnection:
        loop = asyncio.get_running_loop()
        conn: _Connection | _h2own.OwnConnection = (
            _h2own.OwnConnection(loop, self._settings) if self._settings.framing == "own"
            else _Connection(loop, self._settings)
        )
        budget = self._settings.connect_budget_s
        where = f"{self._host}:{self._port}"
        try:
            async with asyncio.timeout(budget):
                await loop.create_connection(
                    lambda: conn, self._host, self._port,
                    ssl=self._ssl, server_hostname=self._server_name,
                )
        except TimeoutError as exc:
            raise ConnectTimedOut(f"cannot connect to {where} within {budget:g}s") from exc
        except OSError as exc:  # refused, unreachable, name lookup, TLS (ssl.SSLError)
            raise ConnectFailed(f"cannot connect to {where}: {exc}") from exc
        if self._closed:
            conn.abort()
            raise Disconnected("client closed")
        self._conns.append(conn)
        return conn
