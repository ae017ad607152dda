"""Restart events from discovery snapshots, and the first sight of each pod (for the
verdict's warm-up: `probes.store.records.known_starts`)."""

from __future__ import annotations

from probes.discovery.changes import RESTART, RestartTracker
from probes.store import APPEARED_EVENT, PRESENT_EVENT
from probes.types import Endpoint


def _ep(name: str, version: str, **labels: str) -> Endpoint:
    return Endpoint(name=name, host="127.0.0.1", port=1,
                    labels={"proxy_version": version, "namespace": "shop", **labels})


def test_a_pod_back_on_a_new_version_is_one_restart() -> None:
    clock = iter([100.0, 101.0, 102.0, 103.0])
    tracker = RestartTracker("proxy_version", wall=lambda: next(clock))
    tracker.observe([_ep("a", "1.20"), _ep("b", "1.20")])
    tracker.observe([_ep("b", "1.20")])                     # a drains: removed first
    tracker.observe([_ep("a", "1.21"), _ep("b", "1.20")])   # a is back, upgraded
    tracker.observe([_ep("a", "1.21"), _ep("b", "1.20")])   # nothing new
    events = tracker.drain()
    (event,) = [e for e in events if e.kind == RESTART]
    assert event.kind == RESTART and event.endpoint == "a" and event.at == 102.0
    assert event.detail["from"] == "1.20" and event.detail["to"] == "1.21"
    assert event.cohort == "1.21" and event.detail["namespace"] == "shop"
    # Present at the start, both; a on 1.21 first seen when it came back.
    assert sorted((e.kind, e.endpoint, e.cohort, e.at) for e in events if e.kind != RESTART) == [
        (APPEARED_EVENT, "a", "1.21", 102.0), (PRESENT_EVENT, "a", "1.20", 100.0),
        (PRESENT_EVENT, "b", "1.20", 100.0)]
    assert tracker.drain() == []


def test_pods_present_at_the_start_and_later_ones_are_told_apart() -> None:
    clock = iter([100.0, 110.0, 120.0])
    tracker = RestartTracker("proxy_version", wall=lambda: next(clock))
    tracker.observe([_ep("a", "1.20"), _ep("k", "1.20", start_time="2026-01-01T00:00:00Z")])
    tracker.observe([_ep("a", "1.20"), _ep("c", "1.21")])
    tracker.observe([_ep("a", "1.20"), _ep("c", "1.21"), _ep("k", "1.20")])
    # k's start is in its labels: nothing to record for it, even without them later.
    assert [(e.kind, e.endpoint, e.at) for e in tracker.drain()] == [
        (PRESENT_EVENT, "a", 100.0), (APPEARED_EVENT, "c", 110.0)]


def test_memory_is_bounded() -> None:
    tracker = RestartTracker("proxy_version", remember=2)
    tracker.observe([_ep("a", "1"), _ep("b", "1"), _ep("c", "1")])
    assert len(tracker.drain()) == 3  # present at the start
    tracker.observe([_ep("a", "2")])  # "a" was forgotten: no restart, no unbounded growth
    assert [e.kind for e in tracker.drain()] == [APPEARED_EVENT]
    assert len(tracker._last) <= 2 and len(tracker._seen) <= 2
