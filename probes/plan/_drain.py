"""Drain timers per tier from the measured p99, against the defaults in force."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from probes.plan._model import PlanInput

__all__ = ["DRAIN_DEFAULTS", "drain_timers"]

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
