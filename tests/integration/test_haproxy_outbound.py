"""A real HAProxy as a caller's outbound proxy, its server list changed at run time: the runtime
API moves endpoints in and out of its server slots, and the relay reads its own answers
(`UF`: the endpoint it picked refused the connection) as the relay's refused connection to
that endpoint, the address the probe judges stale routing by.

Real HAProxy and reference targets on loopback; every loop is bounded in count.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from probes.types import Outcome
from targets.haproxy_config import parse_haproxy_versions
from targets.haproxy_outbound import HaproxyOutbound
from targets.haproxy_process import HaproxyUnavailable, find_haproxy, listen_socket
from targets.profile import VersionProfile
from targets.relay import PodIdentity, Relay
from targets.relay_config import parse_relay
from targets.server import TargetServer, parse_hostport
from tests.servers.haproxy_procs import kill_leftovers, needs_haproxy

pytestmark = needs_haproxy

VERSIONS = parse_haproxy_versions("""
versions:
  "old": {retries: 0}
  "new": {retries: 2, retry_on: [503], attempt_count_header: true}
""")
CALLS = 12  # per step: round robin over at most 3 endpoints, each picked 4 times


def dead_address() -> str:
    """A loopback address:port nobody listens on (bound, then closed: refused)."""
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return f"127.0.0.1:{port}"


async def relay_through(proxy: HaproxyOutbound, relay: Relay, n: int) -> list[tuple[str, str]]:
    return [((a := await relay.call("catalog", f"rid-{i}")).outcome, a.address)
            for i in range(n)]


async def test_runtime_api_moves_endpoints_and_uf_is_a_refused_connection_there(
    tmp_path: Path,
) -> None:
    binary = find_haproxy()
    assert binary is not None
    pods = [TargetServer(VersionProfile("new"), pod=f"catalog-{i}", namespace="shop",
                         grpc_port=None) for i in range(2)]
    for pod in pods:
        await pod.start()
    a, b = (p.http_address for p in pods)
    proxy = HaproxyOutbound(binary, VERSIONS.version("old"), [parse_hostport(a)], tmp_path,
                            name="outbound-old", slots=3)
    relay: Relay | None = None
    try:
        await proxy.start()
        relay = Relay(parse_relay(f"""
relay:
  destinations:
    catalog: {{http: {{url: "http://{proxy.address}/api/catalog"}}}}
"""), caller=PodIdentity("relay-0", "shop", "old"))
        assert [s.address for s in await proxy.servers() if s.serving] == [a]
        assert len(await proxy.servers()) == 3  # one slot per endpoint now, two spare

        # An endpoint arrives: it takes a spare slot, and both answer (named by address).
        assert await proxy.set_upstreams([a, b]) is True
        assert await proxy.set_upstreams([a, b]) is False  # nothing to change
        assert {s.address for s in await proxy.servers() if s.serving} == {a, b}
        got = Counter(await relay_through(proxy, relay, CALLS))
        assert got == {(Outcome.OK, a): CALLS // 2, (Outcome.OK, b): CALLS // 2}

        # b leaves and an address nobody holds arrives: the proxy picks it in turn, fails to
        # connect, and says so (UF); the relay reports a refused connection to that address.
        gone = dead_address()
        await proxy.set_upstreams([a, gone])
        assert {s.address for s in await proxy.servers() if s.serving} == {a, gone}
        got = Counter(await relay_through(proxy, relay, CALLS))
        assert got == {(Outcome.OK, a): CALLS // 2,
                       (Outcome.CONNECT_REFUSED, gone): CALLS // 2}, got
        answer = await relay.call("catalog", "rid-x")
        if answer.outcome != Outcome.CONNECT_REFUSED:
            answer = await relay.call("catalog", "rid-y")
        assert answer.status is None and "(UF)" in answer.detail

        # b comes back (a restarted pod, same address): the slot it held is its again.
        slot_b = {s.address: s.name for s in await proxy.servers()}[b]
        await proxy.set_upstreams([a, b])
        assert {s.address: s.name for s in await proxy.servers() if s.serving}[b] == slot_b

        # More endpoints than slots: refused, the list as it was.
        with pytest.raises(HaproxyUnavailable, match="3 server slots"):
            await proxy.set_upstreams([a, b, gone, dead_address()])
        assert set(proxy.upstreams) == {a, b}

        # No endpoint at all: the proxy's own 503 (UH), not a connection failure.
        await proxy.set_upstreams([])
        answer = await relay.call("catalog", "rid-z")
        assert (answer.outcome, answer.status) == (Outcome.HTTP_5XX, 503)
        assert "(UH)" in answer.detail
    finally:
        if relay is not None:
            await relay.aclose()
        await proxy.stop()
        for pod in pods:
            await pod.stop(0.0)
    assert kill_leftovers(tmp_path) == set()
    assert not proxy.admin_socket.parent.exists()


async def test_a_caller_version_without_attempt_counts_never_passes_on_the_callee_s(
    tmp_path: Path,
) -> None:
    # The callee's own sidecar counts attempts (the emulated one, as 1.21.0's inbound
    # HAProxy would): behind an outbound proxy that counts none, the relay reads none.
    binary = find_haproxy()
    assert binary is not None
    counting = VersionProfile("new", attempt_count_header=True)
    async with TargetServer(counting, pod="catalog-0", grpc_port=None) as pod:
        plain = Relay(parse_relay(f"""
relay:
  destinations:
    catalog: {{http: {{url: "http://{pod.http_address}/api/catalog"}}}}
"""), caller=PodIdentity("relay-0"))
        try:
            direct = await plain.call("catalog")
        finally:
            await plain.aclose()
        assert direct.attempts == 1  # the callee's header, when nothing strips it
        async with HaproxyOutbound(binary, VERSIONS.version("old"),
                                   [parse_hostport(pod.http_address)], tmp_path,
                                   name="outbound-old") as proxy:
            relay = Relay(parse_relay(f"""
relay:
  destinations:
    catalog: {{http: {{url: "http://{proxy.address}/api/catalog"}}}}
"""), caller=PodIdentity("relay-0"))
            try:
                answer = await relay.call("catalog")
            finally:
                await relay.aclose()
    assert answer.outcome == Outcome.OK and answer.attempts is None
    assert answer.address == pod.http_address  # the pod behind the proxy, not the proxy
    assert kill_leftovers(tmp_path) == set()
