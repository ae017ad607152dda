"""Probe clients: one call of one path on one endpoint, classified into an outcome.

    Prober (Protocol)          call(endpoint, request_id) -> CallOutcome; forget; aclose
    ├── HttpProber             HTTP/1.1 on the probe's own protocol + httptools (`_h1`),
    │                          HTTP/2 on httpcore through the httpx transport API
    └── GrpcProber             grpc.aio unary, raw bytes; standard health Check
    build_prober(path)         picks one from PROBERS by PathSpec.kind

    StreamProber               the engine's StreamHolder: K long-lived server streams per
                               (stream path, endpoint), re-opened with backoff; reports
                               OpenStream / StreamEnd (reason: EndReason) to a StreamSink

Every library error is mapped to an outcome class in `_classify`; a request the server
provably did not process (HTTP/2 GOAWAY or REFUSED_STREAM, gRPC likewise) is re-sent once
on a fresh connection and counted in `CallOutcome.churn`, not as a failure.

Transport choice, measured on loopback against haproxy (client pinned to one core, 20 in
flight for req/CPU-s, 1 in flight for p50):

    httpx.AsyncClient, default transport, HTTP/1.1     765 req/CPU-s   p50 0.64 ms
    httpx.AsyncClient + httpx-aiohttp, HTTP/1.1      3,953 req/CPU-s   p50 0.33 ms
    httpx-aiohttp transport called directly          6,432 req/CPU-s   p50 0.25 ms
    httpx.AsyncClient, HTTP/2 (h2c)                  1,571 req/CPU-s   p50 0.77 ms
    httpx HTTP/2 transport called directly           2,022 req/CPU-s   p50 0.61 ms
    aiohttp alone (reference)                       11,089 req/CPU-s   p50 0.17 ms
    HttpProber HTTP/1.1, first build (httpx-aiohttp) 5,274 req/CPU-s   p50 0.27 ms
    HttpProber HTTP/2, as built (httpcore+observer)  1,811 req/CPU-s   p50 0.62 ms
    GrpcProber, health Check (server on other core)  6,413 req/CPU-s   p50 0.38 ms

Against the reference target (the fleet on the other core, 20 in flight), for the capacity
work (issue 7): the HTTP/1.1 prober through the httpx-aiohttp transport 0.21 ms CPU per
call; on the aiohttp session directly 0.15 ms; without aiohttp's request tracing (reuse of
a keep-alive connection noted by the connector instead) 0.135 ms, ~7,400 req/CPU-s.

Then (issue 7, 2,400 endpoints × 1/s with 2,400 held streams): aiohttp was half of the
probe's CPU and kept ~30 objects per connection alive between calls, which every garbage
collection walked. HTTP/1.1 now runs on the probe's own `asyncio.Protocol` with httptools'
C parser (`_h1`), which keeps a socket and a parser per connection and frames the request
once per endpoint: 0.312 → 0.185 CPU-s per 1,000 calls and schedule lag p99 79 → 5 ms at
2,400 × 1/s (BENCHMARKS.md). HTTP/2 uses httpcore through the httpx transport API (with the
GOAWAY observer in `_h2`, ~10 % of its cost).
"""

from __future__ import annotations

from probes.clients._base import Prober
from probes.clients._classify import classify_exception, classify_grpc_code, classify_status
from probes.clients._grpc import GrpcProber
from probes.clients._http import BODY_LIMIT, HttpProber
from probes.clients._registry import PROBERS, ProberFactory, build_prober
from probes.clients._stream_types import (
    EndReason,
    OpenStream,
    StreamEnd,
    StreamSink,
    classify_stream_end,
)
from probes.clients._streams import HEALTH_WATCH, StreamPolicy, StreamProber

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
