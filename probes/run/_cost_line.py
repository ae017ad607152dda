"""The cost line `skewprobe run` logs once at start (logger `skewprobe.cost`, shown at the
default level by `probes.cli`): what its paths will cost (`probes.measure.cost`), with a
warning if it is more than one probe can use."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

from probes.measure.cost import cpu_limit_cores, estimate
from probes.run.engine import Engine
from probes.spec import PathSpec
from probes.types import Endpoint

__all__ = ["cost_logged"]

cost_log = logging.getLogger("skewprobe.cost")


async def cost_logged(
    snapshots: AsyncIterator[Sequence[Endpoint]], paths: Sequence[PathSpec], engine: Engine
) -> AsyncIterator[Sequence[Endpoint]]:
    """The snapshots, unchanged; once the engine has scheduled the first endpoints (it asks
    for the next snapshot right after applying one), what they will cost is logged once."""
    logged = False
    async for snapshot in snapshots:
        yield snapshot
        if not logged and engine.endpoints:
            logged = True
            rates: dict[str, float] = {}
            for (path, _), rate in engine.intended_rates().items():
                rates[path] = rates.get(path, 0.0) + rate
            cost = estimate(paths, rates, engine.held_streams(), cgroup_cores=cpu_limit_cores())
            cost_log.info("%s", cost.line())
            if (warning := cost.warning()) is not None:
                cost_log.warning("%s", warning)
