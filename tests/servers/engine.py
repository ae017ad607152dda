"""Run a prober's call the way the engine does: under the path's deadline."""

from __future__ import annotations

import asyncio
import time

from probes._types import CallOutcome, Endpoint, Outcome
from probes.clients import Prober


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
