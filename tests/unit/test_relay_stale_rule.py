"""The relay prober's stale-routing rule, against discovery snapshots on a fake clock."""

from __future__ import annotations

from probes.clients import RelayProber
from probes.spec import PathSpec, RelaySpec
from probes.types import Endpoint, Outcome
from tests.unit.virtual_time import FakeClock


def catalog(i: int) -> Endpoint:
    return Endpoint(f"catalog-{i}", f"127.0.0.{10 + i}", 8080,
                    {"pod": f"catalog-{i}", "service": "catalog"})


def answer(pod: str = "", address: str = "", **extra: object) -> dict[str, object]:
    doc: dict[str, object] = {"status": 200, "answered_by": {"pod": pod, "proxy_version": "1"},
                              "address": address}
    doc.update(extra)
    return doc


async def test_removed_pods_and_addresses_are_stale_after_the_timeout() -> None:
    clock = FakeClock()
    path = PathSpec("r", 1.0, 1.0, relay=RelaySpec("catalog", {"service": "catalog"}))
    prober = RelayProber(path, clock=clock)
    try:
        other = Endpoint("relay-0", "127.0.0.2", 8080, {"pod": "relay-0", "role": "relay"})
        prober.observe([catalog(0), catalog(1), other])
        clock.now = 10.0
        prober.observe([catalog(0), other])
        clock.now = 10.5  # a call sent before the removal may still land there
        assert prober._judge(answer("catalog-1")).outcome == Outcome.OK
        clock.now = 11.5
        assert prober._judge(answer("catalog-1")).outcome == Outcome.STALE_ENDPOINT
        assert prober._judge(answer("catalog-0")).outcome == Outcome.OK
        # A pod discovery has not seen yet is not judged; nor a pod of another service.
        assert prober._judge(answer("catalog-9")).outcome == Outcome.OK
        assert prober._judge(answer("relay-0")).outcome == Outcome.OK
        refused = {"status": None, "outcome": Outcome.CONNECT_REFUSED}
        gone = answer(address="127.0.0.11:8080", **refused)
        assert prober._judge(gone).outcome == Outcome.STALE_ENDPOINT
        never = answer(address="127.0.0.99:8080", **refused)
        assert prober._judge(never).outcome == Outcome.CONNECT_REFUSED
        # Back in discovery: current again.
        prober.observe([catalog(0), catalog(1)])
        assert prober._judge(answer("catalog-1")).outcome == Outcome.OK
    finally:
        await prober.aclose()


async def test_without_callees_nothing_is_judged_stale() -> None:
    clock = FakeClock()
    prober = RelayProber(PathSpec("r", 1.0, 1.0, relay=RelaySpec("catalog")),
                         clock=clock)
    try:
        prober.observe([catalog(0), catalog(1)])
        prober.observe([])
        clock.now = 100.0
        assert prober._judge(answer("catalog-1")).outcome == Outcome.OK
    finally:
        await prober.aclose()


async def test_a_pod_back_on_another_version_is_restarted_not_stale() -> None:
    """A sidecar upgrade restarts a pod under its name: until discovery shows it back, its
    answers on the new version are not stale; on the version it left with, they are."""
    clock = FakeClock()
    path = PathSpec("r", 1.0, 1.0, relay=RelaySpec("catalog", {"service": "catalog"}))
    prober = RelayProber(path, clock=clock)
    try:
        pod = Endpoint("catalog-1", "127.0.0.11", 8080,
                       {"pod": "catalog-1", "service": "catalog", "proxy_version": "1.20.3"})
        prober.observe([catalog(0), pod])
        prober.observe([catalog(0)])
        clock.now = 5.0
        back = answer("catalog-1")
        back["answered_by"] = {"pod": "catalog-1", "proxy_version": "1.21.0"}
        assert prober._judge(back).outcome == Outcome.OK
        left = answer("catalog-1")
        left["answered_by"] = {"pod": "catalog-1", "proxy_version": "1.20.3"}
        assert prober._judge(left).outcome == Outcome.STALE_ENDPOINT
    finally:
        await prober.aclose()
