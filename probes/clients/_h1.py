"""HTTP/1.1 on an `asyncio.Protocol` with httptools' C parser (llhttp, Node.js's parser).

The probe's hot path at scale: a general client (aiohttp, before this) cost half the probe's
CPU and kept ~30 objects per connection alive between calls for every garbage collection to
walk; here a connection keeps its socket and its parser, nothing else, and the request's
bytes are framed once per endpoint (BENCHMARKS.md, D6).

What the wire says is kept honest:

* a request is sent once; a re-send is the prober's decision (`replay_reason`): only an
  idempotent request whose *reused* keep-alive connection closed before any byte of an
  answer (RFC 9112 §9.3.1), counted as churn;
* the read budget is the time without a byte from the server (as aiohttp's `sock_read`),
  so a server dripping headers is ended by the engine's deadline on the whole call;
* a body is read and discarded up to `body_limit`; past it the connection is closed;
* an answer whose length is the connection's end (no Content-Length, not chunked) is
  complete only on a clean close; a reset cuts it.

Errors, mapped to outcome classes by `_classify`:

    H1Error                 `reused`: sent on a kept-alive connection; `answered`: some
    │                       of the answer had arrived
    ├── ConnectFailed       TCP or TLS set-up failed (the OSError or SSLError is the cause)
    │   └── ConnectTimedOut
    ├── Disconnected        the server closed or reset the connection before the answer ended
    ├── ReadTimedOut        no byte from the server for the read budget
    └── MalformedAnswer     not HTTP/1.x (httptools' parser error is the cause)
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

import httptools

from probes.clients._base import Replay, connect_protocol


class H1Error(Exception):
    reused: bool = False
    answered: bool = False


class ConnectFailed(H1Error):
    pass


class ConnectTimedOut(ConnectFailed):
    pass


class Disconnected(H1Error):
    pass


class ReadTimedOut(H1Error):
    pass


class MalformedAnswer(H1Error):
    pass


# Statuses whose answers never have a body (RFC 9110 §6.4.1); HEAD's answers neither.
_NO_BODY = frozenset({204, 304})
_FORBIDDEN = frozenset("\r\n\0")


@dataclass(frozen=True, slots=True)
class H1Settings:
    """What every connection of one path shares."""

    connect_budget_s: float
    read_budget_s: float
    keepalive_s: float
    body_limit: int
    # Answer headers the prober reads, lower-case; the rest are skipped unread.
    wanted: frozenset[bytes]
    # Idle connections kept per endpoint. One serves a probe (a call per period, answered
    # well inside it); calls that overlapped while a callee was slow each opened their own
    # connection, and keeping those would pile up connections on the callee with every
    # slow spell (seen: 2,400 endpoints grew to 11,000 connections and filled HAProxy's
    # maxconn).
    max_idle: int = 1
    # Keep the body's bytes (the relay reads its JSON answer), not only their count.
    keep_body: bool = False


@dataclass(frozen=True, slots=True)
class H1Answer:
    status: int
    # Only the wanted headers, by lower-case name.
    headers: Mapping[str, str]
    # Body bytes read (at most about body_limit), or what cut the body short.
    received: int | BaseException
    # The body, when the settings keep it (at most about body_limit bytes).
    body: bytes = b""


def frame_request(
    method: str, target: str, host: str, headers: list[tuple[str, str]], body: bytes | None
) -> tuple[bytes, bytes]:
    """The request's bytes before and after the per-call `x-request-id` value.

    Raises ValueError for a header that would break the framing (a line break, a NUL, a
    name with a space or colon) or that is not Latin-1.
    """
    lines = [f"{method} {target} HTTP/1.1"]
    names = {name.lower() for name, _ in headers}
    if "host" not in names:
        lines.append(f"Host: {host}")
    for name, value in headers:
        if not name or _FORBIDDEN & set(name) or " " in name or ":" in name:
            raise ValueError(f"header name {name!r} cannot be sent")
        if _FORBIDDEN & set(value):
            raise ValueError(f"header {name}: value has a line break or NUL")
        lines.append(f"{name}: {value}")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    try:
        head = ("\r\n".join(lines) + "\r\nx-request-id: ").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ValueError(f"a header is not Latin-1: {exc}") from exc
    return head, b"\r\n\r\n" + (body or b"")


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: one exchange at a time, kept alive between them."""

    __slots__ = (
        "_answered",
        "_body",
        "_chunked",
        "_head_only",
        "_headers",
        "_headers_done",
        "_last_read",
        "_loop",
        "_parser",
        "_received",
        "_settings",
        "_sized",
        "_status",
        "_timer",
        "_transport",
        "_waiter",
        "closed",
        "exchanges",
        "idle_since",
        "reusable",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: H1Settings) -> None:
        self._loop = loop
        self._settings = settings
        self._transport: asyncio.Transport | None = None
        # Made once connected: the parser and this object refer to each other, a cycle
        # that `connection_lost` breaks (a connection that never came up gets none).
        self._parser: httptools.HttpResponseParser | None = None
        self._waiter: asyncio.Future[H1Answer] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._head_only = False
        self._reset_answer()
        self.closed = False
        self.reusable = True
        self.exchanges = 0
        self.idle_since = 0.0

    def _reset_answer(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._headers_done = False
        self._answered = False
        self._sized = False
        self._chunked = False
        self._received = 0
        self._body = b""

    # -- the caller's side -----------------------------------------------------------------

    async def exchange(self, request: bytes, *, head_only: bool) -> H1Answer:
        transport = self._transport
        if transport is None or self.closed or self._parser is None:
            raise self._error(Disconnected("connection closed before the request was sent"))
        self.exchanges += 1
        self._head_only = head_only
        self._reset_answer()
        waiter = self._waiter = self._loop.create_future()
        transport.write(request)
        self._last_read = self._loop.time()
        self._timer = self._loop.call_at(
            self._last_read + self._settings.read_budget_s, self._check_read
        )
        try:
            return await waiter
        except BaseException:
            # Failed, or cancelled by the caller's deadline, possibly after its answer had
            # arrived: either way the connection is not kept, and it must not stay open
            # (seen: ~2,600 connections left open by one start-up's timeouts).
            self.abort()
            raise
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._waiter = None
            # A raised error's traceback holds this frame: without this, frame → future →
            # error → traceback → frame is a cycle only the garbage collector would free.
            del waiter

    def abort(self) -> None:
        self.reusable = False
        if self._transport is not None and not self.closed:
            self._transport.abort()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        parser = self._parser
        if waiter is None or waiter.done() or parser is None:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self.abort()
            return
        self._last_read = self._loop.time()
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A 101 (or CONNECT answer): the rest is another protocol; the answer is its head.
            self.reusable = False
            self._finish()
        except httptools.HttpParserError as exc:
            error = MalformedAnswer(f"not an HTTP/1.1 answer: {exc}")
            error.__cause__ = exc.with_traceback(None)  # its traceback would hold `error`
            self._cut(error)
        if not self.reusable:
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost says the rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._parser = None  # it refers back to this object
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._headers_done and self._ends_at_close() and exc is None:
            self._finish()  # the close is the end of this answer's body
            return
        message = (
            "server disconnected before the answer ended"
            if self._answered
            else "server disconnected before answering"
        )
        if exc is not None:
            message = f"{message} ({type(exc).__name__}: {exc})"
        error = Disconnected(message)
        error.__cause__ = exc
        self._cut(error)

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # A second answer in the bytes of this one: nobody asked for it.
            self.reusable = False
        self._answered = True

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key == b"content-length":
            self._sized = True
        elif key == b"transfer-encoding":
            self._chunked = b"chunked" in value.lower()
        if key in self._settings.wanted:
            self._headers[key.decode("latin-1")] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._reset_answer()  # informational (100, 103): the answer follows
            self._answered = True
            return
        self._status = status
        self._headers_done = True
        if self._head_only:
            # llhttp cannot know the request was HEAD and would wait for Content-Length
            # bytes; the answer ends here, and the next one needs a fresh parser.
            if not self._parser.should_keep_alive():
                self.reusable = False
            self._parser = httptools.HttpResponseParser(self)
            self._finish()

    def _ends_at_close(self) -> bool:
        """The answer's body runs to the connection's end (RFC 9112 §6.3, rule 8)."""
        return self._status not in _NO_BODY and not self._sized and not self._chunked

    def on_body(self, body: bytes) -> None:
        self._received += len(body)
        if self._settings.keep_body:
            self._body += body  # a small answer: one chunk, and b"" + chunk is the chunk
        if self._received >= self._settings.body_limit:
            self.reusable = False  # the unread rest would be the next answer's start
            self._finish()

    def on_message_complete(self) -> None:
        waiter = self._waiter
        if not self._headers_done or waiter is None or waiter.done():
            return  # an informational answer ended, or this one was already taken
        if self._parser is not None and not self._parser.should_keep_alive():
            self.reusable = False
        self._finish()

    # -- ending an exchange ----------------------------------------------------------------

    def _finish(self, *, received: BaseException | None = None) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if received is not None:
            self.reusable = False
        waiter.set_result(
            H1Answer(self._status, self._headers, received or self._received, self._body)
        )

    def _cut(self, error: H1Error) -> None:
        """The exchange ends in `error`: after the status it cut the body (the answer
        stands, its body broken), before it there is no answer."""
        if self._headers_done:
            self._finish(received=error)
        else:
            self._fail(error)

    def _fail(self, error: H1Error) -> None:
        self.reusable = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(self._error(error))

    def _error(self, error: H1Error) -> H1Error:
        error.reused = self.exchanges > 1
        error.answered = self._answered
        return error

    def _check_read(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        due = self._last_read + self._settings.read_budget_s
        if self._loop.time() < due:  # bytes came in since: wait for the rest of the budget
            self._timer = self._loop.call_at(due, self._check_read)
            return
        self._cut(ReadTimedOut(f"no byte from the server for {self._settings.read_budget_s:g}s"))
        self.abort()


class H1Client:
    """One endpoint: its framed request and its kept-alive connection(s), newest last."""

    __slots__ = ("_closed", "_host", "_idle", "_in_use", "_port", "_request",
                 "_server_name", "_settings", "_ssl")

    def __init__(
        self,
        host: str,
        port: int,
        request: tuple[bytes, bytes],
        settings: H1Settings,
        *,
        ssl_context: ssl.SSLContext | None,
        server_name: str | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._request = request
        self._settings = settings
        self._ssl = ssl_context
        self._server_name = server_name if ssl_context is not None else None
        self._idle: list[_Connection] = []
        self._in_use: set[_Connection] = set()
        self._closed = False

    async def request(self, request_id: str, *, head_only: bool = False) -> H1Answer:
        """One request on a kept-alive connection, or a new one; raises `H1Error`."""
        if "\r" in request_id or "\n" in request_id:
            raise ValueError("request id has a line break")
        conn = self._take_idle() or await self._connect()
        self._in_use.add(conn)
        head, tail = self._request
        try:
            answer = await conn.exchange(head + request_id.encode() + tail, head_only=head_only)
        finally:
            self._in_use.discard(conn)
        if (conn.reusable and not conn.closed and not self._closed
                and len(self._idle) < self._settings.max_idle):
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.append(conn)
        else:
            conn.abort()  # a no-op when it is closed already
        return answer

    async def aclose(self) -> None:
        self._closed = True
        for conn in (*self._idle, *self._in_use):
            conn.abort()
        self._idle.clear()

    def _take_idle(self) -> _Connection | None:
        idle = self._idle
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        keepalive = self._settings.keepalive_s
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > keepalive:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self) -> _Connection:
        conn = _Connection(asyncio.get_running_loop(), self._settings)
        await connect_protocol(
            conn, self._host, self._port, ssl_context=self._ssl, server_name=self._server_name,
            budget_s=self._settings.connect_budget_s, failed=ConnectFailed,
            timed_out=ConnectTimedOut,
        )
        return conn


def replay_reason(exc: BaseException) -> tuple[Replay, str] | None:
    """A request may be re-sent only when a reused keep-alive connection closed before any
    byte of an answer (the server may have closed it while the request was on its way)."""
    if isinstance(exc, Disconnected) and exc.reused and not exc.answered:
        return Replay.LOST, "reused keep-alive connection closed before an answer"
    return None
