"""`skewprobe inventory`: pods per proxy version, the long tail, and the skew bound.

Two sources:
- `--config FILE` lists the cluster once, live (`targets.kubernetes`), and reports every
  pod with its revision-aware skew verdict. Exit 4 when the API does not answer.
- `--store PATH` reports the latest inventory snapshot a running probe wrote (or the one in
  force `--at` a time, for a postmortem), judged against `--control-plane`, else the
  config's `control_plane_version`, else the control plane the probe recorded; next to the
  skew bound, the stale routing each caller version's relay calls showed in the hour
  before (`probes.verdict.pairs.stale_by_caller`).

`--control-plane VERSION` judges skew against a version you are about to install:
the report names the pods that upgrade would leave outside the supported skew.
`--fail-on-skew` exits 1 when any pod is outside it (a CI step before a control-plane move).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from probes.cli._stdout import emit
from probes.discovery.meshes import NONE, ControlPlane
from probes.errors import EXIT_FAIL, EXIT_PASS, BadInput, SourceUnavailable
from probes.inventory import (
    CONTROL_PLANE_EVENT,
    planes_from_detail,
    report_from_pods,
    report_from_rows,
)
from probes.spec import KubernetesSpec, SkewPolicy

__all__ = [
    "STALE_LOOKBACK_S", "add_inventory_parser", "format_report", "no_snapshot",
    "run_inventory",
]

def add_inventory_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `inventory` to the CLI's subparsers (from `ArgumentParser.add_subparsers`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "inventory", help="pods per proxy version, the long tail and the skew bound"
    )
    parser.add_argument("--config", help="list pods live, as the config's targets.kubernetes")
    parser.add_argument("--store", help="report the latest inventory snapshot in this store")
    parser.add_argument("--at", help="with --store: the snapshot in force then (RFC 3339, -2h)")
    parser.add_argument(
        "--control-plane", metavar="VERSION",
        help="judge skew against this control-plane version (e.g. the one you will install)",
    )
    parser.add_argument(
        "--fail-on-skew", action="store_true",
        help="exit 1 when any pod is outside the supported skew",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--limit", type=int, default=20, help="rows per table in the text output (20)"
    )
    return parser


def run_inventory(args: argparse.Namespace) -> int:
    """Print the report; 0, or 1 with --fail-on-skew and pods outside the bound."""
    if not args.config and not args.store:
        raise BadInput("inventory needs --config FILE (live) or --store PATH (recorded)")
    if args.at and not args.store:
        raise BadInput("--at reads a recorded snapshot: give --store")
    report = _from_store(args) if args.store else _live(args)
    emit(json.dumps(report, indent=2) if args.json
         else format_report(report, limit=max(1, args.limit)))
    outside = (report.get("skew") or {}).get("outside") or 0
    return EXIT_FAIL if args.fail_on_skew and outside else EXIT_PASS


def _spec(args: argparse.Namespace) -> tuple[KubernetesSpec | None, SkewPolicy, str | None]:
    if not args.config:
        return None, SkewPolicy(), args.control_plane
    from probes.config import load_config

    spec = load_config(args.config).kubernetes
    if spec is None:
        if not args.store:
            raise BadInput(f"{args.config}: no targets.kubernetes to list pods from")
        return None, SkewPolicy(), args.control_plane
    return spec, spec.supported_skew, args.control_plane or spec.control_plane_version


def _live(args: argparse.Namespace) -> dict[str, Any]:
    from probes.discovery.kubernetes import KubernetesSource

    spec, _, control_plane = _spec(args)
    assert spec is not None
    if control_plane:
        spec = dataclasses.replace(spec, control_plane_version=control_plane)
    state = asyncio.run(KubernetesSource(spec).list_once())
    return report_from_pods(
        state.pods, state.control_planes, spec.supported_skew, now=state.at, mesh=state.mesh
    )


def no_snapshot(store: str, at: str | None) -> SourceUnavailable:
    """The error for a store without an inventory snapshot (at or before `--at`, if given)."""
    when = f" at or before {at}" if at else ""
    return SourceUnavailable(f"{store}: no inventory snapshot{when} (a run records one after"
                             " its first window)")


def _from_store(args: argparse.Namespace) -> dict[str, Any]:
    from probes._parsing import parse_time
    from probes.store import Store

    _, policy, control_plane = _spec(args)
    now = time.time()
    at = parse_time(args.at, now=now) if args.at else now
    with Store.open(args.store, readonly=True) as store:
        snapshots = store.read_inventory(since=at, until=at + 1e-6)
        if not snapshots:
            raise no_snapshot(args.store, args.at)
        snapshot = snapshots[0]
        if control_plane:
            planes: Sequence[ControlPlane] = (ControlPlane(control_plane, "", "command line"),)
        else:
            events = store.read_events(until=snapshot.at + 1e-6, kinds=[CONTROL_PLANE_EVENT])
            planes = planes_from_detail(events[-1].detail) if events else ()
    report = report_from_rows(snapshot.rows, planes, policy, at=snapshot.at)
    report["stale_routing"] = _stale_routing(args, at)
    return report


# Stale routing is read over the hour before the report's time: recent enough to be how
# callers route now, long enough for thousands of relay calls at a path's usual 1/s per pod.
STALE_LOOKBACK_S = 3600.0


def _stale_routing(args: argparse.Namespace, at: float) -> dict[str, Any] | None:
    """Stale routing per caller version from the store's relay windows of the hour before
    `at` (None: the store has no relay windows then)."""
    from probes._parsing import rfc3339
    from probes.verdict.pairs import stale_by_caller
    from probes.verdict.settings import load_judging_config

    since = at - STALE_LOOKBACK_S
    seen = stale_by_caller(args.store, load_judging_config(args.config), since=since, until=at)
    if not seen:
        return None
    return {"since": rfc3339(since), "until": rfc3339(at),
            "callers": [s.to_json() for s in seen]}


# -- text --------------------------------------------------------------------------------


def _age(seconds: float) -> str:
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400}d{(s % 86400) // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60}m"
    if s >= 60:
        return f"{s // 60}m{s % 60}s"
    return f"{s}s"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def _more(lines: list[str], total: int, limit: int) -> None:
    if total > limit:
        lines.append(f"  … {total - limit} more (--limit, or --json for all)")


def format_report(report: Mapping[str, Any], *, limit: int = 20) -> str:
    """The report as a few plain-text tables."""
    lines: list[str] = []
    where = "live" if report.get("source") == "kubernetes" else "recorded"
    mesh = f"{report['mesh']}, " if report.get("mesh") else ""
    probed = f"; {report['probed']} probed" if "probed" in report else ""
    lines.append(f"inventory: {report['pods']} pods ({mesh}{where} at {report['at']}{probed})")
    versions = report["versions"]
    parts = []
    for version, n in versions.items():
        note = " (newest)" if version == report.get("newest") else ""
        note = " (no proxy)" if version == NONE else note
        parts.append(f"{version}: {n}{note}")
    lines.append("proxy versions: " + (", ".join(parts) or "no pods"))
    fraction = report.get("fraction_on_newest")
    if fraction is not None:
        lines.append(f"on the newest version: {fraction * 100:.1f} % of pods with a proxy")

    cp = report["control_plane"]
    skew_policy = cp["supported_skew"]
    planes = ", ".join(
        f"{p['version']} ({p['source']}"
        + (f", revision {p['revision']})" if p["revision"] else ")")
        for p in cp["versions"]
    )
    lines.append(
        f"control plane: {planes or 'unknown'}; supported skew: {skew_policy['behind']} minor"
        f" behind, {skew_policy['ahead']} ahead"
    )

    columns = list(versions)
    lines.append("")
    namespaces = report["namespaces"]
    lines += _table(
        ["NAMESPACE", "PODS", *columns],
        [[n["namespace"], n["pods"], *(n["versions"].get(v, 0) for v in columns)]
         for n in namespaces[:limit]],
    )
    _more(lines, len(namespaces), limit)

    tail = report["long_tail"]
    lines.append("")
    if tail:
        lines.append("long tail: workloads with pods on older versions, oldest first")
        lines += _table(
            ["NAMESPACE", "WORKLOAD", "OLD/PODS", "VERSIONS", "OLDEST"],
            [[t["namespace"], t["workload"], f"{t['old_pods']}/{t['pods']}",
              ",".join(f"{v}:{n}" for v, n in t["versions"].items()), _age(t["oldest_age_s"])]
             for t in tail[:limit]],
        )
        _more(lines, len(tail), limit)
    else:
        lines.append("long tail: none (every pod with a proxy runs the newest version)")

    skew = report["skew"]
    lines.append("")
    if not skew["judged"]:
        lines.append(
            "skew: not judged (control-plane version unknown; set control_plane_version or"
            " --control-plane)"
        )
    elif skew["outside"]:
        n = skew["outside"]
        lines.append(f"skew: {n} pod{'s' if n != 1 else ''} OUTSIDE the supported skew")
        rows = skew["workloads"]
        lines += _table(
            ["NAMESPACE", "WORKLOAD", "VERSION", "PODS", "REASON"],
            [[w["namespace"], w["workload"], w["proxy_version"], w["pods"], w["reason"]]
             for w in rows[:limit]],
        )
        _more(lines, len(rows), limit)
    else:
        lines.append("skew: every pod with a proxy is within the supported skew")
    if skew.get("not_judged"):
        lines.append(f"  ({skew['not_judged']} pods with a version that cannot be compared)")
    lines += _stale_lines(report.get("stale_routing"))
    return "\n".join(lines)


def _stale_lines(stale: Mapping[str, Any] | None) -> list[str]:
    """Next to the skew bound: the share of relay calls each caller version routed to pods
    that were gone (`stale_endpoint`), where any did."""
    if not stale:
        return []
    when = f"from {stale['since']} to {stale['until']}"
    seen = [c for c in stale["callers"] if c["stale"] or c["verdict"] == "fail"]
    if not seen:
        calls = sum(c["calls"] for c in stale["callers"])
        return [f"stale routing: none seen in {calls:,} relay calls {when}"]
    return [f"stale routing seen from callers on {c['caller']}: {c['share'] * 100:.1f} % of "
            f"relay calls ({c['stale']:,} of {c['calls']:,} {when}): {c['verdict']}"
            for c in seen]
