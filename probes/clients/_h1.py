"""HTTP/1.1 for httpx through aiohttp (the `httpx-aiohttp` transport).

Chosen from measurement (see the package docstring): on loopback it costs about a sixth of the
CPU of httpx's own HTTP/1.1 transport per request and about half its latency at one request
in flight, which is latency the probe would otherwise add to every figure it reports.

Two aiohttp behaviours are changed for a probe:

* aiohttp re-sends an idempotent request once after *any* `ServerDisconnectedError` or
  `ClientOSError`, even on a fresh connection: a pod that resets every new connection would
  be called twice per probe and a flaky reset would vanish. That retry is switched off;
  the prober replays only what RFC 9112 §9.3.1 describes, an idempotent request whose
  *reused* keep-alive connection was closed before any answer, and counts it as churn.
* cookies are not kept between calls (a sticky-session cookie would pin the probe).
"""

from __future__ import annotations

import ssl
from types import SimpleNamespace

import aiohttp
from httpx_aiohttp import AiohttpTransport

from probes.clients._classify import exception_chain
from probes.clients._wire import Replay, WireRecord, current_record


async def _mark_reused(
    _session: aiohttp.ClientSession,
    _ctx: SimpleNamespace,
    _params: aiohttp.TraceConnectionReuseconnParams,
) -> None:
    record = current_record()
    if record is not None:
        record.reused = True


def aiohttp_transport(
    *, ssl_context: ssl.SSLContext, keepalive_s: float, limit: int = 64
) -> AiohttpTransport:
    """A transport with its own aiohttp session; call from a running event loop."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_mark_reused)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_context, keepalive_timeout=keepalive_s, limit=limit),
        trace_configs=[trace],
        cookie_jar=aiohttp.DummyCookieJar(),
        # The body is discarded unread; asking for compression would only cost the callee.
        skip_auto_headers=("Accept-Encoding",),
    )
    if "_retry_connection" in aiohttp.ClientSession.ATTRS:
        session._retry_connection = False
    return AiohttpTransport(verify=ssl_context, client=session)


def replay_reason(exc: BaseException, record: WireRecord) -> tuple[Replay, str] | None:
    """A request may be re-sent only when a reused keep-alive connection closed before
    any answer (the server may have closed it while the request was on its way)."""
    if record.reused and any(
        isinstance(link, aiohttp.ServerDisconnectedError) for link in exception_chain(exc)
    ):
        return Replay.LOST, "reused keep-alive connection closed before an answer"
    return None
