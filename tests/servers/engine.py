"""Run a prober's call the way the engine does: under the path's deadline."""

from __future__ import annotations

import asyncio
import time

from probes.clients import Prober
from probes.spec import PathSpec
from probes.types import CallOutcome, Endpoint, Outcome
from tests.reference import OWN, Clients

COHORT = "1.20.3"


def endpoint_at(port: int, host: str = "127.0.0.1", name: str = "pod-0") -> Endpoint:
    """One endpoint on the baseline cohort."""
    return Endpoint(name, host, port, {"proxy_version": COHORT})


async def engine_call(
    prober: Prober, endpoint: Endpoint, timeout_s: float, request_id: str = "req-1"
) -> tuple[CallOutcome, float]:
    """(outcome, seconds taken); a call still running at the deadline is a timeout."""
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            outcome = await prober.call(endpoint, request_id)
    except TimeoutError:
        outcome = CallOutcome(Outcome.TIMEOUT, detail="engine deadline")
    return outcome, time.perf_counter() - started


async def one_call(
    path: PathSpec,
    endpoint: Endpoint,
    request_id: str = "req-1",
    on: Clients = OWN,
    engine_timeout_s: float | None = None,
) -> tuple[CallOutcome, float]:
    """One call by a prober `on` builds for `path`, closed after it, under the engine's deadline
    (`engine_timeout_s`, default the path's)."""
    prober = on.build(path)
    try:
        return await engine_call(prober, endpoint, engine_timeout_s or path.timeout_s, request_id)
    finally:
        await prober.aclose()


async def call_once(
    prober: Prober, endpoint: Endpoint, timeout_s: float
) -> tuple[CallOutcome, float]:
    """`engine_call` on a prober made for this one call, closed after it."""
    try:
        return await engine_call(prober, endpoint, timeout_s)
    finally:
        await prober.aclose()


async def stuck_beside_healthy(
    stuck: Prober,
    stuck_at: Endpoint,
    healthy: Prober,
    healthy_at: Endpoint,
    timeout_s: float,
    stuck_timeout_s: float | None = None,
) -> tuple[tuple[CallOutcome, float], list[tuple[CallOutcome, float]]]:
    """One call to a stuck target and, meanwhile, calls to a healthy one, one after another:
    (the stuck call's outcome and time, every healthy answer). Both probers are closed.
    `stuck_timeout_s` (default `timeout_s`) is the engine's deadline around the stuck call."""
    try:
        pending = asyncio.ensure_future(
            engine_call(stuck, stuck_at, stuck_timeout_s or timeout_s))
        answers = []
        while not pending.done():
            answers.append(await engine_call(healthy, healthy_at, timeout_s))
        return await pending, answers
    finally:
        await stuck.aclose()
        await healthy.aclose()
