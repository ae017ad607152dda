"""The pure parts of the clients: status and code classes, the exception-chain rules, header
counts, and the HTTP/2 frame scanner that finds GOAWAY in a byte stream.

The exceptions here are built the way the libraries chain them (seen on real servers in
test_clients_http.py), to pin down the priority between a wrapper and what it wraps.
"""

from __future__ import annotations

import itertools
import socket
import ssl

import httpcore
import httptools
import httpx
import pytest

from probes.clients import classify_exception, classify_grpc_code, classify_status
from probes.clients._classify import parse_count
from probes.clients._h1 import (
    ConnectFailed,
    ConnectTimedOut,
    Disconnected,
    MalformedAnswer,
    ReadTimedOut,
)
from probes.types import Outcome
from tests.reference.httpcore_h2 import FrameScanner


@pytest.mark.parametrize(
    ("status", "expected", "outcome"),
    [
        (200, {200}, Outcome.OK),
        (201, {200}, Outcome.UNEXPECTED_STATUS),
        (301, {200}, Outcome.UNEXPECTED_STATUS),
        (404, {200}, Outcome.HTTP_4XX),
        (404, {200, 404}, Outcome.OK),
        (500, {200}, Outcome.HTTP_5XX),
        (599, {200}, Outcome.HTTP_5XX),
        (600, {200}, Outcome.UNEXPECTED_STATUS),
    ],
)
def test_classify_status(status, expected, outcome):
    assert classify_status(status, expected) == outcome


def test_classify_grpc_code():
    assert classify_grpc_code("OK", {"OK"}) == Outcome.OK
    assert classify_grpc_code("UNAVAILABLE", {"OK"}) == "grpc_UNAVAILABLE"
    assert classify_grpc_code("NOT_FOUND", {"OK", "NOT_FOUND"}) == Outcome.OK
    tls = "last error: UNAVAILABLE: ipv4:127.0.0.1:1: Unwrap failed (TSI_DATA_CORRUPTED)"
    assert classify_grpc_code("UNAVAILABLE", {"OK"}, tls) == Outcome.TLS_ERROR
    refused = "last error: UNAVAILABLE: ipv4:127.0.0.1:1: Connection refused"
    assert classify_grpc_code("UNAVAILABLE", {"OK"}, refused) == "grpc_UNAVAILABLE"


@pytest.mark.parametrize(
    ("value", "count"),
    [(None, None), ("3", 3), (" 2 ", 2), ("0", 0), ("-1", None), ("many", None), ("", None)],
)
def test_parse_count(value, count):
    assert parse_count(value) == count


def chained(*excs: BaseException) -> BaseException:
    """Raise excs[-1] from ... from excs[0], as the libraries do; return the outermost."""
    for inner, outer in itertools.pairwise(excs):
        outer.__cause__ = inner
    return excs[-1]


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        # A wrapper that names a symptom loses to what it wraps.
        (chained(Disconnected("x"), httpx.ConnectTimeout("x")), Outcome.RESET),
        (
            chained(ConnectionRefusedError(111, "refused"), httpx.ConnectTimeout("x")),
            Outcome.CONNECT_REFUSED,
        ),
        # The HTTP/1.1 transport's own errors (probes.clients._h1).
        (chained(TimeoutError(), ConnectTimedOut("x")), Outcome.CONNECT_TIMEOUT),
        (ReadTimedOut("x"), Outcome.TIMEOUT),
        (chained(ConnectionRefusedError(111, "refused"), ConnectFailed("x")),
         Outcome.CONNECT_REFUSED),
        (chained(OSError(113, "no route to host"), ConnectFailed("x")), Outcome.CONNECT_REFUSED),
        (chained(socket.gaierror(-2, "Name or service not known"), ConnectFailed("x")),
         Outcome.DNS_ERROR),
        (chained(ssl.SSLEOFError("eof"), ConnectFailed("x")), Outcome.TLS_ERROR),
        (chained(ConnectionResetError(104, "reset"), Disconnected("x")), Outcome.RESET),
        (Disconnected("server disconnected before answering"), Outcome.RESET),
        (chained(httptools.HttpParserInvalidStatusError("bad"), MalformedAnswer("x")),
         Outcome.PROTOCOL_ERROR),
        (chained(TimeoutError(), httpcore.ConnectTimeout()), Outcome.CONNECT_TIMEOUT),
        (chained(ConnectionResetError(104, "reset"), httpcore.ReadError()), Outcome.RESET),
        (httpcore.RemoteProtocolError("Server disconnected"), Outcome.RESET),
        (httpcore.RemoteProtocolError("illegal status line"), Outcome.PROTOCOL_ERROR),
        (
            chained(ssl.SSLCertVerificationError("bad cert"), httpcore.ConnectError()),
            Outcome.TLS_ERROR,
        ),
        # A TLS session cut short after the handshake is a reset; during it, a TLS failure.
        (chained(ssl.SSLEOFError("eof"), httpcore.ReadError()), Outcome.RESET),
        (chained(ssl.SSLEOFError("eof"), httpcore.ConnectError()), Outcome.TLS_ERROR),
        (httpx.ReadTimeout("x"), Outcome.TIMEOUT),
        # httpcore's "connection went away": a reset, unless its cause says more.
        (httpcore.ReadError("x"), Outcome.RESET),
        (chained(ConnectionRefusedError(111, "refused"), httpcore.ReadError("x")),
         Outcome.CONNECT_REFUSED),
        (ValueError("a bug"), Outcome.PROBE_ERROR),
    ],
)
def test_classify_exception_lets_the_most_specific_fact_win(exc, outcome):
    assert classify_exception(exc)[0] == outcome


def test_detail_names_the_deciding_exception_in_one_bounded_line():
    exc = chained(
        ConnectionResetError(104, "Connection reset by peer\n" + "x" * 500),
        httpx.ConnectTimeout("x"),
    )
    outcome, detail = classify_exception(exc)
    assert outcome == Outcome.RESET
    assert detail.startswith("ConnectionResetError:")
    assert "\n" not in detail and len(detail) <= 240


def frame(kind: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, 0]) + stream.to_bytes(4, "big") + payload


GOAWAY = frame(0x7, 0, (3).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"drain")
WIRE = (
    frame(0x4, 0, b"\x00" * 6)  # SETTINGS
    + frame(0x1, 1, b"\x88")  # HEADERS
    + frame(0x0, 1, bytes([0x7]) * 40000)  # DATA, with bytes that look like a GOAWAY type
    + GOAWAY
    + frame(0x1, 3, b"\x88")
)


@pytest.mark.parametrize("chunk", [1, 2, 7, 9, 17, 1000, len(WIRE)])
def test_frame_scanner_finds_goaway_across_any_read_boundaries(chunk):
    scanner = FrameScanner()
    for start in range(0, len(WIRE), chunk):
        scanner.feed(WIRE[start : start + chunk])
        if start + chunk < len(WIRE) - len(GOAWAY) - 10:
            assert scanner.goaway is None
    assert scanner.goaway == (3, 0)
    assert not scanner.answered_http1


def test_frame_scanner_keeps_the_last_goaway():
    scanner = FrameScanner()
    first = frame(0x7, 0, (2**31 - 1).to_bytes(4, "big") + (0).to_bytes(4, "big"))
    second = frame(0x7, 0, (5).to_bytes(4, "big") + (2).to_bytes(4, "big"))
    scanner.feed(first + second)
    assert scanner.goaway == (5, 2)


def test_frame_scanner_notices_an_http1_answer():
    scanner = FrameScanner()
    scanner.feed(b"HT")
    scanner.feed(b"TP/1.1 400 Bad Request\r\n\r\n")
    assert scanner.answered_http1


def from_none(wrapped: BaseException, outer: BaseException) -> BaseException:
    """`outer(wrapped)` re-raised `from None`, as httpcore's connection pool does."""
    outer.__cause__ = None
    outer.__suppress_context__ = True
    return outer


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        # httpcore keeps what it mapped only as the first argument.
        (
            from_none(err := ssl.SSLError(1, "WRONG_VERSION_NUMBER"), httpcore.ConnectError(err)),
            Outcome.TLS_ERROR,
        ),
        (
            from_none(err := socket.gaierror(-2, "Name or service not known"),
                      httpcore.ConnectError(err)),
            Outcome.DNS_ERROR,
        ),
        (httpcore.ConnectError("[Errno 113] No route to host"), Outcome.CONNECT_REFUSED),
    ],
)
def test_what_a_wrapper_holds_as_its_argument_is_read_too(exc, outcome):
    assert classify_exception(exc)[0] == outcome


@pytest.mark.parametrize(
    ("code", "detail", "outcome"),
    [
        ("UNAVAILABLE", "errors resolving nohost.invalid:80: [... Domain name not found]",
         Outcome.DNS_ERROR),
        ("UNKNOWN", "Stream removed (Failed parsing HTTP/2 (Frame size 16777215 is larger "
                    "than max frame size 4194304))", Outcome.PROTOCOL_ERROR),
        ("INTERNAL", "Stream removed (Failed parsing HTTP/2 (Illegal hpack op code))",
         Outcome.PROTOCOL_ERROR),
        ("UNAVAILABLE", "failed to connect to all addresses; last error: INTERNAL: ipv4:"
                        "127.0.0.1:1: Failed parsing HTTP/2 (Expected SETTINGS frame as the "
                        "first frame, got frame type 80)", Outcome.PROTOCOL_ERROR),
        ("INTERNAL", "Compression bit set but no encoding configured", "grpc_INTERNAL"),
    ],
)
def test_grpc_codes_that_grpc_core_explains_as_dns_or_http2_failures(code, detail, outcome):
    assert classify_grpc_code(code, {"OK"}, detail) == outcome


def test_frame_scanner_notes_the_first_frame_above_the_max_frame_size():
    scanner = FrameScanner()
    scanner.feed(frame(0x0, 1, b"x" * 16384))
    assert not scanner.oversized
    scanner.feed(b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + b"x" * 16)
    scanner.feed(frame(0x0, 1, b"x" * 20000))
    assert scanner.oversized == 0xFFFFFF
