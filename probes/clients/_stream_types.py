"""What a held stream reports: how it ended (classified once, here), and the sink seam.

The end reasons and the rule that classifies grpc core's status details are shared by the
prober (`probes.clients._streams`), the recorder and the storm and lifetime analyses
(`probes.streams`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Protocol

from probes.types import Endpoint, Outcome

__all__ = [
    "EndReason",
    "OpenStream",
    "StreamEnd",
    "StreamSink",
    "classify_stream_end",
]


class EndReason:
    """How a stream ended, named once.

    Resets (counted in `skewprobe_stream_resets_total` and per stream-hour): an *established*
    stream that ended with `goaway`, `rst_stream`, `connection_reset`, `protocol_error` (the
    server sent HTTP/2 grpc core could not parse), `deadline`, `cancelled` or any other
    non-OK status (`grpc_<CODE>`).
    Not resets: `server_closed_ok` (the server finished the stream with OK),
    `client_rotated` (the probe's own max lifetime), `client_stopped` (the probe shut down,
    or a removed endpoint's stream outlived the linger time), and `refused`, which only a
    stream that never opened can have (no connection: an open failure, not a reset), and
    `probe_error` (a bug in the probe is logged, never blamed on the callee).
    Any reason can end a stream that never opened; those are open failures, never resets.
    """

    GOAWAY: Final = "goaway"
    RST_STREAM: Final = "rst_stream"
    CONNECTION_RESET: Final = "connection_reset"
    DEADLINE: Final = "deadline"
    CANCELLED: Final = "cancelled"
    SERVER_CLOSED_OK: Final = "server_closed_ok"
    REFUSED: Final = "refused"
    CLIENT_ROTATED: Final = "client_rotated"
    CLIENT_STOPPED: Final = "client_stopped"

    PROTOCOL_ERROR: Final = Outcome.PROTOCOL_ERROR
    PROBE_ERROR: Final = Outcome.PROBE_ERROR

    NOT_RESETS: Final = frozenset(
        {SERVER_CLOSED_OK, REFUSED, CLIENT_ROTATED, CLIENT_STOPPED, PROBE_ERROR}
    )
    # Ends the probe caused: the stream's lifetime says nothing about the server (censored).
    CLIENT_SIDE: Final = frozenset({CLIENT_ROTATED, CLIENT_STOPPED, PROBE_ERROR})

    @staticmethod
    def is_reset(reason: str) -> bool:
        return reason not in EndReason.NOT_RESETS


# grpc core's own texts (chttp2 transport and server), as grpcio 1.85 reports them, e.g.
#   "Stream removed (Socket closed (GOAWAY received; Error code: 0; Debug Text: ))"
#   "Stream removed (RST_STREAM (Received RST_STREAM with error code 2))"
#   "max connection age"       server: max_connection_age_grace over, after its GOAWAY
#   "Cancelling all calls"     server: shutdown grace over, after its GOAWAY (a drain)
#   "Stream removed (recvmsg:Connection reset by peer (104))", "... (Socket closed)"
#   "failed to connect to all addresses; last error: ... Connection refused"
#   "errors resolving nohost.invalid:80: [... Domain name not found]"   (no address at all)
#   "Stream removed (Failed parsing HTTP/2 (Frame size 16777215 is larger than max frame
#   size 4194304))", "... (Illegal hpack op code))": grpc core tears the connection down
#   (UNKNOWN or INTERNAL), but the cause is the server's malformed HTTP/2, not a lost socket
_GOAWAY = ("GOAWAY received", "max connection age", "Cancelling all calls")
_RST = re.compile(r"Received RST_STREAM with error code (\d+)")
_PROTOCOL = ("Failed parsing HTTP/2",)
_REFUSED = (
    "failed to connect to all addresses", "Failed to connect to remote host",
    "Connection refused", "connections to all backends failing", "DNS resolution failed",
    "errors resolving",
)
_CONNECTION_LOST = (
    "Connection reset", "Socket closed", "Broken pipe", "Connection aborted",
    "keepalive watchdog timeout", "Transport closed", "Stream removed", "Endpoint read failed",
)


def classify_stream_end(code: str, details: str, *, established: bool = True) -> str:
    """The end reason of a stream from its status code name and details (first rule wins).

    OK → server_closed_ok; a GOAWAY (or grpc core's post-GOAWAY drain cut) → goaway, even
    when the socket then closed; an RST_STREAM frame → rst_stream, whatever status it mapped
    to; HTTP/2 that could not be parsed → protocol_error; a failed connect or name lookup →
    refused (connection_reset if the stream had opened); a message over the receive limit →
    grpc_RESOURCE_EXHAUSTED; a lost connection → connection_reset; then DEADLINE_EXCEEDED →
    deadline, CANCELLED → cancelled, and `grpc_<CODE>` for anything else.
    """
    code = code.upper()
    if code == "OK":
        return EndReason.SERVER_CLOSED_OK
    if any(marker in details for marker in _GOAWAY):
        return EndReason.GOAWAY
    if _RST.search(details):
        return EndReason.RST_STREAM
    if any(marker in details for marker in _PROTOCOL):
        return EndReason.PROTOCOL_ERROR
    if any(marker in details for marker in _REFUSED):
        return EndReason.CONNECTION_RESET if established else EndReason.REFUSED
    if code == "RESOURCE_EXHAUSTED":
        # "Stream removed (CLIENT: Received message larger than max ...)": the message, not
        # the connection, was at fault (the "Stream removed" below would say otherwise).
        return Outcome.grpc(code)
    if any(marker in details for marker in _CONNECTION_LOST):
        return EndReason.CONNECTION_RESET
    if code == "DEADLINE_EXCEEDED":
        return EndReason.DEADLINE
    if code == "CANCELLED":
        return EndReason.CANCELLED
    return Outcome.grpc(code)


@dataclass(frozen=True, slots=True)
class OpenStream:
    """An established stream, as a snapshot (ages for the lifetime check)."""

    path: str
    endpoint: str
    cohort: str
    slot: int
    opened_at: float
    age_s: float
    messages: int = 0
    lingering: bool = False


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """One stream attempt, finished. Wall-clock times (epoch seconds); `lifetime_s` is
    measured on the monotonic clock from the moment the stream was established.

    `opened_at` None means it never opened (an open failure). `gap_p99_s` is the p99 of the
    gaps between consecutive messages (None with fewer than two messages), read from the
    shared log-linear buckets (within 1 %). `code` is the gRPC status name, "" when the probe
    ended the stream itself.
    """

    path: str
    endpoint: str
    cohort: str
    slot: int
    started_at: float
    opened_at: float | None
    ended_at: float
    lifetime_s: float
    messages: int
    gap_p99_s: float | None
    reason: str
    code: str = ""
    detail: str = ""

    @property
    def established(self) -> bool:
        return self.opened_at is not None

    @property
    def is_reset(self) -> bool:
        return self.established and EndReason.is_reset(self.reason)


class StreamSink(Protocol):
    """Takes what held streams report (`probes.streams.StreamRecorder` feeds the window
    aggregator, the metrics and the storm detector)."""

    def stream_opened(self, stream: OpenStream, endpoint: Endpoint) -> None: ...

    def stream_held(
        self, path: str, cohort: str, endpoint: str, start: float, end: float
    ) -> None: ...

    def streams_held(self, path: str, cohort: str, start: float, end: float, count: int) -> None:
        """`count` streams of one path and cohort, each held over [start, end): a
        checkpoint's report, one call per group instead of one per stream."""
        ...

    def stream_message(self, path: str, cohort: str, gap_s: float) -> None: ...

    def stream_ended(self, end: StreamEnd, endpoint: Endpoint) -> None: ...
