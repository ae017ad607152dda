"""One shard of an estate: `skewprobe run --shard i/n` probes the endpoints whose stable hash
falls in shard i, so n probes cover the estate with no overlap and no gap.

The hash is SHA-1 of the endpoint's *name* (the pod name), taken modulo n. The name, not
`Endpoint.key`: the key changes with the labels, and a pod that restarts into the new proxy
version keeps its name (StatefulSets) or gets a new one (Deployments) either way, so the
name keeps a pod with its probe as long as it lives. SHA-1 because it is the same on every
machine and Python version (the built-in `hash` is salted per process); any fixed function
gives the partition, this one also spreads names evenly.

Every snapshot of the wrapped source is filtered whole, so at every moment each endpoint
is in exactly one of the n shards. Endpoints that share a name (rare: the same pod name in
two namespaces) share a shard, which changes nothing for the partition. Whatever else the
wrapped source offers (`state()`, `health()`, `inventory_updates()` of the Kubernetes
source) is passed through untouched: the inventory is the whole estate's in every shard,
so sum it over probes with `max by`, not `sum by`.

`i` may also be a StatefulSet pod's name (`skewprobe-2/3`: shard 2 of 3): its ordinal is
the number after the last `-`. The Helm chart's `shards: N` runs a StatefulSet of N probes
and passes each `--shard $(POD_NAME)/N`, so a pod's ordinal is its shard with no script in
the image; the ordinal must still be below N.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

from probes.errors import BadInput
from probes.types import Endpoint

__all__ = ["ShardSource", "parse_shard", "shard_of"]


# "i/n", or "<pod>-i/n" for a StatefulSet pod (a DNS label, then its ordinal).
_SHARD = re.compile(r"(?:[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?-)?([0-9]+)/([0-9]+)", re.ASCII)


def parse_shard(text: str) -> tuple[int, int]:
    """"i/n" (0 <= i < n), or "<pod>-i/n" with a StatefulSet pod's name, as (i, n); raises
    BadInput with the reason."""
    match = _SHARD.fullmatch(text.strip())
    if match is None:
        raise BadInput(f"--shard {text!r} is not i/n (e.g. 0/2) or pod-i/n (e.g. skewprobe-0/2)")
    i, n = int(match.group(1)), int(match.group(2))
    if n < 1 or i >= n:
        raise BadInput(f"--shard {text!r}: need n >= 1 and 0 <= i < n")
    return i, n


def shard_of(endpoint: Endpoint, count: int) -> int:
    """The shard in [0, count) that probes `endpoint`."""
    digest = hashlib.sha1(endpoint.name.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big") % count


class ShardSource:
    """A discovery source that keeps shard `index` of `count` from `inner`'s snapshots."""

    def __init__(self, inner: Any, index: int, count: int) -> None:
        if count < 1 or not 0 <= index < count:
            raise BadInput(f"shard {index}/{count}: need count >= 1 and 0 <= index < count")
        self.inner = inner
        self.index = index
        self.count = count

    def keeps(self, endpoint: Endpoint) -> bool:
        return shard_of(endpoint, self.count) == self.index

    async def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        """The wrapped source's snapshots, filtered; a change outside the shard is not news."""
        last: tuple[Endpoint, ...] | None = None
        async for snapshot in self.inner.snapshots():
            mine = tuple(e for e in snapshot if self.keeps(e))
            if mine != last:
                last = mine
                yield mine

    def __getattr__(self, name: str) -> Any:
        # Only reached for names ShardSource lacks: the wrapped source's extras.
        if name == "inner":  # not yet set (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
