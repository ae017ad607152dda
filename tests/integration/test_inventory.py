"""Inventory and skew-bound computations (pure), and their Prometheus series."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from probes.discovery.meshes import ControlPlane, IstioExtractor
from probes.discovery.pods import PodRecord, parse_time, pod_record
from probes.inventory import (
    SkewMetrics,
    control_plane_for,
    inventory_rows,
    judge_skew,
    newest_version,
    parse_version,
    report_from_pods,
    report_from_rows,
)
from probes.spec import SkewPolicy
from probes.store import InventoryRow
from tests.servers import kube_pods as kp

NOW = (parse_time("2024-05-01T10:00:00Z") or 0.0) + 30 * 86400  # 30 days after STARTED
DAY = 86400.0
ISTIO = IstioExtractor()


def _days_ago(days: float) -> str:
    from probes._parsing import rfc3339

    return rfc3339(NOW - days * DAY)


def _record(name: str, version: str, *, age_days: float, mesh: str = "istio",
            **kw: object) -> PodRecord:
    pod = kp.pod(name, mesh=mesh, version=version, started=_days_ago(age_days), **kw)  # type: ignore[arg-type]
    return pod_record(pod, ISTIO)


def _fleet() -> list[PodRecord]:
    return [
        _record("checkout-x-1", "1.22.3", age_days=1),
        _record("checkout-x-2", "1.22.3", age_days=1),
        _record("cart-x-1", "1.22.3", age_days=2),
        _record("cart-x-2", "1.21.2", age_days=9),  # half-restarted workload
        _record("ledger-x-1", "1.20.1", age_days=25, namespace="finance"),  # the long tail
        _record("ledger-x-2", "1.20.1", age_days=24, namespace="finance"),
        _record("batch-x-1", "1.22.3", age_days=3, mesh="plain"),  # no sidecar
        _record("search-x-1", "1.23.0", age_days=0.5, revision="1-23-0"),  # canary revision
        # neither counted: finished, and terminating
        _record("job-x-1", "1.19.0", age_days=40, phase="Succeeded", ready=False),
        pod_record(kp.terminating(kp.pod("old-x-1", mesh="istio", version="1.19.0")), ISTIO),
    ]


PLANES = (
    ControlPlane("1.22.3", "default", "deployment istio-system/istiod"),
    ControlPlane("1.23.0", "1-23-0", "deployment istio-system/istiod-1-23-0"),
)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("1.22.3", (1, 22, 3, True)),
        ("1.22.3-distroless", (1, 22, 3, True)),
        ("v1.22", (1, 22, 0, True)),
        ("stable-2.14.10", (2, 14, 10, True)),
        ("edge-24.5.1", (24, 5, 1, True)),
        ("1.23.0-beta.1", (1, 23, 0, False)),
    ],
)
def test_parse_version(text: str, parsed: tuple[int, int, int, bool]) -> None:
    version = parse_version(text)
    assert version is not None
    assert (version.major, version.minor, version.patch, version.release) == parsed


def test_unparseable_and_ordering() -> None:
    for text in ("none", "unknown", "latest", "sha256:abc", ""):
        assert parse_version(text) is None
    assert newest_version(["1.22.3", "1.23.0-beta.1", "1.9.9", "none"]) == "1.23.0-beta.1"
    assert newest_version(["1.23.0-beta.1", "1.23.0"]) == "1.23.0"  # release after pre-release
    assert newest_version(["1.10.0", "1.9.0"]) == "1.10.0"  # numeric, not lexical
    assert newest_version(["none", "latest"]) is None


@pytest.mark.parametrize(
    ("data", "control", "policy", "status"),
    [
        ("1.22.3", "1.22.0", SkewPolicy(), "ok"),
        ("1.21.9", "1.22.0", SkewPolicy(), "ok"),  # one minor behind: supported
        ("1.20.1", "1.22.3", SkewPolicy(), "outside"),  # two behind
        ("1.23.0", "1.22.3", SkewPolicy(), "outside"),  # never ahead by default
        ("1.23.0", "1.22.3", SkewPolicy(ahead=1), "ok"),
        ("1.20.1", "1.22.3", SkewPolicy(behind=2), "ok"),
        ("2.0.0", "1.22.3", SkewPolicy(behind=9, ahead=9), "outside"),
        ("stable-2.13.7", "stable-2.14.10", SkewPolicy(), "ok"),
        ("custom-build", "1.22.3", SkewPolicy(), "unknown"),
        ("none", "1.22.3", SkewPolicy(), "no_proxy"),
    ],
)
def test_judge_skew(data: str, control: str, policy: SkewPolicy, status: str) -> None:
    finding = judge_skew(data, ControlPlane(control, "", "config"), policy)
    assert finding.status == status
    if status == "outside":
        assert control in finding.reason


def test_skew_reason_names_the_distance() -> None:
    finding = judge_skew("1.20.1", ControlPlane("1.22.3"), SkewPolicy())
    assert finding.reason == "2 minor versions behind control plane 1.22.3 (supported: 1)"
    assert judge_skew("1.22.3", None, SkewPolicy()).status == "unknown"


def test_control_plane_for_revisions() -> None:
    assert control_plane_for("1-23-0", PLANES) == PLANES[1]
    assert control_plane_for("default", PLANES) == PLANES[0]
    assert control_plane_for("", PLANES) == PLANES[0]
    assert control_plane_for("other", PLANES) == PLANES[0]  # unknown revision: the default
    no_default = (ControlPlane("1.22.3", "1-22-3"), ControlPlane("1.23.0", "1-23-0"))
    assert control_plane_for("", no_default) == no_default[1]  # the newest
    assert control_plane_for("x", ()) is None


def test_inventory_rows_count_live_pods_by_workload_and_version() -> None:
    rows = inventory_rows(_fleet(), NOW)
    assert InventoryRow("finance", "deployment/ledger", "1.20.1", 2, 25 * DAY) in rows
    assert InventoryRow("shop", "deployment/cart", "1.21.2", 1, 9 * DAY) in rows
    assert sum(r.pods for r in rows) == 8  # finished and terminating pods left out
    assert {r.proxy_version for r in rows} == {"1.22.3", "1.21.2", "1.20.1", "1.23.0", "none"}


def test_report_from_pods() -> None:
    report = report_from_pods(_fleet(), PLANES, SkewPolicy(), now=NOW, mesh="istio")
    assert report["pods"] == 8 and report["probed"] == 8 and report["mesh"] == "istio"
    assert list(report["versions"]) == ["1.23.0", "1.22.3", "1.21.2", "1.20.1", "none"]
    assert report["newest"] == "1.23.0" and report["without_proxy"] == 1
    assert report["fraction_on_newest"] == pytest.approx(1 / 7)  # of the 7 with a proxy
    tail = [(t["namespace"], t["workload"], t["old_pods"]) for t in report["long_tail"]]
    assert tail[0] == ("finance", "deployment/ledger", 2)  # the oldest pods first
    assert ("shop", "deployment/cart", 2) in tail
    assert ("shop", "deployment/search", 1) not in tail
    skew = report["skew"]
    # 1.20.1 is two behind istiod 1.22.3; search runs 1.23.0 on its own revision: fine.
    assert skew["outside"] == 2 and skew["judged"]
    assert [p["pod"] for p in skew["pods"]] == ["ledger-x-1", "ledger-x-2"]
    assert skew["workloads"] == [{
        "namespace": "finance", "workload": "deployment/ledger", "proxy_version": "1.20.1",
        "pods": 2, "control_plane": "1.22.3",
        "reason": "2 minor versions behind control plane 1.22.3 (supported: 1)",
    }]
    shop = next(n for n in report["namespaces"] if n["namespace"] == "shop")
    assert shop["versions"] == {"1.23.0": 1, "1.22.3": 3, "1.21.2": 1, "none": 1}


def test_what_if_the_control_plane_moved_to_the_next_minor() -> None:
    planned = (ControlPlane("1.23.0", "", "command line"),)
    report = report_from_pods(_fleet(), planned, SkewPolicy(), now=NOW)
    outside = {(p["pod"], p["proxy_version"]) for p in report["skew"]["pods"]}
    assert outside == {("ledger-x-1", "1.20.1"), ("ledger-x-2", "1.20.1"), ("cart-x-2", "1.21.2")}


def test_report_without_control_plane_is_not_judged() -> None:
    report = report_from_pods(_fleet(), (), SkewPolicy(), now=NOW)
    assert not report["skew"]["judged"] and report["skew"]["outside"] == 0
    assert report["skew"]["not_judged"] == 7


def test_report_from_rows_matches_the_live_report() -> None:
    fleet = _fleet()
    rows = inventory_rows(fleet, NOW)
    stored = report_from_rows(rows, PLANES[:1], SkewPolicy(), at=NOW)
    live = report_from_pods(fleet, PLANES[:1], SkewPolicy(), now=NOW)
    for key in ("pods", "versions", "newest", "fraction_on_newest", "namespaces", "workloads",
                "long_tail"):
        assert stored[key] == live[key], key
    assert stored["source"] == "store" and stored["at"] == live["at"]
    # Without revisions a store judges every row against the default control plane.
    assert {w["proxy_version"] for w in stored["skew"]["workloads"]} == {"1.20.1", "1.23.0"}


def test_skew_metrics() -> None:
    registry = CollectorRegistry()
    metrics = SkewMetrics(registry)
    metrics.update(report_from_pods(_fleet(), PLANES, SkewPolicy(), now=NOW))
    text = generate_latest(registry).decode()
    assert 'skewprobe_inventory_pods_outside_skew{namespace="finance",proxy_version="1.20.1"}' \
        ' 2.0' in text
    assert "skewprobe_inventory_newest_fraction 0.142857" in text
    assert 'skewprobe_control_plane_info{revision="1-23-0",version="1.23.0"} 1.0' in text
    metrics.update(report_from_pods(_fleet()[:3], PLANES, SkewPolicy(), now=NOW))
    assert "finance" not in generate_latest(registry).decode()  # replaced whole
    promtool = shutil.which("promtool")
    if promtool:
        checked = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                                 capture_output=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
