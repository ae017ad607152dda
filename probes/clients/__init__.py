"""Probe clients: one call of one path on one endpoint, classified into an outcome.

    Prober (Protocol)          call(endpoint, request_id) -> CallOutcome; forget; aclose
    ├── HttpProber             HTTP/1.1 on the probe's own protocol + httptools (`_h1`),
    │                          HTTP/2 on the probe's own protocol and framing (`_h2lean`)
    ├── GrpcProber             gRPC unary, raw bytes, or the standard health Check, as
    │                          HTTP/2 POSTs on the same client (`_grpc`)
    └── RelayProber            through a relay pod (`/relay/<destination>`): the
                               destination's outcome, attempts and answering pod; an
                               HttpProber on `_h1` (or `_h2lean`) that reads the answer
    build_prober(path)         picks one from PROBERS by PathSpec.kind

    StreamProber               the engine's StreamHolder: K long-lived server streams per
                               (stream path, endpoint) on grpc.aio (`_connection`), re-opened
                               with backoff; reports OpenStream / StreamEnd (reason:
                               EndReason) to a StreamSink

Every library error is mapped to an outcome class in `_classify`; a request the server
provably did not process (HTTP/2 GOAWAY or REFUSED_STREAM, gRPC likewise) is re-sent once
on a fresh connection and counted in `CallOutcome.churn`, not as a failure.

One client per protocol. Why these: they are the cheapest measured that keep every outcome
class honest (BENCHMARKS.md, decision records D6 and D15). The library clients they were
measured against, httpcore for HTTP/2 and grpc.aio for gRPC unary, are not in the product:
they are the reference the tests prove these clients against (`tests/reference/`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from probes.clients._base import Prober
from probes.clients._classify import classify_exception, classify_grpc_code, classify_status
from probes.clients._grpc import GrpcProber
from probes.clients._http import BODY_LIMIT, HttpProber
from probes.clients._relay import RelayProber
from probes.clients._stream_types import (
    EndReason,
    OpenStream,
    StreamEnd,
    StreamSink,
    classify_stream_end,
)
from probes.clients._streams import HEALTH_WATCH, StreamPolicy, StreamProber
from probes.errors import BadInput
from probes.spec import PathSpec

__all__ = [
    "BODY_LIMIT",
    "HEALTH_WATCH",
    "PROBERS",
    "EndReason",
    "GrpcProber",
    "HttpProber",
    "OpenStream",
    "Prober",
    "ProberFactory",
    "RelayProber",
    "StreamEnd",
    "StreamPolicy",
    "StreamProber",
    "StreamSink",
    "build_prober",
    "classify_exception",
    "classify_grpc_code",
    "classify_status",
    "classify_stream_end",
]

ProberFactory = Callable[[PathSpec], Prober]

# Which prober runs which kind of path: a registry dict, passed in, never global state. Keyed
# by PathSpec.kind; long-lived streams ("stream") have their own prober (`StreamProber`).
PROBERS: Mapping[str, ProberFactory] = MappingProxyType(
    {"http": HttpProber, "grpc": GrpcProber, "relay": RelayProber})


def build_prober(path: PathSpec, registry: Mapping[str, ProberFactory] = PROBERS) -> Prober:
    """The prober for a path, from `registry` (default: HTTP, gRPC unary and relay)."""
    try:
        factory = registry[path.kind]
    except KeyError:
        raise BadInput(f"path {path.name}: no prober for {path.kind!r} paths") from None
    return factory(path)
