"""HTTP/1.1 on aiohttp, called directly.

Chosen from measurement (see the package docstring): on loopback aiohttp costs about a sixth
of the CPU of httpx's own HTTP/1.1 transport per request and about half its latency at one
request in flight, which is latency the probe would otherwise add to every figure it
reports. The prober talks to the aiohttp session itself rather than through the
`httpx-aiohttp` transport: building an `httpx.Request` and `httpx.Response` around every
call, and wrapping every error, cost about 40 % of the prober's CPU at 2,400 endpoints, and
the probe needs none of it (one fixed request per path; the answer's status, three headers
and a discarded body).

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
import weakref
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace
from yarl import URL

from probes.clients._classify import exception_chain
from probes.clients._wire import Replay, WireRecord, current_record


class _ReuseNotingConnector(aiohttp.TCPConnector):
    """Notes in the request's `WireRecord` whether its connection came from the keep-alive
    pool: a connection handed out before is a reused one.

    Done here rather than with an aiohttp `TraceConfig` (`on_connection_reuseconn`): tracing
    builds a parameters object for every stage of every request, about 10 % of the prober's
    CPU, to learn this one fact.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's interface)
    ) -> Connection:
        conn = await super().connect(req, traces, timeout)
        proto = conn.protocol
        if proto is not None:
            if proto in self._handed_out:
                record = current_record()
                if record is not None:
                    record.reused = True
            else:
                self._handed_out.add(proto)
        return conn


def client_session(
    *, ssl_context: ssl.SSLContext, keepalive_s: float, limit: int = 64
) -> aiohttp.ClientSession:
    """An aiohttp session for one endpoint; call from a running event loop."""
    session = aiohttp.ClientSession(
        connector=_ReuseNotingConnector(
            ssl=ssl_context, keepalive_timeout=keepalive_s, limit=limit
        ),
        cookie_jar=aiohttp.DummyCookieJar(),
        # The body is discarded unread; asking for compression would only cost the callee.
        skip_auto_headers=("Accept-Encoding",),
    )
    if "_retry_connection" in aiohttp.ClientSession.ATTRS:
        session._retry_connection = False
    return session


class H1Client:
    """One endpoint's session with its request target and timeouts, built once.

    `url` is parsed once here (aiohttp would parse a string URL on every request) and the
    `ClientTimeout` is shared by every call.
    """

    __slots__ = ("server_name", "session", "timeout", "url")

    def __init__(
        self,
        url: str,  # already checked by the caller (httpx.URL)
        *,
        ssl_context: ssl.SSLContext,
        keepalive_s: float,
        budget_s: float,
        server_name: str | None = None,
    ) -> None:
        self.url = URL(url)
        self.timeout = aiohttp.ClientTimeout(
            sock_connect=budget_s, sock_read=budget_s, connect=budget_s
        )
        self.server_name = server_name
        self.session = client_session(ssl_context=ssl_context, keepalive_s=keepalive_s)

    async def aclose(self) -> None:
        await self.session.close()


def replay_reason(exc: BaseException, record: WireRecord) -> tuple[Replay, str] | None:
    """A request may be re-sent only when a reused keep-alive connection closed before
    any answer (the server may have closed it while the request was on its way)."""
    if record.reused and any(
        isinstance(link, aiohttp.ServerDisconnectedError) for link in exception_chain(exc)
    ):
        return Replay.LOST, "reused keep-alive connection closed before an answer"
    return None
