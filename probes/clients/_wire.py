"""Whether a request that failed on the wire may be sent again on a fresh connection."""

from __future__ import annotations

import enum


class Replay(enum.Enum):
    """Why a failed request may be sent again on a fresh connection."""

    # The server provably did not process it: a stream above a GOAWAY's last-stream-id
    # (RFC 9113 §6.8) or refused with REFUSED_STREAM (§8.7). Safe for any method.
    UNPROCESSED = "unprocessed"
    # The connection went away under it without an answer after a graceful close, so the
    # server may have processed it: only idempotent methods may be re-sent
    # (RFC 9110 §9.2.2, RFC 9112 §9.3.1).
    LOST = "lost"


IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
