"""The pod's gRPC API: `skewprobe.target.v1.Target` (Echo, Subscribe) behind the sidecar.

Faults are looked up by full method name, so a profile can target
`/skewprobe.target.v1.Target/Echo` or `/skewprobe.target.v1.Target/Subscribe`. The emulated
proxy's headers (`x-proxy-version`, `x-app-attempts`, `x-envoy-attempt-count`) travel as
trailing metadata, on errors too; Subscribe also sends them as initial metadata so a
stream's cohort is known when it opens, before anything ends it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, NoReturn

import grpc

from targets.profile import Faults
from targets.proto import target_pb2, target_pb2_grpc
from targets.relay import Relay as PodRelay
from targets.relay import UnknownDestination
from targets.sidecar import (
    ATTEMPT_COUNT_HEADER,
    VERSION_HEADER,
    Forwarded,
    Sidecar,
    grpc_code_for_http,
)

SERVICE = "skewprobe.target.v1.Target"
ECHO = f"/{SERVICE}/Echo"
SUBSCRIBE = f"/{SERVICE}/Subscribe"
DEFAULT_INTERVAL_S = 0.5
MAX_DELAY_S = 60.0
MAX_ECHO_PAYLOAD = 1 << 20
MAX_EVENT_PAYLOAD = 64 << 10

Metadata = tuple[tuple[str, str], ...]


class TargetService(target_pb2_grpc.TargetServicer):
    """Echo and Subscribe for one pod."""

    def __init__(
        self,
        sidecar: Sidecar,
        *,
        relay: PodRelay | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ):
        self.sidecar = sidecar
        self.relay = relay
        self._clock = clock
        self._wall = wall_clock
        self.open_streams = 0

    async def Echo(  # the generated servicer's name
        self, request: target_pb2.EchoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> target_pb2.EchoReply:
        faults = self.sidecar.faults(ECHO)
        forwarded, trailers = await self._through_sidecar(faults, context)
        if request.delay_ms:
            await asyncio.sleep(min(request.delay_ms / 1000.0, MAX_DELAY_S))
        context.set_trailing_metadata(trailers)
        return target_pb2.EchoReply(
            message=request.message,
            pod=self.sidecar.pod,
            proxy_version=self.sidecar.version,
            app_attempts=forwarded.app_attempts,
            payload=b"x" * min(request.payload_bytes, MAX_ECHO_PAYLOAD),
        )

    async def Subscribe(  # the generated servicer's name
        self, request: target_pb2.SubscribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        # A coroutine that writes with context.write() (grpc.aio accepts it for streaming
        # responses), so the stream can end with a status after a timeout.
        faults = self.sidecar.faults(SUBSCRIBE)
        _, trailers = await self._through_sidecar(faults, context)
        interval = request.interval_ms / 1000.0 if request.interval_ms else DEFAULT_INTERVAL_S
        payload = b"x" * min(request.payload_bytes, MAX_EVENT_PAYLOAD)
        pod, version = self.sidecar.pod, self.sidecar.version
        seq = 0
        cut = False
        # Counted before the headers go out: a client that has them sees the stream counted.
        self.open_streams += 1
        try:
            await context.send_initial_metadata(trailers)
            async with asyncio.timeout(faults.max_stream_duration_s):
                start = self._clock()
                while True:
                    seq += 1
                    await context.write(target_pb2.Event(
                        seq=seq, sent_unix_nanos=int(self._wall() * 1e9),
                        pod=pod, proxy_version=version, payload=payload,
                    ))
                    if request.max_events and seq >= request.max_events:
                        break
                    # Paced from the stream's start, so gaps do not drift with load.
                    await asyncio.sleep(max(0.0, start + seq * interval - self._clock()))
        except TimeoutError:
            cut = True
        finally:
            self.open_streams -= 1
        if cut:
            # Envoy resets a stream at max_stream_duration; see Faults.stream_reset_code.
            await context.abort(
                grpc.StatusCode[faults.stream_reset_code],
                "max_stream_duration reached (emulated stream reset)",
                trailing_metadata=trailers,
            )
        context.set_trailing_metadata(trailers)

    async def Relay(  # the generated servicer's name
        self, request: target_pb2.RelayRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> target_pb2.RelayReply:
        trailers = ((VERSION_HEADER, self.sidecar.version),)
        if self.relay is None:
            await _abort(context, "UNIMPLEMENTED", "this pod has no relay", trailers)
        given = None
        for item in context.invocation_metadata() or ():
            if item[0] == "x-request-id":
                given = str(item[1])
        try:
            answer = await self.relay.call(request.destination, given)
        except UnknownDestination as exc:
            await _abort(context, "PERMISSION_DENIED", str(exc), trailers)
        context.set_trailing_metadata(trailers)
        return answer.to_proto()

    async def _through_sidecar(
        self, faults: Faults, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[Forwarded, Metadata]:
        """Header rules, latency and retries; aborts the call when the app's answer fails."""
        sidecar = self.sidecar
        started = self._clock()
        metadata = context.invocation_metadata() or ()
        given = arrived_attempts = None
        for item in metadata:
            if item[0] == "x-request-id":
                given = str(item[1])
            elif item[0] == ATTEMPT_COUNT_HEADER:
                arrived_attempts = str(item[1])
        request_id = sidecar.request_id(given)
        app = tuple(sidecar.app_headers(arrived_attempts))
        if faults.headers.reject_requests_with:
            rejected = sidecar.rejects(faults, (str(item[0]) for item in metadata))
            if rejected is not None:
                await _abort(context, "INTERNAL", f"request header {rejected} not allowed (400)",
                             (*sidecar.response_headers(faults, None, request_id, 0.0), *app))
        delay = sidecar.delay(faults)
        if delay > 0:
            await asyncio.sleep(delay)
        forwarded = await sidecar.forward(faults, request_id)
        trailers = (*sidecar.response_headers(
            faults, forwarded, request_id, self._clock() - started
        ), *app)
        if not forwarded.ok:
            await _abort(context, grpc_code_for_http(forwarded.status),
                         f"upstream answered {forwarded.status}", trailers)
        return forwarded, trailers


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], code: str, details: str, trailers: Metadata
) -> NoReturn:
    await context.abort(grpc.StatusCode[code], details, trailing_metadata=trailers)
    raise AssertionError("unreachable: abort raises")
