"""Time: natural recycle rates, the date without forced restarts, the long tail, and the
elapsed time of forced tiered restarts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from probes._timeparse import rfc3339
from probes.discovery.meshes import NONE
from probes.plan._model import DAY, PlanInput, PlanSettings

__all__ = ["plan_time", "recycle_rates"]


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
