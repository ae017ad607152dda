"""The local fleet in HAProxy mode with relay pods: the outbound side is a real HAProxy per caller
version too, probed end to end by a real `ProbeRunner` through the relay.

Four pods of `catalog` start on 1.20.3, each with a real inbound HAProxy; two restart onto
1.21.0 and the service scales up by two (new pods on 1.21.0); the emulated control plane
runs 1.21.0 (upgraded first), so both versions take its endpoint lists. Each caller version gets one
outbound HAProxy (`retries 0` for 1.20.3; `retries 2`, `retry-on 503` for 1.21.0), whose
server list the fleet sets through HAProxy's runtime API from the emulated control plane's
view of that version. The app fails 20 % of request ids on every attempt, so a 1.21.0 caller
sends 3 attempts for each failed call and 1 for the others, at the same success rate as the
1.20.3 callers, which send 1 for every call. Then the control plane moves to 1.22.0 (1.20.3
falls two minors behind and stops taking endpoint lists) and the service scales back down:
the 1.21.0 callers' HAProxy gets the new list, the 1.20.3 callers' keeps the two addresses
nobody holds now, and only those callers see `stale_endpoint`.

Every bound comes from the counts the test measured; the waits are bounded in calls (the hang
guard), never in seconds; the fleet's HAProxy processes end with the fleet, failure or not.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from probes.discovery.meshes import UNKNOWN
from probes.errors import BadInput
from probes.store import Store
from probes.types import Outcome, pair_cohort, split_pair
from targets.fleet import EventKind, Fleet
from targets.haproxy import HaproxySidecars
from targets.haproxy_config import parse_haproxy_versions
from targets.haproxy_outbound import HaproxyOutbound
from targets.meshview import EmulatedMesh
from targets.relay_config import parse_relay
from targets.server import hostport

# The same fleet as there: its rate, and so the windows its slowest pair takes.
from tests.integration.test_relay_fleet import RATE, SLOWEST_PER_S
from tests.servers.haproxy_procs import kill_leftovers, needs_haproxy
from tests.servers.probe_run import Windows, probe_runner, running, windows_for

pytestmark = needs_haproxy

OLD, NEW, MOVED = "1.20.3", "1.21.0", "1.22.0"
PATH = "relay-catalog"
MIN_SAMPLES = 100
MAX_SAMPLES = 40 * MIN_SAMPLES  # the hang guard, in calls per caller version (never seconds)
ERROR_RATE, NEW_TRIES = 0.2, 3
Z = 4.5  # standard errors allowed between two estimates of one rate
VERSIONS = f"""
app:
  routes:
    /api/catalog: {{error_rate: {ERROR_RATE}}}
versions:
  "{OLD}": {{retries: 0, attempt_count_header: true}}
  "{NEW}": {{retries: {NEW_TRIES - 1}, retry_on: [503], attempt_count_header: true}}
"""
RELAY = """
relay:
  timeout: 1s
  destinations:
    catalog: {http: {url: "http://catalog.shop.svc:8080/api/catalog"}, service: catalog}
"""


def config(endpoints: Path) -> str:
    # 5 calls/s per pod: the fleet's apps and relays share this test's event loop with the
    # probe (tests/integration/test_relay_fleet.py).
    return (f"targets: {{file: {{path: {endpoints}}}}}\nwindow: 1s\n"
            f"verdict: {{min_samples: {MIN_SAMPLES}, warmup: 1s}}\n"
            f"paths:\n  - name: {PATH}\n"
            "    relay: {destination: catalog, callees: {service: catalog}}\n"
            f"    rate: {RATE:g}/s\n    timeout: 2s\n")


def by_pair(store_path: str) -> dict[tuple[str, str], Counter[str]]:
    """Outcomes per (caller, callee) pair, with `calls`, `successes`, `attempts` and
    `measured` summed."""
    with Store.open(store_path, readonly=True) as store:
        windows = store.read_windows(paths=[PATH])
    found: dict[tuple[str, str], Counter[str]] = {}
    for w in windows:
        pair = split_pair(w.cohort)
        assert pair is not None, w.cohort  # every relay result is keyed by a pair
        cell = found.setdefault(pair, Counter())
        cell.update(w.outcomes)
        cell.update({"calls": w.requests, "successes": w.successes, "attempts": w.attempts_sum,
                     "measured": w.attempts_count})
    return found


def by_caller(pairs: dict[tuple[str, str], Counter[str]]) -> dict[str, Counter[str]]:
    found: dict[str, Counter[str]] = {OLD: Counter(), NEW: Counter()}
    for (caller, _), cell in pairs.items():
        found[caller].update(cell)
    return found


async def serving(proxy: HaproxyOutbound) -> set[str]:
    """The addresses HAProxy itself balances over now (its runtime API, not our record)."""
    return {s.address for s in await proxy.servers() if s.serving}


async def test_real_outbound_haproxy_per_version_retries_and_keeps_a_stale_list_past_the_skew(
    tmp_path: Path,
) -> None:
    endpoints = tmp_path / "endpoints.json"
    store = str(tmp_path / "fleet.db")
    windows = Windows()
    try:
        async with HaproxySidecars(parse_haproxy_versions(VERSIONS),
                                   workdir=tmp_path) as sidecars:
            fleet = Fleet(pods=4, version=OLD, sidecar=sidecars, base_host="127.0.0.90",
                          grpc_port=None, namespace="shop", service="catalog",
                          endpoints_file=endpoints, seed=5, drain_s=0.0,
                          relay=parse_relay(RELAY), mesh=EmulatedMesh(NEW))
            # The control plane upgraded first, as it must be: both versions within its skew.
            assert fleet.mesh is not None and fleet.mesh.accepts(OLD) and fleet.mesh.accepts(NEW)
            async with fleet:
                await fleet.rollout(NEW, interval_s=0.0, limit=2)
                await fleet.scale(6)
                added = [e.pod for e in fleet.history() if e.kind == EventKind.POD_ADDED]
                assert added == ["catalog-4", "catalog-5"]
                assert [p.version for p in fleet.pods] == [NEW, NEW, OLD, OLD, NEW, NEW]
                # One real outbound HAProxy per caller version, each following the fleet
                # (rollout restarts and the scale-up) while its version is within the skew.
                proxies = {v: p for v, p in fleet.outbounds.items()
                           if isinstance(p, HaproxyOutbound)}
                assert set(proxies) == {OLD, NEW}
                everyone = {hostport(p.host, p.http_port) for p in fleet.pods}
                assert len(everyone) == 6
                for proxy in proxies.values():
                    assert await serving(proxy) == everyone

                runner = probe_runner(config(endpoints), store, on_window=windows.on_window)
                async with running(runner, stop_within_s=30):
                    pairs = [(PATH, pair_cohort(a, b)) for a in (OLD, NEW) for b in (OLD, NEW)]
                    await windows.until(pairs, MIN_SAMPLES,
                                        within=windows_for(MIN_SAMPLES, SLOWEST_PER_S))
                    before = by_pair(store)

                    await fleet.move_control_plane(MOVED)
                    assert not fleet.mesh.accepts(OLD) and fleet.mesh.accepts(NEW)
                    gone = {hostport(p.host, p.http_port) for p in fleet.pods[4:]}
                    await fleet.scale(4)
                    now_held = everyone - gone
                    # The new callers' HAProxy got the new list; the old callers' did not.
                    assert await serving(proxies[NEW]) == now_held
                    assert await serving(proxies[OLD]) == everyone
                    wait = windows.budget(windows_for(MIN_SAMPLES, SLOWEST_PER_S),
                                          f"{MIN_SAMPLES} stale calls from the old callers")
                    while True:
                        await wait.next()
                        now = by_caller(by_pair(store))
                        calls_old = now[OLD]["calls"] - by_caller(before)[OLD]["calls"]
                        if (now[OLD][Outcome.STALE_ENDPOINT] >= MIN_SAMPLES
                                or calls_old > MAX_SAMPLES):
                            break
    finally:
        leftover = kill_leftovers(tmp_path)
    assert leftover == set(), "HAProxy processes outlived the fleet"

    # Retries per caller version, pair by pair, from the store: the attempts of every call
    # the destination answered measured (the outbound HAProxy's x-envoy-attempt-count; only
    # a call the relay gave up on, a timeout on this loaded machine, has none); one per call
    # from the old callers, three per failed call from the new ones (the app fails the same
    # request ids on every attempt), whoever the callee.
    for (caller, callee), cell in before.items():
        if callee == UNKNOWN:
            # No pod answered (the relay gave up: a timeout on a loaded machine), so no
            # callee to key it by and no attempts measured.
            assert cell["measured"] == 0 and cell[Outcome.STALE_ENDPOINT] == 0, cell
            continue
        assert cell["measured"] > 0, (caller, callee)
        assert cell["calls"] - cell["measured"] == cell[Outcome.TIMEOUT], (caller, callee, cell)
        assert cell[Outcome.STALE_ENDPOINT] == 0
        failed = cell["measured"] - cell["successes"]
        tries = 1 if caller == OLD else NEW_TRIES
        assert cell["attempts"] == cell["successes"] + tries * failed, (caller, callee, cell)
    # The new caller against the old-old pair: the same success rate (within Z standard
    # errors of these counts), attempts per failed call 3x the old-old pair's, attempts per
    # call 1 + 2 x the failed share, as measured.
    base, canary = before[OLD, OLD], before[NEW, OLD]
    n1, n2 = base["calls"], canary["calls"]
    p1, p2 = base["successes"] / n1, canary["successes"] / n2
    pooled = (base["successes"] + canary["successes"]) / (n1 + n2)
    assert 0 < pooled < 1
    assert abs(p1 - p2) <= Z * (pooled * (1 - pooled) * (1 / n1 + 1 / n2)) ** 0.5, (p1, p2)
    per_failed = [(c["attempts"] - c["successes"]) / (c["measured"] - c["successes"])
                  for c in (base, canary)]
    assert per_failed == [1.0, float(NEW_TRIES)]
    failed_share = 1 - canary["successes"] / canary["measured"]
    ratio = (canary["attempts"] / canary["measured"]) / (base["attempts"] / base["measured"])
    assert ratio == pytest.approx(1 + (NEW_TRIES - 1) * failed_share)
    assert abs(failed_share - ERROR_RATE) <= Z * (ERROR_RATE * (1 - ERROR_RATE) / n2) ** 0.5

    # Past the skew and a scale-down: stale routing from the old callers only, through their
    # HAProxy's stale list; the new callers kept calling, none of it stale.
    after = by_caller(by_pair(store))
    old_before, new_before = by_caller(before)[OLD], by_caller(before)[NEW]
    assert after[OLD][Outcome.STALE_ENDPOINT] >= MIN_SAMPLES
    assert after[NEW][Outcome.STALE_ENDPOINT] == 0
    assert after[NEW]["calls"] - new_before["calls"] >= MIN_SAMPLES
    # What the old callers' HAProxy did with the two gone addresses of its six: connections
    # refused there (stale once the removal is older than the path's timeout), at most their
    # round-robin share of the calls since (within Z standard errors); nothing else failed
    # but the app's own 503s, a call in flight when its pod went away (reset), and calls the
    # relay gave up on on a loaded machine.
    since = after[OLD] - old_before
    unreached = since[Outcome.STALE_ENDPOINT] + since[Outcome.CONNECT_REFUSED]
    assert unreached / since["calls"] <= 2 / 6 + Z * ((2 / 6) * (4 / 6) / since["calls"]) ** 0.5
    assert set(since) - {"calls", "successes", "attempts", "measured"} <= {
        Outcome.OK, Outcome.HTTP_5XX, Outcome.STALE_ENDPOINT, Outcome.CONNECT_REFUSED,
        Outcome.TIMEOUT, Outcome.RESET}, since


@pytest.mark.parametrize(("destination", "message"), [
    ('{http: {url: "http://cart.shop.svc:8080/api/cart"}, service: cart}',
     "name service(s) cart; the fleet's outbound HAProxy balances over catalog only"),
    ('{grpc: {target: "catalog.shop.svc:9090", method: /skewprobe.target.v1.Target/Echo}, '
     "service: catalog}", "HTTP destinations only"),
])
async def test_destinations_the_outbound_haproxy_cannot_carry_are_refused_before_any_start(
    tmp_path: Path, destination: str, message: str,
) -> None:
    relay = parse_relay(f"relay:\n  destinations:\n    other: {destination}\n")
    async with HaproxySidecars(parse_haproxy_versions(VERSIONS), workdir=tmp_path) as sidecars:
        with pytest.raises(BadInput, match=re.escape(message)):
            Fleet(pods=1, version=OLD, sidecar=sidecars, service="catalog", relay=relay)
    assert kill_leftovers(tmp_path) == set()
