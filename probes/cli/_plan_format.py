"""The plan (`probes.plan.build_plan`) as plain-text tables or Markdown.

Both renderings come from the same sections, so the terminal and a pasted runbook say the
same thing; each section names the data it came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_markdown", "format_text"]

Table = tuple[list[str], list[list[Any]]]


def _span(values: Sequence[float]) -> str:
    low, high = values
    return f"{low:g} s" if low == high else f"{low:g}–{high:g} s"


def _pods(n: int) -> str:
    return f"{n} pod{'s' if n != 1 else ''}"


def _step_what(step: Mapping[str, Any]) -> str:
    if step["kind"] == "control_plane":
        return f"control plane {step['from']} → {step['to']}"
    return f"restart onto {step['to']}"


def _names(workloads: Sequence[Mapping[str, Any]], limit: int) -> str:
    """Each workload once, with its pods per proxy version (`ns/wl (1.21.4: 2, 1.22.1: 1)`)."""
    shown = ", ".join(
        f"{w['namespace']}/{w['workload']} ("
        + ", ".join(f"{v}: {n}" for v, n in (w.get("versions") or {"?": w["pods"]}).items())
        + ")"
        for w in workloads[:limit])
    more = len(workloads) - limit
    return shown + (f", … {more} more" if more > 0 else "")


def _steps_table(plan: Mapping[str, Any]) -> Table:
    ponr = (plan.get("point_of_no_return") or {}).get("step")
    rows = []
    for step in plan["steps"]:
        if step["kind"] == "control_plane":
            pods, workloads = "-", "-"
            note = (f"leaves {step['left_outside']['pods']} outside; made now:"
                    f" {step['outside_if_made_now']['pods']} outside")
        else:
            pods, workloads = step["pods"], step["workloads"]
            note = "from " + ", ".join(f"{v}: {n}" for v, n in step["from"].items())
            if step.get("ambient_pods"):
                note += f" ({step['ambient_pods']} ambient: via ztunnel, no restart)"
        if step["step"] == ponr:
            note += "  ← POINT OF NO RETURN"
        rows.append([step["step"], _step_what(step), pods, workloads, note])
    return ["STEP", "WHAT", "PODS", "WORKLOADS", "NOTES"], rows


def _tiers_table(plan: Mapping[str, Any]) -> Table:
    rows = []
    for t in plan["tiers"]:
        rate = t["natural_recycle"]
        recycle = "no history" if rate is None else (
            f"{rate['pods_per_day']:g} pods/day"
            + (f", slowest every {rate['slowest_interval_days']:g} d"
               if rate["slowest_interval_days"] else "")
            + (f", {rate['workloads_not_seen_recycling']} not seen recycling"
               if rate["workloads_not_seen_recycling"] else "")
        )
        rows.append([t["tier"], t["name"], t["pods"], len(t["workloads"]),
                     len(t["stream_holders"]), t["basis"], recycle])
    return ["TIER", "NAME", "PODS", "WORKLOADS", "STREAM HOLDERS", "BY", "NATURAL RECYCLE"], rows


def _sections(plan: Mapping[str, Any], limit: int) -> list[tuple[str, list[str], Table | None]]:
    """(title, lines, table) in reading order."""
    src = plan["sources"]
    skew = plan["supported_skew"]
    head = [
        f"{plan['control_plane']} → {plan['to']} for {plan['pods']} pods"
        f"{' (' + plan['mesh'] + ')' if plan['mesh'] else ''}, as of {plan['at']}",
        f"pods from: {src['pods']}",
        f"control plane {plan['control_plane']} from: {src['control_plane']}",
        f"supported skew: {skew['behind']} minor behind, {skew['ahead']} ahead"
        f" (source: {skew['source']})",
        "versions now: " + ", ".join(f"{v}: {n}" for v, n in plan["versions"].items()),
    ]
    sections: list[tuple[str, list[str], Table | None]] = [("plan", head, None)]
    lines = [plan["why"]]
    if plan["without_proxy"]:
        lines.append(f"{_pods(plan['without_proxy'])} without a proxy: not in the plan")
    if plan["not_planned"]:
        lines.append("NOT PLANNED (version cannot be compared): "
                     + _names(plan["not_planned"], limit))
    sections.append(("steps", lines, _steps_table(plan)))

    ponr = plan["point_of_no_return"]
    if ponr is None:
        sections.append(("point of no return", [
            "none: every step can be undone by moving the control plane back"], None))
    else:
        un = ponr["unsupported"]
        sections.append(("point of no return", [
            f"step {ponr['step']} ({ponr['what']}): {ponr['why']}.",
            f"unsupported if the control plane moved back to {un['control_plane']}:"
            f" {_pods(un['pods'])}: {_names(un['workloads'], limit)}",
        ], None))

    basis = sorted({t["basis"] for t in plan["tiers"]})
    sections.append(("tiers", [
        "one tier at a time, in this order; by: " + ", ".join(basis)
        + f" (measurements: {src['measurements'] or 'none'})",
    ], _tiers_table(plan)))

    streams = plan["connection_lifetime"]["streams"]
    if streams:
        lines = []
        for st in streams:
            state = {True: f"capped ({st.get('cap_s') or '?'} s)", False: "NOT capped",
                     None: "cap unknown"}[st["capped"]]
            lines.append(f"tier {st['tier']} ({st['tier_name']}), {st['path']}: {state}:"
                         f" {st['why']}")
            for key in ("step", "lead", "storm"):
                if st.get(key):
                    lines.append(f"  {st[key]}")
        lines.append("levers, and what each does to an endless stream:")
        lines += [f"  {lever}" for lever in plan["connection_lifetime"]["levers"]]
        sections.append(("connection lifetime first", lines, None))

    drains = plan["drain"]["tiers"]
    lines = [f"defaults: {plan['drain']['defaults']['source']}"]
    for d in drains:
        if d["drain_s"] is None:
            lines.append(f"tier {d['tier']} ({d['name']}): unknown: {d['why']}")
            continue
        lines.append(f"tier {d['tier']} ({d['name']}): drain {d['drain_s']} s, grace"
                     f" {d['termination_grace_period_s']} s: {d['arithmetic']};"
                     f" {d['against_defaults']}")
        force = d.get("in_force")
        if force:
            lines.append(
                f"  in force on its {_pods(force['pods'])}: grace {_span(force['grace_s'])},"
                f" drain {_span(force['drain_s'])}"
                + (f"; grace too short: {', '.join(force['grace_too_short'][:limit])}"
                   if force["grace_too_short"] else "")
                + (f"; drain too short: {', '.join(force['drain_too_short'][:limit])}"
                   if force["drain_too_short"] else ""))
        if d.get("streams"):
            lines.append(f"  {d['streams']}")
    sections.append(("drain timers", lines, None))

    time = plan["time"]
    forced = time["forced"]
    lines = [f"forced, tier by tier: {forced['arithmetic']}: done by {forced['done_by']}"]
    natural = time["natural"]
    if natural is None:
        lines.append("without forced restarts: unknown (no inventory history)")
    elif natural["days"] is None:
        lines.append("without forced restarts: unknown (no workload seen recycling in"
                     f" {src['history']})")
    else:
        lines.append(f"without forced restarts: {natural['arithmetic']}:"
                     f" {'at the earliest ' if natural['at_least'] else ''}{natural['done_by']}"
                     f" (history: {src['history']})")
        if natural["not_seen_recycling"]:
            unseen = natural["not_seen_recycling"]
            lines.append(f"  not seen recycling in the recorded span: {len(unseen)}"
                         f" workload{'s' if len(unseen) != 1 else ''}: "
                         + ", ".join(unseen[:limit]))
    tail = time["long_tail"]
    if tail["workloads"]:
        lines.append(
            f"long tail, never there on their own (oldest pod older than"
            f" {time['max_pod_age_days']:g} d): {_pods(tail['pods'])}: "
            + ", ".join(f"{w['namespace']}/{w['workload']} ({w['oldest_age_days']:g} d)"
                        for w in tail["workloads"][:limit]))
    else:
        lines.append(f"long tail: none (no pod older than {time['max_pod_age_days']:g} d)")
    sections.append(("time", lines, None))

    if plan["pinning"] is not None:
        unpinned = [p for p in plan["pinning"] if p["state"] in ("default injector", "not pinned")]
        lines = [f"{len(plan['pinning']) - len(unpinned)} of {len(plan['pinning'])} namespaces"
                 " pin their injected version (a rollback is a restart)"]
        lines += [f"  {p['namespace']}: {p['state']} ({p['detail']})" for p in unpinned[:limit]]
        sections.append(("pinning", lines, None))

    if "check" in plan:
        check = plan["check"]
        sections.append((f"check step {check['step']}", [check["answer"]]
                         + [f"  {r}" for r in check["reasons"]], None))
    sections.append(("missing", plan["missing"] or ["nothing"], None))
    return sections


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def format_text(plan: Mapping[str, Any], *, limit: int = 10) -> str:
    """The plan as plain-text sections and tables."""
    out: list[str] = []
    for title, lines, table in _sections(plan, limit):
        if out:
            out.append("")
        out.append(f"{title}:")
        out += [f"  {line}" for line in lines]
        if table is not None:
            out += [f"  {line}" for line in _table(*table)]
    return "\n".join(out)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|")


def format_markdown(plan: Mapping[str, Any], *, limit: int = 10) -> str:
    """The plan as Markdown: a heading per section, tables as pipe tables."""
    out = [f"# Upgrade plan: {plan['control_plane']} → {plan['to']}"]
    for title, lines, table in _sections(plan, limit):
        out += ["", f"## {title[0].upper()}{title[1:]}", ""]
        out += [f"- {line.strip()}" for line in lines]
        if table is not None:
            header, rows = table
            out += ["", "| " + " | ".join(header) + " |",
                    "|" + "---|" * len(header)]
            out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
