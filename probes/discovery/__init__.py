"""Where endpoints and their proxy versions come from.

A discovery source is anything with `snapshots()`: an async iterator that yields the full
current endpoint list each time it changes. The engine diffs consecutive snapshots, so a
source never reports additions and removals separately. The sources the config names
directly are here: its static targets (`StaticSource`) and an endpoints file
(`FileSource`); Kubernetes has a module of its own (`kubernetes`).

The endpoints file, re-read when it changes, is for estates without an API to watch, and for
the local fleet, which rewrites the file atomically (temp file + rename) on every restart.
It is JSON or YAML:

    {"endpoints": [{"name": "checkout-0", "address": "127.0.0.10:18080",
                    "ports": {"grpc": 19090}, "labels": {"proxy_version": "1.20.3"}}]}

Changes are found by comparing (inode, mtime, size) every `refresh_s`, as Prometheus's
file_sd does; a file that fails to parse keeps the last good endpoint list and is reported
once per change, so a half-written file never empties the probe.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import yaml

from probes._parsing import BoundedSafeLoader
from probes.errors import BadInput
from probes.types import Endpoint

__all__ = ["DiscoverySource", "FileSource", "StaticSource", "parse_endpoints"]


class DiscoverySource(Protocol):
    def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        """Yield the whole endpoint list now, then again whenever it changes."""
        ...


class StaticSource:
    """Static targets from the config: one snapshot, then nothing changes."""

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self._endpoints = tuple(endpoints)

    async def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        yield self._endpoints
        # Static targets never change; park until the engine cancels us.
        await asyncio.Event().wait()


log = logging.getLogger("skewprobe.discovery")


class _EndpointsLoader(BoundedSafeLoader):
    # A machine-written list: some ten values an endpoint, so room for 500,000 endpoints;
    # depth and aliases bounded as a config's are (an alias bomb stops early).
    max_nodes = 5_000_000


def parse_endpoints(text: str, *, source: str = "<endpoints>") -> list[Endpoint]:
    """Parse an endpoints document; raise BadInput with a one-line reason."""
    loader = _EndpointsLoader(text)  # JSON is YAML
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise BadInput(f"{source}: not JSON or YAML: {str(exc).splitlines()[0]}") from exc
    finally:
        loader.dispose()
    if isinstance(data, Mapping):
        data = data.get("endpoints")
    if not isinstance(data, list):
        raise BadInput(f"{source}: expected a list under 'endpoints'")
    return [_endpoint(item, index, source) for index, item in enumerate(data)]


def _endpoint(item: Any, index: int, source: str) -> Endpoint:
    where = f"{source}: endpoints[{index}]"
    if not isinstance(item, Mapping) or not isinstance(item.get("address"), str):
        raise BadInput(f"{where}: needs an 'address' of the form host:port")
    host, sep, port = item["address"].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"{where}: address {item['address']!r} is not host:port")
    labels = item.get("labels") or {}
    ports = item.get("ports") or {}
    if not isinstance(labels, Mapping) or not isinstance(ports, Mapping):
        raise BadInput(f"{where}: labels and ports must be mappings")
    try:
        named = {str(k): int(v) for k, v in ports.items()}
    except (TypeError, ValueError):
        raise BadInput(f"{where}: ports must be numbers") from None
    str_labels = {str(k): str(v) for k, v in labels.items()}
    name = str(item.get("name") or str_labels.get("pod") or item["address"])
    return Endpoint(name=name, host=host, port=int(port), labels=str_labels, ports=named)


class FileSource:
    def __init__(self, path: str, *, refresh_s: float = 1.0) -> None:
        self.path = path
        self.refresh_s = refresh_s

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self) -> list[Endpoint]:
        with open(self.path, encoding="utf-8") as f:
            return parse_endpoints(f.read(), source=self.path)

    async def snapshots(self) -> AsyncIterator[Sequence[Endpoint]]:
        seen: tuple[int, int, int] | None = None
        current: list[Endpoint] | None = None
        while True:
            signature = self._signature()
            if signature != seen:
                seen = signature
                if signature is None:
                    log.warning("endpoints file %s is missing; keeping %d endpoints",
                                self.path, len(current or []))
                else:
                    try:
                        endpoints = await asyncio.to_thread(self._read)
                    except (OSError, BadInput) as exc:
                        log.error("endpoints file not loaded, keeping the last good list: %s", exc)
                    else:
                        if endpoints != current:
                            current = endpoints
                            yield tuple(endpoints)
            await asyncio.sleep(self.refresh_s)
