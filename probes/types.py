"""Plain data that crosses the module boundaries.

The flow is discovery → engine → clients → measure → store → verdict → api/cli/report, and
each arrow carries one of the frozen dataclasses below. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

__all__ = [
    "PAIR_SEPARATOR",
    "CallOutcome",
    "CallResult",
    "Endpoint",
    "EndpointWindow",
    "Outcome",
    "PathWindow",
    "pair_cohort",
    "split_pair",
]

_EMPTY_COUNTS: Mapping[int, int] = MappingProxyType({})


def _frozen(labels: Mapping[str, str] | None) -> Mapping[str, str]:
    # A read-only view is taken as it is: the probe's own (every Endpoint's labels) wrap a
    # private copy, and copying them again for every window row cost ~2 µs × 4,800 rows
    # per window at 2,400 endpoints.
    if isinstance(labels, MappingProxyType):
        return labels
    return MappingProxyType(dict(labels or {}))


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One callee: a pod (or a static address) with its labels.

    `ports` holds named ports (as Kubernetes' named container ports do) so one pod can serve
    HTTP on one port and gRPC on another; a path picks a port by name or number, and falls
    back to `port`.
    """

    name: str
    host: str
    port: int
    labels: Mapping[str, str] = field(default_factory=lambda: _frozen(None))
    ports: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # `key`, computed once: the connection pools look it up on every call.
    _key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen(self.labels))
        object.__setattr__(self, "ports", MappingProxyType(dict(self.ports)))
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        object.__setattr__(self, "_key", f"{self.name}@{self.host}:{self.port}[{labels}]")

    @property
    def key(self) -> str:
        """A stable identity: an endpoint with a new address or new labels is a new endpoint."""
        return self._key

    def port_for(self, port: str | int | None) -> int:
        """The port a path should call: a number as given, a name looked up, else the default."""
        if port is None:
            return self.port
        if isinstance(port, int):
            return port
        try:
            return self.ports[port]
        except KeyError:
            raise LookupError(f"endpoint {self.name} has no port named {port!r}") from None


class Outcome:
    """The outcome classes of one call, named once.

    gRPC status codes other than OK become `grpc_<CODE>` (e.g. `grpc_UNAVAILABLE`), built with
    `Outcome.grpc(code_name)`.
    """

    OK: Final = "ok"
    HTTP_5XX: Final = "http_5xx"
    HTTP_4XX: Final = "http_4xx"
    UNEXPECTED_STATUS: Final = "unexpected_status"
    CONNECT_REFUSED: Final = "connect_refused"
    CONNECT_TIMEOUT: Final = "connect_timeout"
    # The endpoint's host name did not resolve: no address to connect to, so neither a
    # refusal nor a timeout of the callee.
    DNS_ERROR: Final = "dns_error"
    TIMEOUT: Final = "timeout"
    RESET: Final = "reset"
    PROTOCOL_ERROR: Final = "protocol_error"
    TLS_ERROR: Final = "tls_error"
    # The probe itself could not run the call (e.g. a path names a port the endpoint lacks).
    PROBE_ERROR: Final = "probe_error"
    # A relayed call reached a pod discovery had removed from the destination (or an address
    # no current pod of it holds): the caller's proxy routes by a stale endpoint list.
    STALE_ENDPOINT: Final = "stale_endpoint"

    FIXED: Final = (
        OK, HTTP_5XX, HTTP_4XX, UNEXPECTED_STATUS, CONNECT_REFUSED, CONNECT_TIMEOUT,
        DNS_ERROR, TIMEOUT, RESET, PROTOCOL_ERROR, TLS_ERROR, PROBE_ERROR, STALE_ENDPOINT,
    )

    @staticmethod
    def grpc(code_name: str) -> str:
        return f"grpc_{code_name.upper()}"

    @staticmethod
    def is_success(outcome: str) -> bool:
        return outcome == Outcome.OK


PAIR_SEPARATOR: Final = "->"


def pair_cohort(caller: str, callee: str) -> str:
    """The cohort of a relayed call: the caller's proxy version (the relay pod's, from
    discovery) and the callee's (the answering pod's), `"1.21.0->1.20.3"`. The separator
    never occurs in a version name, so a pair is never taken for a version."""
    return f"{caller}{PAIR_SEPARATOR}{callee}"


def split_pair(cohort: str) -> tuple[str, str] | None:
    """(caller, callee) of a pair cohort, or None for a callee-only cohort."""
    caller, sep, callee = cohort.partition(PAIR_SEPARATOR)
    return (caller, callee) if sep else None


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What a client reports for one call: the classified outcome and what the wire told it.

    `attempts` is the number of upstream attempts the callee's proxy made (from
    `x-envoy-attempt-count` or the target's echo); None means not measured, never 1.
    `churn` counts requests the server provably did not process (HTTP/2 GOAWAY above the
    last stream id, gRPC transparent retry) that the client retried once on a fresh connection:
    connection churn is a signal of a proxy change, kept apart from the callee's success rate.
    `cohort_hint` is the proxy version reported by the response (a header or trailer) when
    the path is configured to read it; for a relay path, the answering (callee) pod's version.
    """

    outcome: str
    status: int | None = None
    attempts: int | None = None
    churn: int = 0
    cohort_hint: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class CallResult:
    """One finished call, timed by the engine.

    Times are wall-clock seconds (epoch) so windows line up across probes. `latency_s` runs
    from the *intended* send time (wrk2's correction for coordinated omission); `lag_s` is the
    probe's own delay in sending (actual − intended) and says whether the probe was starved.
    """

    path: str
    endpoint: str
    cohort: str
    intended_at: float
    latency_s: float
    lag_s: float
    outcome: CallOutcome

    @property
    def ok(self) -> bool:
        return self.outcome.outcome == Outcome.OK


@dataclass(frozen=True, slots=True)
class PathWindow:
    """One window's aggregate for one path × cohort (cohort = the callee's proxy version).

    Windows are aligned to multiples of `length` seconds since the epoch, so the windows of
    several probes (and of both cohorts) cover the same intervals. `latency` holds bucket
    counts of the shared log-linear layout in `probes.measure.histogram` (mergeable by
    addition). Attempts are summed only over calls whose attempts were measured:
    `attempts_count == 0` means retry volume was not measured, never "no retries".
    Stream fields stay zero for paths without streams; `streams_opened == 0` and
    `stream_seconds == 0` mean the path has no stream data.
    """

    start: float
    length: float
    path: str
    cohort: str
    outcomes: Mapping[str, int]
    latency: tuple[int, ...]
    attempts_sum: int = 0
    attempts_count: int = 0
    churn: int = 0
    lag_max_s: float = 0.0
    streams_opened: int = 0
    stream_seconds: float = 0.0
    stream_resets: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcomes", MappingProxyType(dict(self.outcomes)))
        object.__setattr__(self, "stream_resets", MappingProxyType(dict(self.stream_resets)))

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    @property
    def successes(self) -> int:
        return self.outcomes.get(Outcome.OK, 0)


@dataclass(frozen=True, slots=True)
class EndpointWindow:
    """Per-endpoint counts for one window, so a report can name the pods that fail and the
    verdict can take the pod as the unit for every metric.

    `attempts_sum` / `attempts_count` are the upstream attempts of the calls that reported
    them; `latency` is the calls' latency histogram, sparse ({bucket of
    `probes.measure.histogram`: count}); it is taken as given, not copied (its producer,
    the window aggregator, hands over a copy of its own)."""

    start: float
    path: str
    endpoint: str
    cohort: str
    requests: int
    errors: int
    labels: Mapping[str, str] = field(default_factory=lambda: _frozen(None))
    attempts_sum: int = 0
    attempts_count: int = 0
    latency: Mapping[int, int] = field(default_factory=lambda: _EMPTY_COUNTS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen(self.labels))
