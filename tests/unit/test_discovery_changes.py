"""Restart events from discovery snapshots."""

from __future__ import annotations

from probes._types import Endpoint
from probes.discovery.changes import RESTART, RestartTracker


def _ep(name: str, version: str) -> Endpoint:
    return Endpoint(name=name, host="127.0.0.1", port=1,
                    labels={"proxy_version": version, "namespace": "shop"})


def test_a_pod_back_on_a_new_version_is_one_restart() -> None:
    clock = iter([100.0, 101.0, 102.0, 103.0])
    tracker = RestartTracker("proxy_version", wall=lambda: next(clock))
    tracker.observe([_ep("a", "1.20"), _ep("b", "1.20")])
    tracker.observe([_ep("b", "1.20")])                     # a drains: removed first
    tracker.observe([_ep("a", "1.21"), _ep("b", "1.20")])   # a is back, upgraded
    tracker.observe([_ep("a", "1.21"), _ep("b", "1.20")])   # nothing new
    (event,) = tracker.drain()
    assert event.kind == RESTART and event.endpoint == "a" and event.at == 102.0
    assert event.detail["from"] == "1.20" and event.detail["to"] == "1.21"
    assert event.cohort == "1.21" and event.detail["namespace"] == "shop"
    assert tracker.drain() == []


def test_memory_is_bounded() -> None:
    tracker = RestartTracker("proxy_version", remember=2)
    tracker.observe([_ep("a", "1"), _ep("b", "1"), _ep("c", "1")])
    tracker.observe([_ep("a", "2")])  # "a" was forgotten: no event, and no unbounded growth
    assert tracker.drain() == []
