"""A relay estate on loopback: relay pods of two caller versions and two destination pods of
two callee versions (`estate`), and the probe config that calls through them (`config`).

The destination app fails a fixed 20 % of request ids on every attempt; the 1.21.0
caller's outbound proxy retries twice on 503, so it sends 3 attempts for each of them: the
same success rate, 1.4 attempts per request.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from targets.haproxy_config import parse_haproxy_versions
from targets.haproxy_outbound import HaproxyOutbound
from targets.haproxy_process import find_haproxy
from targets.profile import VersionProfile, parse_profiles
from targets.relay import RoundRobinView
from targets.relay_config import parse_relay
from targets.server import TargetServer

__all__ = ["MIN_SAMPLES", "NEW", "OLD", "PAIR_PER_S", "PATH", "PROFILES", "config", "estate"]

OLD, NEW = "1.20.3", "1.21.0"
PATH = "relay-catalog"
MIN_SAMPLES = 100
RATE = 20.0  # calls/s to each caller's relay pod
# Each caller/callee pair's calls a second: a caller's calls balanced over the two callees.
PAIR_PER_S = RATE / 2

PROFILES = """
versions:
  "1.20.3":
    outbound: {}
    routes: {/api/catalog: {error_rate: 0.2}}
  "1.21.0":
    outbound: {retries: {num_retries: 2, retry_on: [503]}}
    routes: {/api/catalog: {error_rate: 0.2}}
"""
RELAY = """
relay:
  destinations:
    catalog:
      http: {url: "http://catalog.shop.svc:8080/api/catalog"}
      service: catalog
"""


# The same two caller versions as real HAProxy outbound proxies: 1.21.0 retries 503 twice.
HAPROXY_VERSIONS = """
versions:
  "1.20.3": {retries: 0, attempt_count_header: true}
  "1.21.0": {retries: 2, retry_on: [503], attempt_count_header: true}
"""


@contextlib.asynccontextmanager
async def estate(outbound: str, workdir: Path) -> AsyncIterator[dict[str, TargetServer]]:
    """Callers' relay pods and two callee pods. `outbound`: "emulated" (the profile's
    `outbound` retries, an endpoint view balancing over the callees) or "haproxy" (each
    caller version's calls leave through a real HAProxy of that version)."""
    profiles = parse_profiles(PROFILES)
    async with contextlib.AsyncExitStack() as stack:
        callees = [TargetServer(profiles.profile(v), pod=f"catalog-{i}", namespace="shop",
                                seed=7, grpc_port=None) for i, v in enumerate((OLD, NEW))]
        for server in callees:
            await stack.enter_async_context(server)
        relays = {}
        for v in (OLD, NEW):
            if outbound == "emulated":
                view = RoundRobinView({"catalog": [s.http_address for s in callees]})
                server = TargetServer(profiles.profile(v), pod=f"relay-{v}",
                                      namespace="platform-test", grpc_port=None,
                                      relay=parse_relay(RELAY), relay_view=view)
            else:
                binary = find_haproxy()
                assert binary is not None
                proxy = HaproxyOutbound(
                    binary, parse_haproxy_versions(HAPROXY_VERSIONS).version(v),
                    [(s.host, s.http_port) for s in callees], workdir, name=f"outbound-{v}")
                await stack.enter_async_context(proxy)
                relay = parse_relay(RELAY.replace("catalog.shop.svc:8080", proxy.address)
                                    .replace("      service: catalog\n", ""))
                server = TargetServer(VersionProfile(v), pod=f"relay-{v}",
                                      namespace="platform-test", grpc_port=None, relay=relay)
            relays[v] = await stack.enter_async_context(server)
        yield relays


def config(relays: dict[str, TargetServer], extra: str = "") -> str:
    """The probe's config: the relay pods as static targets, one relay path at 20/s, 1 s
    windows; `extra` is more top-level YAML (a `source:`, say)."""
    static = "".join(
        f"    - {{address: '{s.http_address}', name: {s.pod}, "
        f"labels: {{proxy_version: '{v}'}}}}\n" for v, s in relays.items())
    return (f"targets:\n  static:\n{static}window: 1s\n"
            f"verdict: {{min_samples: {MIN_SAMPLES}, warmup: 1s}}\n"
            f"paths:\n  - name: {PATH}\n    relay: {{destination: catalog}}\n"
            f"    rate: {RATE:g}/s\n    timeout: 2s\n" + extra)
