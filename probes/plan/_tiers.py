"""Restart tiers and what each needs before its restart.

The tiers: reference target first, then a namespace label, then what the probe measured; and
each workload's recycles from the recorded inventory history. Per tier, connection lifetime
first (which stream tiers lack a lifetime cap, and what each lever does to an endless
stream), then the drain timers from the measured p99, against the defaults in force.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise
from types import MappingProxyType
from typing import Any, Final

from probes.discovery.meshes import NONE
from probes.plan._model import DAY, PlanInput, PlanSettings, WorkloadHistory, WorkloadTraffic
from probes.store.records import InventorySnapshot

__all__ = [
    "DRAIN_DEFAULTS",
    "LEVERS",
    "WEEK",
    "drain_timers",
    "lifetime_steps",
    "restart_tiers",
    "workload_history",
]


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


WEEK: Final = 7 * DAY
# What each lever does to a stream that never ends on its own.
LEVERS: Final = (
    "Envoy max_connection_duration drains the connection with GOAWAY but does not end the"
    " streams active on it (envoyproxy/envoy#10274): an endless stream outlives it",
    "Envoy max_stream_duration ends each stream at the limit",
    "gRPC MAX_CONNECTION_AGE with MAX_CONNECTION_AGE_GRACE: GOAWAY at the age, active"
    " streams cut when the grace ends",
    "the client's own rotation (re-opening streams older than a limit) ends them without"
    " a reset",
)


def lifetime_steps(inp: PlanInput, tiers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per tier holding streams: each stream path's cap, and without a proven cap the step
    to take weeks before the tier, with the streams a restart now would reset together."""
    out = []
    for tier in tiers:
        paths = sorted({p for key in tier["_stream_keys"]
                        for p in (inp.traffic or {})[key].streams})
        for path in paths:
            found = None if inp.lifetimes is None else inp.lifetimes.get(path)
            entry: dict[str, Any] = {"tier": tier["tier"], "tier_name": tier["name"],
                                     "path": path}
            if not found:
                entry.update(capped=None, why=(
                    "no lifetime check recorded for this path"
                    f" ({inp.lifetimes_source or 'no store'}): not known to be capped"))
            else:
                capped = all(f.get("capped") for f in found)
                caps = [f["cap_s"] for f in found if f.get("cap_s")]
                held = max(float(f.get("oldest_s") or 0.0) for f in found)
                entry.update(
                    capped=capped, cap_s=max(caps) if capped and caps else None,
                    why="; ".join(f"{f.get('cohort', '?')}: {f.get('why', '')}" for f in found),
                    open_streams=sum(int(f.get("open_streams") or 0) for f in found),
                    aged=sum(int(f.get("aged") or 0) for f in found),
                    oldest_s=held,
                )
            if not entry["capped"]:
                oldest: float | None = entry.get("oldest_s")
                weeks = max(1, -(-int(oldest or 0) // int(WEEK))) if oldest else None
                entry["step"] = (
                    f"roll out a maximum connection duration {weeks} week"
                    f"{'s' if weeks != 1 else ''} before tier {tier['tier']}" if weeks else
                    f"roll out a maximum connection duration before tier {tier['tier']}, at"
                    " least as long before it as its longest-lived connection"
                )
                if weeks and oldest:
                    entry["lead"] = (
                        f"a cap applies to connections opened after it is in force; the oldest"
                        f" stream the probe holds on {path} is {oldest / 3600:.1f} h old:"
                        f" {weeks} week{'s' if weeks != 1 else ''} covers it")
                if "open_streams" in entry:
                    entry["storm"] = (
                        f"restarting tier {tier['tier']} now resets the {entry['open_streams']}"
                        f" streams the probe holds on {path} together ({entry['aged']} older"
                        " than an hour); the mesh's own callers hold more")
            out.append(entry)
    return out


# The defaults a pod gets without settings, and where they are written: Istio's four
# termination settings and their defaults are listed in istio/istio#34855; Envoy's hot-restart
# flags in its command-line options (--drain-time-s, --parent-shutdown-time-s).
DRAIN_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType({
    "istio_termination_drain_duration_s": 5,
    "kubernetes_termination_grace_period_s": 30,
    "envoy_drain_time_s": 600,
    "envoy_parent_shutdown_time_s": 900,
    "source": "Istio terminationDrainDuration 5 s and the pod's terminationGracePeriodSeconds"
              " 30 s (istio/istio#34855); Envoy --drain-time-s 600 s and"
              " --parent-shutdown-time-s 900 s, edge defaults (its docs suggest about 60 and"
              " 90 s between services)",
})
_DRAIN_FACTOR: Final = 3  # the request in flight, the retry it may cause, and a margin
_GRACE_MARGIN_S: Final = 5  # after the drain: the app's own stop before SIGKILL


def drain_timers(inp: PlanInput, tiers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per tier: the drain its slowest measured path needs, with the arithmetic."""
    out = []
    for tier in tiers:
        paths = sorted({p for key in tier["_keys"] for t in [(inp.traffic or {}).get(key)]
                        if t is not None for p in (*t.reads, *t.writes)})
        entry: dict[str, Any] = {"tier": tier["tier"], "name": tier["name"]}
        measured = {p: (inp.latency or {})[p] for p in paths if p in (inp.latency or {})}
        if not measured:
            entry["drain_s"] = None
            entry["why"] = ("no measured request durations for this tier's paths"
                            f" ({inp.latency_source or 'no store'})")
            out.append(entry)
            continue
        path, (p99, calls) = max(measured.items(), key=lambda kv: kv[1][0])
        raw = _DRAIN_FACTOR * p99
        drain = max(DRAIN_DEFAULTS["istio_termination_drain_duration_s"], -(-raw // 1))
        grace = max(int(drain) + _GRACE_MARGIN_S,
                    DRAIN_DEFAULTS["kubernetes_termination_grace_period_s"])
        entry.update(
            drain_s=int(drain), termination_grace_period_s=grace, slowest_path=path,
            p99_ms=round(p99 * 1000, 1), calls=calls,
            arithmetic=(
                f"terminationDrainDuration = max(5 s, ⌈{_DRAIN_FACTOR} × p99 of {path}"
                f" {p99 * 1000:.0f} ms⌉) = {int(drain)} s (the request in flight, the retry"
                f" it may cause, a margin); terminationGracePeriodSeconds = max(30 s,"
                f" {int(drain)} + {_GRACE_MARGIN_S} s) = {grace} s"
            ),
            against_defaults=(
                f"Istio's default drain (5 s) {'covers' if drain <= 5 else 'is SHORTER than'}"
                f" it; Envoy's 600 s edge drain would hold each pod {600 - int(drain)} s"
                " longer than the measured requests need"
            ),
        )
        entry["in_force"] = _in_force(inp, tier["_keys"], int(drain), grace)
        if tier["_stream_keys"]:
            entry["streams"] = ("held streams do not finish within any drain: they end when"
                                " it does unless a lifetime cap ended them first (see"
                                " connection lifetime)")
        out.append(entry)
    return out


def _in_force(inp: PlanInput, keys: Sequence[tuple[str, str]], drain: int, grace: int
              ) -> dict[str, Any] | None:
    """The tier's pods' own settings against the recommendation (None: not known, as in a
    store, which keeps counts, not pod specs)."""
    pods = [g for g in inp.pods if (g.namespace, g.workload) in set(keys) and g.names]
    if not pods:
        return None
    graces = [g.grace_s if g.grace_s is not None else 30.0 for g in pods]
    drains = [g.drain_s if g.drain_s is not None else 5.0 for g in pods]
    short_grace = sorted({f"{g.namespace}/{g.workload}" for g, v in zip(pods, graces, strict=True)
                          if v < grace})
    short_drain = sorted({f"{g.namespace}/{g.workload}" for g, v in zip(pods, drains, strict=True)
                          if v < drain})
    return {
        "pods": len(pods),
        "grace_s": [min(graces), max(graces)], "drain_s": [min(drains), max(drains)],
        "grace_too_short": short_grace, "drain_too_short": short_drain,
    }
