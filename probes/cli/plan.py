"""`skewprobe plan --to VERSION`: the upgrade plan from the facts `inventory` reads.

The same two sources as `skewprobe inventory`:
- `--config FILE`: pods listed once, live (`targets.kubernetes`), with each pod's version,
  revision and age, the discovered control plane, namespace labels (tiers, pinning) and the
  config's paths matched to pods (which workloads answer read, write or stream paths). No
  history: natural recycle rates need a store.
- `--store PATH`: the latest inventory snapshot (or the one in force `--at`), the recorded
  control plane, every snapshot before it (each workload's natural recycle rate) and the
  paths each pod answered (kinds from `--config` when given).
- `--config FILE --with-store PATH`: the live pods, with what the store adds (history,
  measured paths, request durations, stream lifetime checks).

`--control-plane VERSION` names the control plane in force when none was discovered or
recorded. Exit 0 with the plan; 2 for a target that cannot be planned; 3 when a fact the
plan needs is missing (no control-plane version); 4 when the source does not answer.
`--check N` gates step N of the plan as computed now: 0 safe now, 1 not (with the reasons),
3 when the data to decide is not there.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probes.cli._stdout import emit
from probes.discovery.meshes import ControlPlane
from probes.errors import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    BadInput,
    DataMissing,
    SourceUnavailable,
)
from probes.inventory import CONTROL_PLANE_EVENT, control_plane_for, planes_from_detail
from probes.plan import (
    SKEW_SOURCES,
    NamespaceInfo,
    PlanInput,
    PlanPods,
    PlanSettings,
    WorkloadHistory,
    WorkloadTraffic,
    build_plan,
    workload_history,
)
from probes.spec import Config, KubernetesSpec, PathSpec, PlanSpec, SkewPolicy
from probes.store.records import InventorySnapshot

__all__ = ["add_plan_parser", "check_step", "path_role", "run_plan"]

# HTTP methods that only read (RFC 9110's safe methods): their paths form the read tier.
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `plan` to the CLI's subparsers (from `ArgumentParser.add_subparsers`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan", help="the upgrade plan: control-plane moves, fleet restarts, tiers, time"
    )
    parser.add_argument("--to", required=True, metavar="VERSION",
                        help="the version the control plane and every proxy should reach")
    parser.add_argument("--config", help="list pods live, as the config's targets.kubernetes")
    parser.add_argument("--store", help="plan from the inventory this store recorded")
    parser.add_argument("--at", help="with --store: the snapshot in force then (RFC 3339, -2h)")
    parser.add_argument("--with-store", metavar="PATH",
                        help="with --config: add what a running probe recorded here (history,"
                             " measured paths, request durations, stream lifetimes)")
    parser.add_argument("--control-plane", metavar="VERSION",
                        help="the control-plane version in force (default: discovered,"
                             " configured, or recorded)")
    parser.add_argument("--soak", metavar="DURATION",
                        help="wait after each fleet restart (default: plan.soak, 1d)")
    parser.add_argument("--check", type=int, metavar="STEP",
                        help="exit 0 if step STEP is safe now, 1 if not, 3 without the data")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the plan as JSON")
    out.add_argument("--markdown", action="store_true", help="print the plan as Markdown")
    parser.add_argument("--limit", type=int, default=10, help="rows per list in the text (10)")
    return parser


def run_plan(args: argparse.Namespace) -> int:
    """Print the plan; with --check, the gate's answer decides the exit code."""
    from probes._parsing import parse_days
    from probes.cli._plan_format import format_markdown, format_text

    if not args.config and not args.store:
        raise BadInput("plan needs --config FILE (live) or --store PATH (recorded)")
    if args.at and not args.store:
        raise BadInput("--at reads a recorded snapshot: give --store")
    if args.with_store and (args.store or not args.config):
        raise BadInput("--with-store adds a store to a live plan: give --config, not --store")
    config = _load(args.config)
    spec = config.kubernetes if config is not None else None
    plan_spec = config.plan if config is not None else PlanSpec()
    soak = plan_spec.soak_s
    if args.soak is not None:
        try:
            soak = parse_days(args.soak)
        except ValueError as exc:
            raise BadInput(f"--soak: {exc}") from None
    inp = _from_store(args, config) if args.store else _live(args, config)
    policy, policy_source = _policy(spec, inp.mesh)
    settings = PlanSettings(
        target=args.to, policy=policy, policy_source=policy_source,
        first_namespaces=plan_spec.first_namespaces, tier_label=plan_spec.tier_label,
        max_pod_age_s=plan_spec.max_pod_age_s, tier_every_s=plan_spec.tier_every_s,
        soak_s=soak,
    )
    if inp.control_plane is None:
        raise DataMissing(
            f"control-plane version unknown ({inp.control_plane_source}): give --control-plane"
            " VERSION or targets.kubernetes.control_plane_version")
    try:
        plan = build_plan(inp, settings)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    code = EXIT_PASS
    if args.check is not None:
        verdict = _verdict(args.store or args.with_store, config, inp.at)
        plan["check"] = check_step(plan, args.check, verdict=verdict)
        code = {"safe": EXIT_PASS, "not safe": EXIT_FAIL}.get(
            plan["check"]["answer"], EXIT_INCONCLUSIVE)
    if args.json:
        emit(json.dumps(plan, indent=2))
    elif args.markdown:
        emit(format_markdown(plan, limit=max(1, args.limit)))
    else:
        emit(format_text(plan, limit=max(1, args.limit)))
    return code


def _load(path: str | None) -> Config | None:
    if not path:
        return None
    from probes.config import load_config

    return load_config(path)


def _policy(spec: KubernetesSpec | None, mesh: str) -> tuple[SkewPolicy, str]:
    """The skew and where it comes from: the config when it says otherwise, else the mesh's
    published policy (the default matches both Istio's and Linkerd's)."""
    if spec is not None and spec.supported_skew != SkewPolicy():
        return spec.supported_skew, "config targets.kubernetes.supported_skew"
    return SkewPolicy(), SKEW_SOURCES.get(mesh, SKEW_SOURCES["generic"])


# -- live --------------------------------------------------------------------------------


def _live(args: argparse.Namespace, config: Config | None) -> PlanInput:
    from probes.discovery.kubernetes import KubernetesSource
    from probes.discovery.pods import endpoint_for

    spec = config.kubernetes if config is not None else None
    if config is None or spec is None:
        raise BadInput(f"{args.config}: no targets.kubernetes to list pods from")
    source = KubernetesSource(spec)
    state = asyncio.run(source.list_once())
    namespaces: dict[str, NamespaceInfo] | None
    try:
        listed = asyncio.run(source.list_namespaces())
        namespaces = {n: NamespaceInfo(n, m.labels, m.annotations) for n, m in listed.items()}
        ns_source = f"kubernetes namespaces (live, {len(namespaces)})"
    except SourceUnavailable as exc:
        namespaces, ns_source = None, f"not readable: {exc}"
    counted = [p for p in state.pods if p.counted]
    pods = tuple(
        PlanPods(p.namespace, p.workload, p.proxy.version, 1, p.age_s(state.at), (p.name,),
                 p.proxy.mode, p.proxy.revision, p.grace_s, p.drain_s)
        for p in counted
    )
    control_plane, cp_source = _control_plane(args, spec, state.control_planes)
    endpoints = [endpoint_for(p) for p in counted if p.probed]
    traffic = _traffic(
        ((e.labels["namespace"], e.labels["workload"], path.name)
         for e in endpoints for path in config.paths if path.matches(e)),
        {p.name: path_role(p) for p in config.paths},
    )
    inp = PlanInput(
        source=f"kubernetes (live list of {len(counted)} pods)", at=state.at, pods=pods,
        control_plane=control_plane, control_plane_source=cp_source, mesh=state.mesh,
        namespaces=namespaces, namespaces_source=ns_source,
        traffic=traffic, traffic_source="the config's paths matched to the probed pods",
        history=None, history_source="live: one list, no history (--with-store adds it)",
        lifetimes=None,
        lifetimes_source="live: the lifetime check is a running probe's (--with-store)",
        latency=None, latency_source="live: request durations are a probe's (--with-store)",
    )
    if not args.with_store:
        return inp
    rec = _recorded(args.with_store, state.at, config, live=True)
    measured = rec.traffic is not None
    return dataclasses.replace(
        inp,
        traffic=rec.traffic if measured else inp.traffic,
        traffic_source=rec.traffic_source if measured else inp.traffic_source,
        history=rec.history, history_source=rec.history_source,
        latency=rec.latency, latency_source=rec.latency_source,
        lifetimes=rec.lifetimes, lifetimes_source=rec.lifetimes_source,
    )


def _control_plane(args: argparse.Namespace, spec: KubernetesSpec | None,
                   planes: Sequence[Any]) -> tuple[str | None, str]:
    if args.control_plane:
        return args.control_plane, "--control-plane"
    if spec is not None and spec.control_plane_version:
        return spec.control_plane_version, "config control_plane_version"
    plane = control_plane_for("", planes)
    if plane is None:
        return None, "none discovered or recorded"
    others = len(planes) - 1
    note = f"; {others} more revision{'s' if others > 1 else ''} not planned" if others else ""
    return plane.version, f"{plane.source or 'recorded'}{note}"


def path_role(path: PathSpec) -> str:
    """`read`, `write` or `stream`: what a path does to the pods it reaches. A gRPC unary
    method's effect is unknown, so it counts as a write (the later tier); health is a read."""
    if path.stream is not None:
        return "stream"
    if path.http is not None:
        return "read" if path.http.method.upper() in _READ_METHODS else "write"
    if path.grpc is not None and path.grpc.health_service is not None:
        return "read"
    return "write"


def _traffic(hits: Iterable[tuple[str, str, str]], roles: Mapping[str, str]
             ) -> dict[tuple[str, str], WorkloadTraffic]:
    found: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(
        lambda: {"read": set(), "write": set(), "stream": set()})
    for ns, workload, path in hits:
        role = roles.get(path)
        if role is not None:
            found[(ns, workload)][role].add(path)
    return {
        key: WorkloadTraffic(tuple(sorted(r["read"])), tuple(sorted(r["write"])),
                             tuple(sorted(r["stream"])))
        for key, r in found.items()
    }


# -- recorded ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Recorded:
    """What a probe's store adds to the pods: each fact with where it came from."""

    snapshots: tuple[InventorySnapshot, ...]
    planes: tuple[ControlPlane, ...]
    traffic: dict[tuple[str, str], WorkloadTraffic] | None
    traffic_source: str
    history: dict[tuple[str, str], WorkloadHistory] | None
    history_source: str
    latency: dict[str, tuple[float, int]] | None
    latency_source: str
    lifetimes: dict[str, list[dict[str, Any]]] | None
    lifetimes_source: str


def _recorded(path: str, until: float, config: Config | None, *, live: bool) -> _Recorded:
    """The store's facts up to `until` (recorded: up to the last snapshot by then, so every
    fact is of the same moment): snapshots, control plane, calls per pod and path, lifetime
    checks and a day of request durations."""
    from probes.store import Store
    from probes.streams.recorder import LIFETIME_EVENT

    with Store.open(path, readonly=True) as store:
        snapshots = tuple(store.read_inventory(since=0.0, until=until + 1e-6))
        last = until if live or not snapshots else snapshots[-1].at
        events = store.read_events(until=last + 1e-6, kinds=[CONTROL_PLANE_EVENT])
        planes = planes_from_detail(events[-1].detail) if events else ()
        totals = store.read_endpoint_totals(until=last + 1e-6)
        checks = store.read_events(until=last + 1e-6, kinds=[LIFETIME_EVENT])
        table = store.read_table(since=last - _LATENCY_SPAN_S, until=last + 1e-6)
    latency = _p99s(table, {p.name for p in config.paths if p.stream is None}
                    if config is not None else None)
    traffic: dict[tuple[str, str], WorkloadTraffic] | None = None
    if config is None:
        traffic_source = "the store has the paths each pod answered, not their kinds: give --config"
    elif not totals:
        traffic_source = "no probe windows in the store"
    else:
        traffic = _traffic(
            ((t.labels.get("namespace", ""), t.labels.get("workload", ""), t.path)
             for t in totals if t.requests),
            {p.name: path_role(p) for p in config.paths},
        )
        traffic_source = (f"store: calls per pod and path ({len(totals)} pod × path totals),"
                          " path kinds from the config")
    latest_check: dict[tuple[str, str], dict[str, Any]] = {}
    for event in checks:  # in time order: the last one per (path, cohort) wins
        latest_check[(event.path, event.cohort)] = {"cohort": event.cohort, **event.detail}
    lifetimes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (stream_path, _), detail in sorted(latest_check.items()):
        lifetimes[stream_path].append(detail)
    span = (last - snapshots[0].at) / 86400.0 if snapshots else 0.0
    return _Recorded(
        snapshots=snapshots, planes=planes, traffic=traffic, traffic_source=traffic_source,
        history=workload_history(snapshots) if len(snapshots) > 1 else None,
        history_source=(f"store: {len(snapshots)} inventory snapshots over {span:.1f} days"
                        if len(snapshots) > 1 else
                        f"store: {len(snapshots) or 'no'} inventory snapshot, no history"),
        latency=latency or None,
        latency_source=(f"store: p99 per path from the probe's pooled histograms over the"
                        f" {_LATENCY_SPAN_S / 3600:.0f} h before {_rfc(last)}" if latency
                        else f"store: no request windows in the day before {_rfc(last)}"),
        lifetimes=dict(lifetimes) if checks else None,
        lifetimes_source=(f"store: the probe's lifetime check ({len(checks)} records)"
                          if checks else "store: no lifetime check recorded"),
    )


def _from_store(args: argparse.Namespace, config: Config | None) -> PlanInput:
    from probes._parsing import parse_time

    spec = config.kubernetes if config is not None else None
    now = time.time()
    at = parse_time(args.at, now=now) if args.at else now
    rec = _recorded(args.store, at, config, live=False)
    if not rec.snapshots:
        from probes.cli.inventory import no_snapshot

        raise no_snapshot(args.store, args.at)
    latest = rec.snapshots[-1]
    control_plane, cp_source = _control_plane(args, spec, rec.planes)
    if rec.planes and cp_source == rec.planes[0].source:
        cp_source = f"recorded by the probe ({cp_source})"
    pods = tuple(PlanPods(r.namespace, r.workload, r.proxy_version, r.pods, r.max_age_s)
                 for r in latest.rows)
    return PlanInput(
        source=f"store {args.store} (inventory snapshot at {_rfc(latest.at)})",
        at=latest.at, pods=pods, control_plane=control_plane, control_plane_source=cp_source,
        mesh=spec.mesh if spec is not None else "",
        namespaces=None, namespaces_source="namespace labels are not recorded in the store",
        traffic=rec.traffic, traffic_source=rec.traffic_source,
        history=rec.history, history_source=rec.history_source,
        latency=rec.latency, latency_source=rec.latency_source,
        lifetimes=rec.lifetimes, lifetimes_source=rec.lifetimes_source,
    )


_LATENCY_SPAN_S = 86400.0  # the day of windows the drain timers are measured on


def _p99s(table: Any, unary: set[str] | None) -> dict[str, tuple[float, int]]:
    """p99 per unary path from the pooled histogram of its windows (every cohort): stream
    paths' windows hold stream opens, not request durations."""
    out: dict[str, tuple[float, int]] = {}
    for path in table.paths:
        rows = table.mask(paths=[path])
        if unary is not None and path not in unary:
            continue
        if unary is None and int(table.streams_opened[rows].sum()) > 0:
            continue
        hist = table.latency_histogram(rows)
        if hist.count:
            out[path] = (float(hist.quantile(0.99)), int(hist.count))
    return out


def _rfc(at: float) -> str:
    from probes._parsing import rfc3339

    return rfc3339(at)


# -- the gate ----------------------------------------------------------------------------


def _verdict(store: str | None, config: Config | None, at: float) -> Mapping[str, Any] | None:
    """The verdict on the tiers restarted so far (the canary cohort against the baseline),
    once the store holds two cohorts; None before the first restart or without a store."""
    if store is None:
        return None
    from probes.spec import JudgingSettings
    from probes.store import Store
    from probes.verdict.entry import Query, StoreSource, verdict

    with Store.open(store, readonly=True) as opened:
        cohorts = [c for c in opened.cohorts() if c not in ("none", "unknown")]
    if len(cohorts) < 2:
        return None
    # The verdict `skewprobe verdict --store` gives: relay paths judged as their matrices.
    settings = config.judging if config is not None else JudgingSettings()
    return verdict(Query(now=at), settings, StoreSource(store)).to_json()


def check_step(plan: Mapping[str, Any], number: int, *,
               verdict: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Is step `number` of this plan safe to take now? `safe`, `not safe` (with reasons) or
    `unknown` (the data to decide is missing). A restart also needs the verdict on what was
    restarted before it to pass, when there is one (`verdict`: two cohorts in the store)."""
    steps = plan["steps"]
    if not 1 <= number <= len(steps):
        raise BadInput(f"--check {number}: the plan has {len(steps)} steps")
    step = steps[number - 1]
    reasons: list[str] = []
    if plan["not_planned"]:
        n = sum(w["pods"] for w in plan["not_planned"])
        return {"step": number, "answer": "unknown",
                "reasons": [f"{n} pods with a version that cannot be compared"]}
    if step["kind"] == "control_plane":
        outside = step["outside_if_made_now"]
        if outside["pods"]:
            names = ", ".join(f"{w['namespace']}/{w['workload']} ({', '.join(w['versions'])})"
                              for w in outside["workloads"][:5])
            reasons.append(f"{outside['pods']} pods would be outside the supported skew of"
                           f" {step['to']}: {names}")
    else:
        earlier = [s for s in steps[: number - 1] if s["kind"] == "control_plane"]
        if earlier:
            reasons.append(f"control plane {plan['control_plane']} is in force; step"
                           f" {earlier[-1]['step']} (control plane to {earlier[-1]['to']})"
                           " comes first")
        if verdict is not None and verdict.get("verdict") != "pass":
            why = [r for r in verdict.get("reasons") or () if ": " in r][:3]
            reasons.append(
                f"the verdict on the pods restarted so far ({verdict.get('canary')} against"
                f" {verdict.get('baseline')}) is {verdict.get('verdict')}"
                + (": " + "; ".join(why) if why else ""))
        holders = {t["tier"]: set(t["stream_holders"]) for t in plan["tiers"]}
        for stream in plan["connection_lifetime"]["streams"]:
            if not stream["capped"] and holders[stream["tier"]] & set(step["touches"]):
                state = "no cap recorded" if stream["capped"] is None else "no cap"
                reasons.append(f"tier {stream['tier']} ({stream['tier_name']}) holds streams on"
                               f" {stream['path']} with {state}: {stream['step']}")
    out: dict[str, Any] = {"step": number, "answer": "not safe" if reasons else "safe",
                           "reasons": reasons}
    if step["kind"] == "restart":
        out["verdict"] = None if verdict is None else {
            k: verdict.get(k) for k in ("verdict", "baseline", "canary")}
    return out
