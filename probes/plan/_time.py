"""Time: natural recycle rates, the date without forced restarts, the long tail, the elapsed
time of forced tiered restarts, and the upgrade's progress over recorded inventory snapshots
(the report shows it: the date the present pace reaches every pod).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from probes._parsing import rfc3339
from probes.discovery.meshes import NONE
from probes.inventory import Version, parse_version
from probes.plan._model import DAY, DEFAULT_MAX_POD_AGE_S, PlanInput, PlanSettings
from probes.store.records import InventorySnapshot

__all__ = ["plan_time", "progress", "recycle_rates"]


def recycle_rates(inp: PlanInput, settings: PlanSettings) -> dict[tuple[str, str], dict[str, Any]]:
    pods: dict[tuple[str, str], int] = defaultdict(int)
    oldest: dict[tuple[str, str], float] = defaultdict(float)
    for g in inp.pods:
        if g.version == NONE:
            continue
        key = (g.namespace, g.workload)
        pods[key] += g.pods
        oldest[key] = max(oldest[key], g.max_age_s)
    rates = {}
    for key, n in pods.items():
        hist = (inp.history or {}).get(key)
        interval = hist.interval_s if hist is not None else None
        rates[key] = {
            "namespace": key[0], "workload": key[1], "pods": n,
            "oldest_age_days": round(oldest[key] / DAY, 2),
            "recycles": hist.recycles if hist else None,
            "observed_days": round(hist.span_s / DAY, 2) if hist else None,
            "interval_days": round(interval / DAY, 3) if interval else None,
            "long_tail": oldest[key] > settings.max_pod_age_s,
        }
    return rates


def plan_time(inp: PlanInput, settings: PlanSettings, rates: Mapping[tuple[str, str], Any],
          restarts: int, tiers: int) -> dict[str, Any]:
    tail = sorted((r for r in rates.values() if r["long_tail"]),
                  key=lambda r: (-r["oldest_age_days"], r["namespace"], r["workload"]))
    forced_s = restarts * (tiers * settings.tier_every_s + settings.soak_s)
    result: dict[str, Any] = {
        "max_pod_age_days": round(settings.max_pod_age_s / DAY, 2),
        "long_tail": {"pods": sum(r["pods"] for r in tail), "workloads": tail},
        "forced": {
            "elapsed_days": round(forced_s / DAY, 2),
            "arithmetic": (
                f"{restarts} restart{'s' if restarts != 1 else ''} × ({tiers} tier"
                f"{'s' if tiers != 1 else ''} × {settings.tier_every_s / DAY:g} d + soak"
                f" {settings.soak_s / DAY:g} d) = {forced_s / DAY:g} d"
            ),
            "done_by": rfc3339(inp.at + forced_s),
        },
    }
    if inp.history is None:
        result["natural"] = None
        return result
    known = [r for r in rates.values() if not r["long_tail"] and r["interval_days"]]
    unseen = sorted(
        (r for r in rates.values() if not r["long_tail"] and not r["interval_days"]),
        key=lambda r: (r["namespace"], r["workload"]))
    slowest = max(known, key=lambda r: r["interval_days"], default=None)
    days = restarts * slowest["interval_days"] if slowest else None
    result["natural"] = {
        "workloads": sorted(rates.values(), key=lambda r: (r["namespace"], r["workload"])),
        "slowest": None if slowest is None else f"{slowest['namespace']}/{slowest['workload']}",
        "days": round(days, 2) if days is not None else None,
        "arithmetic": None if slowest is None else (
            f"{restarts} restart{'s' if restarts != 1 else ''} × the slowest natural recycle"
            f" ({slowest['namespace']}/{slowest['workload']}: every"
            f" {slowest['interval_days']:g} d) = {days:g} d"
        ),
        "done_by": rfc3339(inp.at + days * DAY) if days is not None else None,
        "at_least": bool(unseen),
        "not_seen_recycling": [f"{r['namespace']}/{r['workload']}" for r in unseen],
        "never": [f"{r['namespace']}/{r['workload']}" for r in tail],
    }
    return result


def progress(snapshots: Sequence[InventorySnapshot], *, target: str | None = None,
             max_pod_age_s: float = DEFAULT_MAX_POD_AGE_S) -> dict[str, Any] | None:
    """The upgrade's progress from stored snapshots (for `skewprobe report`): per snapshot
    the share of pods on `target` (default: the newest version seen), the namespaces done,
    and the long tail (pods off target in rows whose oldest pod is past the maximum age); the
    date the present pace reaches every pod, from a straight line through the share over
    the span (None while it does not rise). None without snapshots."""
    if not snapshots:
        return None
    ordered = sorted(snapshots, key=lambda snap: snap.at)
    if target is None:
        seen = {r.proxy_version for snap in ordered for r in snap.rows}
        versions = [v for v in seen if parse_version(v) is not None]
        if not versions:
            return None
        target = max(versions, key=lambda v: parse_version(v) or Version(0, 0, 0, True))
    points: list[dict[str, Any]] = []
    shares: list[tuple[float, float]] = []
    for snap in ordered:
        rows = [r for r in snap.rows if parse_version(r.proxy_version) is not None]
        pods = sum(r.pods for r in rows)
        on = sum(r.pods for r in rows if r.proxy_version == target)
        namespaces = {r.namespace for r in rows}
        behind = {r.namespace for r in rows if r.proxy_version != target}
        tail = sum(r.pods for r in rows
                   if r.proxy_version != target and r.max_age_s > max_pod_age_s)
        points.append({
            "at": rfc3339(snap.at), "pods": pods, "on_target": on,
            "share": round(on / pods, 4) if pods else None,
            "namespaces_done": len(namespaces - behind), "namespaces": len(namespaces),
            "long_tail_pods": tail,
        })
        if pods:
            shares.append((snap.at, on / pods))
    projected: str | None = None
    if len(shares) >= 2:
        t0 = shares[0][0]
        xs = [t - t0 for t, _ in shares]
        ys = [v for _, v in shares]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0
        if ys[-1] >= 1.0:
            projected = rfc3339(shares[-1][0])
        elif slope > 0:
            projected = rfc3339(shares[-1][0] + (1.0 - ys[-1]) / slope)
    return {
        "target": target, "max_pod_age_days": round(max_pod_age_s / DAY, 2),
        "points": points, "projected_done_by": projected,
        "projection": ("a straight line through the share on the target over the recorded"
                       " snapshots" if projected else
                       "none: the share on the target does not rise over the recorded span"),
        "tiers": "tiers are not recorded (namespace labels are not in the store):"
                 " namespaces with every pod on the target stand in for them",
    }
