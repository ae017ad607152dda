"""Pod JSON → PodRecord → Endpoint: workloads, readiness, ports, labels."""

from __future__ import annotations

import pytest

from probes.discovery.meshes import IstioExtractor, LinkerdExtractor
from probes.discovery.pods import endpoint_for, owner_workload, parse_time, pod_record
from tests.servers import kube_pods as kp

ISTIO = IstioExtractor()


def test_deployment_pods_are_named_after_the_deployment() -> None:
    pod = kp.pod("checkout-x-1", workload="checkout")
    rs = pod["metadata"]["ownerReferences"][0]["name"]
    assert rs.startswith("checkout-") and rs != "checkout"
    assert owner_workload(pod) == "deployment/checkout"


def test_workload_kinds() -> None:
    assert owner_workload(kp.pod("db-0-x", workload="db", owner="StatefulSet")) == "statefulset/db"
    assert owner_workload(kp.pod("agent-x-y", workload="agent", owner="DaemonSet")) \
        == "daemonset/agent"
    assert owner_workload(kp.pod("debug-shell-x", owner="")) == "pod/debug-shell-x"


def test_replicaset_without_a_matching_hash_is_its_own_workload() -> None:
    pod = kp.pod("legacy-x-1", workload="legacy")
    pod["metadata"]["ownerReferences"][0]["name"] = "legacy-rs"
    assert owner_workload(pod) == "replicaset/legacy-rs"


def test_argo_rollout_pods() -> None:
    pod = kp.pod("web-x-1", workload="web")
    labels = pod["metadata"]["labels"]
    labels["rollouts-pod-template-hash"] = labels.pop("pod-template-hash")
    assert owner_workload(pod) == "rollout/web"


def test_running_ready_pod_is_probed_at_its_named_port() -> None:
    pod = kp.pod("checkout-x-1", mesh="istio", version="1.22.3", ip="10.1.2.3", port=8080,
                 grpc_port=9090, labels={"team": "payments", "tier": "web"})
    record = pod_record(pod, ISTIO, port="grpc", copy_labels=["team", "missing"])
    assert record.probed and record.counted and record.port == 9090
    assert record.started_at == parse_time("2024-05-01T10:00:00Z")
    endpoint = endpoint_for(record)
    assert (endpoint.name, endpoint.host, endpoint.port) == ("shop/checkout-x-1", "10.1.2.3", 9090)
    assert endpoint.port_for("http") == 8080
    # The proxy's own port is known by name, but never the app's default port.
    assert endpoint.port_for("http-envoy-prom") == 15090
    assert dict(endpoint.labels) == {
        "team": "payments", "namespace": "shop", "pod": "checkout-x-1",
        "workload": "deployment/checkout", "node": "node-a",
        "start_time": "2024-05-01T10:00:00Z", "proxy_version": "1.22.3", "revision": "default",
    }


def test_default_port_is_the_first_app_port_not_the_proxy_one() -> None:
    pod = kp.pod("checkout-x-1", mesh="linkerd", version="stable-2.14.10", port=7000)
    assert pod["spec"]["containers"][0]["name"] == "linkerd-proxy"  # injected first
    record = pod_record(pod, LinkerdExtractor())
    assert record.port == 7000


def test_numeric_port_need_not_be_declared_and_a_missing_name_is_explained() -> None:
    pod = kp.pod("checkout-x-1")
    assert pod_record(pod, ISTIO, port=8443).port == 8443
    missing = pod_record(pod, ISTIO, port="admin")
    assert missing.port is None and not missing.probed and missing.counted
    assert "no container port named 'admin'" in missing.port_problem


def test_a_pod_label_cannot_overwrite_the_cohort() -> None:
    pod = kp.pod("checkout-x-1", mesh="istio", version="1.22.3",
                 labels={"proxy_version": "forged"})
    record = pod_record(pod, ISTIO, copy_labels=["proxy_version"])
    assert endpoint_for(record).labels["proxy_version"] == "1.22.3"


@pytest.mark.parametrize(
    ("change", "probed", "counted"),
    [
        ({"ready": False}, False, True),
        ({"phase": "Pending", "ready": False}, False, True),
        ({"phase": "Succeeded", "ready": False}, False, False),
        ({"phase": "Failed", "ready": False}, False, False),
        ({"ip": ""}, False, True),
    ],
)
def test_only_running_ready_addressed_pods_are_probed(
    change: dict[str, object], probed: bool, counted: bool
) -> None:
    record = pod_record(kp.pod("checkout-x-1", mesh="istio", **change), ISTIO)  # type: ignore[arg-type]
    assert (record.probed, record.counted) == (probed, counted)


def test_terminating_pod_is_neither_probed_nor_counted() -> None:
    record = pod_record(kp.terminating(kp.pod("checkout-x-1", mesh="istio")), ISTIO)
    assert record.terminating and not record.probed and not record.counted


def test_age_from_start_time_or_creation() -> None:
    record = pod_record(kp.pod("checkout-x-1"), ISTIO)
    start = parse_time("2024-05-01T10:00:00Z")
    assert start is not None and record.age_s(start + 90) == 90
    pending = kp.pod("checkout-x-2", phase="Pending", ready=False, node="")
    assert "startTime" not in pending["status"]
    assert pod_record(pending, ISTIO).age_s(start + 5) == 5  # from creationTimestamp
    assert parse_time("yesterday") is None and parse_time(None) is None
