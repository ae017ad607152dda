"""Durations (`250ms`, `2m`) and times (RFC 3339, relative `-6h`, `now`), for configs, the
command line, queries and the reference targets' profiles alike."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from probes.errors import BadInput

_DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# An RFC 3339 time whose `+hh:mm` offset lost its sign to a space. Argo Rollouts puts a web
# metric's arguments into the URL unescaped, and a `+` in a query string decodes as a space,
# so `since=2026-12-02T09:30:00+01:00` arrives as `2026-12-02T09:30:00 01:00`. Only that
# one space, exactly where the sign belongs, is read as `+`; anything else stays an error.
_SPACED_OFFSET_RE = re.compile(
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?) ([0-9]{2}:[0-9]{2})$"
)


def parse_duration(text: str) -> float:
    """'250ms' → 0.25, '2m' → 120.0, '0' → 0.0 (seconds). Raises ValueError."""
    value = text.strip()
    if value == "0":
        return 0.0
    match = _DURATION_RE.match(value)
    if not match:
        raise ValueError(f"{text!r} is not a duration like 500ms, 1s, 2m, 1h")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def parse_days(text: str) -> float:
    """`30d`, `12h`, `2.5d` → seconds: the plan's spans (pod ages, soaks) run to days."""
    value = text.strip()
    if value.endswith("d") and re.fullmatch(r"[0-9]+(?:\.[0-9]+)?d", value):
        return float(value[:-1]) * 86400.0
    try:
        return parse_duration(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration like 30d, 12h, 90m") from None


def parse_time(text: str, *, now: float) -> float:
    """Return epoch seconds for `text`.

    Accepted: `now`; a relative duration back from now (`-30m`, `30m`, `1.5h`); an RFC 3339
    timestamp (`2026-12-02T09:30:00Z`, with an offset or `Z`); epoch seconds. A `+hh:mm`
    offset may come with a space for its `+` (`2026-12-02T09:30:00 01:00`): an unescaped
    `+` in a URL's query, as Argo Rollouts sends its arguments, decodes as a space.
    """
    value = _SPACED_OFFSET_RE.sub(r"\1+\2", text.strip())
    if value == "now":
        return now
    relative = value[1:] if value.startswith("-") else value
    try:
        return _in_range(now - parse_duration(relative), text)
    except ValueError:
        pass
    try:
        return _in_range(float(value), text)
    except ValueError:
        pass
    not_a_time = BadInput(
        f"{text!r} is not a time: use RFC 3339 (2026-12-02T09:30:00Z), -30m, or now"
    )
    # fromisoformat skips whitespace before a zone (`09:30:00 -01:00`, `09:30:00 Z`); RFC 3339
    # has none there. A space may only separate the date from the time.
    if any(c.isspace() for i, c in enumerate(value) if (i, c) != (10, " ")):
        raise not_a_time
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise not_a_time from None
    if parsed.tzinfo is None:
        raise BadInput(f"{text!r} has no time zone: add Z or an offset like +01:00")
    return _in_range(parsed.timestamp(), text)


def _in_range(epoch: float, text: str) -> float:
    """`epoch` if it is a time `rfc3339` can print (years 1 to 9999), else BadInput:
    `nan`, `inf` or `1e300` would otherwise fail deep inside a verdict."""
    try:
        datetime.fromtimestamp(epoch, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise BadInput(
            f"{text!r} is out of range: use a time between the years 1 and 9999"
        ) from None
    return epoch


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z"
    )
