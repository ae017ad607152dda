"""Outcome classes from what the wire said: HTTP statuses, gRPC codes and library errors.

This is the one place that knows the exception types of the HTTP/1.1 transport (`_h1`),
httpcore, h2, httptools, ssl and the OS. A prober catches whatever its library raised and
asks `classify_exception` for the outcome class and a one-line detail, so library errors
stop at this edge. httpcore's and httpx's rules serve the HTTP/2 reference the tests prove
the probe's own client against (`tests/reference/`): one rule book for both.

Library wrappers are not trusted on their own: httpx re-raises httpcore's errors as its
own, and a wrapper may name a symptom (a connect error) where what it wraps names the cause
(a refused connection, a TLS alert). The rules below therefore look at the whole
`__cause__`/`__context__` chain and let the most specific fact win (a
`ConnectionResetError` anywhere in the chain is a reset, whatever wraps it), in a fixed
priority order.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Collection, Iterator

import h2.events
import h2.exceptions
import httpcore
import httptools
import httpx

from probes.clients import _h1, _h2base
from probes.types import Outcome

# HTTP/2 error codes (RFC 9113 §7) that say the peer found the exchange malformed; any other
# code on a GOAWAY or RST_STREAM means the connection or stream was torn down: a reset.
_H2_PROTOCOL_CODES = frozenset({1, 6, 9})  # PROTOCOL_ERROR, FRAME_SIZE_ERROR, COMPRESSION_ERROR

# httpcore reports a connection that closed early as a RemoteProtocolError with one of these
# messages (HTTP/2, HTTP/1.1 before the response, HTTP/1.1 mid-body).
_CLOSED_MESSAGES = ("Server disconnected", "peer closed connection")

_DETAIL_MAX = 240

# grpc core fails an RPC UNAVAILABLE when TLS fails under it, naming its transport security
# layer (TSI) in the detail: "Tls handshake failed (TSI_PROTOCOL_FAILURE): ...
# CERTIFICATE_VERIFY_FAILED" (a server it does not trust), "Unwrap failed
# (TSI_DATA_CORRUPTED)" (a TLS alert after the handshake: the server refused our client
# certificate, or wanted one).
_GRPC_TLS_MARKERS = ("tls handshake failed", "ssl handshake failed", "(tsi_")
# ... and names a failed name lookup ("errors resolving host:port: ... Domain name not
# found"; older releases: "DNS resolution failed"), or an HTTP/2 stream it could not parse
# ("Failed parsing HTTP/2 (Frame size ... is larger than max frame size ...)", "(Illegal
# hpack op code)", "(Expected SETTINGS frame as the first frame ...)" from an HTTP/1.1
# server), under UNAVAILABLE, UNKNOWN or INTERNAL depending on where it noticed.
_GRPC_DNS_MARKERS = ("errors resolving", "dns resolution failed")
_GRPC_PROTOCOL_MARKERS = ("failed parsing http/2",)


def classify_status(status: int, expected: Collection[int]) -> str:
    """An HTTP status as an outcome: expected → ok, else 5xx / 4xx / unexpected."""
    if status in expected:
        return Outcome.OK
    if 500 <= status <= 599:
        return Outcome.HTTP_5XX
    if 400 <= status <= 499:
        return Outcome.HTTP_4XX
    return Outcome.UNEXPECTED_STATUS


def classify_grpc_code(code_name: str, expected: Collection[str], detail: str = "") -> str:
    """A gRPC status code name (`"UNAVAILABLE"`) as an outcome; an UNAVAILABLE that grpc
    core explains as a TLS failure is `tls_error`, and a name lookup that failed is
    `dns_error`, as the same failures are over HTTP; so is an answer grpc core could not
    parse as HTTP/2 (`protocol_error`), whatever code it reported."""
    if code_name in expected:
        return Outcome.OK
    lowered = detail.lower()
    if code_name == "UNAVAILABLE" and any(m in lowered for m in _GRPC_TLS_MARKERS):
        return Outcome.TLS_ERROR
    if code_name == "UNAVAILABLE" and any(m in lowered for m in _GRPC_DNS_MARKERS):
        return Outcome.DNS_ERROR
    if any(m in lowered for m in _GRPC_PROTOCOL_MARKERS):
        return Outcome.PROTOCOL_ERROR
    return Outcome.grpc(code_name)


def parse_count(value: str | None) -> int | None:
    """A non-negative integer header value, or None when absent or not a number."""
    if value is None:
        return None
    try:
        count = int(value.strip())
    except ValueError:
        return None
    return count if count >= 0 else None


def describe(exc: BaseException) -> str:
    """`Type: message`, one line, bounded, for CallOutcome.detail."""
    message = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= _DETAIL_MAX else text[: _DETAIL_MAX - 1] + "…"


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it was raised from or while handling, outermost first.

    An exception that wraps another as its first argument leads there too: httpcore maps
    `ssl.SSLError` and `socket.gaierror` to `ConnectError(original)`, and its connection pool
    re-raises that `from None`, which drops the cause but not the argument.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        wrapped = current.args[0] if current.args else None
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        ) or (wrapped if isinstance(wrapped, BaseException) else None)


def _h2_event(exc: BaseException) -> h2.events.Event | None:
    """The h2 event httpcore put in a RemoteProtocolError (GOAWAY or RST_STREAM), if any."""
    if isinstance(exc, httpcore.RemoteProtocolError) and exc.args:
        event = exc.args[0]
        if isinstance(event, h2.events.ConnectionTerminated | h2.events.StreamReset):
            return event
    return None


def _h2_code(event: h2.events.Event) -> int:
    code = getattr(event, "error_code", None)
    return int(code) if code is not None else 0


def _rule(exc: BaseException) -> tuple[int, str] | None:
    """(priority, outcome) for one exception of the chain; lower priority number wins."""
    if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        # The peer closed under TLS: a failed handshake if we were still connecting (see
        # classify_exception), otherwise an established connection that went away.
        return 4, Outcome.RESET
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return 0, Outcome.TLS_ERROR
    if isinstance(exc, _h1.ConnectTimedOut | _h2base.ConnectTimedOut | httpcore.ConnectTimeout):
        return 1, Outcome.CONNECT_TIMEOUT
    if isinstance(exc, ConnectionRefusedError):
        return 2, Outcome.CONNECT_REFUSED
    if isinstance(exc, socket.gaierror):
        # The lookup failed (`_h1` and httpcore both keep the gaierror in the chain).
        return 2, Outcome.DNS_ERROR
    if isinstance(exc, _h1.ReadTimedOut | _h2base.ReadTimedOut | httpcore.TimeoutException):
        return 3, Outcome.TIMEOUT
    if isinstance(exc, _h2base.StreamReset):
        return 4, Outcome.PROTOCOL_ERROR if exc.code in _H2_PROTOCOL_CODES else Outcome.RESET
    event = _h2_event(exc)
    if event is not None:
        protocol = _h2_code(event) in _H2_PROTOCOL_CODES
        return 4, Outcome.PROTOCOL_ERROR if protocol else Outcome.RESET
    if isinstance(
        exc,
        ConnectionResetError
        | BrokenPipeError
        | ConnectionAbortedError
        | _h1.Disconnected
        | _h2base.Disconnected,
    ):
        return 4, Outcome.RESET
    if isinstance(exc, httpcore.RemoteProtocolError) and str(exc).startswith(_CLOSED_MESSAGES):
        return 4, Outcome.RESET
    if isinstance(exc, _h1.ConnectFailed | _h2base.ConnectFailed | httpcore.ConnectError):
        # Unreachable host or network: the endpoint could not be connected to at all.
        return 5, Outcome.CONNECT_REFUSED
    if isinstance(
        exc,
        _h1.MalformedAnswer
        | _h2base.MalformedAnswer
        | httptools.HttpParserError
        | httpcore.ProtocolError
        | h2.exceptions.ProtocolError,
    ):
        return 6, Outcome.PROTOCOL_ERROR
    if isinstance(exc, httpcore.NetworkError):
        # An established connection went away; a cause in the chain may say more.
        return 7, Outcome.RESET
    # Wrapper types last: only trusted when nothing underneath says more.
    if isinstance(exc, httpx.ConnectTimeout):
        return 8, Outcome.CONNECT_TIMEOUT
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return 9, Outcome.TIMEOUT
    if isinstance(exc, httpx.ConnectError):
        return 9, Outcome.CONNECT_REFUSED
    if isinstance(exc, httpx.ProtocolError):
        return 9, Outcome.PROTOCOL_ERROR
    if isinstance(exc, httpx.NetworkError | OSError):
        return 9, Outcome.RESET
    return None


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """The outcome class of a failed call and a one-line detail naming the deciding error.

    Anything no rule knows is `probe_error`: the probe, not the callee, is then at fault
    until a rule says otherwise.
    """
    chain = list(exception_chain(exc))
    best: tuple[int, str, BaseException] | None = None
    for link in chain:
        rule = _rule(link)
        if rule is not None and (best is None or rule[0] < best[0]):
            best = (rule[0], rule[1], link)
    if best is None:
        return Outcome.PROBE_ERROR, describe(exc)
    outcome, decider = best[1], best[2]
    if isinstance(decider, ssl.SSLEOFError | ssl.SSLZeroReturnError) and any(
        isinstance(link, _h1.ConnectFailed | _h2base.ConnectFailed | httpcore.ConnectError)
        for link in chain
    ):
        outcome = Outcome.TLS_ERROR
    return outcome, describe(decider)
