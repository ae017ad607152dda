"""The rollout's progress over the range: the share of pods on each proxy version.

From the store's inventory snapshots (pods per namespace x workload x version, as the
probe's discovery saw them) when there are any: the fleet's share, a step function that
holds each snapshot until the next. Pods without a proxy or with an unreadable version
(`none`, `unknown`) are left out of the shares and counted apart.

Without snapshots (a store from before inventory existed, or from before static and file
targets recorded them), the share is derived from what the probe called: per bucket, the
endpoints (of the paths given) with calls on each version, those without one (an etcd
endpoint without the cohort label) counted apart as above. That is the share of *probed*
endpoints, not of the fleet's pods, and the report says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from probes.report._collect import TimeGrid
from probes.report._endpoints import EndpointTotal
from probes.stats.cohorts import version_key
from probes.store import InventorySnapshot

__all__ = ["INVENTORY", "PROBED", "Rollout", "from_endpoints", "from_inventory"]

F64 = npt.NDArray[np.float64]
INVENTORY = "inventory"
PROBED = "probed endpoints"
_NOT_VERSIONS = frozenset({"none", "unknown", ""})


@dataclass(frozen=True, slots=True, eq=False)
class Rollout:
    """Shares per version at step times: `share[v, i]` holds from `times[i]` to the next.

    `pods[i]` is the number of pods (or endpoints) with a version at `times[i]`; before the
    first time nothing is known.
    """

    source: str
    versions: tuple[str, ...]
    times: F64
    share: F64
    pods: F64
    unversioned: F64

    @property
    def empty(self) -> bool:
        return self.times.size == 0

    def share_at(self, version: str, at: float) -> float | None:
        """The share of `version` in force at `at` (None: unknown then)."""
        i = int(np.searchsorted(self.times, at, side="right")) - 1
        return self._share(version, i)

    def share_near(self, version: str, at: float) -> tuple[float, float] | None:
        """(share, time of the step) from the step nearest to `at`, before or after.

        Snapshots lag: a pod that restarted a second before a crossing shows in the next
        snapshot, not the one in force, so the nearer of the two is the better estimate.
        """
        if self.times.size == 0:
            return None
        i = int(np.searchsorted(self.times, at, side="right"))
        candidates = [j for j in (i - 1, i) if 0 <= j < self.times.size]
        j = min(candidates, key=lambda k: (abs(self.times[k] - at), k))
        value = self._share(version, j)
        return None if value is None else (value, float(self.times[j]))

    def _share(self, version: str, i: int) -> float | None:
        if version not in self.versions or i < 0 or i >= self.times.size or self.pods[i] <= 0:
            return None
        return float(self.share[self.versions.index(version), i])

    def sample(self, at: F64) -> F64:
        """Shares [versions, len(at)] in force at each time (NaN before the first step)."""
        idx = np.searchsorted(self.times, at, side="right") - 1
        out = np.full((len(self.versions), at.size), np.nan)
        ok = idx >= 0
        if self.times.size:
            out[:, ok] = self.share[:, idx[ok]]
        return out


def _order(versions: Iterable[str]) -> tuple[str, ...]:
    def key(v: str) -> tuple[int, object, str]:
        k = version_key(v)
        return (0, k, v) if k is not None else (1, (), v)

    return tuple(sorted(set(versions), key=key))


def _build(source: str, times: list[float], counts: list[dict[str, float]],
           unversioned: list[float]) -> Rollout:
    versions = _order(v for c in counts for v in c)
    pods = np.array([sum(c.values()) for c in counts], dtype=np.float64)
    share = np.zeros((len(versions), len(times)))
    for i, c in enumerate(counts):
        for v, n in c.items():
            share[versions.index(v), i] = n / pods[i] if pods[i] else 0.0
    return Rollout(source, versions, np.array(times, dtype=np.float64), share, pods,
                   np.array(unversioned, dtype=np.float64))


def from_inventory(snapshots: Sequence[InventorySnapshot]) -> Rollout:
    """The fleet's shares from inventory snapshots (one step per snapshot)."""
    times: list[float] = []
    counts: list[dict[str, float]] = []
    unversioned: list[float] = []
    for snap in snapshots:
        c: dict[str, float] = defaultdict(float)
        other = 0.0
        for row in snap.rows:
            if row.proxy_version in _NOT_VERSIONS:
                other += row.pods
            else:
                c[row.proxy_version] += row.pods
        times.append(snap.at)
        counts.append(dict(c))
        unversioned.append(other)
    return _build(INVENTORY, times, counts, unversioned)


def from_endpoints(totals: Iterable[EndpointTotal], grid: TimeGrid) -> Rollout:
    """The share of probed endpoints (all paths) on each version, per sampled bucket.

    A bucket without a sample holds the previous share for up to three buckets (a quiet
    stream path has no calls in many windows), then the share is unknown until the next.
    """
    seen: dict[float, dict[str, set[str]]] = defaultdict(dict)
    for t in totals:
        if t.requests > 0 and t.bucket is not None:
            seen[t.bucket].setdefault(t.cohort, set()).add(t.endpoint)
    steps: list[float] = []
    counts: list[dict[str, float]] = []
    unversioned: list[float] = []
    for at in sorted(seen):
        if steps and at - steps[-1] > grid.step * 3.5:
            steps.append(steps[-1] + grid.step * 3)
            counts.append({})
            unversioned.append(0.0)
        steps.append(at)
        counts.append({v: float(len(eps)) for v, eps in seen[at].items()
                       if v not in _NOT_VERSIONS})
        unversioned.append(float(sum(len(eps) for v, eps in seen[at].items()
                                     if v in _NOT_VERSIONS)))
    return _build(PROBED, steps, counts, unversioned)
