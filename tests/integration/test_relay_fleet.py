"""The local fleet's outbound side, probed through its relay: each pod a relay pod whose
retries are its proxy version's (the fault profile's `outbound`) and whose endpoint view
follows the fleet only while its version is within the emulated control plane's skew.

Four pods of `catalog` start on 1.20.3; two restart onto 1.21.0, whose outbound proxy
retries 503 twice, and the service scales up by two (new pods, new addresses, on 1.21.0).
Every pair is measured, and the new callers send 3 attempts for each failed call. Then the
control plane moves to 1.22.0 (1.20.3 falls two minors behind and stops taking endpoint
lists) and the service scales back down: the old callers keep routing to the two addresses
nobody holds now (`stale_endpoint`), the new ones do not.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from probes.store import Store
from probes.types import Outcome, pair_cohort, split_pair
from targets.fleet import EventKind, Fleet
from targets.profile import parse_profiles
from targets.relay_config import parse_relay
from tests.integration import test_relay_stale as relay_stale
from tests.servers.probe_run import Windows, probe_runner, running, windows_for
from tests.servers.relay_estate import PROFILES

OLD, NEW = "1.20.3", "1.21.0"
PATH = "relay-catalog"
MIN_SAMPLES = 100
MAX_SAMPLES = 40 * MIN_SAMPLES  # the hang guard, in calls per caller (never seconds)
RATE = 5.0  # calls/s to each relay pod (`config`)
# The slowest pair to fill, old -> old, and the old callers' stale calls: the two old
# callers' calls, a third of them to the two old callees (of six), or, past the skew and
# the scale-down, to the two addresses gone (of the six they still route to).
SLOWEST_PER_S = 2 * RATE * 2 / 6
# The destination fails 20 % of request ids on every attempt; 1.21.0's outbound side
# retries 503 twice (tests/servers/relay_estate); the allowlist names the service
# (test_relay_stale).
RELAY = relay_stale.RELAY


def config(endpoints: Path) -> str:
    # 5 calls/s per pod: the fleet's relays, their destinations and the probe share this
    # test's one event loop (at 20/s on a loaded machine, relay calls timed out).
    return (f"targets: {{file: {{path: {endpoints}}}}}\nwindow: 1s\n"
            f"verdict: {{min_samples: {MIN_SAMPLES}, warmup: 1s}}\n"
            f"paths:\n  - name: {PATH}\n"
            "    relay: {destination: catalog, callees: {service: catalog}}\n"
            f"    rate: {RATE:g}/s\n    timeout: 1s\n")


def by_caller(store_path: str) -> dict[str, Counter[str]]:
    """Outcomes per caller version, and `attempts`/`measured` summed, over the store."""
    with Store.open(store_path, readonly=True) as store:
        windows = store.read_windows(paths=[PATH])
    found: dict[str, Counter[str]] = {OLD: Counter(), NEW: Counter()}
    for w in windows:
        pair = split_pair(w.cohort)
        assert pair is not None, w.cohort
        found[pair[0]].update(w.outcomes)
        found[pair[0]].update({"attempts": w.attempts_sum, "measured": w.attempts_count})
    return found


async def test_fleet_outbound_retries_per_version_and_stale_views_past_the_skew(
    tmp_path: Path,
) -> None:
    endpoints = tmp_path / "endpoints.json"
    store = str(tmp_path / "fleet.db")
    windows = Windows()
    fleet = Fleet(pods=4, version=OLD, profiles=parse_profiles(PROFILES),
                  base_host="127.0.0.70", grpc_port=None, namespace="shop", service="catalog",
                  endpoints_file=endpoints, seed=5, drain_s=0.0, relay=parse_relay(RELAY))
    assert fleet.mesh is not None and fleet.mesh.control_plane == OLD
    async with fleet:
        await fleet.rollout(NEW, interval_s=0.0, limit=2)
        await fleet.scale(6)
        added = [e.pod for e in fleet.history() if e.kind == EventKind.POD_ADDED]
        assert added == ["catalog-4", "catalog-5"]
        assert [p.version for p in fleet.pods] == [NEW, NEW, OLD, OLD, NEW, NEW]
        assert len(fleet.mesh.addresses("catalog")) == 6
        runner = probe_runner(config(endpoints), store, on_window=windows.on_window)
        async with running(runner, stop_within_s=30):
            pairs = [(PATH, pair_cohort(a, b)) for a in (OLD, NEW) for b in (OLD, NEW)]
            await windows.until(pairs, MIN_SAMPLES,
                                within=windows_for(MIN_SAMPLES, SLOWEST_PER_S))
            before = by_caller(store)

            fleet.mesh.move_control_plane("1.22.0")
            assert not fleet.mesh.accepts(OLD) and fleet.mesh.accepts(NEW)
            gone = {p.http_address for p in fleet.pods[4:]}
            await fleet.scale(4)
            assert gone <= set(fleet.mesh.view(OLD).addresses("catalog"))
            assert not gone & set(fleet.mesh.view(NEW).addresses("catalog"))
            wait = windows.budget(windows_for(MIN_SAMPLES, SLOWEST_PER_S),
                                  f"{MIN_SAMPLES} stale calls from the old callers")
            while True:
                await wait.next()
                now = by_caller(store)
                calls_old = sum(now[OLD].values()) - sum(before[OLD].values())
                if now[OLD][Outcome.STALE_ENDPOINT] >= MIN_SAMPLES or calls_old > MAX_SAMPLES:
                    break

    after = by_caller(store)
    # Retries per version: one attempt per call from the old callers, three per failed
    # call from the new ones (the destination fails the same request ids on every attempt).
    for caller in (OLD, NEW):
        measured = before[caller]["measured"]
        failed = measured - before[caller][Outcome.OK]
        assert measured > 0 and before[caller][Outcome.STALE_ENDPOINT] == 0
        extra = 0 if caller == OLD else 2 * failed
        assert before[caller]["attempts"] == measured + extra
    # Past the skew and a scale-down: stale routing from the old callers only.
    assert after[OLD][Outcome.STALE_ENDPOINT] >= MIN_SAMPLES
    assert after[NEW][Outcome.STALE_ENDPOINT] == 0
    assert sum(after[NEW].values()) - sum(before[NEW].values()) >= MIN_SAMPLES
