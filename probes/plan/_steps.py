"""Control-plane moves, the fleet restarts each needs, the point of no return, and pinning:
whether each namespace pins its injected version (then a rollback is a restart).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from probes.discovery.meshes import NONE
from probes.inventory import Version, parse_version
from probes.plan._model import NamespaceInfo, PlanInput, PlanPods
from probes.spec import SkewPolicy

__all__ = ["pinning", "plan_steps", "version_counts"]


def _label(major: int, minor: int, target: Version, text: str) -> str:
    """The version a step moves to: the target itself, or an intermediate minor (its latest
    patch: `1.23.x`)."""
    if (major, minor) == (target.major, target.minor):
        return text
    return f"{major}.{minor}.x"


def _within(v: tuple[int, int], cp_minor: int, policy: SkewPolicy) -> bool:
    return cp_minor - policy.behind <= v[1] <= cp_minor + policy.ahead


def _workloads(groups: Iterable[tuple[PlanPods, Any]]) -> list[dict[str, Any]]:
    """Each workload once, with its pods in all and per proxy version (a workload mid-way
    through a restart has pods on two versions, and is still one workload)."""
    by: dict[tuple[str, str], list[PlanPods]] = defaultdict(list)
    for g, _ in groups:
        by[(g.namespace, g.workload)].append(g)
    return [
        {"namespace": ns, "workload": wl,
         "pods": sum(g.pods for g in gs),
         "versions": version_counts((g.version, g.pods) for g in gs),
         "names": sorted(n for g in gs for n in g.names)}
        for (ns, wl), gs in sorted(by.items())
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
            "from": version_counts((g.version, g.pods) for g, _ in moved),
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


def version_counts(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for v, n in pairs:
        totals[v] += n
    return dict(sorted(totals.items(), key=lambda kv: _sort_version(kv[0])))


def _sort_version(text: str) -> tuple[int, Any]:
    parsed = parse_version(text)
    return (0, parsed) if parsed is not None else (1, text)


def pinning(inp: PlanInput) -> list[dict[str, Any]] | None:
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
