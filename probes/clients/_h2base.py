"""What the lean HTTP/2 client's modules share: its errors, settings and answer, the
request's header list and the codes' names (`_h2lean` holds the client, `_h2own` the
connection, `_h2frames` the codec; each imports this, none another's internals).

Errors, mapped to outcome classes by `_classify` (gRPC's names by `_grpc`); `replay`
says whether and why the request may be re-sent (None: it may not):

    H2Error                 `replay`: (Replay, reason) or None
    ├── ConnectFailed       TCP or TLS set-up failed (the OSError or SSLError is the cause)
    │   └── ConnectTimedOut
    ├── Disconnected        the connection closed or was reset before the answer ended
    ├── ReadTimedOut        no byte from the server for the read budget
    │   └── DeadlineExceeded  the call's own deadline passed (gRPC's)
    ├── StreamReset         RST_STREAM, or GOAWAY with an error code (`code`)
    └── MalformedAnswer     not HTTP/2, or HTTP/2 that breaks the protocol
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import h2.errors

from probes.clients._base import Replay

__all__ = [
    "PROTOCOL_CODES",
    "REFUSED_STREAM",
    "WINDOW",
    "ConnectFailed",
    "ConnectTimedOut",
    "DeadlineExceeded",
    "Disconnected",
    "H2Answer",
    "H2Error",
    "H2Settings",
    "Header",
    "MalformedAnswer",
    "ReadTimedOut",
    "StreamReset",
    "code_name",
    "replay_reason",
    "request_headers",
]

WINDOW = 1 << 24
REFUSED_STREAM = 0x7
# The peer found the exchange malformed; any other code tears the stream down: a reset.
PROTOCOL_CODES = frozenset({1, 6, 9})  # PROTOCOL_ERROR, FRAME_SIZE_ERROR, COMPRESSION_ERROR

Header = tuple[bytes, bytes]


class H2Error(Exception):
    replay: tuple[Replay, str] | None = None


class ConnectFailed(H2Error):
    pass


class ConnectTimedOut(ConnectFailed):
    pass


class Disconnected(H2Error):
    pass


class ReadTimedOut(H2Error):
    pass


class DeadlineExceeded(ReadTimedOut):
    """The call's own deadline passed (gRPC's, carried by the connection's timer)."""


class StreamReset(H2Error):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class MalformedAnswer(H2Error):
    pass


@dataclass(frozen=True, slots=True)
class H2Settings:
    """What every connection of one path shares."""

    connect_budget_s: float
    read_budget_s: float
    keepalive_s: float
    body_limit: int
    # Answer headers the prober reads (lower-case); the rest are skipped unread.
    wanted: frozenset[bytes]
    # Keep the body's bytes (gRPC reads its message), not only their count.
    keep_body: bool = False


@dataclass(frozen=True, slots=True)
class H2Answer:
    status: int
    headers: Mapping[str, str]
    # Body bytes read (at most about body_limit), or what cut the body short.
    received: int | BaseException
    # Trailers (wanted names only), for gRPC.
    trailers: Mapping[str, str]
    # The body, when the settings keep it (at most about body_limit bytes).
    body: bytes = b""


def code_name(code: int) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return f"error code {code}"


def request_headers(
    method: str, scheme: str, authority: str, target: str, headers: list[tuple[str, str]]
) -> list[Header]:
    """The request's header list, checked once: raises ValueError for a header HTTP/2
    forbids (connection-specific, RFC 9113 §8.2.2) or that has a line break or NUL."""
    out: list[Header] = [
        (b":method", method.encode("ascii")),
        (b":scheme", scheme.encode("ascii")),
        (b":authority", authority.encode("ascii")),
        (b":path", target.encode("ascii")),
    ]
    for name, value in headers:
        low = name.lower()
        if not low or set(low) & set("\r\n\0 :") or set(value) & set("\r\n\0"):
            raise ValueError(f"header {name!r} cannot be sent")
        if low in ("connection", "keep-alive", "proxy-connection", "transfer-encoding",
                   "upgrade") or (low == "te" and value.lower() != "trailers"):
            raise ValueError(f"header {name!r} is connection-specific: HTTP/2 forbids it")
        if low == "host":
            out[2] = (b":authority", value.encode("latin-1"))
            continue
        out.append((low.encode("latin-1"), value.encode("latin-1")))
    return out


def replay_reason(exc: BaseException) -> tuple[Replay, str] | None:
    return exc.replay if isinstance(exc, H2Error) else None
