"""gRPC unary over the probe's own HTTP/2 client (`_h2lean`): the wire protocol, and grpc
core's way of naming what went wrong.

A unary call is one HTTP/2 POST (PROTOCOL-HTTP2.md in grpc/grpc): `content-type:
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

import math
import socket
import ssl
import urllib.parse
from dataclasses import dataclass

from probes.clients import _h2base
from probes.clients._classify import classify_exception, exception_chain
from probes.types import Outcome

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


def frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def timeout_header(seconds: float) -> _h2base.Header:
    """`grpc-timeout` in whole milliseconds, rounded up as grpc core and grpc-go round it
    (so the server's deadline never falls before the call's), at most 8 digits."""
    return b"grpc-timeout", f"{min(max(math.ceil(seconds * 1000), 1), 99_999_999)}m".encode()


def reply(answer: _h2base.H2Answer, max_receive: int) -> Reply:
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
