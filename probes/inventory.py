"""The rollout inventory and the skew bound: pure functions over pods or stored rows.

From the pods discovery keeps (`PodRecord`, live) or the rows a store snapshot holds
(`InventoryRow`: namespace × workload × proxy version → pods, oldest age), this computes:

- pods per proxy version, per namespace and per owner workload;
- the **newest** data-plane version and the fraction of pods with a known proxy version
  that run it (pods without a proxy, cohort `none`, are counted apart: missing injection is
  a finding of its own);
- the **long tail**: workloads with pods still on an older version, oldest pod first —
  the teams holding the control-plane upgrade hostage;
- the **skew bound**: each pod's proxy against the control plane that serves it (its Istio
  revision's istiod, else the default one) under the supported skew (default: at most one
  minor version behind, never ahead). Pods outside it are the seed's "skew exceeded"
  before it happens: set `control_plane_version` (or `inventory --control-plane`) to the
  version you are about to install and the report names who would fall out of support.

Versions are compared as major.minor[.patch] after dropping a release-channel prefix
(`stable-2.14.10`, `edge-24.5.1`, `v1.22.3`); a version that does not parse (`unknown`,
a custom tag) is reported as not judged, never as inside the bound.
`SkewMetrics` exports the bound and the rollout fraction next to the inventory series.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from probes._parsing import rfc3339
from probes.discovery.meshes import NONE, UNKNOWN, ControlPlane
from probes.discovery.pods import PodRecord
from probes.spec import SkewPolicy
from probes.store.records import InventoryRow

__all__ = [
    "CONTROL_PLANE_EVENT",
    "SkewFinding",
    "SkewMetrics",
    "Version",
    "control_plane_for",
    "inventory_rows",
    "judge_skew",
    "newest_version",
    "parse_version",
    "planes_from_detail",
    "report_from_pods",
    "report_from_rows",
]

_VERSION = re.compile(r"^(?:[a-z]+-)?v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+](.*))?$")
NOT_A_VERSION: Final = frozenset({NONE, UNKNOWN, ""})

# The store event a running probe writes when the control plane it sees changes
# (detail: {"versions": [{"version", "revision", "source"}, ...]}).
CONTROL_PLANE_EVENT = "control_plane"


def planes_from_detail(detail: Mapping[str, Any]) -> tuple[ControlPlane, ...]:
    """The control planes a recorded `control_plane` event names."""
    return tuple(
        ControlPlane(str(p.get("version", "")), str(p.get("revision", "")),
                     str(p.get("source", "")))
        for p in detail.get("versions") or ()
        if p.get("version")
    )


@dataclass(frozen=True, slots=True, order=True)
class Version:
    """A comparable proxy version; a pre-release (`1.23.0-beta.1`) sorts before its release."""

    major: int
    minor: int
    patch: int
    release: bool
    pre: str = ""


def parse_version(text: str) -> Version | None:
    """`1.22.3`, `1.22.3-distroless`, `stable-2.14.10`, `v1.22` → Version; else None."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch, rest = match.groups()
    pre = rest or ""
    release = pre in ("", "distroless", "debug")
    return Version(int(major), int(minor), int(patch or 0), release, "" if release else pre)


def newest_version(versions: Iterable[str]) -> str | None:
    """The highest parseable version (ties: the first seen)."""
    best: tuple[Version, str] | None = None
    for text in versions:
        parsed = parse_version(text)
        if parsed is not None and (best is None or parsed > best[0]):
            best = (parsed, text)
    return best[1] if best else None


# -- the skew bound ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SkewFinding:
    """A data-plane version judged against a control plane.

    `status`: `ok`, `outside`, `unknown` (a version does not parse or no control plane is
    known) or `no_proxy`.
    """

    status: str
    control_plane: str = ""
    reason: str = ""


def control_plane_for(revision: str, planes: Sequence[ControlPlane]) -> ControlPlane | None:
    """The control plane serving a pod: its revision's, else the default, else the newest."""
    if not planes:
        return None
    if len(planes) == 1:
        return planes[0]
    if revision:
        for plane in planes:
            if plane.revision == revision:
                return plane
    for plane in planes:
        if plane.revision in ("", "default"):
            return plane
    newest = newest_version(p.version for p in planes)
    return next((p for p in planes if p.version == newest), planes[0])


def judge_skew(version: str, plane: ControlPlane | None, policy: SkewPolicy) -> SkewFinding:
    """Is `version` within `policy` of the control plane `plane`?"""
    if version == NONE:
        return SkewFinding("no_proxy")
    if plane is None:
        return SkewFinding("unknown", "", "control-plane version unknown")
    data, control = parse_version(version), parse_version(plane.version)
    if data is None or control is None:
        bad = version if data is None else plane.version
        return SkewFinding("unknown", plane.version, f"{bad!r} is not a comparable version")
    if data.major != control.major:
        return SkewFinding(
            "outside", plane.version,
            f"major version {data.major} against control plane {plane.version}",
        )
    behind = control.minor - data.minor
    if behind > policy.behind:
        return SkewFinding(
            "outside", plane.version,
            f"{behind} minor versions behind control plane {plane.version}"
            f" (supported: {policy.behind})",
        )
    if -behind > policy.ahead:
        return SkewFinding(
            "outside", plane.version,
            f"{-behind} minor version{'s' if -behind > 1 else ''} ahead of control plane"
            f" {plane.version} (supported: {policy.ahead})",
        )
    return SkewFinding("ok", plane.version)


# -- aggregation -------------------------------------------------------------------------


def inventory_rows(pods: Iterable[PodRecord], now: float) -> list[InventoryRow]:
    """Counted pods grouped by namespace × workload × proxy version (the store's rows)."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for pod in pods:
        if pod.counted:
            groups[(pod.namespace, pod.workload, pod.proxy.version)].append(pod.age_s(now))
    return [
        InventoryRow(ns, workload, version, len(ages), max(ages))
        for (ns, workload, version), ages in sorted(groups.items())
    ]


def _version_order(versions: Iterable[str]) -> list[str]:
    """Newest first; unparseable versions after, then `unknown`, then `none`."""
    def key(v: str) -> tuple[int, Any]:
        parsed = parse_version(v)
        if parsed is not None:
            return (0, _Desc(parsed))
        return ({UNKNOWN: 2, NONE: 3}.get(v, 1), v)
    return sorted(set(versions), key=key)


class _Desc:
    """Sort key wrapper: reverses the order of versions (newest first)."""

    __slots__ = ("v",)

    def __init__(self, v: Version) -> None:
        self.v = v

    def __lt__(self, other: _Desc) -> bool:
        return self.v > other.v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.v == other.v

    def __hash__(self) -> int:
        return hash(self.v)


def _counts(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for version, n in pairs:
        totals[version] += n
    return {v: totals[v] for v in _version_order(totals)}


def _summary(rows: Sequence[InventoryRow]) -> dict[str, Any]:
    versions = _counts((r.proxy_version, r.pods) for r in rows)
    newest = newest_version(versions)
    known = sum(n for v, n in versions.items() if v not in NOT_A_VERSION)
    on_newest = versions.get(newest, 0) if newest else 0
    newest_parsed = parse_version(newest) if newest else None

    by_ns: dict[str, list[InventoryRow]] = defaultdict(list)
    by_workload: dict[tuple[str, str], list[InventoryRow]] = defaultdict(list)
    for row in rows:
        by_ns[row.namespace].append(row)
        by_workload[(row.namespace, row.workload)].append(row)

    namespaces = [
        {
            "namespace": ns,
            "pods": sum(r.pods for r in group),
            "versions": _counts((r.proxy_version, r.pods) for r in group),
            "oldest_age_s": {
                v: round(max(r.max_age_s for r in group if r.proxy_version == v), 1)
                for v in _version_order(r.proxy_version for r in group)
            },
        }
        for ns, group in sorted(by_ns.items())
    ]
    workloads: list[dict[str, Any]] = []
    long_tail: list[dict[str, Any]] = []
    for (ns, workload), group in sorted(by_workload.items()):
        entry = {
            "namespace": ns,
            "workload": workload,
            "pods": sum(r.pods for r in group),
            "versions": _counts((r.proxy_version, r.pods) for r in group),
            "oldest_age_s": round(max(r.max_age_s for r in group), 1),
        }
        workloads.append(entry)
        old = [r for r in group if _older(r.proxy_version, newest_parsed)]
        if old:
            long_tail.append({
                "namespace": ns,
                "workload": workload,
                "old_pods": sum(r.pods for r in old),
                "pods": entry["pods"],
                "versions": _counts((r.proxy_version, r.pods) for r in old),
                "oldest_age_s": round(max(r.max_age_s for r in old), 1),
            })
    long_tail.sort(key=lambda e: (-e["oldest_age_s"], e["namespace"], e["workload"]))
    return {
        "pods": sum(versions.values()),
        "versions": versions,
        "newest": newest,
        "on_newest": on_newest,
        "fraction_on_newest": round(on_newest / known, 6) if known else None,
        "without_proxy": versions.get(NONE, 0),
        "namespaces": namespaces,
        "workloads": workloads,
        "long_tail": long_tail,
    }


def _older(version: str, newest: Version | None) -> bool:
    parsed = parse_version(version)
    return parsed is not None and newest is not None and parsed < newest


def _planes_json(planes: Sequence[ControlPlane], policy: SkewPolicy) -> dict[str, Any]:
    return {
        "versions": [
            {"version": p.version, "revision": p.revision, "source": p.source} for p in planes
        ],
        "supported_skew": {"behind": policy.behind, "ahead": policy.ahead},
    }


def report_from_pods(
    pods: Sequence[PodRecord],
    control_planes: Sequence[ControlPlane],
    policy: SkewPolicy,
    *,
    now: float,
    mesh: str = "",
) -> dict[str, Any]:
    """The inventory report (JSON-ready) from live pods: skew judged pod by pod, each
    against the control plane of its own revision."""
    counted = [p for p in pods if p.counted]
    report: dict[str, Any] = {"at": rfc3339(now), "source": "kubernetes", "mesh": mesh}
    report.update(_summary(inventory_rows(counted, now)))
    report["probed"] = sum(1 for p in pods if p.probed)
    report["control_plane"] = _planes_json(control_planes, policy)
    outside: list[dict[str, Any]] = []
    unknown = 0
    for pod in counted:
        finding = judge_skew(
            pod.proxy.version, control_plane_for(pod.proxy.revision, control_planes), policy
        )
        if finding.status == "unknown":
            unknown += 1
        elif finding.status == "outside":
            outside.append({
                "namespace": pod.namespace,
                "pod": pod.name,
                "workload": pod.workload,
                "proxy_version": pod.proxy.version,
                "control_plane": finding.control_plane,
                "reason": finding.reason,
                "age_s": round(pod.age_s(now), 1),
            })
    outside.sort(key=lambda e: (-e["age_s"], e["namespace"], e["pod"]))
    report["skew"] = {
        "judged": bool(control_planes),
        "outside": len(outside),
        "not_judged": unknown,
        "workloads": _outside_workloads(outside),
        "pods": outside,
    }
    return report


def _outside_workloads(outside: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for entry in outside:
        groups[(entry["namespace"], entry["workload"], entry["proxy_version"])].append(entry)
    return [
        {
            "namespace": ns, "workload": wl, "proxy_version": v, "pods": len(group),
            "control_plane": group[0]["control_plane"], "reason": group[0]["reason"],
        }
        for (ns, wl, v), group in sorted(groups.items())
    ]


def report_from_rows(
    rows: Sequence[InventoryRow],
    control_planes: Sequence[ControlPlane],
    policy: SkewPolicy,
    *,
    at: float,
) -> dict[str, Any]:
    """The inventory report from a stored snapshot: skew judged per workload row against
    the default control plane (a row does not keep its pods' revisions)."""
    report: dict[str, Any] = {"at": rfc3339(at), "source": "store"}
    report.update(_summary(rows))
    report["control_plane"] = _planes_json(control_planes, policy)
    plane = control_plane_for("", control_planes)
    outside: list[dict[str, Any]] = []
    unknown = 0
    for row in rows:
        finding = judge_skew(row.proxy_version, plane, policy)
        if finding.status == "unknown":
            unknown += row.pods
        elif finding.status == "outside":
            outside.append({
                "namespace": row.namespace, "workload": row.workload,
                "proxy_version": row.proxy_version, "pods": row.pods,
                "control_plane": finding.control_plane, "reason": finding.reason,
            })
    report["skew"] = {
        "judged": bool(control_planes),
        "outside": sum(e["pods"] for e in outside),
        "not_judged": unknown,
        "workloads": outside,
    }
    return report


# -- metrics -----------------------------------------------------------------------------


_SkewData = tuple[dict[tuple[str, str], int], float | None, list[tuple[str, str]]]


class SkewMetrics(Collector):
    """The skew bound and rollout progress as Prometheus series, next to
    `skewprobe_inventory_pods` (`ProbeMetrics.set_inventory`):

    - `skewprobe_inventory_pods_outside_skew{namespace, proxy_version}`
    - `skewprobe_inventory_newest_fraction` (of pods with a known proxy version)
    - `skewprobe_control_plane_info{version, revision}` = 1

    Replaced whole from one report (`update`), so a scrape never sees half an update.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._data: _SkewData = ({}, None, [])
        registry.register(self)

    def update(self, report: Mapping[str, Any]) -> None:
        """Take the numbers of a `report_from_pods` / `report_from_rows` result."""
        outside: dict[tuple[str, str], int] = defaultdict(int)
        skew = report.get("skew") or {}
        for entry in skew.get("workloads") or ():
            outside[(entry["namespace"], entry["proxy_version"])] += int(entry["pods"])
        planes = [
            (p["version"], p["revision"])
            for p in (report.get("control_plane") or {}).get("versions") or ()
        ]
        self._data = (dict(outside), report.get("fraction_on_newest"), planes)  # one swap

    def describe(self) -> Iterator[Metric]:
        return self._families(({}, None, []))

    def collect(self) -> Iterator[Metric]:
        return self._families(self._data)

    @staticmethod
    def _families(data: _SkewData) -> Iterator[Metric]:
        outside, fraction, planes = data
        pods = GaugeMetricFamily(
            "skewprobe_inventory_pods_outside_skew",
            "Pods whose proxy is outside the supported skew of its control plane.",
            labels=["namespace", "proxy_version"],
        )
        for (ns, version), n in sorted(outside.items()):
            pods.add_metric([ns, version], n)
        yield pods
        newest = GaugeMetricFamily(
            "skewprobe_inventory_newest_fraction",
            "Fraction of pods with a known proxy version that run the newest one.",
        )
        if fraction is not None:
            newest.add_metric([], fraction)
        yield newest
        info = GaugeMetricFamily(
            "skewprobe_control_plane_info",
            "The control-plane versions the skew bound is judged against.",
            labels=["version", "revision"],
        )
        for version, revision in sorted(set(planes)):
            info.add_metric([version, revision], 1)
        yield info
