"""`skewprobe plan` end to end: live from the fake Kubernetes API (real list protocol), and
from a store a probe's inventory snapshots filled."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes._parsing import rfc3339
from probes.cli import main
from probes.cli.plan import add_plan_parser, run_plan
from probes.errors import BadInput, DataMissing
from probes.inventory import CONTROL_PLANE_EVENT
from probes.measure.window import WindowAggregator
from probes.store import Event, InventoryRow, Store
from probes.types import CallOutcome, CallResult, Outcome
from tests.servers import kube_pods as kp
from tests.servers.kube_api import FakeKubeApi, served_in_thread

DAY = 86400.0

CONFIG = """\
targets:
  kubernetes:
    mesh: istio
    namespaces: [platform-test, shop, feeds, legacy]
    port: http
    kubeconfig: {kubeconfig}
paths:
  - name: catalog
    http: {{path: /api/catalog}}
    selector: {{workload: deployment/catalog}}
  - name: checkout
    http: {{method: POST, path: /api/checkout}}
    selector: {{workload: deployment/checkout}}
  - name: feed
    stream: {{method: /skewprobe.target.v1.Target/Subscribe}}
    port: http
    selector: {{namespace: feeds}}
plan:
  max_pod_age: 30d
  soak: 2d
"""


def _ago(days: float) -> str:
    return rfc3339(time.time() - days * DAY)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKubeApi, Path]]:
    """An n-2 estate: istiod 1.21.4, every proxy on 1.21.4 (sidecar, native sidecar and
    ambient), one pod without a proxy, a pod older than the maximum age, four namespaces."""
    api = FakeKubeApi()
    objects = [
        kp.namespace("platform-test", labels={"istio.io/rev": "1-21-4"}),
        kp.namespace("shop", labels={"istio-injection": "enabled"}),
        kp.namespace("feeds", labels={"istio.io/rev": "1-21-4"}),
        kp.namespace("legacy"),
        kp.pod("canary-callee-x-1", namespace="platform-test", mesh="istio", version="1.21.4",
               ip="10.0.0.1", started=_ago(1)),
        kp.pod("catalog-x-1", mesh="istio", version="1.21.4", ip="10.0.0.2", started=_ago(2)),
        kp.pod("catalog-x-2", mesh="istio-native", version="1.21.4", ip="10.0.0.3",
               started=_ago(3)),
        kp.pod("checkout-x-1", mesh="istio", version="1.21.4", ip="10.0.0.4", started=_ago(2),
               annotations={"proxy.istio.io/config": "terminationDrainDuration: 2s\n"}),
        kp.pod("cart-x-1", mesh="istio-ambient", ip="10.0.0.5", node="node-a",
               started=_ago(4)),
        kp.pod("ticker-x-1", namespace="feeds", mesh="istio", version="1.21.4", ip="10.0.0.6",
               started=_ago(5)),
        kp.pod("ledger-x-1", namespace="legacy", mesh="istio", version="1.21.4", ip="10.0.0.7",
               started=_ago(200)),
        kp.pod("batch-x-1", namespace="legacy", ip="10.0.0.8", started=_ago(1)),
        kp.ztunnel_pod("node-a", "1.21.4"),
        kp.istiod("1.21.4"),
    ]
    for obj in objects:
        api.create(obj)
    with served_in_thread(api, tmp_path, CONFIG) as config:
        yield api, config


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="skewprobe")
    add_plan_parser(parser.add_subparsers(dest="command"))
    return run_plan(parser.parse_args(["plan", *argv]))


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = _run(*argv, "--json")
    return code, json.loads(capsys.readouterr().out)


def test_live_n_minus_2_to_n(cluster: tuple[FakeKubeApi, Path],
                             capsys: pytest.CaptureFixture[str]) -> None:
    api, config = cluster
    code, plan = _json(capsys, "--config", str(config), "--to", "1.23.0")
    assert code == 0 and plan["sources"]["pods"].startswith("kubernetes (live list of 8 pods")
    assert plan["control_plane"] == "1.21.4"
    assert plan["sources"]["control_plane"] == "deployment istio-system/istiod"
    assert "istio.io" in plan["supported_skew"]["source"]
    assert [(s["kind"], s["to"]) for s in plan["steps"]] == [
        ("control_plane", "1.22.x"), ("restart", "1.22.x"),
        ("control_plane", "1.23.0"), ("restart", "1.23.0")]
    assert plan["fleet_restarts"] == 2 and "2 fleet restarts, not one" in plan["why"]
    restart = plan["steps"][1]
    assert restart["pods"] == 7 and restart["ambient_pods"] == 1  # the ztunnel's node pod
    assert plan["without_proxy"] == 1
    ponr = plan["point_of_no_return"]
    assert ponr["step"] == 2 and ponr["unsupported"]["pods"] == 7
    assert "ledger-x-1" in {n for w in ponr["unsupported"]["workloads"] for n in w["names"]}
    # tiers: the reference target, then by what the probe's paths do, streams last
    assert [(t["name"], t["pods"]) for t in plan["tiers"]] == [
        ("reference target", 1), ("read paths", 2), ("write paths", 1), ("not probed", 2),
        ("stream holders", 1)]
    assert plan["tiers"][-1]["stream_holders"] == ["feeds/deployment/ticker"]
    pins = {p["namespace"]: p["state"] for p in plan["pinning"]}
    assert pins == {"feeds": "pinned", "legacy": "not pinned", "platform-test": "pinned",
                    "shop": "default injector"}
    tail = plan["time"]["long_tail"]
    assert tail["pods"] == 1 and tail["workloads"][0]["workload"] == "deployment/ledger"
    assert plan["time"]["natural"] is None
    assert plan["time"]["forced"]["elapsed_days"] == 2 * (5 + 2)  # 5 tiers a day, 2 d soak
    assert any("inventory history" in m for m in plan["missing"])
    # the namespaces were listed through the API, as the pods were
    assert api.lists("/namespaces")


def test_live_n_minus_1_text_markdown_and_gate(cluster: tuple[FakeKubeApi, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _, config = cluster
    assert _run("--config", str(config), "--to", "1.22.1") == 0
    text = capsys.readouterr().out
    assert "1 fleet restart:" in text and "POINT OF NO RETURN" in text
    assert "restart onto 1.22.1" in text and "legacy: not pinned" in text
    assert _run("--config", str(config), "--to", "1.23.0", "--markdown") == 0
    md = capsys.readouterr().out
    assert md.startswith("# Upgrade plan: 1.21.4 → 1.23.0")
    assert "| 2 | restart onto 1.22.x |" in md
    # the gate: the first move is safe now, the second is not (every pod still on 1.21)
    assert _run("--config", str(config), "--to", "1.23.0", "--check", "1") == 0
    capsys.readouterr()
    code, plan = _json(capsys, "--config", str(config), "--to", "1.23.0", "--check", "3")
    assert code == 1 and plan["check"]["answer"] == "not safe"
    assert "7 pods would be outside the supported skew of 1.23.0" in plan["check"]["reasons"][0]
    # a restart with streams on a tier whose lifetime cap nobody recorded is not safe either
    code, plan = _json(capsys, "--config", str(config), "--to", "1.22.1", "--check", "2")
    assert code == 1 and any("feed with no cap recorded" in r for r in plan["check"]["reasons"])


def test_live_bad_target_is_exit_2(cluster: tuple[FakeKubeApi, Path],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, config = cluster
    assert main(["plan", "--config", str(config), "--to", "1.20.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "downgrade" in err


def _store(path: Path, now: float, *, control_plane: bool = True) -> None:
    """Ten days of snapshots: `catalog` redeploys every 2 days, `checkout` every 5,
    `ledger` (200 days old) never; the probe recorded istiod 1.22.3."""
    with Store.open(path) as store:
        if control_plane:
            store.write_events([Event(CONTROL_PLANE_EVENT, now - 10 * DAY, detail={"versions": [
                {"version": "1.22.3", "revision": "default",
                 "source": "deployment istio-system/istiod"}]})])
        for day in range(11):
            at = now - (10 - day) * DAY
            store.write_inventory(at, [
                InventoryRow("shop", "deployment/catalog", "1.22.3", 4, (day % 2) * DAY + 60),
                InventoryRow("shop", "deployment/checkout", "1.22.3", 3, (day % 5) * DAY + 60),
                InventoryRow("legacy", "statefulset/ledger", "1.21.2", 2, (200 + day) * DAY),
            ])


def test_plan_from_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    path = tmp_path / "probe.db"
    _store(path, now)
    code, plan = _json(capsys, "--store", str(path), "--to", "1.23.0")
    assert code == 0 and plan["sources"]["pods"].startswith(f"store {path}")
    assert plan["sources"]["control_plane"].startswith("recorded by the probe")
    assert plan["sources"]["history"] == "store: 11 inventory snapshots over 10.0 days"
    # ledger's 1.21.2 is inside 1.22.3's skew but would not be inside 1.23.0's: it goes first.
    assert [(s["kind"], s["to"]) for s in plan["steps"]] == [
        ("restart", "1.22.3"), ("control_plane", "1.23.0"), ("restart", "1.23.0")]
    natural = plan["time"]["natural"]
    assert natural["never"] == ["legacy/statefulset/ledger"]
    assert natural["slowest"] == "shop/deployment/checkout"
    assert natural["days"] == pytest.approx(2 * 5)  # 2 restarts × every 5 days
    rates = {w["workload"]: w for w in natural["workloads"]}
    assert rates["deployment/catalog"]["recycles"] == 5
    assert rates["deployment/catalog"]["interval_days"] == pytest.approx(2)
    assert plan["tiers"][0]["name"] == "unmeasured"  # no --config: path kinds unknown
    assert plan["pinning"] is None
    assert any("namespace labels" in m for m in plan["missing"])
    # the text names where each answer came from
    assert _run("--store", str(path), "--to", "1.23.0") == 0
    text = capsys.readouterr().out
    assert "without forced restarts: 2 restarts × the slowest natural recycle" in text
    assert "long tail, never there on their own" in text and "legacy/statefulset/ledger" in text
    assert "history: store: 11 inventory snapshots" in text


STORE_CONFIG = """\
targets: {static: [{address: "127.0.0.1:1"}]}
paths:
  - name: catalog
    http: {path: /api/catalog}
  - name: feed
    stream: {method: /skewprobe.target.v1.Target/Subscribe}
"""


def _calls(path: Path, now: float) -> None:
    """A minute of calls as a probe records them: `catalog` answers a GET path, `checkout`
    holds the `feed` streams."""
    agg = WindowAggregator(length_s=10.0, grace_s=0.0)
    start = (now // 10) * 10 - 60
    for i in range(60):
        for name, workload, probe in (("catalog-1", "deployment/catalog", "catalog"),
                                      ("checkout-1", "deployment/checkout", "feed")):
            labels = {"namespace": "shop", "workload": workload, "pod": name}
            agg.add(CallResult(probe, f"shop/{name}", "1.22.3", start + i, 0.01, 0.0,
                               CallOutcome(Outcome.OK, 200)), labels)
    with Store.open(path) as store:
        store.write(*agg.flush(now=now, force=True))
        store.write_events([Event("lifetime", now - 30, path="feed", cohort="1.22.3", detail={
            "capped": False, "cap_s": None, "why": "no band of ended lifetimes",
            "open_streams": 8, "aged": 8, "oldest_s": 3 * 3600.0})])


def test_plan_from_the_store_with_the_probes_measurements(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    path = tmp_path / "probe.db"
    _store(path, now - 5)
    _calls(path, now - 5)
    config = tmp_path / "probe.yaml"
    config.write_text(STORE_CONFIG)
    code, plan = _json(capsys, "--store", str(path), "--config", str(config), "--to", "1.23.0")
    assert code == 0 and plan["sources"]["stream_lifetimes"].startswith("store: the probe's")
    assert plan["sources"]["measurements"].startswith("store: calls per pod and path")
    assert [(t["name"], t["workloads"]) for t in plan["tiers"]] == [
        ("read paths", ["shop/deployment/catalog"]),
        ("not probed", ["legacy/statefulset/ledger"]),
        ("stream holders", ["shop/deployment/checkout"])]
    (stream,) = plan["connection_lifetime"]["streams"]
    assert stream["capped"] is False and stream["tier"] == 3
    assert stream["step"] == "roll out a maximum connection duration 1 week before tier 3"
    assert "resets the 8 streams the probe holds on feed" in stream["storm"]
    read = plan["drain"]["tiers"][0]
    assert (read["name"], read["slowest_path"], read["calls"]) == ("read paths", "catalog", 60)
    assert read["drain_s"] == 5 and read["p99_ms"] < 20  # 10 ms calls: Istio's 5 s covers it
    assert plan["sources"]["request_durations"].startswith("store: p99 per path")
    gate = ("--store", str(path), "--config", str(config), "--to", "1.23.0", "--check")
    assert _run(*gate, "1") == 0  # the ledger restart: no streams there
    assert _run(*gate, "3") == 1  # the fleet restart would cut the uncapped streams
    assert "connection lifetime first:" in capsys.readouterr().out


def test_store_without_a_control_plane_is_exit_3(tmp_path: Path) -> None:
    path = tmp_path / "probe.db"
    _store(path, time.time(), control_plane=False)
    with pytest.raises(DataMissing, match="control-plane version unknown") as info:
        _run("--store", str(path), "--to", "1.23.0")
    assert info.value.exit_code == 3
    with pytest.raises(BadInput, match="--config FILE"):
        _run("--to", "1.23.0")


async def test_a_running_probe_records_the_lifetime_check_plan_reads(tmp_path: Path) -> None:
    """Real streams held on the reference target: the run leaves `lifetime` events that
    `skewprobe plan --store` turns into the stream tier's cap."""
    from probes.config import parse_config
    from probes.run.runner import ProbeRunner, RunOptions
    from probes.streams.recorder import LIFETIME_EVENT
    from targets.profile import VersionProfile
    from targets.server import TargetServer

    async with TargetServer(VersionProfile("1.22.3"), pod="feed-0") as server:
        config = parse_config(f"""\
targets:
  static:
    - address: {server.grpc_address}
      labels: {{proxy_version: "1.22.3", namespace: shop, workload: deployment/feed}}
window: 1s
paths:
  - name: feed
    stream: {{method: /skewprobe.target.v1.Target/Subscribe, per_endpoint: 2}}
""")
        store = tmp_path / "probe.db"
        runner = ProbeRunner(config, RunOptions(store_path=str(store), listen=None,
                                                duration_s=2.0))
        await asyncio.wait_for(runner.run(), 30)
    with Store.open(store, readonly=True) as s:
        events = s.read_events(kinds=[LIFETIME_EVENT])
    assert events and {(e.path, e.cohort) for e in events} == {("feed", "1.22.3")}
    last = events[-1].detail
    assert last["open_streams"] == 2 and last["capped"] is False  # captured before the stop


def test_live_with_a_store_a_capped_stream_tier_and_measured_drains(
        cluster: tuple[FakeKubeApi, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Live pods, plus what a running probe recorded: the `feed` streams are capped, so the
    stream tier needs no lifetime step and its restart passes the gate."""
    _, config = cluster
    now = time.time()
    path = tmp_path / "probe.db"
    agg = WindowAggregator(length_s=10.0, grace_s=0.0)
    start = (now // 10) * 10 - 60
    for i in range(60):
        for name, ns, workload, probe, latency in (
                ("catalog-x-1", "shop", "deployment/catalog", "catalog", 0.2),
                ("checkout-x-1", "shop", "deployment/checkout", "checkout", 3.0),
                ("ticker-x-1", "feeds", "deployment/ticker", "feed", 0.2)):
            agg.add(CallResult(probe, f"{ns}/{name}", "1.21.4", start + i, latency, 0.0,
                               CallOutcome(Outcome.OK, 200)),
                    {"namespace": ns, "workload": workload, "pod": name})
    with Store.open(path) as store:
        store.write(*agg.flush(now=now, force=True))
        for day in range(3):
            store.write_inventory(now - (3 - day) * DAY, [
                InventoryRow("shop", "deployment/catalog", "1.21.4", 2, (day % 2) * DAY + 60)])
        store.write_events([Event("lifetime", now - 60, path="feed", cohort="1.21.4", detail={
            "capped": True, "cap_s": 1800.0, "why": "cap ~30 min", "open_streams": 2,
            "aged": 0, "oldest_s": 1700.0})])
    code, plan = _json(capsys, "--config", str(config), "--with-store", str(path),
                       "--to", "1.22.1", "--check", "2")
    assert code == 1  # the control-plane move (step 1) comes first, and only that
    assert len(plan["check"]["reasons"]) == 1 and "comes first" in plan["check"]["reasons"][0]
    code, plan = _json(capsys, "--config", str(config), "--with-store", str(path),
                       "--control-plane", "1.22.1", "--to", "1.22.1", "--check", "1")
    assert code == 0 and plan["check"]["answer"] == "safe"  # the restart, streams capped
    assert plan["sources"]["pods"].startswith("kubernetes (live list")
    assert plan["sources"]["measurements"].startswith("store: calls per pod and path")
    (stream,) = plan["connection_lifetime"]["streams"]
    assert stream["capped"] is True and "step" not in stream
    drains = {d["name"]: d for d in plan["drain"]["tiers"]}
    read, write = drains["read paths"], drains["write paths"]
    assert read["slowest_path"] == "catalog" and read["drain_s"] == 5  # ⌈3 × ~200 ms⌉ < 5
    assert read["in_force"]["grace_s"] == [30.0, 30.0] and not read["in_force"]["drain_too_short"]
    # checkout's p99 is about 3 s: 3 × p99 ≈ 9-10 s, and the pod sets a 2 s drain
    assert 9 <= write["drain_s"] <= 10 and write["termination_grace_period_s"] == 30
    assert write["in_force"]["drain_s"] == [2.0, 2.0]
    assert write["in_force"]["drain_too_short"] == ["shop/deployment/checkout"]
    assert "shop/deployment/catalog" in {f"{w['namespace']}/{w['workload']}"
                                         for w in plan["time"]["natural"]["workloads"]}
    with pytest.raises(BadInput, match="--with-store"):
        _run("--store", str(path), "--with-store", str(path), "--to", "1.22.1")


def test_the_report_shows_the_upgrade_progress(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    path = tmp_path / "probe.db"
    with Store.open(path) as store:
        for day in range(5):  # two pods a day move to 1.23.0; the ledger never does
            store.write_inventory(now - (4 - day) * DAY - 120, [
                InventoryRow("shop", "deployment/catalog", "1.23.0", 2 * day, 600.0),
                InventoryRow("shop", "deployment/catalog", "1.22.3", 10 - 2 * day, 9 * DAY),
                InventoryRow("legacy", "statefulset/ledger", "1.22.3", 2, 200 * DAY),
            ])
    _calls(path, now - 5)
    out = tmp_path / "report"
    assert main(["report", "--store", str(path), "--from", "-5d", "--out", str(out)]) == 0
    capsys.readouterr()
    upgrade = json.loads((out / "report.json").read_text())["period"]["upgrade"]
    assert upgrade["target"] == "1.23.0" and len(upgrade["points"]) == 5
    assert [p["on_target"] for p in upgrade["points"]] == [0, 2, 4, 6, 8]
    assert {p["long_tail_pods"] for p in upgrade["points"]} == {2}
    assert upgrade["projected_done_by"] is not None
    markdown = (out / "report.md").read_text()
    assert "## Upgrade progress (inventory snapshots)" in markdown
    assert "| snapshot | pods on the target | namespaces done | long tail (pods) |" in markdown
    assert "Upgrade progress" in (out / "report.html").read_text()


def test_the_gate_wants_the_verdict_on_what_was_restarted_to_pass(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.servers.stores import store_with_a_failing_canary

    now = time.time()
    path = tmp_path / "probe.db"
    store_with_a_failing_canary(path, now)  # checkout: the 1.21.0 pods fail one call in five
    with Store.open(path) as store:
        store.write_inventory(now - 5, [
            InventoryRow("shop", "deployment/checkout", "1.21.0", 3, 600.0),
            InventoryRow("shop", "deployment/checkout", "1.20.3", 3, 5 * DAY)])
        store.write_events([Event(CONTROL_PLANE_EVENT, now - DAY, detail={"versions": [
            {"version": "1.21.0", "revision": "default", "source": "deployment"}]})])
    code, plan = _json(capsys, "--store", str(path), "--to", "1.21.0", "--check", "1")
    assert plan["steps"][0]["kind"] == "restart" and code == 1
    assert plan["check"]["verdict"] == {"verdict": "fail", "baseline": "1.20.3",
                                        "canary": "1.21.0"}
    assert "is fail: checkout: fail: success rate" in plan["check"]["reasons"][0]
