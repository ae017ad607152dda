"""The upgrade's progress over recorded inventory snapshots (the report shows it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from probes._timeparse import rfc3339
from probes.inventory import Version, parse_version
from probes.plan._model import DAY, DEFAULT_MAX_POD_AGE_S
from probes.store.records import InventorySnapshot

__all__ = ["progress"]


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
