"""Which cohort is the baseline and which the canary.

Cohorts are named by the callee's proxy version. Unless the caller names them, the baseline
is the oldest version present and the canary the newest, compared as versions, not strings:
"1.9.0" < "1.20.3" < "1.21.0". A name is a version when it reads `[prefix-][v]N(.N)*`
with an optional semver pre-release (`-rc.1`, ordered before the release) and build
(`+meta`, ignored); e.g. "1.21.0", "v1.21.0", "1.22.0-beta.1", "stable-2.14.10". Names that
are not versions ("none", "unknown", "") are never picked automatically: a pod without a
sidecar or with an unreadable version says nothing about which proxy is newer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["CohortChoice", "pick_cohorts", "version_key"]

_VERSION = re.compile(
    r"^(?:[A-Za-z][A-Za-z0-9]*-)?[vV]?(\d+(?:\.\d+)*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$"
)

VersionKey = tuple[tuple[int, ...], int, tuple[tuple[int, int, str], ...]]


def version_key(name: str) -> VersionKey | None:
    """A sort key for a version name, or None when the name is not a version."""
    match = _VERSION.match(name.strip())
    if match is None:
        return None
    numbers = [int(x) for x in match.group(1).split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()  # "1.21" and "1.21.0" are the same release
    pre = match.group(2)
    if pre is None:
        return tuple(numbers), 1, ()
    # Semver §11: numeric identifiers sort numerically and before alphanumeric ones.
    idents = tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in pre.split(".")
    )
    return tuple(numbers), 0, idents


@dataclass(frozen=True, slots=True)
class CohortChoice:
    """The chosen pair (None where no choice was possible) and one sentence per decision."""

    baseline: str | None
    canary: str | None
    reasons: tuple[str, ...]


def pick_cohorts(
    present: Iterable[str], baseline: str | None = None, canary: str | None = None
) -> CohortChoice:
    """Pick baseline and canary among the cohorts `present` (those with data).

    A named cohort is used as given, even when it has no data (the per-path checks then say
    so). An unnamed one is the oldest (baseline) or newest (canary) version present, other
    than the named one.
    """
    names = sorted(set(present))
    # (key, name) pairs: ordered by version, ties ("1.21" vs "1.21.0") by name.
    versions = sorted((key, n) for n in names if (key := version_key(n)) is not None)
    reasons: list[str] = []
    skipped = [n for n in names if version_key(n) is None and n not in (baseline, canary)]
    if skipped and (baseline is None or canary is None):
        listed = ", ".join(repr(n) for n in skipped)
        reasons.append(f"cohorts {listed} are not version names and were not considered")

    chosen_b, chosen_c = baseline, canary
    if chosen_b is None:
        pool = [n for _, n in versions if n != chosen_c]
        if chosen_c is not None:
            key_c = version_key(chosen_c)
            if key_c is not None:
                pool = [n for k, n in versions if n != chosen_c and k < key_c]
        if pool:
            chosen_b = pool[0]
            reasons.append(f"baseline {chosen_b} is the oldest version with data")
    if chosen_c is None:
        pool = [n for _, n in versions if n != chosen_b]
        if chosen_b is not None:
            key_b = version_key(chosen_b)
            if key_b is not None:
                pool = [n for k, n in versions if n != chosen_b and k > key_b]
        if pool:
            chosen_c = pool[-1]
            reasons.append(f"canary {chosen_c} is the newest version with data")

    if chosen_b is None or chosen_c is None:
        have = ", ".join(n for _, n in versions) or "none"
        reasons.append(
            f"need two proxy versions to compare, found {len(versions)} ({have})"
        )
    elif chosen_b == chosen_c:
        reasons.append(f"baseline and canary are the same cohort {chosen_b}")
    else:
        others = [n for _, n in versions if n not in (chosen_b, chosen_c)]
        if others:
            reasons.append(f"other versions with data were not compared: {', '.join(others)}")
    return CohortChoice(chosen_b, chosen_c, tuple(reasons))
