"""Stale routing end to end on loopback: a control-plane move past the old callers' skew, then a
scale-down, produces `stale_endpoint` from the old callers only, and fails them.

Two relay pods (callers 1.20.3 and 1.21.0) reach the `catalog` service through their
outbound views (`targets.meshview.EmulatedMesh`, control plane 1.21.0). The control plane
moves to 1.22.0: 1.20.3 is two minors behind and stops taking endpoint lists. Then catalog
scales down and back up on a new address (catalog-1 stops, catalog-2 starts elsewhere). The
probe discovers every pod from an endpoints file, as it discovers the fleet.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from probes.spec import JudgingSettings
from probes.store import Store
from probes.types import Outcome, pair_cohort, split_pair
from probes.verdict.pairs import pair_matrix
from targets.fleet import write_atomically
from targets.meshview import EmulatedMesh
from targets.profile import VersionProfile
from targets.relay_config import parse_relay
from targets.server import TargetServer
from tests.servers.probe_run import Windows, probe_runner, running, windows_for
from tests.servers.stores import newest_window_end

OLD, NEW = "1.20.3", "1.21.0"
PATH = "relay-catalog"
MIN_SAMPLES = 100
MAX_SAMPLES = 40 * MIN_SAMPLES  # the hang guard, in calls per caller (never seconds)
RATE = 20.0  # calls/s to each relay pod (`config`)
RELAY = """
relay:
  timeout: 500ms
  destinations:
    catalog: {http: {url: "http://catalog.shop.svc:8080/api/catalog"}, service: catalog}
"""


class Estate:
    """Relay pods, catalog pods, the emulated mesh and the endpoints file the probe reads."""

    def __init__(self, endpoints: Path) -> None:
        self.file = endpoints
        self.mesh = EmulatedMesh(NEW)
        self.relays: dict[str, TargetServer] = {}
        self.catalog: dict[str, TargetServer] = {}
        self._generation = 0

    async def add_catalog(self, name: str) -> None:
        server = TargetServer(VersionProfile(NEW), pod=name, namespace="shop", grpc_port=None)
        await server.start()
        self.catalog[name] = server
        self.mesh.set_endpoints("catalog", [s.http_address for s in self.catalog.values()])
        self.publish()

    async def remove_catalog(self, name: str) -> None:
        server = self.catalog.pop(name)
        self.mesh.set_endpoints("catalog", [s.http_address for s in self.catalog.values()])
        self.publish()
        await server.stop(0.0)

    def publish(self) -> None:
        def entry(s: TargetServer, labels: dict[str, str]) -> dict[str, object]:
            return {"name": s.pod, "address": s.http_address, "ports": {"http": s.http_port},
                    "labels": {"pod": s.pod, "proxy_version": s.version, **labels}}

        found = [entry(s, {"role": "relay"}) for s in self.relays.values()]
        found += [entry(s, {"service": "catalog"}) for s in self.catalog.values()]
        self._generation += 1
        write_atomically(self.file, json.dumps(
            {"generation": self._generation, "endpoints": found}))


@contextlib.asynccontextmanager
async def estate(tmp_path: Path) -> AsyncIterator[Estate]:
    e = Estate(tmp_path / "endpoints.json")
    try:
        for name in ("catalog-0", "catalog-1"):
            await e.add_catalog(name)
        for version in (OLD, NEW):
            server = TargetServer(VersionProfile(version), pod=f"relay-{version}",
                                  namespace="platform-test", grpc_port=None,
                                  relay=parse_relay(RELAY), relay_view=e.mesh.view(version))
            await server.start()
            e.relays[version] = server
        e.publish()
        yield e
    finally:
        for server in [*e.relays.values(), *e.catalog.values()]:
            await server.stop(0.0)


def config(endpoints: Path) -> str:
    return (f"targets: {{file: {{path: {endpoints}}}}}\nwindow: 1s\n"
            f"verdict: {{min_samples: {MIN_SAMPLES}, warmup: 1s}}\n"
            f"paths:\n  - name: {PATH}\n"
            "    relay: {destination: catalog, callees: {service: catalog}}\n"
            f"    selector: {{role: relay}}\n    rate: {RATE:g}/s\n    timeout: 1s\n")


def outcomes_by_caller(store_path: str) -> dict[str, Counter[str]]:
    store = Store.open(store_path, readonly=True)
    try:
        windows = store.read_windows(paths=[PATH])
    finally:
        store.close()
    found: dict[str, Counter[str]] = {OLD: Counter(), NEW: Counter()}
    for w in windows:
        pair = split_pair(w.cohort)
        assert pair is not None, w.cohort  # every relay result is keyed by a pair
        found[pair[0]].update(w.outcomes)
    return found


async def test_control_plane_move_then_scale_down_is_stale_from_old_callers_only(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "stale.db")
    windows = Windows()
    async with estate(tmp_path) as e:
        runner = probe_runner(config(e.file), store, on_window=windows.on_window)
        async with running(runner, stop_within_s=30):
            callers = [(PATH, pair_cohort(v, NEW)) for v in (OLD, NEW)]
            # Every caller's calls go to the one callee version.
            await windows.until(callers, MIN_SAMPLES, within=windows_for(MIN_SAMPLES, RATE))
            before = outcomes_by_caller(store)
            # Every call so far went to a current pod: nothing stale, from anyone.
            assert before[OLD][Outcome.STALE_ENDPOINT] == before[NEW][Outcome.STALE_ENDPOINT] == 0

            e.mesh.move_control_plane("1.22.0")
            assert not e.mesh.accepts(OLD) and e.mesh.accepts(NEW)
            await e.remove_catalog("catalog-1")
            await e.add_catalog("catalog-2")
            assert e.mesh.view(NEW).addresses("catalog") == e.mesh.addresses("catalog")
            assert e.catalog["catalog-0"].http_address in e.mesh.view(OLD).addresses("catalog")
            # The old callers' view still holds catalog-1's address; the new ones' does not.
            # Half of the old caller's calls go to the gone address (one of the two it keeps).
            wait = windows.budget(windows_for(MIN_SAMPLES, RATE / 2),
                                  f"{MIN_SAMPLES} stale calls from the old caller")
            while True:
                await wait.next()
                now = outcomes_by_caller(store)
                stale_old = now[OLD][Outcome.STALE_ENDPOINT]
                calls_old = sum(now[OLD].values()) - sum(before[OLD].values())
                if stale_old >= MIN_SAMPLES or calls_old > MAX_SAMPLES:
                    break
            matrix = pair_matrix(store, JudgingSettings(min_samples=MIN_SAMPLES, window_s=1.0,
                                                        warmup_s=1.0),
                                 path=PATH, now=newest_window_end(store) + 1.0, every_window=True)

    after = outcomes_by_caller(store)
    assert after[OLD][Outcome.STALE_ENDPOINT] >= MIN_SAMPLES
    assert after[NEW][Outcome.STALE_ENDPOINT] == 0
    # The new callers made as many calls since the change as the old ones did.
    assert sum(after[NEW].values()) - sum(before[NEW].values()) >= MIN_SAMPLES
    stale = {s.caller: s for s in matrix.stale}
    assert stale[OLD].verdict == "fail" and stale[OLD].stale >= MIN_SAMPLES
    assert stale[NEW].stale == 0 and stale[NEW].verdict != "fail"
    assert matrix.verdict == "fail"

    # /metrics carries the pair and the outcome: stale calls from the old callers only.
    stale_series = {
        sample.labels["cohort"]: sample.value
        for family in text_string_to_metric_families(generate_latest(runner.registry).decode())
        for sample in family.samples
        if sample.name == "skewprobe_requests_total"
        and sample.labels.get("outcome") == Outcome.STALE_ENDPOINT
    }
    stale_from = {c for c, value in stale_series.items() if value > 0}
    assert stale_from and all(c.startswith(f"{OLD}->") for c in stale_from), stale_from
    assert sum(stale_series.values()) == after[OLD][Outcome.STALE_ENDPOINT]

