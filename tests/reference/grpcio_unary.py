"""The gRPC unary reference: `GrpcProber` with its calls on grpc.aio (grpc core). Not in the
product (BENCHMARKS.md, D15): the library client the probe's own (`_grpc` over
`_h2lean`) is proven against and measured beside. Held streams stay on grpc.aio in the
product (`probes/clients/_streams.py`), on the same channel options (`_connection`).

One channel per endpoint, bytes in and bytes out (no serializers, so no generated code for
the callee). grpc core's own re-sends are off (`grpc.enable_retries=0`), so an RPC the
server provably never saw fails UNAVAILABLE with one of grpc core's details for it; the
prober re-sends exactly those once itself, on a new channel, and counts them as churn, as
the probe's own client does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import grpc.aio

from probes.clients._base import host_port
from probes.clients._classify import classify_exception, classify_grpc_code
from probes.clients._connection import channel_options, grpc_credentials
from probes.clients._grpc import GrpcProber, Unprocessed, _serving_status
from probes.spec import PathSpec
from probes.types import CallOutcome, Endpoint, Outcome

# Details grpc core gives an RPC it failed because the server never saw it.
_UNPROCESSED_DETAILS = ("GOAWAY received", "Received RST_STREAM with error code 7")

_Channel = tuple[grpc.aio.Channel, grpc.aio.UnaryUnaryMultiCallable]


class GrpcioProber(GrpcProber):
    """`GrpcProber` with each call on a grpc.aio channel per endpoint."""

    def __init__(self, path: PathSpec) -> None:
        super().__init__(path)
        tls = self._spec.tls
        self._credentials = grpc_credentials(tls, where=f"path {path.name}") if tls else None
        self._options = channel_options(self._spec)

    def _connect(self, endpoint: Endpoint) -> _Channel:  # type: ignore[override]
        target = host_port(endpoint.host, endpoint.port_for(self._path.port))
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(target, self._credentials, options=self._options)
        else:
            channel = grpc.aio.insecure_channel(target, options=self._options)
        return channel, channel.unary_unary(self._method)

    @staticmethod
    async def _disconnect(client: _Channel) -> None:  # type: ignore[override]
        await client[0].close()

    async def _once(  # type: ignore[override]
        self, client: _Channel, metadata: Sequence[tuple[str, str | bytes]], deadline: float
    ) -> CallOutcome | Unprocessed:
        outcome = await self._once_grpcio(client, metadata, deadline)
        unprocessed = outcome.outcome == Outcome.grpc("UNAVAILABLE") and any(
            marker in outcome.detail for marker in _UNPROCESSED_DETAILS
        )
        return Unprocessed(outcome) if unprocessed else outcome

    async def _once_grpcio(
        self, client: _Channel, metadata: Sequence[tuple[str, str | bytes]], deadline: float
    ) -> CallOutcome:
        channel, method = client
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.001)
        try:
            call = method(self._request, timeout=remaining, metadata=metadata)
            response = await call
            initial = await call.initial_metadata()
            trailing = await call.trailing_metadata()
        except grpc.aio.AioRpcError as err:
            code = err.code()
            detail = " ".join((err.details() or "").split())
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                state = channel.get_state(try_to_connect=False)
                if state is not grpc.ChannelConnectivity.READY:
                    detail = f"{detail} (channel {state.name}: no connection yet)"
            return CallOutcome(
                classify_grpc_code(code.name, self._expected, detail),
                status=code.value[0],
                attempts=self._attempts(err.initial_metadata(), err.trailing_metadata()),
                cohort_hint=self._cohort(err.initial_metadata(), err.trailing_metadata()),
                detail=detail,
            )
        except Exception as exc:
            kind, detail = classify_exception(exc)
            return CallOutcome(kind, detail=detail)
        attempts = self._attempts(initial, trailing)
        cohort = self._cohort(initial, trailing)
        if response is None:
            # OK with no message (or a message cut short, which grpc core drops): a unary
            # answer must carry one, and grpc-java and grpc-go fail such a call INTERNAL.
            code = grpc.StatusCode.INTERNAL
            return CallOutcome(
                classify_grpc_code(code.name, self._expected), status=code.value[0],
                attempts=attempts, cohort_hint=cohort, detail="status OK without a message",
            )
        outcome = classify_grpc_code("OK", self._expected)
        detail = ""
        if self._health and outcome == Outcome.OK:
            serving = _serving_status(response)
            if serving != "SERVING":
                outcome, detail = Outcome.UNEXPECTED_STATUS, f"health status {serving}"
        return CallOutcome(outcome, status=0, attempts=attempts, cohort_hint=cohort, detail=detail)
