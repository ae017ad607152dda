"""The upgrade planner on plain dataclasses: steps, the point of no return, tiers, time."""

from __future__ import annotations

import pytest

from probes.cli._plan_format import format_text
from probes.plan import (
    NamespaceInfo,
    PlanInput,
    PlanPods,
    PlanSettings,
    WorkloadTraffic,
    build_plan,
    plan_steps,
    workload_history,
)
from probes.spec import SkewPolicy
from probes.store.records import InventoryRow, InventorySnapshot

ONE = SkewPolicy(behind=1, ahead=0)
DAY = 86400.0


def _fleet(version: str, n: int = 3) -> list[PlanPods]:
    return [PlanPods("shop", f"deployment/app{i}", version, pods=10, max_age_s=DAY)
            for i in range(n)]


def test_n_minus_1_to_n_is_one_restart_and_the_restart_is_the_point_of_no_return() -> None:
    plan = plan_steps(_fleet("1.22.3"), "1.22.3", "1.23.1", ONE)
    assert [(s["kind"], s["to"]) for s in plan["steps"]] == [
        ("control_plane", "1.23.1"), ("restart", "1.23.1")]
    assert plan["fleet_restarts"] == 1 and plan["control_plane_moves"] == 1
    move, restart = plan["steps"]
    assert move["left_outside"]["pods"] == 0 and move["outside_if_made_now"]["pods"] == 0
    assert restart["pods"] == 30 and restart["workloads"] == 3
    ponr = plan["point_of_no_return"]
    assert ponr["step"] == 2 and ponr["unsupported"]["control_plane"] == "1.22.3"
    assert ponr["unsupported"]["pods"] == 30


def test_n_minus_2_to_n_is_two_restarts_and_says_why() -> None:
    plan = plan_steps(_fleet("1.21.4"), "1.21.4", "1.23.0", ONE)
    assert [(s["step"], s["kind"], s["to"]) for s in plan["steps"]] == [
        (1, "control_plane", "1.22.x"), (2, "restart", "1.22.x"),
        (3, "control_plane", "1.23.0"), (4, "restart", "1.23.0")]
    assert plan["fleet_restarts"] == 2
    assert "2 fleet restarts, not one" in plan["why"]
    assert "at most 1 minor behind" in plan["why"] and "never ahead" in plan["why"]
    # The second move, made now, would leave every pod outside: the restart must come first.
    assert plan["steps"][2]["outside_if_made_now"]["pods"] == 30
    assert plan["steps"][2]["left_outside"]["pods"] == 0
    # Rollback by moving the control plane back ends at the first restart (after move 1).
    ponr = plan["point_of_no_return"]
    assert ponr["step"] == 2 and ponr["what"] == "restart onto 1.22.x"
    assert ponr["unsupported"]["control_plane"] == "1.21.4"
    assert {w["workload"] for w in ponr["unsupported"]["workloads"]} == {
        "deployment/app0", "deployment/app1", "deployment/app2"}


def test_control_plane_ahead_of_an_old_fleet_restarts_first() -> None:
    plan = plan_steps(_fleet("1.21.4"), "1.22.1", "1.23.0", ONE)
    assert [(s["kind"], s["to"]) for s in plan["steps"]] == [
        ("restart", "1.22.1"), ("control_plane", "1.23.0"), ("restart", "1.23.0")]
    assert plan["fleet_restarts"] == 2
    assert plan["point_of_no_return"]["step"] == 3


def test_wider_skew_is_one_restart() -> None:
    plan = plan_steps(_fleet("1.21.4"), "1.21.4", "1.23.0", SkewPolicy(behind=2))
    assert plan["fleet_restarts"] == 1 and plan["steps"][0]["to"] == "1.23.0"


def test_pods_already_outside_restart_first_and_unknown_versions_are_not_planned() -> None:
    pods = [*_fleet("1.22.0", 1), PlanPods("shop", "deployment/old", "1.20.1", pods=2),
            PlanPods("shop", "deployment/x", "custom-build", pods=4),
            PlanPods("shop", "deployment/plain", "none", pods=5)]
    plan = plan_steps(pods, "1.22.0", "1.22.3", ONE)
    first = plan["steps"][0]
    assert first["kind"] == "restart" and first["pods"] == 2 and "already" in first["why"]
    assert plan["not_planned"][0]["workload"] == "deployment/x"
    assert plan["without_proxy"] == 5
    # a patch move: the control plane, then every pod below the target
    assert [s["kind"] for s in plan["steps"][1:]] == ["control_plane", "restart"]
    assert plan["steps"][2]["pods"] == 12 and plan["point_of_no_return"] is None


def test_a_workload_on_two_versions_is_listed_once_with_its_pods_per_version() -> None:
    """Live pods come one PlanPods each: a workload half-way through a restart has pods on
    two versions, and the point of no return names it once (it repeated it per version)."""
    ledger = [PlanPods("legacy", "replicaset/ledger-1b2c", v, names=(f"ledger-1b2c-{i}",))
              for i, v in enumerate(("1.22.0", "1.22.1", "1.22.1"))]
    pods = [*ledger, PlanPods("shop", "deployment/app", "1.22.1", pods=4)]
    plan = build_plan(_input(pods=tuple(pods), control_plane="1.22.1"), PlanSettings("1.23.0"))
    unsupported = plan["point_of_no_return"]["unsupported"]
    assert unsupported["workloads"] == [
        {"namespace": "legacy", "workload": "replicaset/ledger-1b2c", "pods": 3,
         "versions": {"1.22.0": 1, "1.22.1": 2},
         "names": ["ledger-1b2c-0", "ledger-1b2c-1", "ledger-1b2c-2"]},
        {"namespace": "shop", "workload": "deployment/app", "pods": 4,
         "versions": {"1.22.1": 4}, "names": []}]
    text = format_text(plan)
    assert ("unsupported if the control plane moved back to 1.22.1: 7 pods: legacy/replicaset/"
            "ledger-1b2c (1.22.0: 1, 1.22.1: 2), shop/deployment/app (1.22.1: 4)") in text
    assert text.count("ledger-1b2c") == 1


@pytest.mark.parametrize("target,match", [
    ("1.20.0", "downgrade"), ("2.0.0", "major"), ("latest", "not a version")])
def test_targets_that_cannot_be_planned(target: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_steps(_fleet("1.21.0"), "1.21.0", target, ONE)


def test_history_counts_recycles_from_the_oldest_pods_age() -> None:
    snaps = []
    for day in range(10):
        at = day * DAY
        # `weekly` redeploys on day 3 and 7; `stuck` never; ages grow with time otherwise.
        weekly_age = at - max(d * DAY for d in (0, 3, 7) if d * DAY <= at) + 600
        snaps.append(InventorySnapshot(at, (
            InventoryRow("shop", "deployment/weekly", "1.21.0", 3, weekly_age),
            InventoryRow("shop", "deployment/stuck", "1.21.0", 2, 90 * DAY + at),
        )))
    hist = workload_history(snaps)
    assert hist[("shop", "deployment/weekly")].recycles == 2
    assert hist[("shop", "deployment/weekly")].interval_s == pytest.approx(4 * DAY)
    assert hist[("shop", "deployment/stuck")].recycles == 0
    assert hist[("shop", "deployment/stuck")].interval_s is None


def _input(**kw: object) -> PlanInput:
    pods = (
        PlanPods("platform-test", "deployment/canary-callee", "1.21.0", 2, DAY),
        PlanPods("shop", "deployment/catalog", "1.21.0", 6, 3 * DAY),
        PlanPods("shop", "deployment/checkout", "1.21.0", 4, 2 * DAY),
        PlanPods("feeds", "deployment/ticker", "1.21.0", 3, 5 * DAY),
        PlanPods("legacy", "statefulset/ledger", "1.21.0", 2, 200 * DAY),
        PlanPods("batch", "deployment/cron", "none", 1, DAY),
    )
    base: dict[str, object] = dict(
        source="store", at=1_000_000.0, pods=pods, control_plane="1.21.0",
        control_plane_source="recorded", mesh="istio")
    base.update(kw)
    return PlanInput(**base)  # type: ignore[arg-type]


TRAFFIC = {
    ("shop", "deployment/catalog"): WorkloadTraffic(reads=("catalog",)),
    ("shop", "deployment/checkout"): WorkloadTraffic(reads=("health",), writes=("checkout",)),
    ("feeds", "deployment/ticker"): WorkloadTraffic(streams=("feed",)),
}


def test_tiers_by_measurement_reference_first_streams_last() -> None:
    plan = build_plan(_input(traffic=TRAFFIC, traffic_source="store"), PlanSettings("1.22.0"))
    assert [(t["name"], t["pods"]) for t in plan["tiers"]] == [
        ("reference target", 2), ("read paths", 6), ("write paths", 4), ("not probed", 2),
        ("stream holders", 3)]
    assert plan["tiers"][-1]["stream_holders"] == ["feeds/deployment/ticker"]
    assert plan["tiers"][0]["natural_recycle"] is None  # no history
    assert any("inventory history" in m for m in plan["missing"])
    assert any("namespace labels" in m for m in plan["missing"])
    assert plan["pinning"] is None


def test_tiers_by_namespace_label_and_pinning() -> None:
    namespaces = {
        "shop": NamespaceInfo("shop", {"skewprobe.io/restart-tier": "2",
                                       "istio-injection": "enabled"}),
        "feeds": NamespaceInfo("feeds", {"skewprobe.io/restart-tier": "10",
                                         "istio.io/rev": "1-21-0"}),
        "legacy": NamespaceInfo("legacy", {}),
        "platform-test": NamespaceInfo("platform-test", {"istio.io/rev": "canary"}),
    }
    plan = build_plan(_input(namespaces=namespaces, namespaces_source="kubernetes",
                             traffic=TRAFFIC, traffic_source="store"), PlanSettings("1.22.0"))
    names = [t["name"] for t in plan["tiers"]]
    assert names == ["reference target", "skewprobe.io/restart-tier=2",
                     "skewprobe.io/restart-tier=10", "not probed"]  # 2 before 10: natural order
    pins = {p["namespace"]: p["state"] for p in plan["pinning"]}
    assert pins == {"feeds": "pinned", "legacy": "not pinned", "platform-test": "pinned",
                    "shop": "default injector"}


def test_time_long_tail_and_dates() -> None:
    history = workload_history([
        InventorySnapshot(0.0, (
            InventoryRow("platform-test", "deployment/canary-callee", "1.21.0", 2, 600.0),
            InventoryRow("shop", "deployment/catalog", "1.21.0", 6, 5 * DAY),
            InventoryRow("shop", "deployment/checkout", "1.21.0", 4, DAY),
            InventoryRow("legacy", "statefulset/ledger", "1.21.0", 2, 190 * DAY))),
        InventorySnapshot(4 * DAY, (
            InventoryRow("platform-test", "deployment/canary-callee", "1.21.0", 2, DAY),
            InventoryRow("shop", "deployment/catalog", "1.21.0", 6, 2 * DAY),
            InventoryRow("shop", "deployment/checkout", "1.21.0", 4, DAY),
            InventoryRow("legacy", "statefulset/ledger", "1.21.0", 2, 194 * DAY))),
        InventorySnapshot(8 * DAY, (
            InventoryRow("platform-test", "deployment/canary-callee", "1.21.0", 2, DAY),
            InventoryRow("shop", "deployment/catalog", "1.21.0", 6, DAY),
            InventoryRow("shop", "deployment/checkout", "1.21.0", 4, 5 * DAY),
            InventoryRow("legacy", "statefulset/ledger", "1.21.0", 2, 198 * DAY))),
    ])
    settings = PlanSettings("1.23.0", tier_every_s=DAY, soak_s=2 * DAY)
    plan = build_plan(_input(history=history, history_source="store: 3 snapshots"), settings)
    time = plan["time"]
    assert time["long_tail"]["pods"] == 2
    assert time["long_tail"]["workloads"][0]["workload"] == "statefulset/ledger"
    natural = time["natural"]
    assert natural["never"] == ["legacy/statefulset/ledger"]
    # catalog and the callee recycle every 4 days, checkout every 8: two restarts = 16 days.
    assert natural["slowest"] == "shop/deployment/checkout" and natural["days"] == 16
    assert natural["at_least"] is True  # feeds/ticker has no history: not seen recycling
    assert "feeds/deployment/ticker" in natural["not_seen_recycling"]
    tiers = plan["tiers"]
    assert time["forced"]["elapsed_days"] == 2 * (len(tiers) * 1 + 2)
    assert "2 restarts × (" in time["forced"]["arithmetic"]


def test_unknown_control_plane_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="control-plane version unknown"):
        build_plan(_input(control_plane=None), PlanSettings("1.22.0"))


def _lifetime(capped: bool) -> dict[str, object]:
    return {"cohort": "1.21.0", "capped": capped, "cap_s": 1800.0 if capped else None,
            "why": "cap ~30 min" if capped else "no band of ended lifetimes",
            "open_streams": 6, "aged": 4, "oldest_s": 9 * 86400.0}


def test_a_stream_tier_without_a_cap_gets_the_lifetime_step_first() -> None:
    plan = build_plan(_input(traffic=TRAFFIC, traffic_source="store",
                             lifetimes={"feed": [_lifetime(False)]}, lifetimes_source="store"),
                      PlanSettings("1.22.0"))
    (stream,) = plan["connection_lifetime"]["streams"]
    assert stream["tier_name"] == "stream holders" and stream["capped"] is False
    assert stream["step"] == "roll out a maximum connection duration 2 weeks before tier 5"
    assert "9 days" not in stream["lead"] and "216.0 h old" in stream["lead"]
    assert stream["storm"].startswith("restarting tier 5 now resets the 6 streams")
    assert any("envoyproxy/envoy#10274" in lever
               for lever in plan["connection_lifetime"]["levers"])


def test_a_capped_stream_tier_needs_no_step_and_an_unrecorded_one_is_not_assumed_capped() -> None:
    plan = build_plan(_input(traffic=TRAFFIC, traffic_source="store",
                             lifetimes={"feed": [_lifetime(True)]}, lifetimes_source="store"),
                      PlanSettings("1.22.0"))
    (stream,) = plan["connection_lifetime"]["streams"]
    assert stream["capped"] is True and stream["cap_s"] == 1800.0 and "step" not in stream
    plan = build_plan(_input(traffic=TRAFFIC, traffic_source="store"), PlanSettings("1.22.0"))
    (stream,) = plan["connection_lifetime"]["streams"]
    assert stream["capped"] is None and "before tier 5" in stream["step"]
    assert any("stream lifetimes" in m for m in plan["missing"])


def test_the_recorder_writes_the_lifetime_check_as_events_plan_reads() -> None:
    from prometheus_client import CollectorRegistry

    from probes.clients import OpenStream
    from probes.measure.window import WindowAggregator
    from probes.metrics import ProbeMetrics
    from probes.streams.recorder import LIFETIME_EVENT, StreamRecorder

    recorder = StreamRecorder(WindowAggregator(length_s=10.0), ProbeMetrics(CollectorRegistry()))
    held = [OpenStream("feed", f"shop/p{i}", "1.21.0", 0, 0.0, age_s=7200.0 * i)
            for i in range(3)]
    (event,) = recorder.lifetime_events(held, now=100.0)
    assert (event.kind, event.path, event.cohort) == (LIFETIME_EVENT, "feed", "1.21.0")
    assert event.detail["capped"] is False and event.detail["open_streams"] == 3
    assert event.detail["aged"] == 2 and event.detail["oldest_s"] == 14400.0


def test_drain_timers_from_the_slowest_measured_path_with_the_arithmetic() -> None:
    latency = {"catalog": (0.040, 5000), "checkout": (2.4, 800), "health": (0.002, 900)}
    plan = build_plan(_input(traffic=TRAFFIC, traffic_source="store", latency=latency,
                             latency_source="store"), PlanSettings("1.22.0"))
    drains = {d["name"]: d for d in plan["drain"]["tiers"]}
    read, write = drains["read paths"], drains["write paths"]
    assert read["drain_s"] == 5 and read["termination_grace_period_s"] == 30  # defaults do
    assert write["slowest_path"] == "checkout" and write["drain_s"] == 8  # ⌈3 × 2.4 s⌉
    assert write["termination_grace_period_s"] == 30
    assert "⌈3 × p99 of checkout 2400 ms⌉) = 8 s" in write["arithmetic"]
    assert "is SHORTER than" in write["against_defaults"]
    assert drains["stream holders"]["drain_s"] is None  # no unary path measured there
    assert plan["drain"]["defaults"]["envoy_drain_time_s"] == 600


def test_progress_share_namespaces_long_tail_and_projection() -> None:
    from probes.plan import progress

    snaps = [InventorySnapshot(day * DAY, (
        InventoryRow("shop", "deployment/a", "1.22.0", day, DAY),
        InventoryRow("shop", "deployment/a", "1.21.0", 4 - day, DAY),
        InventoryRow("legacy", "statefulset/old", "1.21.0", 2, 90 * DAY),
        InventoryRow("batch", "deployment/x", "none", 1, DAY),
    )) for day in range(4)]
    out = progress(snaps)
    assert out is not None and out["target"] == "1.22.0"
    shares = [p["share"] for p in out["points"]]
    assert shares == [0.0, round(1 / 6, 4), round(2 / 6, 4), 0.5]
    assert [p["long_tail_pods"] for p in out["points"]] == [2, 2, 2, 2]
    assert out["points"][-1]["namespaces_done"] == 0
    # a straight line: +1/6 a day from 0.5 → 1.0 three days after the last snapshot
    assert out["projected_done_by"] == "1970-01-07T00:00:00Z"
    flat = progress(snaps[:1] * 2)
    assert flat is not None and flat["projected_done_by"] is None
    assert progress([]) is None
