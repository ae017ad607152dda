"""Connection lifetime first: which stream tiers lack a lifetime cap, and what each lever
does to an endless stream."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from probes.plan._model import DAY, PlanInput

__all__ = ["LEVERS", "WEEK", "lifetime_steps"]

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
