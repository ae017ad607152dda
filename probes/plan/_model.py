"""The planner's inputs and settings (plain dataclasses) and the defaults it cites."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from probes.spec import PlanSpec, SkewPolicy

__all__ = [
    "DAY",
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
]

_DEFAULTS: Final = PlanSpec()  # the config's defaults are the planner's, written once
# Where the reference target is installed (README, "Deploy to a cluster"): the first tier.
DEFAULT_FIRST_NAMESPACES: Final = _DEFAULTS.first_namespaces
# A namespace label (or annotation) whose value orders restart tiers: 0, 1, 2 ... or names.
DEFAULT_TIER_LABEL: Final = _DEFAULTS.tier_label
# A pod older than this is not recycled by its team's deploys: the long tail.
DEFAULT_MAX_POD_AGE_S: Final = _DEFAULTS.max_pod_age_s
DAY: Final = 86400.0

# The supported skew each mesh publishes, as the plan cites it.
SKEW_SOURCES: Final[Mapping[str, str]] = MappingProxyType({
    "istio": "Istio's supported releases, istio.io/latest/docs/releases/supported-releases"
             " (Control Plane/Data Plane Skew: the control plane may be one minor version"
             " ahead of the data plane; the data plane may not be ahead of the control plane)",
    "linkerd": "linkerd.io/2/tasks/upgrade (Upgrade paths: upgrade to the next major version"
               " from the latest minor of the previous one, control plane first, then the data"
               " plane; Linkerd's 2.<major> is the minor number here)",
    "generic": "the default, one minor behind and never ahead (no mesh policy known;"
               " set targets.kubernetes.supported_skew)",
    "": "the default, one minor behind and never ahead, as Istio and Linkerd publish (the"
        " mesh is not recorded in a store: give --config to name it)",
})

@dataclass(frozen=True, slots=True)
class PlanPods:
    """Pods of one workload on one proxy version: one live pod (`names` holds it) or one
    stored inventory row (`names` empty: a snapshot keeps counts, not names)."""

    namespace: str
    workload: str
    version: str
    pods: int = 1
    max_age_s: float = 0.0
    names: tuple[str, ...] = ()
    mode: str = ""  # sidecar, native-sidecar, ambient, none; "" when not recorded
    revision: str = ""
    grace_s: float | None = None  # terminationGracePeriodSeconds (None: not known)
    drain_s: float | None = None  # Istio terminationDrainDuration set on the pod


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """A namespace's labels and annotations (tier label, injection and revision)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class WorkloadTraffic:
    """The probe's paths that reach a workload, by what they do."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    streams: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadHistory:
    """A workload's recycles (its oldest pod replaced) over the recorded span: how many, and
    the first and last snapshot that saw one."""

    span_s: float
    recycles: int
    snapshots: int
    first_s: float = 0.0
    last_s: float = 0.0

    @property
    def interval_s(self) -> float | None:
        """Seconds between recycles: between the first and the last seen when there are two
        or more (the span's ends cut a cycle short), else the span (an upper bound); None
        when none was seen (the interval exceeds the span)."""
        if self.recycles >= 2:
            return (self.last_s - self.first_s) / (self.recycles - 1)
        return self.span_s if self.recycles else None


@dataclass(frozen=True, slots=True)
class PlanSettings:
    """What the user decides: the target, the skew, the tiers' order and pace."""

    target: str
    policy: SkewPolicy = SkewPolicy()
    policy_source: str = ""
    first_namespaces: tuple[str, ...] = DEFAULT_FIRST_NAMESPACES
    tier_label: str = DEFAULT_TIER_LABEL
    max_pod_age_s: float = DEFAULT_MAX_POD_AGE_S
    tier_every_s: float = _DEFAULTS.tier_every_s
    soak_s: float = _DEFAULTS.soak_s


@dataclass(frozen=True, slots=True)
class PlanInput:
    """The facts: pods, the control plane, and what is known besides (None: not known)."""

    source: str  # "kubernetes" (live) or "store" (recorded)
    at: float
    pods: tuple[PlanPods, ...]
    control_plane: str | None
    control_plane_source: str = ""
    mesh: str = ""
    namespaces: Mapping[str, NamespaceInfo] | None = None
    namespaces_source: str = ""
    traffic: Mapping[tuple[str, str], WorkloadTraffic] | None = None
    traffic_source: str = ""
    history: Mapping[tuple[str, str], WorkloadHistory] | None = None
    history_source: str = ""
    # stream path → the latest lifetime check per cohort (`lifetime` events' details, with
    # `cohort`): is a maximum connection / stream duration in effect?
    lifetimes: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
    lifetimes_source: str = ""
    # unary path → (p99 seconds, calls) the probe measured, for drain timers
    latency: Mapping[str, tuple[float, int]] | None = None
    latency_source: str = ""
