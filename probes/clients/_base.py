"""The prober seam: one call on one endpoint, classified; plus what every prober shares,
among it whether a request that failed on the wire may be sent again (`Replay`).

The engine owns scheduling and the overall deadline: it wraps every `call()` in
`asyncio.timeout(path.timeout_s)` and records a timeout itself when that fires. Probers set
their libraries' own timeouts a little inside that deadline (`inner_budget_s`), so a connect
that never completes is reported by the library as `connect_timeout` (and a gRPC deadline as
`grpc_DEADLINE_EXCEEDED`) before the engine's backstop cancels the call.
"""

from __future__ import annotations

import asyncio
import enum
import ssl
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from probes.types import CallOutcome, Endpoint

USER_AGENT = "skewprobe/0.1"


@runtime_checkable
class Prober(Protocol):
    """Runs one call of one path on one endpoint.

    `call` never raises for anything the callee or the network does: every such event is a
    classified `CallOutcome`. It may be cancelled (the engine's deadline). Connections are
    pooled per endpoint; `forget` drops an endpoint that left discovery (its connections are
    closed once its in-flight calls finish), `aclose` closes everything.
    """

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome: ...

    def forget(self, endpoint: Endpoint) -> None: ...

    async def aclose(self) -> None: ...


def inner_budget_s(timeout_s: float) -> float:
    """The library-level timeout for a path timeout: 5 % (at most 50 ms) inside it."""
    return timeout_s - min(0.05 * timeout_s, 0.05)


def keepalive_s(rate_per_s: float) -> float:
    """How long an idle pooled connection is kept: a few probe intervals, 15 s to 120 s.

    A probe that reconnected on every call would measure connection set-up, which the
    callee's real, keep-alive clients do not pay.
    """
    if rate_per_s <= 0:
        return 15.0
    return min(max(2.5 / rate_per_s, 15.0), 120.0)


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 literal bracketed."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


async def connect_protocol(
    protocol: asyncio.BaseProtocol,
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None,
    server_name: str | None,
    budget_s: float,
    failed: Callable[[str], Exception],
    timed_out: Callable[[str], Exception],
) -> None:
    """Connect `protocol` (one of the probe's own transports) to host:port, TLS included,
    within `budget_s`; raises `timed_out(message)` or `failed(message)` (refused,
    unreachable, name lookup, TLS) with the library's error as the cause."""
    where = f"{host}:{port}"
    try:
        async with asyncio.timeout(budget_s):
            await asyncio.get_running_loop().create_connection(
                lambda: protocol, host, port, ssl=ssl_context, server_hostname=server_name
            )
    except TimeoutError as exc:
        raise timed_out(f"cannot connect to {where} within {budget_s:g}s") from exc
    except OSError as exc:  # ssl.SSLError and socket.gaierror are OSErrors too
        raise failed(f"cannot connect to {where}: {exc}") from exc


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
