"""The gRPC prober: one unary call with raw bytes in and out, classified.

The probe needs no generated code for the callee: the request is the path's raw protobuf
bytes and the answer is only counted. With `health_service` set the call is the standard
`grpc.health.v1.Health/Check`; SERVING is ok, any other serving status is
`unexpected_status` (the RPC worked, the answer was not the expected one) with the status in
the detail, and a status code other than OK is `grpc_<CODE>` as for any call.

Each call is one HTTP/2 POST on the probe's own client (`_h2lean`), one connection per
endpoint, reused and closed on `forget`/`aclose` (BENCHMARKS.md, D15). Its
outcomes are named as grpc core names them, so a path reads the same as on grpc.aio. A call
the server provably never saw (a stream above a GOAWAY's last-stream-id, REFUSED_STREAM) is
re-sent once, on a new connection, and counted as churn: the same rule as for HTTP/2.

**The wire** (`request_headers`, `frame_message`, `read_reply`, `error_reply`): gRPC unary
over the probe's own HTTP/2 client, and grpc core's way of naming what went wrong. A unary
call is one HTTP/2 POST (PROTOCOL-HTTP2.md in grpc/grpc): `content-type:
application/grpc`, `te: trailers`, `grpc-timeout`, the message behind a 5-byte prefix
(compressed flag, length); the answer is HEADERS (`:status 200`), the message, then
trailers with `grpc-status` and `grpc-message` (or all in one HEADERS frame: trailers-only).
What the answer becomes follows grpc core (the C library under grpc.aio), so one path reads
the same on either client:

* an HTTP status other than 200 is the code of gRPC's HTTP-to-gRPC mapping
  (doc/http-grpc-status-mapping.md);
* no `grpc-status` is UNKNOWN; a compressed message without `grpc-encoding` INTERNAL; a
  message above the receive limit RESOURCE_EXHAUSTED; OK without a whole message is left to
  the prober (it fails such a call INTERNAL, as grpc-java and grpc-go do);
* RST_STREAM: REFUSED_STREAM is UNAVAILABLE (unprocessed: re-sent once), CANCEL
  CANCELLED (DEADLINE_EXCEEDED when read once the call's deadline had passed: the
  connection says so, `_h2own`), ENHANCE_YOUR_CALM RESOURCE_EXHAUSTED, INADEQUATE_SECURITY
  PERMISSION_DENIED, any other INTERNAL; a connection that failed or closed is
  UNAVAILABLE; a TLS failure, a failed name lookup and an answer that is not HTTP/2 keep
  their own classes (`tls_error`, `dns_error`, `protocol_error`), as `classify_grpc_code`
  gives them for grpc core's details;
* the deadline is the call's (`grpc-timeout`, rounded up, tells the server); past it,
  DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import socket
import ssl
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from grpc_health.v1 import health_pb2

from probes.clients import _h2base, _h2lean
from probes.clients._base import USER_AGENT, host_port, inner_budget_s, keepalive_s
from probes.clients._classify import (
    classify_exception,
    classify_grpc_code,
    exception_chain,
    parse_count,
)
from probes.clients._connection import (
    MAX_RECEIVE_BYTES,
    EndpointPool,
    grpc_credentials,
    ssl_context,
)
from probes.errors import BadInput
from probes.spec import GrpcSpec, PathSpec
from probes.types import CallOutcome, Endpoint, Outcome

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_SERVING = health_pb2.HealthCheckResponse(
    status=health_pb2.HealthCheckResponse.SERVING
).SerializeToString()
APP_ATTEMPTS_KEY = "x-app-attempts"

_Metadata = Sequence[tuple[str, str | bytes]]
# Initial or trailing metadata as a client library hands it back (None: none arrived).
_AnyMetadata: TypeAlias = "Iterable[tuple[str, str | bytes]] | None"


class GrpcProber:
    """gRPC unary calls (or health checks) for one path, one connection per endpoint."""

    def __init__(self, path: PathSpec) -> None:
        spec = path.grpc
        if spec is None:
            raise BadInput(f"path {path.name}: not a gRPC path")
        self._path = path
        self._spec = spec
        self._health = spec.health_service is not None
        self._method = HEALTH_CHECK if self._health else spec.method
        if not self._method.startswith("/") or self._method.count("/") != 2:
            raise BadInput(f"path {path.name}: grpc.method must look like /pkg.Service/Method")
        self._request = (
            health_pb2.HealthCheckRequest(service=spec.health_service).SerializeToString()
            if spec.health_service is not None
            else spec.request
        )
        self._expected = frozenset(c.upper() for c in path.expect.grpc_codes)
        self._budget = inner_budget_s(path.timeout_s)
        self._metadata = tuple((k.lower(), v) for k, v in spec.metadata.items())
        self._attempt_keys = tuple(dict.fromkeys((path.attempts_header.lower(), APP_ATTEMPTS_KEY)))
        self._cohort_key = path.cohort_header.lower() if path.cohort_header else None
        if spec.tls is not None:
            # The TLS rules of a gRPC path are grpc.aio's, as for its held streams: a path
            # means the same on either (insecure_skip_verify is refused).
            grpc_credentials(spec.tls, where=f"path {path.name}")
        self._scheme = "https" if spec.tls else "http"
        self._ssl = ssl_context(spec.tls, where=f"path {path.name}") if spec.tls else None
        if self._ssl is not None:
            self._ssl.set_alpn_protocols(["h2"])
        self._server_name = spec.tls.server_name if spec.tls else None
        self._h2 = _h2base.H2Settings(
            connect_budget_s=self._budget,
            read_budget_s=self._budget,
            keepalive_s=keepalive_s(path.rate_per_s),
            body_limit=MAX_RECEIVE_BYTES + 6,
            wanted=frozenset(
                (*STATUS_KEYS,
                 *(k.encode("latin-1") for k in (*self._attempt_keys, self._cohort_key) if k))
            ),
            keep_body=True,
        )
        self._body = frame_message(self._request)
        self._lean_headers("localhost")  # a metadata entry that cannot be sent: bad input
        self._pool: EndpointPool[_h2lean.H2Client] = EndpointPool(self._connect, self._disconnect)

    @property
    def spec(self) -> GrpcSpec:
        return self._spec

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome:
        try:
            endpoint.port_for(self._path.port)
        except LookupError as exc:
            return CallOutcome(Outcome.PROBE_ERROR, detail=str(exc))
        metadata = (*self._metadata, ("x-request-id", request_id))
        deadline = asyncio.get_running_loop().time() + self._budget
        async with self._pool.use(endpoint) as lease:
            first = await self._once(lease.client, metadata, deadline)
            if not isinstance(first, Unprocessed):
                return first
            # Never seen by the server: re-send once, on a connection of its own.
            self._pool.retire(lease)
        async with self._pool.use(endpoint) as lease:
            again = await self._once(lease.client, metadata, deadline)
        if isinstance(again, Unprocessed):
            again = again.outcome
        note = f"re-sent on a fresh connection: {first.outcome.detail}"
        return dataclasses.replace(
            again, churn=1, detail=f"{note}; {again.detail}" if again.detail else note
        )

    def forget(self, endpoint: Endpoint) -> None:
        self._pool.forget(endpoint)

    async def aclose(self) -> None:
        await self._pool.aclose()

    def _connect(self, endpoint: Endpoint) -> _h2lean.H2Client:
        port = endpoint.port_for(self._path.port)
        return _h2lean.H2Client(
            endpoint.host, port, self._lean_headers(host_port(endpoint.host, port)),
            self._body, self._h2, ssl_context=self._ssl, server_name=self._server_name,
        )

    def _lean_headers(self, authority: str) -> list[_h2base.Header]:
        try:
            return request_headers(
                self._scheme, authority, self._method, self._metadata, USER_AGENT
            )
        except (ValueError, UnicodeEncodeError) as exc:
            raise BadInput(f"path {self._path.name}: grpc: {exc}") from exc

    @staticmethod
    async def _disconnect(client: _h2lean.H2Client) -> None:
        await client.aclose()

    async def _once(
        self, client: _h2lean.H2Client, metadata: _Metadata, deadline: float
    ) -> CallOutcome | Unprocessed:
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.001)
        request_id = metadata[-1][1]
        rid = request_id if isinstance(request_id, bytes) else request_id.encode("latin-1")
        extra = [timeout_header(remaining), (b"x-request-id", rid)]
        try:  # the connection's timer carries the deadline
            answer = await client.request(extra, deadline=deadline)
            reply = read_reply(answer, MAX_RECEIVE_BYTES)
        except _h2base.H2Error as exc:
            reply = error_reply(exc)
        except Exception as exc:
            kind, detail = classify_exception(exc)
            return CallOutcome(kind, detail=detail)
        attempts = self._attempts(reply.initial, reply.trailing)
        cohort = self._cohort(reply.initial, reply.trailing)
        code, detail = reply.code, reply.detail
        if code == "OK" and reply.message is None:
            code, detail = "INTERNAL", "status OK without a message"
        outcome = reply.outcome or classify_grpc_code(code, self._expected, detail)
        if code == "OK" and self._health and outcome == Outcome.OK:
            assert reply.message is not None
            serving = _serving_status(reply.message)
            if serving != "SERVING":
                outcome, detail = Outcome.UNEXPECTED_STATUS, f"health status {serving}"
        result = CallOutcome(outcome, status=CODES[code], attempts=attempts,
                             cohort_hint=cohort, detail=detail)
        return Unprocessed(result) if reply.unprocessed else result

    def _attempts(self, *metadata: _AnyMetadata) -> int | None:
        for key in self._attempt_keys:
            count = parse_count(_lookup(key, metadata))
            if count is not None:
                return count
        return None

    def _cohort(self, *metadata: _AnyMetadata) -> str | None:
        return _lookup(self._cohort_key, metadata) if self._cohort_key else None


@dataclasses.dataclass(frozen=True, slots=True)
class Unprocessed:
    """A call the server provably never saw: re-sent once, on a fresh connection."""

    outcome: CallOutcome


def _lookup(key: str, metadata: Sequence[_AnyMetadata]) -> str | None:
    """The first text value of `key` in initial, then trailing metadata."""
    for md in metadata:
        if md is None:
            continue
        for name, value in md:
            if name == key:
                return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def _serving_status(response: bytes) -> str:
    if response == _SERVING:
        return "SERVING"
    try:
        status = health_pb2.HealthCheckResponse.FromString(response).status
    except Exception:  # a malformed answer is an answer we did not expect
        return "UNPARSEABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(status))


# gRPC status codes by name, as grpc.StatusCode numbers them.
CODES = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}
NAMES = {v: k for k, v in CODES.items()}
_HTTP_TO_GRPC = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "UNIMPLEMENTED", 429: "UNAVAILABLE", 502: "UNAVAILABLE",
                 503: "UNAVAILABLE", 504: "UNAVAILABLE"}
_RST_TO_GRPC = {8: "CANCELLED", 11: "RESOURCE_EXHAUSTED", 12: "PERMISSION_DENIED"}
_REFUSED_STREAM = 7
STATUS_KEYS = (b"grpc-status", b"grpc-message", b"content-type", b"grpc-encoding")


@dataclass(frozen=True, slots=True)
class Reply:
    """One unary call's end: the status code name, its detail, the message (None: no whole
    message), the metadata the prober reads, and whether the server provably never saw it."""

    code: str
    detail: str
    message: bytes | None = None
    initial: tuple[tuple[str, str], ...] = ()
    trailing: tuple[tuple[str, str], ...] = ()
    unprocessed: bool = False
    # Set when the outcome class is not the code's own (tls_error, dns_error, ...).
    outcome: str | None = None


def request_headers(
    scheme: str, authority: str, method: str, metadata: tuple[tuple[str, str], ...],
    user_agent: str,
) -> list[_h2base.Header]:
    headers: list[tuple[str, str]] = [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", user_agent),
        *metadata,
    ]
    return _h2base.request_headers("POST", scheme, authority, method, headers)


def frame_message(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def timeout_header(seconds: float) -> _h2base.Header:
    """`grpc-timeout` in whole milliseconds, rounded up as grpc core and grpc-go round it
    (so the server's deadline never falls before the call's), at most 8 digits."""
    return b"grpc-timeout", f"{min(max(math.ceil(seconds * 1000), 1), 99_999_999)}m".encode()


def read_reply(answer: _h2base.H2Answer, max_receive: int) -> Reply:
    initial = tuple(answer.headers.items())
    trailing = tuple(answer.trailers.items())
    if answer.status != 200:
        code = _HTTP_TO_GRPC.get(answer.status, "UNKNOWN")
        return Reply(code, f"Received http2 header with status: {answer.status}",
                     initial=initial, trailing=trailing)
    if isinstance(answer.received, BaseException):
        failed = error_reply(answer.received)
        return Reply(failed.code, failed.detail, initial=initial, trailing=trailing,
                     outcome=failed.outcome)
    status = answer.trailers.get("grpc-status") or answer.headers.get("grpc-status")
    text = answer.trailers.get("grpc-message") or answer.headers.get("grpc-message") or ""
    detail = urllib.parse.unquote(text)
    if status is None:
        return Reply("UNKNOWN", "no grpc-status in the answer", initial=initial,
                     trailing=trailing)
    try:
        code = NAMES.get(int(status), "UNKNOWN")
    except ValueError:
        code = "UNKNOWN"
    body = answer.body
    message: bytes | None = None
    if len(body) >= 5:
        length = int.from_bytes(body[1:5], "big")
        if length > max_receive:
            return Reply("RESOURCE_EXHAUSTED",
                         f"Received message larger than max ({length} vs. {max_receive})",
                         initial=initial, trailing=trailing)
        if body[0] & 1 and "grpc-encoding" not in answer.headers:
            return Reply("INTERNAL", "Compression bit set but no encoding (grpc-encoding)",
                         initial=initial, trailing=trailing)
        if len(body) >= 5 + length:
            message = body[5 : 5 + length]
    return Reply(code, detail, message, initial=initial, trailing=trailing)


def error_reply(exc: BaseException) -> Reply:
    """A transport failure as grpc core would name it: UNAVAILABLE with what happened, or
    a class of its own (tls, dns, protocol) from the same rules as for HTTP."""
    kind, detail = classify_exception(exc)
    unprocessed = False
    for link in exception_chain(exc):
        if isinstance(link, _h2base.H2Error) and link.replay is not None:
            unprocessed = link.replay[0].value == "unprocessed"
            detail = f"{detail}; {link.replay[1]}"
    if kind in (Outcome.TLS_ERROR, Outcome.DNS_ERROR, Outcome.PROTOCOL_ERROR):
        return Reply("UNAVAILABLE", detail, outcome=kind)
    for link in exception_chain(exc):
        if isinstance(link, _h2base.StreamReset):
            if link.code == _REFUSED_STREAM:
                return Reply("UNAVAILABLE", detail, unprocessed=unprocessed)
            return Reply(_RST_TO_GRPC.get(link.code, "INTERNAL"), detail)
        if isinstance(link, _h2base.ConnectTimedOut):
            return Reply("DEADLINE_EXCEEDED", f"Deadline Exceeded (no connection yet): {detail}")
        if isinstance(link, _h2base.DeadlineExceeded):
            return Reply("DEADLINE_EXCEEDED", str(link))
        if isinstance(link, _h2base.ReadTimedOut):
            return Reply("DEADLINE_EXCEEDED", detail)
        if isinstance(link, socket.gaierror):
            return Reply("UNAVAILABLE", detail, outcome=Outcome.DNS_ERROR)
        if isinstance(link, ssl.SSLError):
            return Reply("UNAVAILABLE", detail, outcome=Outcome.TLS_ERROR)
    return Reply("UNAVAILABLE", detail, unprocessed=unprocessed)
