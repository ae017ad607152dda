"""`/healthz` of `skewprobe run`: whether the probe is doing its job, in one line."""

from __future__ import annotations

from probes.discovery import DiscoverySource

__all__ = ["judge_health"]


def judge_health(store_error: str | None, kubernetes: DiscoverySource | None,
                 endpoints: int) -> tuple[bool, str]:
    """(healthy, why): unhealthy while the store refuses writes or, with Kubernetes
    discovery (`kubernetes`, its source), while the API is down."""
    if store_error:
        return False, f"store: {store_error}"
    if kubernetes is not None:
        # False while the API is down (the last known pods are still probed): meant for
        # readiness, not liveness, or an API outage becomes a restart loop.
        ok, line = kubernetes.health()  # type: ignore[attr-defined]
        if not ok:
            return False, line
    if not endpoints:
        return True, "no endpoints discovered yet"
    return True, f"probing {endpoints} endpoints"
