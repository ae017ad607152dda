"""`--shard i/n`: a stable partition of the endpoints by the SHA-1 of their name."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from probes.discovery import FileSource
from probes.discovery.shard import ShardSource, parse_shard, shard_of
from probes.errors import BadInput
from probes.types import Endpoint


def _ep(name: str, version: str = "1.20.3", host: str = "127.0.0.1", port: int = 80) -> Endpoint:
    return Endpoint(name=name, host=host, port=port, labels={"proxy_version": version})


def test_parse_shard() -> None:
    assert parse_shard("0/2") == (0, 2)
    assert parse_shard(" 3/4 ") == (3, 4)
    assert parse_shard("0/1") == (0, 1)
    for bad in ("2/2", "1/0", "-1/2", "a/b", "1", "1/2/3", "", "1.0/2"):
        with pytest.raises(BadInput, match="--shard"):
            parse_shard(bad)


def test_parse_shard_takes_a_statefulset_pods_ordinal() -> None:
    """The chart passes `--shard $(POD_NAME)/N`: the ordinal after the pod name's last `-`."""
    assert parse_shard("skewprobe-0/3") == (0, 3)
    assert parse_shard("skewprobe-2/3") == (2, 3)
    assert parse_shard("prod-skewprobe-12/16") == (12, 16)
    for bad in ("skewprobe-3/3", "skewprobe/3", "skewprobe-/3", "-skewprobe-1/3",
                "Skewprobe-1/3", "skewprobe-1", "skewprobe-a/3", "skew probe-1/3"):
        with pytest.raises(BadInput, match="--shard"):
            parse_shard(bad)


def test_every_endpoint_in_exactly_one_shard_and_spread_evenly() -> None:
    endpoints = [_ep(f"checkout-{i}") for i in range(600)]
    for n in (1, 2, 3, 5):
        shards = [[e for e in endpoints if ShardSource(None, i, n).keeps(e)] for i in range(n)]
        assert sorted(e.name for s in shards for e in s) == sorted(e.name for e in endpoints)
        # Each shard's size is Binomial(600, 1/n) for a hash that spreads names: within
        # 5 standard deviations of 600/n (a fixed set of names, so this never flakes).
        sd = (600 * (1 / n) * (1 - 1 / n)) ** 0.5
        assert all(abs(len(s) - 600 / n) <= 5 * sd + 1e-9 for s in shards), [len(s) for s in shards]


def test_shard_is_the_sha1_of_the_name_and_ignores_labels_and_address() -> None:
    # Pinned: the same on every machine and Python (the built-in hash is salted per process).
    expected = int.from_bytes(hashlib.sha1(b"checkout-7").digest()[:8], "big") % 7
    assert shard_of(_ep("checkout-7"), 7) == expected
    # A pod restarted into the new version, on a new address, stays with its probe.
    assert shard_of(_ep("checkout-7", "1.21.0", "127.0.0.9", 81), 7) == expected


def test_shard_is_stable_across_processes() -> None:
    code = (
        "from probes.types import Endpoint; from probes.discovery.shard import shard_of;"
        "print([shard_of(Endpoint(f'pod-{i}', 'h', 1), 3) for i in range(50)])"
    )
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1
    assert runs.pop().strip() == str([shard_of(_ep(f"pod-{i}"), 3) for i in range(50)])


class _Snapshots:
    """A discovery source fed by the test, one snapshot per `put`."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[Endpoint, ...]] = asyncio.Queue()

    async def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        while True:
            yield await self.queue.get()

    def health(self) -> tuple[bool, str]:
        return True, "watching"


async def test_snapshots_filtered_and_changes_elsewhere_not_repeated() -> None:
    inner = _Snapshots()
    names = [f"pod-{i}" for i in range(8)]
    mine = [n for n in names if shard_of(_ep(n), 2) == 0]
    theirs = [n for n in names if shard_of(_ep(n), 2) == 1]
    assert mine and theirs
    source = ShardSource(inner, 0, 2)
    it = aiter(source.snapshots())
    inner.queue.put_nowait(tuple(_ep(n) for n in names))
    first = await asyncio.wait_for(anext(it), 5)
    assert [e.name for e in first] == mine
    # A restart in the other shard, then one in ours: only ours is news.
    inner.queue.put_nowait(tuple(_ep(n, "1.21.0" if n == theirs[0] else "1.20.3") for n in names))
    restarted = tuple(
        _ep(n, "1.21.0" if n in (theirs[0], mine[0]) else "1.20.3") for n in names
    )
    inner.queue.put_nowait(restarted)
    second = await asyncio.wait_for(anext(it), 5)
    assert [(e.name, e.labels["proxy_version"]) for e in second] == [
        (n, "1.21.0" if n == mine[0] else "1.20.3") for n in mine
    ]
    assert inner.queue.empty()  # the other shard's change was read and not yielded
    # The wrapped source's extras pass through (the runner asks Kubernetes sources health()).
    assert source.health() == (True, "watching")
    with pytest.raises(AttributeError):
        source.no_such_thing  # noqa: B018
    await it.aclose()  # type: ignore[attr-defined]


async def test_wraps_a_file_source(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    names = [f"web-{i}" for i in range(10)]
    path.write_text(json.dumps({"endpoints": [
        {"name": n, "address": f"127.0.0.{i + 2}:8080", "labels": {"proxy_version": "1.20.3"}}
        for i, n in enumerate(names)
    ]}))
    seen: dict[int, set[str]] = {}
    for index in (0, 1, 2):
        it = aiter(ShardSource(FileSource(str(path), refresh_s=0.05), index, 3).snapshots())
        seen[index] = {e.name for e in await asyncio.wait_for(anext(it), 5)}
        await it.aclose()  # type: ignore[attr-defined]
    assert set().union(*seen.values()) == set(names)
    assert sum(len(s) for s in seen.values()) == len(names)


def test_bad_shard_numbers_are_bad_input() -> None:
    for index, count in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(BadInput):
            ShardSource(None, index, count)
