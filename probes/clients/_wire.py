"""What the transports saw of one request attempt, for the prober's decision to re-send it.

Connection pools hide which connection a request used and what happened to it. The HTTP
transports fill a `WireRecord` as the request runs: HTTP/2 stream ids (from httpcore's
`trace` extension), the HTTP/2 connection the request was written to, whether an HTTP/1.1
connection came from the keep-alive pool. The record is found through a context variable
because the pool code runs in the caller's task but does not pass anything of ours down;
a context variable is task-local, so concurrent calls never see each other's records.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol


class H2Facts(Protocol):
    """What an HTTP/2 connection saw its server send (see `_h2.ObservedStream`)."""

    @property
    def goaway(self) -> tuple[int, int] | None:
        """(last_stream_id, error_code) of the last GOAWAY received, or None."""
        ...

    @property
    def answered_http1(self) -> bool:
        """The server answered in HTTP/1.x (it does not speak HTTP/2 on this port)."""
        ...


@dataclass(slots=True)
class WireRecord:
    stream_ids: list[int] = field(default_factory=list)
    connection: H2Facts | None = None
    reused: bool = False

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's `trace` extension hook: note every HTTP/2 stream this request opens
        (more than one means httpcore itself re-sent it on another connection)."""
        if name == "http2.send_request_headers.started":
            self.stream_ids.append(int(info["stream_id"]))


_CURRENT: ContextVar[WireRecord | None] = ContextVar("skewprobe_wire_record", default=None)


def current_record() -> WireRecord | None:
    return _CURRENT.get()


@contextmanager
def recording() -> Iterator[WireRecord]:
    """Make a fresh record the current one for the duration of one attempt."""
    record = WireRecord()
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)


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
