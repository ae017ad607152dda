"""Restart tiers: reference target first, then a namespace label, then what the probe
measured; and each workload's recycles from the recorded inventory history."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from probes.discovery.meshes import NONE
from probes.plan._model import PlanInput, PlanSettings, WorkloadHistory, WorkloadTraffic
from probes.store.records import InventorySnapshot

__all__ = ["restart_tiers", "workload_history"]


def workload_history(
    snapshots: Sequence[InventorySnapshot], *, tolerance_s: float = 60.0
) -> dict[tuple[str, str], WorkloadHistory]:
    """Recycles per workload from stored snapshots: between two snapshots the workload's
    oldest pod is younger than it would be had nothing restarted (age + elapsed)."""
    ordered = sorted(snapshots, key=lambda s: s.at)
    seen: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for snap in ordered:
        oldest: dict[tuple[str, str], float] = {}
        for row in snap.rows:
            key = (row.namespace, row.workload)
            oldest[key] = max(oldest.get(key, 0.0), row.max_age_s)
        for key, age in oldest.items():
            seen[key].append((snap.at, age))
    history: dict[tuple[str, str], WorkloadHistory] = {}
    for key, points in seen.items():
        at = [t1 for (t0, a0), (t1, a1) in pairwise(points) if a1 < a0 + (t1 - t0) - tolerance_s]
        history[key] = WorkloadHistory(points[-1][0] - points[0][0], len(at), len(points),
                                       at[0] if at else 0.0, at[-1] if at else 0.0)
    return history


_NUMBER = re.compile(r"(\d+)")


def _natural(text: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in _NUMBER.split(text))


def _measured_tier(traffic: WorkloadTraffic | None) -> tuple[int, str]:
    if traffic is None:
        return 3, "not probed"
    if traffic.streams:
        return 4, "stream holders"
    if traffic.writes:
        return 2, "write paths"
    if traffic.reads:
        return 1, "read paths"
    return 3, "not probed"


def _tier_of(ns: str, wl: str, inp: PlanInput, settings: PlanSettings) -> tuple[Any, str, str]:
    """(order key, tier name, what decided it)."""
    if ns in settings.first_namespaces:
        return (0,), "reference target", "plan.first_namespaces"
    info = (inp.namespaces or {}).get(ns)
    if info is not None:
        value = info.labels.get(settings.tier_label, info.annotations.get(settings.tier_label))
        if value:
            return (1, _natural(value)), f"{settings.tier_label}={value}", "namespace label"
    if inp.traffic is None:
        return (2, 0), "unmeasured", "no probe data"
    order, name = _measured_tier(inp.traffic.get((ns, wl)))
    return (2, order), name, "probe measurements"


def restart_tiers(inp: PlanInput, settings: PlanSettings, rates: Mapping[tuple[str, str], Any]
           ) -> list[dict[str, Any]]:
    tiers: dict[str, dict[str, Any]] = {}
    for g in inp.pods:
        if g.version == NONE:
            continue
        key = (g.namespace, g.workload)
        order, name, basis = _tier_of(g.namespace, g.workload, inp, settings)
        tier = tiers.setdefault(name, {
            "name": name, "order": order, "basis": basis, "pods": 0, "workloads": set(),
            "namespaces": set(), "stream_holders": set(),
        })
        tier["pods"] += g.pods
        tier["workloads"].add(key)
        tier["namespaces"].add(g.namespace)
        traffic = (inp.traffic or {}).get(key)
        if traffic is not None and traffic.streams:
            tier["stream_holders"].add(key)
    out: list[dict[str, Any]] = []
    for tier in sorted(tiers.values(), key=lambda t: t["order"]):
        per_day = 0.0
        slowest: float | None = 0.0
        unknown = 0
        for key in tier["workloads"]:
            rate = rates.get(key)
            if rate is None or rate["interval_days"] is None:
                unknown += 1
                continue
            per_day += rate["pods"] / rate["interval_days"]
            slowest = max(slowest or 0.0, rate["interval_days"])
        out.append({
            "tier": len(out) + 1,
            "name": tier["name"],
            "basis": tier["basis"],
            "pods": tier["pods"],
            "namespaces": sorted(tier["namespaces"]),
            "workloads": [f"{ns}/{wl}" for ns, wl in sorted(tier["workloads"])],
            "stream_holders": [f"{ns}/{wl}" for ns, wl in sorted(tier["stream_holders"])],
            "_stream_keys": sorted(tier["stream_holders"]),
            "_keys": sorted(tier["workloads"]),
            "natural_recycle": None if inp.history is None else {
                "pods_per_day": round(per_day, 2),
                "slowest_interval_days": round(slowest, 2) if slowest else None,
                "workloads_not_seen_recycling": unknown,
            },
        })
    return out
