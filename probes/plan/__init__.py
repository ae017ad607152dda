"""The upgrade plan: pure functions from plain dataclasses to a JSON-ready plan.

`skewprobe plan --to VERSION` answers the platform team's question — take every sidecar from
where it is to VERSION without leaving a pod outside the supported skew — from facts the probe
already holds (`probes.cli.plan` gathers them; nothing here does I/O):

- **steps**: each control-plane move and the fleet restart it requires. The control plane may
  only move as far as the oldest data plane allows (a proxy at most `behind` minors older than
  its control plane, never more than `ahead` newer), so n-2 → n with one minor of skew is two
  moves with a fleet restart after each: two restarts, not one.
- **the point of no return**: the first step after which moving the control plane back to the
  version before its last move would leave pods outside the skew (pods restarted onto a newer
  proxy than that control plane supports): from there a rollback is a restart, not a move.
- **tiers**: the reference target's namespaces first, then namespaces by a tier label, then by
  what the probe measured (read paths, write paths, not probed, stream holders last).
- **time**: each workload's natural recycle interval from the recorded inventory history, the
  date the fleet would get there without forced restarts, the long tail that never will, and
  the elapsed time of forced tiered restarts.
- **pinning**: whether each namespace pins its injected version (an Istio revision), so a
  rollback is a restart.

Missing data is never planned around: every part says what it came from, and what it lacks
is listed under `missing`.
"""

from __future__ import annotations

from typing import Any

from probes._parsing import rfc3339
from probes.plan._model import (
    DEFAULT_FIRST_NAMESPACES,
    DEFAULT_MAX_POD_AGE_S,
    DEFAULT_TIER_LABEL,
    SKEW_SOURCES,
    NamespaceInfo,
    PlanInput,
    PlanPods,
    PlanSettings,
    WorkloadHistory,
    WorkloadTraffic,
)
from probes.plan._steps import pinning, plan_steps, version_counts
from probes.plan._tiers import (
    DRAIN_DEFAULTS,
    LEVERS,
    drain_timers,
    lifetime_steps,
    restart_tiers,
    workload_history,
)
from probes.plan._time import plan_time, progress, recycle_rates

__all__ = [
    "DEFAULT_FIRST_NAMESPACES",
    "DEFAULT_MAX_POD_AGE_S",
    "DEFAULT_TIER_LABEL",
    "SKEW_SOURCES",
    "NamespaceInfo",
    "PlanInput",
    "PlanPods",
    "PlanSettings",
    "WorkloadHistory",
    "WorkloadTraffic",
    "build_plan",
    "plan_steps",
    "progress",
    "workload_history",
]


def build_plan(inp: PlanInput, settings: PlanSettings) -> dict[str, Any]:
    """The plan (JSON-ready). Raises ValueError for a target that cannot be planned."""
    missing: list[str] = []
    if inp.control_plane is None:
        raise ValueError(
            "control-plane version unknown: none discovered or recorded; give --control-plane")
    steps = plan_steps(inp.pods, inp.control_plane, settings.target, settings.policy)
    if steps["not_planned"]:
        n = sum(w["pods"] for w in steps["not_planned"])
        missing.append(f"{n} pods with a proxy version that cannot be compared: not planned")
    if inp.namespaces is None:
        missing.append(f"namespace labels ({inp.namespaces_source or 'not read'}): no"
                       " tiers by label, pinning not judged")
    if inp.traffic is None:
        missing.append(f"probe measurements ({inp.traffic_source or 'none'}): no tiers by"
                       " read/write/stream paths")
    if inp.latency is None:
        missing.append(f"request durations ({inp.latency_source or 'none'}): no drain timers")
    if inp.history is None:
        missing.append(f"inventory history ({inp.history_source or 'none'}): no natural"
                       " recycle rates or dates")
    if inp.lifetimes is None and inp.traffic and any(t.streams for t in inp.traffic.values()):
        missing.append(f"stream lifetimes ({inp.lifetimes_source or 'none'}): no stream"
                       " tier is known to have a lifetime cap")
    rates = recycle_rates(inp, settings)
    tiers = restart_tiers(inp, settings, rates)
    lifetime = lifetime_steps(inp, tiers)
    drain = drain_timers(inp, tiers)
    for tier in tiers:
        del tier["_stream_keys"], tier["_keys"]
    plan: dict[str, Any] = {
        "at": rfc3339(inp.at),
        "to": settings.target,
        "mesh": inp.mesh,
        "sources": {
            "pods": inp.source,
            "control_plane": inp.control_plane_source,
            "namespaces": inp.namespaces_source if inp.namespaces is not None else None,
            "measurements": inp.traffic_source if inp.traffic is not None else None,
            "history": inp.history_source if inp.history is not None else None,
            "stream_lifetimes": inp.lifetimes_source if inp.lifetimes is not None else None,
            "request_durations": inp.latency_source if inp.latency is not None else None,
        },
        "pods": sum(g.pods for g in inp.pods),
        "versions": version_counts((g.version, g.pods) for g in inp.pods),
        "control_plane": inp.control_plane,
        "supported_skew": {"behind": settings.policy.behind, "ahead": settings.policy.ahead,
                           "source": settings.policy_source},
    }
    plan.update(steps)
    plan["tiers"] = tiers
    plan["time"] = plan_time(inp, settings, rates, steps["fleet_restarts"], len(tiers))
    plan["connection_lifetime"] = {"streams": lifetime, "levers": list(LEVERS)}
    plan["drain"] = {"tiers": drain, "defaults": dict(DRAIN_DEFAULTS)}
    plan["pinning"] = pinning(inp)
    plan["missing"] = missing
    return plan
