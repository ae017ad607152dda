"""The upgrade plan: pure functions from plain dataclasses to a JSON-ready plan.

`skewprobe plan --to VERSION` answers the platform team's question — take every sidecar from
where it is to VERSION without leaving a pod outside the supported skew — from facts the probe
already holds (`probes.plan_cli` gathers them; nothing here does I/O):

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

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType
from typing import Any, Final

from probes._spec import PlanSpec, SkewPolicy
from probes._timeparse import rfc3339
from probes.discovery.meshes import NONE
from probes.inventory import Version, parse_version
from probes.store.records import InventorySnapshot

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

_NUMBER = re.compile(r"(\d+)")


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


# -- steps -------------------------------------------------------------------------------


def _label(major: int, minor: int, target: Version, text: str) -> str:
    """The version a step moves to: the target itself, or an intermediate minor (its latest
    patch: `1.23.x`)."""
    if (major, minor) == (target.major, target.minor):
        return text
    return f"{major}.{minor}.x"


def _within(v: tuple[int, int], cp_minor: int, policy: SkewPolicy) -> bool:
    return cp_minor - policy.behind <= v[1] <= cp_minor + policy.ahead


def _workloads(groups: Iterable[tuple[PlanPods, Any]]) -> list[dict[str, Any]]:
    by: dict[tuple[str, str, str], list[PlanPods]] = defaultdict(list)
    for g, _ in groups:
        by[(g.namespace, g.workload, g.version)].append(g)
    return [
        {"namespace": ns, "workload": wl, "proxy_version": v,
         "pods": sum(g.pods for g in gs),
         "names": sorted(n for g in gs for n in g.names)}
        for (ns, wl, v), gs in sorted(by.items())
    ]


def plan_steps(
    pods: Sequence[PlanPods], control_plane: str, target: str, policy: SkewPolicy
) -> dict[str, Any]:
    """The ordered control-plane moves and fleet restarts from `control_plane` to `target`.

    Raises ValueError for a target that does not parse, a downgrade or a major-version move.
    Pods without a proxy are left out; pods whose version does not parse are listed under
    `not_planned` (never assumed to be anywhere).
    """
    tv, cv = parse_version(target), parse_version(control_plane)
    if tv is None:
        raise ValueError(f"--to {target!r} is not a version like 1.24.2")
    if cv is None:
        raise ValueError(f"control-plane version {control_plane!r} is not comparable")
    if tv.major != cv.major:
        raise ValueError(f"{control_plane} → {target} changes the major version: not planned")
    if tv < cv:
        raise ValueError(f"--to {target} is older than the control plane ({control_plane}):"
                         " a downgrade is not planned")

    # Each group's (major, minor) and version as the plan moves it; `initial` keeps today's.
    state: list[tuple[PlanPods, tuple[int, int], Version]] = []
    not_planned: list[PlanPods] = []
    without_proxy = 0
    for g in pods:
        if g.version == NONE:
            without_proxy += g.pods
            continue
        v = parse_version(g.version)
        if v is None or v.major != tv.major:
            not_planned.append(g)
        else:
            state.append((g, (v.major, v.minor), v))
    initial = list(state)

    steps: list[dict[str, Any]] = []
    cp_minor = cv.minor
    cp_label = control_plane
    prev_cp: tuple[int, str] | None = None  # the control plane before the last move

    def add_restart(to_minor: int, why: str, *, final: bool, label: str = "") -> None:
        nonlocal state
        moved: list[tuple[PlanPods, Any]] = []
        kept = []
        for g, mv, v in state:
            behind = mv[1] < to_minor or (final and mv[1] == to_minor and v < tv)
            if behind:
                moved.append((g, mv))
                kept.append((g, (tv.major, to_minor),
                             tv if final else Version(tv.major, to_minor, 0, True)))
            else:
                kept.append((g, mv, v))
        if not moved:
            return
        state = kept
        step: dict[str, Any] = {
            "kind": "restart",
            "to": target if final else label or _label(tv.major, to_minor, tv, target),
            "pods": sum(g.pods for g, _ in moved),
            "workloads": len({(g.namespace, g.workload) for g, _ in moved}),
            "from": _version_counts((g.version, g.pods) for g, _ in moved),
            "why": why,
            "touches": sorted({f"{g.namespace}/{g.workload}" for g, _ in moved}),
        }
        ambient = sum(g.pods for g, _ in moved if g.mode == "ambient")
        if ambient:
            # An ambient pod's proxy is its node's ztunnel: the DaemonSet moves it, no restart.
            step["ambient_pods"] = ambient
            step["ztunnel_note"] = (f"{ambient} ambient pods move with the ztunnel on their"
                                    " nodes (a DaemonSet upgrade), not by restarting them")
        if prev_cp is not None and not _within((tv.major, to_minor), prev_cp[0], policy):
            step["unsupported_if_control_plane_moves_back"] = {
                "control_plane": prev_cp[1],
                "pods": step["pods"],
                "workloads": _workloads(moved),
            }
        steps.append(step)

    # Pods already outside the skew of today's control plane: restart them first.
    outside_now = [(g, mv) for g, mv, _ in state if not _within(mv, cp_minor, policy)]
    if outside_now:
        add_restart(cp_minor, f"onto {control_plane}: they are outside the supported skew of"
                    " the control plane in force already", final=False, label=control_plane)

    at_target = cv.minor == tv.minor and not cv < tv
    while not at_target:
        lowest = min((mv[1] for _, mv, _ in state), default=cp_minor)
        if cp_minor < tv.minor and lowest < cp_minor and lowest + policy.behind <= cp_minor:
            # The oldest proxies are as far behind as allowed: any move would push them out.
            add_restart(cp_minor, (
                f"onto the control plane's version ({cp_label}) first: on {tv.major}.{lowest}"
                f" they would be more than {policy.behind} minor behind its next move"
            ), final=False, label=cp_label)
            lowest = cp_minor
        if cp_minor == tv.minor:
            nxt = tv.minor  # a patch move of the control plane
        else:
            nxt = max(cp_minor + 1, min(tv.minor, lowest + policy.behind))
        # Pods outside after the move: as the plan leaves them, and were it made now.
        left = [(g, mv) for g, mv, _ in state if not _within(mv, nxt, policy)]
        now = [(g, mv) for g, mv, _ in initial if not _within(mv, nxt, policy)]
        move: dict[str, Any] = {
            "kind": "control_plane", "from": cp_label, "to": _label(tv.major, nxt, tv, target),
            "left_outside": {"pods": sum(g.pods for g, _ in left), "workloads": _workloads(left)},
            "outside_if_made_now": {
                "pods": sum(g.pods for g, _ in now), "workloads": _workloads(now)},
        }
        if nxt < tv.minor:
            move["why"] = (
                f"as far as the oldest proxy allows: {tv.major}.{lowest} may be at most"
                f" {policy.behind} minor behind, so not yet {tv.major}.{tv.minor}")
        prev_cp = (cp_minor, cp_label)
        cp_minor, cp_label = nxt, move["to"]
        steps.append(move)
        at_target = cp_minor == tv.minor
        add_restart(cp_minor, (
            f"onto the target {target}" if at_target else
            f"onto {cp_label}: below it they would be more than {policy.behind} minor"
            f" behind the next control-plane move, and they cannot go to {target} before"
            f" the control plane does"
        ), final=at_target)
    if any(v < tv for _, _, v in state):
        add_restart(cp_minor, f"onto the target {target}", final=True)

    for number, step in enumerate(steps, 1):
        step["step"] = number
    restarts = [s for s in steps if s["kind"] == "restart"]
    moves = [s for s in steps if s["kind"] == "control_plane"]
    return {
        "steps": steps,
        "control_plane_moves": len(moves),
        "fleet_restarts": len(restarts),
        "why": _why(policy, steps),
        "point_of_no_return": _point_of_no_return(steps),
        "without_proxy": without_proxy,
        "not_planned": _workloads((g, None) for g in not_planned),
    }


def _why(policy: SkewPolicy, steps: Sequence[Mapping[str, Any]]) -> str:
    """Why this many restarts: the skew rule, then what each restart is for."""
    restarts = [s for s in steps if s["kind"] == "restart"]
    rule = (f"a proxy may be at most {policy.behind} minor behind its control plane and"
            f" {'never' if policy.ahead == 0 else f'at most {policy.ahead} minor'} ahead")
    count = len(restarts)
    head = (f"{count} fleet restarts, not one" if count > 1 else
            f"{count} fleet restart{'s' if count != 1 else ''}")
    parts = [f"step {r['step']} restarts {r['pods']} pods {r['why']}" for r in restarts]
    if parts:
        parts[0] = "S" + parts[0][1:]
    return f"{head}: {rule}" + (". " + "; ".join(parts) if parts else "") + "."


def _point_of_no_return(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    for step in steps:
        unsupported = step.get("unsupported_if_control_plane_moves_back")
        if unsupported:
            return {
                "step": step["step"],
                "what": f"restart onto {step['to']}",
                "why": (
                    f"after it, {unsupported['pods']} pods run {step['to']}, newer than the"
                    f" control plane before the last move ({unsupported['control_plane']}):"
                    " moving the control plane back would leave them outside the supported"
                    " skew, so a rollback means restarting pods (forward, or back onto a"
                    " pinned older revision while its control plane still runs), not moving"
                    " the control plane back"
                ),
                "unsupported": unsupported,
            }
    return None


def _version_counts(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for v, n in pairs:
        totals[v] += n
    return dict(sorted(totals.items(), key=lambda kv: _sort_version(kv[0])))


def _sort_version(text: str) -> tuple[int, Any]:
    parsed = parse_version(text)
    return (0, parsed) if parsed is not None else (1, text)


# -- history -----------------------------------------------------------------------------


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


# -- tiers -------------------------------------------------------------------------------


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


def _tiers(inp: PlanInput, settings: PlanSettings, rates: Mapping[tuple[str, str], Any]
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


# -- time --------------------------------------------------------------------------------


def _rates(inp: PlanInput, settings: PlanSettings) -> dict[tuple[str, str], dict[str, Any]]:
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


def _time(inp: PlanInput, settings: PlanSettings, rates: Mapping[tuple[str, str], Any],
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


# -- connection lifetime -----------------------------------------------------------------

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


def _lifetime(inp: PlanInput, tiers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
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


# -- drain timers ------------------------------------------------------------------------

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


def _drain(inp: PlanInput, tiers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
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


# -- pinning -----------------------------------------------------------------------------


def _pinning(inp: PlanInput) -> list[dict[str, Any]] | None:
    """Per namespace with pods: a revision label pins the injected version; Istio's default
    injector (`istio-injection=enabled`) follows whatever the default control plane is."""
    if inp.namespaces is None:
        return None
    present = sorted({g.namespace for g in inp.pods if g.version != NONE})
    out = []
    for ns in present:
        info = inp.namespaces.get(ns, NamespaceInfo(ns))
        rev = info.labels.get("istio.io/rev")
        if inp.mesh == "linkerd":
            state, detail = "n/a", "Linkerd has no revisions: the injector is the control plane's"
        elif rev:
            state, detail = "pinned", f"istio.io/rev={rev}"
        elif info.labels.get("istio-injection") == "enabled":
            state, detail = "default injector", "istio-injection=enabled: follows the default"
        else:
            revs = sorted({g.revision for g in inp.pods  # "default": the default injector's
                           if g.namespace == ns and g.revision not in ("", "default")})
            state = "pinned per pod" if revs else "not pinned"
            detail = f"pod revisions {', '.join(revs)}" if revs else "no revision label"
        out.append({"namespace": ns, "state": state, "detail": detail})
    return out


# -- progress over the recorded period ----------------------------------------------------


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


# -- the whole plan ----------------------------------------------------------------------


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
    rates = _rates(inp, settings)
    tiers = _tiers(inp, settings, rates)
    lifetime = _lifetime(inp, tiers)
    drain = _drain(inp, tiers)
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
        "versions": _version_counts((g.version, g.pods) for g in inp.pods),
        "control_plane": inp.control_plane,
        "supported_skew": {"behind": settings.policy.behind, "ahead": settings.policy.ahead,
                           "source": settings.policy_source},
    }
    plan.update(steps)
    plan["tiers"] = tiers
    plan["time"] = _time(inp, settings, rates, steps["fleet_restarts"], len(tiers))
    plan["connection_lifetime"] = {"streams": lifetime, "levers": list(LEVERS)}
    plan["drain"] = {"tiers": drain, "defaults": dict(DRAIN_DEFAULTS)}
    plan["pinning"] = _pinning(inp)
    plan["missing"] = missing
    return plan
