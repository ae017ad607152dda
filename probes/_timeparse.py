"""Times on the command line and in queries: RFC 3339, relative (-6h, 30m ago), and `now`."""

from __future__ import annotations

from datetime import UTC, datetime

from probes._exceptions import BadInput


def parse_time(text: str, *, now: float) -> float:
    """Return epoch seconds for `text`.

    Accepted: `now`; a relative duration back from now (`-30m`, `30m`, `1.5h`); an RFC 3339
    timestamp (`2026-12-02T09:30:00Z`, with an offset or `Z`); epoch seconds.
    """
    from probes.config import parse_duration

    value = text.strip()
    if value == "now":
        return now
    relative = value[1:] if value.startswith("-") else value
    try:
        return now - parse_duration(relative)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise BadInput(
            f"{text!r} is not a time: use RFC 3339 (2026-12-02T09:30:00Z), -30m, or now"
        ) from None
    if parsed.tzinfo is None:
        raise BadInput(f"{text!r} has no time zone: add Z or an offset like +01:00")
    return parsed.timestamp()


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z"
    )
