"""The HTTP/2 reference: `HttpProber` with HTTP/2 on httpcore, with the GOAWAY facts that
httpcore and h2 lose. Not in the product (BENCHMARKS.md, D15): the library client the probe's
own HTTP/2 client (`probes/clients/_h2lean.py`) is proven against and measured beside.

When a server drains a connection it sends GOAWAY with the last stream id it will process
(RFC 9113 §6.8). What httpcore 1.x does with that, read from `httpcore/_async/http2.py`:

* a stream above last-stream-id whose task reads next raises `ConnectionNotAvailable`
  inside httpcore, and the pool silently re-sends it on another connection: correct, but
  the churn is invisible;
* h2 moves its state machine to CLOSED on GOAWAY and rejects every later frame, so when
  the GOAWAY and the answers of streams at or below last-stream-id arrive in one read
  (nginx at `keepalive_requests` sends the GOAWAY first), the reader gets
  `LocalProtocolError: Invalid input ConnectionInputs.RECV_HEADERS in state
  ConnectionState.CLOSED`, the exception carries no stream ids, and the other streams then
  see "Server disconnected": a client-library artefact that looks like a callee failure;
* once a GOAWAY is stored, streams at or below last-stream-id are failed with
  `RemoteProtocolError(ConnectionTerminated)` instead of being read to the end.

So this module watches the wire itself: `ObservedStream` wraps each connection's network
stream (httpcore's public network-backend API) and follows HTTP/2 frame boundaries in the
bytes the server sends, remembering the last GOAWAY. With the request's stream id (from
httpcore's `trace` extension) the prober can then tell a request the server provably did not
process from one whose answer was lost (`replay_reason`).

Connection pools hide which connection a request used and what happened to it, so the
transport fills a `WireRecord` as each attempt runs: the HTTP/2 stream ids (from httpcore's
`trace` extension) and the connection the request was written to. The record is found
through a context variable because httpcore runs in the caller's task but passes nothing of
ours down; a context variable is task-local, so concurrent calls never see each other's.

The request goes to the transport directly, not through `httpx.AsyncClient`: the client's
per-request machinery (cookies, auth, redirects, event hooks, header merging) is unused here
and cost about 40 % of the CPU per request in measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
import typing
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Iterator
from contextvars import ContextVar

import h2.events
import httpcore
import httpx

from probes.clients._base import Replay, inner_budget_s
from probes.clients._classify import classify_exception, exception_chain
from probes.clients._http import BODY_LIMIT, HttpProber, _Attempt, _join, _Lease, _Resend
from probes.errors import BadInput
from probes.spec import PathSpec
from probes.types import CallOutcome, Endpoint, Outcome

_FRAME_HEADER = 9
_GOAWAY = 0x7
_HEADERS = 0x1
_GOAWAY_FIXED = 8  # last-stream-id (31 bits) + error code
_REFUSED_STREAM = 0x7
# SETTINGS_MAX_FRAME_SIZE as the client announces it: httpcore keeps h2's initial value.
_MAX_FRAME = 16384


@dataclasses.dataclass(slots=True)
class WireRecord:
    """What the transport saw of one request attempt."""

    stream_ids: list[int] = dataclasses.field(default_factory=list)
    connection: ObservedStream | None = None
    # The connection had answered a request before this one (a kept-alive one).
    reused: bool = False

    async def trace(self, name: str, info: dict[str, typing.Any]) -> None:
        """httpcore's `trace` extension hook: note every HTTP/2 stream this request opens
        (more than one means httpcore itself re-sent it on another connection)."""
        if name == "http2.send_request_headers.started":
            self.stream_ids.append(int(info["stream_id"]))


_CURRENT: ContextVar[WireRecord | None] = ContextVar("skewprobe_wire_record", default=None)


@contextlib.contextmanager
def recording() -> Iterator[WireRecord]:
    """Make a fresh record the current one for the duration of one attempt."""
    record = WireRecord()
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)


class FrameScanner:
    """Follows frame boundaries in a server's HTTP/2 byte stream and keeps the last GOAWAY.

    It only reads 9-byte frame headers (and the first 8 payload bytes of a GOAWAY); payloads
    are skipped by length, so a large body costs one subtraction per read. `oversized` is the
    length of the first frame above the max frame size: h2 only rejects such a frame once it
    holds all of it, so a peer that announces 16 MiB and sends less would hang the call
    until its timeout (and one that sends it all would be buffered).
    """

    __slots__ = (
        "_pending", "_seen", "_skip", "answered_http1", "goaway", "headers_seen", "oversized",
    )

    def __init__(self) -> None:
        self._pending = b""
        self._skip = 0
        self._seen = 0
        self.goaway: tuple[int, int] | None = None
        # h2 buffers an "HTTP/1.1 400 ..." answer as the header of a huge frame and only
        # reports the disconnect that follows; the first bytes say what really happened.
        self.answered_http1 = False
        self.oversized = 0
        # The server has sent a HEADERS frame: the connection has answered a request.
        self.headers_seen = False

    def feed(self, data: bytes) -> None:
        if self._seen < 5:
            head = (self._pending + data)[:5] if self._pending else data[:5]
            self._seen = len(head)
            self.answered_http1 = head == b"HTTP/"
        if self._pending:
            data = self._pending + data
            self._pending = b""
        pos, end = 0, len(data)
        while pos < end:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                continue
            if end - pos < _FRAME_HEADER:
                self._pending = data[pos:]
                return
            length = int.from_bytes(data[pos : pos + 3], "big")
            if length > _MAX_FRAME and not self.oversized:
                self.oversized = length
            if data[pos + 3] == _HEADERS:
                self.headers_seen = True
            if data[pos + 3] == _GOAWAY:
                if end - pos < _FRAME_HEADER + _GOAWAY_FIXED:
                    self._pending = data[pos:]
                    return
                body = pos + _FRAME_HEADER
                last = int.from_bytes(data[body : body + 4], "big") & 0x7FFFFFFF
                code = int.from_bytes(data[body + 4 : body + 8], "big")
                self.goaway = (last, code)
            pos += _FRAME_HEADER
            self._skip = length


class ObservedStream(httpcore.AsyncNetworkStream):
    """A network stream that scans what it reads and tells the current request it was used."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._scanner = FrameScanner()

    @property
    def goaway(self) -> tuple[int, int] | None:
        return self._scanner.goaway

    @property
    def answered_http1(self) -> bool:
        return self._scanner.answered_http1

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        data = await self._inner.read(max_bytes, timeout)
        self._scanner.feed(data)
        if self._scanner.oversized:
            raise httpcore.RemoteProtocolError(
                f"frame of {self._scanner.oversized} bytes exceeds the max frame size "
                f"{_MAX_FRAME} (FRAME_SIZE_ERROR)"
            )
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        # httpcore writes a request's HEADERS from the request's own task, so the record
        # current here belongs to the request that is using this connection. A connection
        # that has answered before is a reused keep-alive one (see `replay_reason`).
        record = _CURRENT.get()
        if record is not None and record.connection is not self:
            record.connection = self
            record.reused = self._scanner.headers_seen
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> httpcore.AsyncNetworkStream:
        # HTTP/2 frames only flow after the handshake, so the scanner starts on the TLS stream.
        return ObservedStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class ObservingBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return ObservedStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return ObservedStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: AsyncIterable[bytes]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:
            yield part

    async def aclose(self) -> None:
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()


class H2Transport(httpx.AsyncBaseTransport):
    """HTTP/2 only: h2c with prior knowledge on http://, ALPN "h2" on https://.

    httpcore's errors are left as they are (no httpx re-mapping): `_classify` reads them.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext, keepalive_s: float) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=16,
            max_keepalive_connections=4,
            keepalive_expiry=keepalive_s,
            http1=False,
            http2=True,
            network_backend=ObservingBackend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        response = await self._pool.handle_async_request(core_request)
        assert isinstance(response.stream, AsyncIterable)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


def replay_reason(exc: BaseException, record: WireRecord) -> tuple[Replay, str] | None:
    """Whether a failed HTTP/2 request may be re-sent, and why; None when it may not.

    Timeouts and streams the server reset for any reason but REFUSED_STREAM are real
    outcomes and never replayed. A connection-level failure on a connection that received
    GOAWAY is replayed: as UNPROCESSED when the request's stream is above last-stream-id,
    as LOST when it is at or below it and the GOAWAY was graceful (NO_ERROR). Without a
    GOAWAY, a *reused* connection that closed before any answer is LOST, as for HTTP/1.1:
    httpcore does not read an idle HTTP/2 connection, so it only learns that the server
    closed it (a restart, an idle timeout without GOAWAY) by sending the next request on it.
    """
    connection_failure = closed = False
    for link in exception_chain(exc):
        if isinstance(link, httpcore.TimeoutException):
            return None
        event = (
            (link.args or (None,))[0] if isinstance(link, httpcore.RemoteProtocolError) else None
        )
        if isinstance(event, h2.events.StreamReset):
            if event.error_code == _REFUSED_STREAM:
                return Replay.UNPROCESSED, f"stream {event.stream_id} refused (REFUSED_STREAM)"
            return None
        if isinstance(link, httpcore.ProtocolError | httpcore.NetworkError):
            connection_failure = True
        if isinstance(link, httpcore.NetworkError) or (
            isinstance(link, httpcore.RemoteProtocolError)
            and str(link).startswith("Server disconnected")
        ):
            closed = True
    goaway = record.connection.goaway if record.connection is not None else None
    if goaway is None and closed and record.reused:
        return Replay.LOST, "reused HTTP/2 connection closed without GOAWAY before an answer"
    if not connection_failure or goaway is None:
        return None
    last, code = goaway
    stream = record.stream_ids[-1] if record.stream_ids else None
    if stream is None or stream > last:
        return Replay.UNPROCESSED, f"GOAWAY last_stream_id={last} below stream {stream}"
    if code == 0:
        return Replay.LOST, (
            f"graceful GOAWAY (last_stream_id={last}); stream {stream} lost its answer "
            "to the client library"
        )
    return None


def misread(record: WireRecord) -> str | None:
    """A detail when the server's bytes were not HTTP/2 at all (h2 would only report the
    disconnect that followed), else None."""
    connection = record.connection
    if connection is not None and connection.answered_http1:
        return "the server answered in HTTP/1.x: it does not speak HTTP/2 on this port"
    return None


class HttpcoreProber(HttpProber):
    """`HttpProber` with HTTP/2 on httpcore; HTTP/1.1 paths stay on the probe's own `_h1`."""

    def __init__(
        self, path: PathSpec, *, body_limit: int = BODY_LIMIT, keep_body: bool = False,
    ) -> None:
        super().__init__(path, body_limit=body_limit, keep_body=keep_body)
        if keep_body and self._http2:
            raise BadInput(f"path {path.name}: only the lean HTTP/2 client keeps answer bodies")
        budget = inner_budget_s(path.timeout_s)
        self._extensions: dict[str, typing.Any] = {
            "timeout": {"connect": budget, "read": budget, "write": budget, "pool": budget}
        }
        if self._server_name:
            self._extensions["sni_hostname"] = self._server_name

    def _connect(self, endpoint: Endpoint) -> typing.Any:
        if not self._http2:
            return super()._connect(endpoint)
        url = self._url(endpoint)
        return H2Transport(ssl_context=self._ssl, keepalive_s=self._keepalive_s), url

    @staticmethod
    async def _disconnect(client: typing.Any) -> None:
        await (client[0] if isinstance(client, tuple) else client).aclose()

    async def _attempt(self, lease: _Lease, request_id: str, *, replayable: bool) -> _Attempt:
        if not self._http2:
            return await super()._attempt(lease, request_id, replayable=replayable)
        with recording() as record:
            try:
                outcome: _Attempt = await self._exchange_core(lease, request_id, record)
            except Exception as exc:
                classified = classify_exception(exc)
                if (wrong := misread(record)) is not None:
                    classified = Outcome.PROTOCOL_ERROR, f"{wrong}; {classified[1]}"
                outcome = self._failed(exc, replay_reason(exc, record), replayable=replayable,
                                       classified=classified)
        internal = max(len(record.stream_ids) - 1, 0)
        if not internal:
            return outcome
        if isinstance(outcome, _Resend):
            return dataclasses.replace(outcome, internal=internal)
        note = f"re-sent {internal}x on another connection by httpcore after GOAWAY"
        return dataclasses.replace(outcome, churn=internal, detail=_join(note, outcome.detail))

    async def _exchange_core(
        self, lease: _Lease, request_id: str, record: WireRecord
    ) -> CallOutcome:
        transport, url = typing.cast(tuple[H2Transport, httpx.URL], lease.client)
        request = httpx.Request(
            self._method,
            url,
            headers=[*self._headers, ("x-request-id", request_id)],
            content=self._spec.body,
            extensions={**self._extensions, "trace": record.trace},
        )
        response = await transport.handle_async_request(request)
        status = response.status_code
        headers = response.headers
        try:
            received: int | BaseException = await self._discard_body(response)
        except Exception as exc:
            received = exc
        finally:
            await response.aclose()
        if isinstance(received, int) and received >= self._body_limit:
            # httpcore cannot reset one stream; the unread rest would hold the connection's
            # flow-control window, so the connection is not reused.
            self._pool.retire(lease)
        return self._answer(status, headers.get, received, b"")

    async def _discard_body(self, response: httpx.Response) -> int:
        received = 0
        parts = typing.cast(AsyncGenerator[bytes, None], response.aiter_raw())
        async with contextlib.aclosing(parts):
            async for part in parts:
                received += len(part)
                if received >= self._body_limit:
                    break
        return received
