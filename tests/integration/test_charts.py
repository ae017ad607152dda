"""The deployment side: charts/skewprobe, charts/skewprobe-target and the Dockerfile.

The charts are rendered with a real helm 3 (`scripts/install-helm.sh` installs one; tests that
need it skip when it cannot be found) under default and non-default values, and the rendered
objects are checked against what the code they deploy really accepts: core objects against
the Kubernetes schemas (kubernetes-validate, offline), the probe's config with
`skewprobe validate`, the target's arguments with its own argument parser, the alert rules
with promtool, and the Argo Rollouts / Flagger gates against the JSON and status codes a real
/verdict and /gate answer. Docker cannot run here: the Dockerfile is checked by reading it
and by building the wheel from exactly the files it copies.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import httpx
import kubernetes_validate
import numpy as np
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError
from prometheus_client import CollectorRegistry

from probes._schema import SCHEMA
from probes.api import ApiApp, VerdictQuery
from probes.cli import build_parser
from probes.cli import main as skewprobe_main
from probes.config import parse_config
from probes.inventory import SkewMetrics
from probes.measure.histogram import BUCKET_COUNT, index_of
from probes.metrics import ProbeMetrics
from probes.types import CallOutcome, CallResult, PathWindow
from probes.verdict.judge import judge
from targets.profile import parse_profiles
from targets.relay_config import parse_relay
from targets.server import _args as target_args
from targets.server import parse_hostport
from tests.servers.asgi import serve_app
from tests.servers.helm import (
    HELM,
    NAMESPACE,
    PROBE,
    RELEASE,
    ROOT,
    TARGET,
    helm,
    one,
    probe_config,
    render,
    shard_argv,
    workload,
)

PROMTOOL = shutil.which("promtool")
needs_helm = pytest.mark.skipif(
    HELM is None, reason="helm not found: run scripts/install-helm.sh (or set SKEWPROBE_HELM)"
)
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not found (apt prometheus)")
K8S_VERSIONS = ("1.25.0", "1.37.0")  # the charts' kubeVersion floor, the newest schemas
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "AnalysisTemplate", "ClusterAnalysisTemplate",
             "MetricTemplate", "PeerAuthentication"}
CHART_OWNED = ("listen", "store")  # config keys the probe chart sets itself
UPDATE_SCHEMA_ENV = "SKEWPROBE_UPDATE_CHART_SCHEMA"

PROBE_VALUES: dict[str, dict[str, Any]] = {
    "default": {},
    "all-on": {
        "persistence": {"enabled": True, "storageClass": "fast"},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True},
        "argoRollouts": {"enabled": True},
        "flagger": {"enabled": True},
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Mesh"}},
        "networkPolicy": {
            "ingressFrom": [{"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "egress": {"enabled": True, "rules": [
                {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 443}]}]},
        },
        "config": {"targets": {"kubernetes": {"namespaces": ["shop", "payments"]}}},
    },
    "static": {
        "config": {
            "targets": {"kubernetes": None, "static": [{"address": "10.0.0.5:8080", "labels": {
                "pod": "checkout-0", "namespace": "shop", "proxy_version": "1.20.3"}}]},
            "paths": [{"name": "checkout", "http": {"method": "GET", "path": "/api/checkout"},
                       "rate": "5/s", "timeout": "1s"}],
        },
        "networkPolicy": {"enabled": False},
    },
    "linkerd-pinned": {"config": {"targets": {"kubernetes": {
        "mesh": "linkerd", "namespaces": ["shop"], "control_plane_version": "2.14.0"}}}},
    "argo-namespaced": {"argoRollouts": {"enabled": True, "clusterScoped": False,
                                         "namespaces": ["shop", "payments"]}},
    "api-token-tls": {
        "api": {"token": {"existingSecret": "skewprobe-api-token"},
                "tls": {"existingSecret": "skewprobe-api-tls"}},
        "argoRollouts": {"enabled": True},
        "serviceMonitor": {"enabled": True, "tlsConfig": {
            "ca": {"secret": {"name": "skewprobe-api-tls", "key": "ca.crt"}},
            "serverName": "skewprobe.skewprobe.svc"}},
    },
    # Three probes (a StatefulSet, pod i probing --shard i/3), judging from Prometheus.
    "sharded": {
        "shards": 3,
        "persistence": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "argoRollouts": {"enabled": True},
        "flagger": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    },
    "api-mtls": {
        "api": {"tls": {"existingSecret": "skewprobe-api-tls", "clientCA": True}},
        "serviceMonitor": {"enabled": True, "tlsConfig": {
            "ca": {"secret": {"name": "skewprobe-api-tls", "key": "ca.crt"}},
            "cert": {"secret": {"name": "prometheus-client", "key": "tls.crt"}},
            "keySecret": {"name": "prometheus-client", "key": "tls.key"}}},
    },
}
PROFILES = yaml.safe_load((ROOT / "targets/examples/profiles.yaml").read_text())
RELAY = yaml.safe_load((ROOT / "targets/examples/relay-allowlist.yaml").read_text())
TARGET_VALUES: dict[str, dict[str, Any]] = {
    "default": {},
    "profiles-linkerd": {"mesh": "linkerd", "profiles": PROFILES, "emulatedVersion": "1.21.0",
                         "podDisruptionBudget": {"enabled": True}},
    "istio-revision": {"istio": {"revision": "1-21-0",
                                 "proxyConfig": {"terminationDrainDuration": "20s"}}},
    "relay-profiles": {"profiles": PROFILES, "emulatedVersion": "1.21.0",
                       "relay": RELAY["relay"]},
}


# --- helm ------------------------------------------------------------------------------------

_helm = helm
_workload = workload


CASES = [(PROBE, k, v) for k, v in PROBE_VALUES.items()] + [
    (TARGET, k, v) for k, v in TARGET_VALUES.items()]


@needs_helm
@pytest.mark.parametrize(("chart", "name", "values"), CASES, ids=[f"{c}:{n}" for c, n, _ in CASES])
def test_lint_strict_and_every_core_object_validates(
    chart: str, name: str, values: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(json.dumps(values))
    lint = _helm("lint", "--strict", str(ROOT / chart), "-f", str(path))
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr
    validated = set()
    for doc in render(chart, values):
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
                validated.add(doc["kind"])
            except SchemaNotFoundError:
                # Custom resources: their key fields are checked by the tests below.
                assert doc["kind"] in CRD_KINDS, f"no schema for {doc['kind']}"
    assert {_workload(render(chart, values))["kind"], "Service"} <= validated


# --- the probe chart -------------------------------------------------------------------------


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(_workload(docs)["spec"]["template"])


def _hardened(container_sc: Mapping[str, Any]) -> None:
    assert container_sc["runAsNonRoot"] is True and container_sc["runAsUser"] != 0
    assert container_sc["readOnlyRootFilesystem"] is True
    assert container_sc["allowPrivilegeEscalation"] is False
    assert container_sc.get("privileged", False) is False
    assert container_sc["capabilities"]["drop"] == ["ALL"]
    assert not container_sc["capabilities"].get("add")


@needs_helm
@pytest.mark.parametrize("name", PROBE_VALUES)
def test_probe_pod_is_outside_the_mesh_and_hardened(name: str) -> None:
    pod = _pod(render(PROBE, PROBE_VALUES[name]))
    annotations, labels = pod["metadata"]["annotations"], pod["metadata"]["labels"]
    assert annotations["sidecar.istio.io/inject"] == "false"
    assert annotations["linkerd.io/inject"] == "disabled"
    assert labels["sidecar.istio.io/inject"] == "false"
    assert labels["istio.io/dataplane-mode"] == "none"  # not captured by ambient's ztunnel
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec["containers"]:
        _hardened(container["securityContext"])
        assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


@needs_helm
@pytest.mark.parametrize("name", PROBE_VALUES)
def test_probe_config_validates_and_matches_the_pod(name: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    docs = render(PROBE, PROBE_VALUES[name])
    text = probe_config(docs)
    config = parse_config(text, file="probe.yaml")
    path = tmp_path / "probe.yaml"
    path.write_text(text)
    assert skewprobe_main(["validate", str(path)]) == 0
    assert ": ok: " in capsys.readouterr().out
    pod = _pod(docs)
    container = pod["spec"]["containers"][0]
    assert container["args"][:3] == ["run", "--config", "/etc/skewprobe/probe.yaml"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/etc/skewprobe"] == "config"
    # The API listens where the Service, the probes and the gates look.
    port = int(config.listen.rpartition(":")[2])
    assert config.listen.startswith("0.0.0.0:")
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    tls = PROBE_VALUES[name].get("api", {}).get("tls", {})
    for probe in ("livenessProbe", "readinessProbe"):
        if tls.get("clientCA"):  # the kubelet has no client certificate: a TCP check
            assert container[probe]["tcpSocket"] == {"port": "http"}
            assert "httpGet" not in container[probe]
        else:
            scheme = {"scheme": "HTTPS"} if tls else {}
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http", **scheme}
    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["port"] == port
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # The store is on a writable volume (the root filesystem is read-only): a PVC or an
    # emptyDir, and /tmp too.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    store_volume = mounts[str(Path(config.store).parent)]
    workload = _workload(docs)
    if PROBE_VALUES[name].get("persistence", {}).get("enabled"):
        if workload["kind"] == "StatefulSet":  # one claim per shard, from the template
            (template,) = workload["spec"]["volumeClaimTemplates"]
            assert template["metadata"]["name"] == store_volume
            assert store_volume not in volumes
            assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
        else:
            claim = one(docs, "PersistentVolumeClaim")
            assert volumes[store_volume]["persistentVolumeClaim"]["claimName"] == claim[
                "metadata"]["name"]
            assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert pod["spec"]["securityContext"]["fsGroup"] == container["securityContext"][
            "runAsGroup"]
    else:
        assert "emptyDir" in volumes[store_volume]
    assert "emptyDir" in volumes[mounts["/tmp"]]
    if workload["kind"] == "Deployment":
        assert workload["spec"]["strategy"] == {"type": "Recreate"}
    else:  # never two pods of one ordinal: one writer per shard's store
        assert workload["spec"]["updateStrategy"] == {"type": "RollingUpdate"}


RBAC = {
    # name: (cluster-wide pods?, namespaces with a pods Role, mesh Role namespace, its rules)
    "default": (True, [], "istio-system", {"deployments"}),
    "all-on": (False, ["shop", "payments"], "istio-system", {"deployments", "pods"}),
    "static": (False, [], None, set()),
    "linkerd-pinned": (False, ["shop"], None, set()),
}


@needs_helm
@pytest.mark.parametrize("name", RBAC)
def test_rbac_is_derived_from_discovery_and_read_only(name: str) -> None:
    cluster, namespaces, mesh_ns, mesh_resources = RBAC[name]
    docs = render(PROBE, PROBE_VALUES[name])
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    for role in roles:
        for rule in role["rules"]:
            assert set(rule["verbs"]) == {"get", "list", "watch"}
            assert "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            assert set(rule["resources"]) <= {"pods", "deployments"}
    assert any(r["kind"] == "ClusterRole" for r in roles) is cluster
    pod_roles = sorted(r["metadata"]["namespace"] for r in roles
                       if r["kind"] == "Role" and r["metadata"]["name"].endswith("-pods"))
    assert pod_roles == sorted(namespaces)
    mesh = [r for r in roles if r["metadata"]["name"].endswith("-mesh")]
    if mesh_ns is None:
        assert not mesh
    else:
        (role,) = mesh
        assert role["metadata"]["namespace"] == mesh_ns
        assert {res for rule in role["rules"] for res in rule["resources"]} == mesh_resources
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert len(bindings) == len(roles)
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE,
                                        "namespace": NAMESPACE}]
    # The token is mounted only when the probe reads the API.
    assert _pod(docs)["spec"]["automountServiceAccountToken"] is bool(roles)


@needs_helm
def test_network_policy_and_service_monitor_select_the_probe() -> None:
    docs = render(PROBE, PROBE_VALUES["all-on"])
    labels = _pod(docs)["metadata"]["labels"]
    policy = one(docs, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert ingress["from"] == PROBE_VALUES["all-on"]["networkPolicy"]["ingressFrom"]
    dns, api = policy["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert api["ports"] == [{"port": 443}]
    assert "egress" not in one(render(PROBE), "NetworkPolicy")["spec"]
    service = one(docs, "Service")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # keeps the inventory's own `namespace` label


# --- alerts, dashboard and the series they read ----------------------------------------------


def _exported_series() -> set[str]:
    """Every sample name the probe's registry exposes, with each series populated."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    metrics.observe(CallResult(
        path="checkout", endpoint="shop/checkout-0", cohort="1.21.0", intended_at=0.0,
        latency_s=0.01, lag_s=0.001, outcome=CallOutcome("ok", status=200, attempts=2)))
    metrics.stream_opened("stream", "1.21.0")
    metrics.stream_closed("stream", "1.21.0", 30.0, "goaway")
    metrics.stream_time("stream", "1.21.0", 30.0)
    metrics.stream_message_gap("stream", "1.21.0", 0.5)
    metrics.set_verdict("checkout", "fail")
    metrics.set_in_flight(1)
    metrics.drop("checkout", "overloaded")
    metrics.store_error()
    metrics.set_inventory([SimpleNamespace(namespace="shop", proxy_version="1.20.3", pods=3,
                                           max_age_s=60.0)])
    SkewMetrics(registry).update({
        "skew": {"workloads": [{"namespace": "legacy", "proxy_version": "1.19.0", "pods": 2}]},
        "fraction_on_newest": 0.5,
        "control_plane": {"versions": [{"version": "1.21.0", "revision": "default"}]},
    })
    return {s.name for family in registry.collect() for s in family.samples}


def _series_in(expr: str) -> set[str]:
    return set(re.findall(r"\b(skewprobe_[a-z0-9_]+)\b", expr))


def _rule_groups(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(one(docs, "PrometheusRule")["spec"]["groups"])


def _dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    configmaps = [d for d in docs if d["kind"] == "ConfigMap" and "skewprobe.json" in d["data"]]
    (configmap,) = configmaps
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    return dict(json.loads(configmap["data"]["skewprobe.json"]))


def _dashboard_exprs(dashboard: Mapping[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]


def _grafana_to_promql(expr: str) -> str:
    return (expr.replace("$__rate_interval", "5m").replace("$job", ".*")
            .replace("$path", ".*"))


@needs_helm
def test_every_series_the_rules_dashboard_and_gates_read_is_exported() -> None:
    docs = render(PROBE, PROBE_VALUES["all-on"])
    exported = _exported_series()
    exprs = [r["expr"] for g in _rule_groups(docs) for r in g["rules"]]
    exprs += _dashboard_exprs(_dashboard(docs))
    exprs.append(one(docs, "MetricTemplate")["spec"]["query"])
    read = set().union(*(_series_in(e) for e in exprs))
    assert read - exported == set()
    # The issue's panels and alerts, by what they read.
    for series in ("skewprobe_requests_total", "skewprobe_request_duration_seconds_bucket",
                   "skewprobe_upstream_attempts_total", "skewprobe_stream_resets_total",
                   "skewprobe_verdict", "skewprobe_inventory_pods",
                   "skewprobe_inventory_pods_outside_skew"):
        assert series in read


@needs_helm
def test_dashboard_has_the_panels_and_unique_ids() -> None:
    dashboard = _dashboard(render(PROBE, PROBE_VALUES["all-on"]))
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Success rate", "Latency p99", "Upstream attempts per request",
            "Stream resets per stream-hour", "Verdict per path",
            "Pods per proxy version"} <= titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    by_title = {p["title"]: p for p in dashboard["panels"]}
    for title in ("Success rate", "Latency p99", "Stream resets per stream-hour"):
        (target,) = by_title[title]["targets"]
        assert "cohort" in target["expr"] and "{{cohort}}" in target["legendFormat"]
    assert {t["name"] for t in dashboard["templating"]["list"]} == {"datasource", "job", "path"}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False)


@needs_helm
@needs_promtool
def test_rules_dashboard_and_metric_template_are_valid_promql(tmp_path: Path) -> None:
    docs = render(PROBE, PROBE_VALUES["all-on"])
    extra = [_grafana_to_promql(e) for e in _dashboard_exprs(_dashboard(docs))]
    extra.append(_flagger_query(one(docs, "MetricTemplate")["spec"]["query"],
                                {"path": "checkout"}))
    groups = [*_rule_groups(docs), {"name": "queries", "rules": [
        {"record": f"check:query_{i}", "expr": e} for i, e in enumerate(extra)]}]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    done = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _alert_tests() -> list[dict[str, Any]]:
    """promtool unit tests (one file per evaluation interval): each alert fires when it
    should and not before."""
    pods = "skewprobe_inventory_pods"
    minutes = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": [
            {"series": 'skewprobe_verdict{job="p", path="checkout", verdict="fail"}',
             "values": "0 0 1x20"},
            {"series": 'skewprobe_verdict{job="p", path="_overall", verdict="fail"}',
             "values": "0 0 1x20"},
            {"series": 'skewprobe_inventory_pods_outside_skew{job="p", namespace="legacy",'
                       ' proxy_version="1.19.0"}', "values": "0 0 3x30"},
        ], "alert_rule_test": [
            {"eval_time": "2m", "alertname": "SkewprobeVerdictFail", "exp_alerts": []},
            {"eval_time": "10m", "alertname": "SkewprobeVerdictFail", "exp_alerts": [
                {"exp_labels": {"job": "p", "path": "checkout", "severity": "critical"}}]},
            {"eval_time": "10m", "alertname": "SkewprobePodsOutsideSupportedSkew",
             "exp_alerts": []},
            {"eval_time": "30m", "alertname": "SkewprobePodsOutsideSupportedSkew",
             "exp_alerts": [{"exp_labels": {"job": "p", "namespace": "legacy",
                                            "proxy_version": "1.19.0", "severity": "critical"}}]},
        ]},
    ]}
    days = {"rule_files": ["rules.yaml"], "evaluation_interval": "10m", "tests": [
        {"interval": "1h", "input_series": [
            # flat: two versions, nothing moves for days
            {"series": f'{pods}{{job="flat", namespace="shop", proxy_version="1.20.3"}}',
             "values": "6x100"},
            {"series": f'{pods}{{job="flat", namespace="shop", proxy_version="1.21.0"}}',
             "values": "4x100"},
            # moving for the first 6 hours, then flat
            {"series": f'{pods}{{job="moving", namespace="shop", proxy_version="1.20.3"}}',
             "values": "10 9 8 7 6 5 4x100"},
            {"series": f'{pods}{{job="moving", namespace="shop", proxy_version="1.21.0"}}',
             "values": "0 1 2 3 4 5 6x100"},
            # one version only: no skew window open
            {"series": f'{pods}{{job="done", namespace="shop", proxy_version="1.21.0"}}',
             "values": "10x100"},
            # a probe deployed two days in: not enough history
            {"series": f'{pods}{{job="fresh", namespace="shop", proxy_version="1.20.3"}}',
             "values": "_x48 5x60"},
            {"series": f'{pods}{{job="fresh", namespace="shop", proxy_version="1.21.0"}}',
             "values": "_x48 5x60"},
            # one version, plus pods without a sidecar and pods whose version is unreadable:
            # `none` and `unknown` are not versions, so no skew window is open
            {"series": f'{pods}{{job="one-version", namespace="shop", proxy_version="1.21.0"}}',
             "values": "8x100"},
            {"series": f'{pods}{{job="one-version", namespace="batch", proxy_version="none"}}',
             "values": "3x100"},
            {"series": f'{pods}{{job="one-version", namespace="shop", proxy_version="unknown"}}',
             "values": "1x100"},
            # two versions beside `none` pods: still stalled
            {"series": f'{pods}{{job="flat-none", namespace="shop", proxy_version="1.20.3"}}',
             "values": "6x100"},
            {"series": f'{pods}{{job="flat-none", namespace="shop", proxy_version="1.21.0"}}',
             "values": "4x100"},
            {"series": f'{pods}{{job="flat-none", namespace="batch", proxy_version="none"}}',
             "values": "2x100"},
        ], "alert_rule_test": [
            {"eval_time": "2d", "alertname": "SkewprobeRolloutStalled", "exp_alerts": []},
            {"eval_time": "3d2h", "alertname": "SkewprobeRolloutStalled", "exp_alerts": [
                {"exp_labels": {"job": "flat", "severity": "warning"}},
                {"exp_labels": {"job": "flat-none", "severity": "warning"}}]},
            {"eval_time": "3d8h", "alertname": "SkewprobeRolloutStalled", "exp_alerts": [
                {"exp_labels": {"job": "flat", "severity": "warning"}},
                {"exp_labels": {"job": "flat-none", "severity": "warning"}},
                {"exp_labels": {"job": "moving", "severity": "warning"}}]},
        ]},
    ]}
    return [minutes, days]


@needs_helm
@needs_promtool
def test_alerts_fire_when_they_should(tmp_path: Path) -> None:
    groups = copy.deepcopy(_rule_groups(render(PROBE, {"prometheusRule": {"enabled": True}})))
    names = {r.get("alert") for g in groups for r in g["rules"]} - {None}
    assert names == {"SkewprobeVerdictFail", "SkewprobeRolloutStalled",
                     "SkewprobePodsOutsideSupportedSkew"}
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # templated text: checked by `check rules` above
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    files = []
    for i, tests in enumerate(_alert_tests()):
        files.append(f"tests{i}.yaml")
        (tmp_path / files[-1]).write_text(yaml.safe_dump(tests))
    done = _promtool("test", "rules", *files, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the gates: Argo Rollouts and Flagger against a real /verdict and /gate ------------------

T0 = 1_700_000_000.0
BASELINE = "1.20.3"
CANARY_FOR = {"pass": "1.21.0", "fail": "1.22.0", "inconclusive": "1.23.0"}


def _cohort(rng: np.random.Generator, cohort: str, windows: int, err: float) -> list[PathWindow]:
    out = []
    for i in range(windows):
        errors = int(rng.binomial(300, err))
        hist = np.bincount(index_of(rng.lognormal(math.log(0.05), 0.5, 300)),
                           minlength=BUCKET_COUNT)
        out.append(PathWindow(
            start=T0 + 10 * i, length=10.0, path="checkout", cohort=cohort,
            outcomes={"ok": 300 - errors, "http_5xx": errors},
            latency=tuple(int(x) for x in hist),
            attempts_sum=300 + int(rng.binomial(1200, 0.01)), attempts_count=300))
    return out


@functools.cache
def _verdict_bodies() -> dict[str, dict[str, Any]]:
    """Real verdict JSON from probes.verdict.judge on small synthetic windows, by canary."""
    rng = np.random.default_rng(6)
    plans = {"pass": (60, 0.0, 0.0), "fail": (20, 0.001, 0.011), "inconclusive": (2, 0.0, 0.0)}
    bodies = {}
    for want, (windows, base_err, canary_err) in plans.items():
        data = (_cohort(rng, BASELINE, windows, base_err)
                + _cohort(rng, CANARY_FOR[want], windows, canary_err))
        body = judge(data, now=T0 + 10 * windows + 1).to_json()
        assert body["verdict"] == want
        bodies[CANARY_FOR[want]] = json.loads(json.dumps(body))
    return bodies


@pytest.fixture
async def verdict_api() -> AsyncIterator[tuple[str, list[VerdictQuery]]]:
    async with _serve_verdicts() as served:
        yield served


@contextlib.asynccontextmanager
async def _serve_verdicts(token: str | None = None) -> AsyncIterator[
        tuple[str, list[VerdictQuery]]]:
    """The probe's real ApiApp on loopback; the verdict is picked by the query's canary."""
    bodies = _verdict_bodies()
    queries: list[VerdictQuery] = []

    async def verdict(query: VerdictQuery) -> Mapping[str, Any]:
        queries.append(query)
        return bodies.get(query.canary or "", bodies[CANARY_FOR["inconclusive"]])

    app = ApiApp(CollectorRegistry(), verdict=verdict, health=lambda: (True, "ok"), token=token)
    async with serve_app(app) as base:
        yield base, queries


def _argo_condition(expression: str, result: Any) -> bool:
    """Evaluate `result.a.b == "x"` / `!=` as Argo does.

    Argo Rollouts evaluates these with the expr language (github.com/expr-lang/expr); this
    covers only the field-path comparison our templates use, and raises KeyError where expr
    would fail on a missing field (Argo marks such a measurement Error, not Failed).
    """
    match = re.fullmatch(r'result((?:\.[A-Za-z_]\w*)+)\s*(==|!=)\s*"([^"]*)"', expression.strip())
    assert match, f"not a field comparison: {expression}"
    value = result
    for field in match.group(1).split(".")[1:]:
        value = value[field]
    return (value == match.group(3)) is (match.group(2) == "==")


def _argo_phase(metric: Mapping[str, Any], result: Any) -> str:
    """Argo's EvaluateResult with both conditions set: failure wins, neither is Inconclusive."""
    if _argo_condition(metric["failureCondition"], result):
        return "Failed"
    if _argo_condition(metric["successCondition"], result):
        return "Successful"
    return "Inconclusive"


def _argo_args(text: str, args: Mapping[str, str]) -> str:
    """Argo's substitution of `{{args.NAME}}` in a metric's fields."""
    return re.sub(r"\{\{\s*args\.([\w-]+)\s*\}\}", lambda m: args[m.group(1)], text)


def _service_url(docs: list[dict[str, Any]]) -> str:
    service = one(docs, "Service")
    return (f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:"
            f"{service['spec']['ports'][0]['port']}")


@needs_helm
async def test_analysis_template_reads_the_real_verdict(
    verdict_api: tuple[str, list[VerdictQuery]],
) -> None:
    base, queries = verdict_api
    docs = render(PROBE, {"argoRollouts": {"enabled": True}})
    template = one(docs, "ClusterAnalysisTemplate")
    (metric,) = template["spec"]["metrics"]
    web = metric["provider"]["web"]
    assert web["jsonPath"] == "{$}" and web.get("method", "GET") == "GET"
    assert metric["successCondition"] == 'result.verdict == "pass"'
    assert metric["failureCondition"] == 'result.verdict == "fail"'
    assert metric["inconclusiveLimit"] < metric["count"]  # all-inconclusive is never a pass
    assert metric["failureLimit"] == 0
    # Argo's default, which the READMEs document: the fifth consecutive non-2xx answer is an
    # Error that aborts the rollout.
    assert metric["consecutiveErrorLimit"] == 4
    defaults = {a["name"]: a["value"] for a in template["spec"]["args"]}
    assert defaults == {"path": "", "baseline": "", "canary": "", "since": ""}
    url = urlsplit(web["url"])
    assert f"{url.scheme}://{url.netloc}" == _service_url(docs) and url.path == "/verdict"
    async with httpx.AsyncClient() as client:
        for want, canary in CANARY_FOR.items():
            query = _argo_args(url.query, {**defaults, "path": "checkout", "canary": canary})
            response = await client.get(f"{base}{url.path}?{query}")
            assert response.status_code == 200  # non-2xx would be an Argo measurement error
            # jsonPath "{$}" hands Argo the whole body as `result`.
            assert _argo_phase(metric, response.json()) == {
                "pass": "Successful", "fail": "Failed", "inconclusive": "Inconclusive"}[want]
            # Empty arguments are dropped, not passed on as "".
            assert queries[-1] == VerdictQuery(path="checkout", canary=canary)


@needs_helm
async def test_flagger_webhook_and_metric_template(
    verdict_api: tuple[str, list[VerdictQuery]],
) -> None:
    base, queries = verdict_api
    docs = render(PROBE, PROBE_VALUES["all-on"])
    template = one(docs, "MetricTemplate")
    assert template["spec"]["provider"]["type"] == "prometheus"
    example = yaml.safe_load((ROOT / PROBE / "examples/flagger-canary.yaml").read_text())
    analysis = example["spec"]["analysis"]
    # The token case's metric: the path comes from the Canary's templateVariables.
    query = _flagger_query(template["spec"]["query"], {"path": "checkout"})
    # `job` is the Service name (the ServiceMonitor's default job label).
    assert f'job="{one(docs, "Service")["metadata"]["name"]}"' in query
    assert 'path="checkout"' in query and 'verdict="pass"' in query
    hooks = {h["type"]: h for h in analysis["webhooks"]}
    assert set(hooks) == {"pre-rollout", "confirm-promotion", "rollback"}
    assert {h["metadata"]["path"] for h in hooks.values()} == {"checkout"}
    statuses = {}
    async with httpx.AsyncClient() as client:
        for kind, hook in hooks.items():
            url = urlsplit(hook["url"])
            assert f"{url.scheme}://{url.netloc}" == _service_url(docs)
            assert url.path == ("/gate/rollback" if kind == "rollback" else "/gate")
            assert set(hook["metadata"]) <= {"path", "baseline", "canary", "since"}
            payload = {"name": example["metadata"]["name"], "phase": "Progressing",
                       "namespace": example["metadata"]["namespace"],
                       "metadata": hook["metadata"]}
            statuses[kind] = (await client.post(f"{base}{url.path}", json=payload)).status_code
            assert queries[-1].path == hook["metadata"]["path"]
        # The example's canary passes: promotion goes ahead and nothing rolls back.
        assert statuses == {"pre-rollout": 409, "confirm-promotion": 200, "rollback": 409}
        # A failing canary: promotion holds and the rollback hook rolls back at once.
        failing = {"path": "checkout", "canary": CANARY_FOR["fail"]}
        assert await _post_gate(base, failing) == 409
        rollback = await client.post(f"{base}/gate/rollback", json={"metadata": failing})
        assert rollback.status_code == 200


def _flagger_query(query: str, variables: Mapping[str, str]) -> str:
    """Flagger's RenderQuery (pkg/metrics/observers/render.go): a Go text/template with one
    function per model field, `variables` returning the Canary metric's templateVariables,
    executed with missingkey=error. This covers `{{ variables.NAME }}`, the only action the
    chart's template uses, and raises KeyError where Flagger fails to render."""
    rendered = re.sub(r"\{\{\s*variables\.(\w+)\s*\}\}", lambda m: variables[m.group(1)], query)
    assert "{{" not in rendered, rendered
    return rendered


@needs_helm
@needs_promtool
def test_metric_template_takes_the_path_from_each_canary(tmp_path: Path) -> None:
    """One MetricTemplate, many Canaries: each one's templateVariables.path picks its path's
    verdict from the same gauge; a path with no verdict returns nothing (Flagger halts)."""
    query = one(render(PROBE, {"flagger": {"enabled": True}}), "MetricTemplate")["spec"]["query"]
    assert "{{ variables.path }}" in query
    with pytest.raises(KeyError):  # no templateVariables.path: Flagger cannot render it
        _flagger_query(query, {})
    verdict = 'skewprobe_verdict{{job="{job}", path="{path}", verdict="{v}"}}'
    series = [{"series": verdict.format(job=job, path=path, v=v), "values": f"{value}x5"}
              for job, path, v, value in [
                  (RELEASE, "checkout", "pass", 1), (RELEASE, "checkout", "fail", 0),
                  (RELEASE, "search", "pass", 0), (RELEASE, "search", "fail", 1),
                  (RELEASE, "_overall", "pass", 0), (RELEASE, "_overall", "fail", 1),
                  ("another-probe", "search", "pass", 1)]]
    want = {"checkout": [{"labels": "{}", "value": 1}], "search": [{"labels": "{}", "value": 0}],
            "_overall": [{"labels": "{}", "value": 0}], "orders": []}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": []}))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m", "input_series": series,
            "promql_expr_test": [
                {"expr": _flagger_query(query, {"path": path}), "eval_time": "2m",
                 "exp_samples": samples} for path, samples in want.items()]}]}))
    done = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


async def _post_gate(base: str, metadata: dict[str, str]) -> int:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base}/gate", json={"metadata": metadata})
    return response.status_code


@needs_helm
def test_argo_example_uses_the_rendered_template() -> None:
    template = one(render(PROBE, {"argoRollouts": {"enabled": True}}), "ClusterAnalysisTemplate")
    arg_names = {a["name"] for a in template["spec"]["args"]}
    rollout = yaml.safe_load((ROOT / PROBE / "examples/argo-rollout.yaml").read_text())
    steps = [s["analysis"] for s in rollout["spec"]["strategy"]["canary"]["steps"]
             if "analysis" in s]
    assert steps
    for step in steps:
        assert step["templates"] == [{"templateName": template["metadata"]["name"],
                                      "clusterScope": True}]
        assert {a["name"] for a in step["args"]} <= arg_names
    namespaced = render(PROBE, PROBE_VALUES["argo-namespaced"])
    assert sorted(d["metadata"]["namespace"] for d in namespaced
                  if d["kind"] == "AnalysisTemplate") == ["payments", "shop"]


# --- API token and TLS from Secrets ----------------------------------------------------------


def _secret_file(pod: Mapping[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) behind the file at `path` in the probe's container."""
    container = pod["spec"]["containers"][0]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for mount in container["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            assert mount.get("readOnly") is True
            secret = volumes[mount["name"]]["secret"]
            (item,) = [i for i in secret["items"] if i["path"] == path[len(prefix):]]
            return str(secret["secretName"]), str(item["key"])
    raise AssertionError(f"{path} is on no mount")


def _run_args(docs: list[dict[str, Any]]) -> Any:
    """The container's arguments as `skewprobe run` itself parses them."""
    return build_parser().parse_args(_pod(docs)["spec"]["containers"][0]["args"])


@needs_helm
def test_api_token_and_tls_reach_the_probe_from_secrets() -> None:
    values = PROBE_VALUES["api-token-tls"]
    docs = render(PROBE, values)
    pod, args = _pod(docs), _run_args(docs)
    assert _secret_file(pod, args.token_file) == ("skewprobe-api-token", "token")
    assert _secret_file(pod, args.api_cert) == ("skewprobe-api-tls", "tls.crt")
    assert _secret_file(pod, args.api_key) == ("skewprobe-api-tls", "tls.key")
    assert args.api_client_ca is None
    # Readable by the pod's group only (fsGroup, the probe's group), not by everyone.
    modes = {v["secret"]["defaultMode"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert modes == {0o440}
    assert one(docs, "Service")["spec"]["ports"][0]["appProtocol"] == "https"
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == values["serviceMonitor"]["tlsConfig"]
    assert endpoint["authorization"] == {
        "type": "Bearer", "credentials": {"name": "skewprobe-api-token", "key": "token"}}

    mtls = render(PROBE, PROBE_VALUES["api-mtls"])
    args = _run_args(mtls)
    assert _secret_file(_pod(mtls), args.api_client_ca) == ("skewprobe-api-tls", "ca.crt")
    assert args.token_file is None
    assert "authorization" not in one(mtls, "ServiceMonitor")["spec"]["endpoints"][0]
    default = _run_args(render(PROBE))
    assert (default.token_file, default.api_cert, default.api_key) == (None, None, None)


@needs_helm
async def test_analysis_template_sends_the_token_from_a_secret() -> None:
    values = PROBE_VALUES["api-token-tls"]
    template = one(render(PROBE, values), "ClusterAnalysisTemplate")
    (metric,) = template["spec"]["metrics"]
    web = metric["provider"]["web"]
    url = urlsplit(web["url"])
    assert url.scheme == "https" and "insecure" not in web  # verification stays on
    args = {a["name"]: a for a in template["spec"]["args"]}
    assert args["api-token"]["valueFrom"] == {
        "secretKeyRef": {"name": "skewprobe-api-token", "key": "token"}}
    # What Argo does: the secret argument resolved, then substituted into the header.
    token = "chart-t0ken-31"
    resolved = {name: a.get("value", "") for name, a in args.items()} | {"api-token": token}
    headers = {h["key"]: _argo_args(h["value"], resolved) for h in web["headers"]}
    assert headers == {"Authorization": f"Bearer {token}"}
    query = _argo_args(url.query, {**resolved, "canary": CANARY_FOR["pass"]})
    async with _serve_verdicts(token) as (base, _), httpx.AsyncClient() as client:
        measured = await client.get(f"{base}{url.path}?{query}", headers=headers)
        assert measured.status_code == 200
        assert _argo_phase(metric, measured.json()) == "Successful"
        # Without the header the probe refuses: Argo counts that as a measurement error.
        assert (await client.get(f"{base}{url.path}?{query}")).status_code == 401

    argo = {"enabled": True, "insecureSkipVerify": True,
            "tokenSecret": {"name": "rollouts-token", "key": "skewprobe"}}
    other = one(render(PROBE, {**values, "argoRollouts": argo}), "ClusterAnalysisTemplate")
    assert other["spec"]["metrics"][0]["provider"]["web"]["insecure"] is True
    (arg,) = [a for a in other["spec"]["args"] if a["name"] == "api-token"]
    assert arg["valueFrom"]["secretKeyRef"] == {"name": "rollouts-token", "key": "skewprobe"}
    plain = one(render(PROBE, {"argoRollouts": {"enabled": True}}), "ClusterAnalysisTemplate")
    assert "headers" not in plain["spec"]["metrics"][0]["provider"]["web"]


@needs_helm
def test_mtls_with_gates_that_cannot_present_a_certificate_fails_clearly() -> None:
    mtls = ["--set", "api.tls.existingSecret=t", "--set", "api.tls.clientCA=true"]
    argo = _helm("template", "x", str(ROOT / PROBE), *mtls, "--set", "argoRollouts.enabled=true")
    assert argo.returncode != 0 and "cannot present a client certificate" in argo.stderr
    monitor = _helm("template", "x", str(ROOT / PROBE), *mtls,
                    "--set", "serviceMonitor.enabled=true")
    assert monitor.returncode != 0
    assert "serviceMonitor.tlsConfig needs cert and keySecret" in monitor.stderr


# --- shards: N probes, a StatefulSet ---------------------------------------------------------


@needs_helm
def test_shards_run_a_statefulset_whose_ordinals_are_the_shards() -> None:
    from probes.discovery.shard import parse_shard

    values = PROBE_VALUES["sharded"]
    docs = render(PROBE, values)
    sts = one(docs, "StatefulSet")
    assert not [d for d in docs if d["kind"] == "Deployment"]
    service = one(docs, "Service")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    # One Service, so one scrape per pod (a headless one would match the ServiceMonitor too).
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Service"] == [
        service["metadata"]["name"]]
    assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"][
        "labels"].items()
    # Each pod's ordinal is its shard, as `skewprobe run` parses its own arguments.
    shards = [parse_shard(build_parser().parse_args(shard_argv(docs, i)).shard)
              for i in range(3)]
    assert shards == [(0, 3), (1, 3), (2, 3)]
    # Every shard judges the merged verdict from the series the ServiceMonitor scrapes.
    config = parse_config(probe_config(docs), file="probe.yaml")
    assert config.source == "prometheus" and config.prometheus is not None
    assert config.prometheus.url == "http://prometheus-operated.monitoring:9090"
    job = service["metadata"]["name"]
    assert config.prometheus.selector == f'job="{job}", namespace="{NAMESPACE}"'
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert config.prometheus.step_s == 30.0 and endpoint["interval"] == "30s"
    # The gates read that merged verdict: the MetricTemplate passes only when every shard's
    # gauge says pass; Argo and Flagger's webhooks ask the Service, i.e. any shard.
    query = one(docs, "MetricTemplate")["spec"]["query"]
    assert query.lstrip().startswith("min(") and f'job="{job}"' in query
    web = one(docs, "ClusterAnalysisTemplate")["spec"]["metrics"][0]["provider"]["web"]
    assert urlsplit(web["url"]).netloc.split(".")[0] == service["metadata"]["name"]

    # Own values win: a URL, a selector for a scrape of one's own, a step.
    own = render(PROBE, {"shards": 2, "config": {"prometheus": {
        "url": "http://thanos:9090", "selector": 'job="probes"', "step": "15s"}}})
    mine = parse_config(probe_config(own), file="probe.yaml")
    assert mine.prometheus is not None and mine.source == "prometheus"
    assert (mine.prometheus.url, mine.prometheus.selector, mine.prometheus.step_s) == (
        "http://thanos:9090", 'job="probes"', 15.0)
    assert [parse_shard(build_parser().parse_args(shard_argv(own, i)).shard)
            for i in range(2)] == [(0, 2), (1, 2)]

    # shards: 1 is the one probe as before: a Deployment, no --shard, its own store's verdict.
    single = render(PROBE, {"shards": 1, "serviceMonitor": {"enabled": True}})
    assert _workload(single)["kind"] == "Deployment"
    assert build_parser().parse_args(shard_argv(single, 0)).shard is None
    assert parse_config(probe_config(single), file="probe.yaml").source == "store"


@needs_helm
def test_shards_refuse_what_cannot_work() -> None:
    base = ["--set", "shards=3", "--set", "serviceMonitor.enabled=true"]
    unscraped = _helm("template", "x", str(ROOT / PROBE), "--set", "shards=3")
    assert unscraped.returncode != 0 and "set serviceMonitor.enabled=true" in unscraped.stderr
    store = _helm("template", "x", str(ROOT / PROBE), *base, "--set", "config.source=store")
    assert store.returncode != 0 and "config.source must be prometheus" in store.stderr
    claim = _helm("template", "x", str(ROOT / PROBE), *base, "--set", "persistence.enabled=true",
                  "--set", "persistence.existingClaim=one")
    assert claim.returncode != 0 and "one claim cannot hold 3 stores" in claim.stderr
    zero = _helm("lint", "--strict", str(ROOT / PROBE), "--set", "shards=0")
    assert zero.returncode != 0 and "shards" in zero.stdout + zero.stderr


@needs_helm
@needs_promtool
def test_rules_dashboard_and_gate_count_each_pod_once_over_shards(tmp_path: Path) -> None:
    """Three shards export the whole estate's inventory each, disjoint calls, and a verdict
    gauge each: the rules and the dashboard count each pod once and each call once, and the
    MetricTemplate passes only when every shard says pass. One probe reads the same."""
    docs = render(PROBE, PROBE_VALUES["sharded"])
    groups = copy.deepcopy(_rule_groups(docs))
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    panels = {p["title"]: [t["expr"] for t in p.get("targets", ())]
              for p in _dashboard(docs)["panels"]}
    query = _flagger_query(one(docs, "MetricTemplate")["spec"]["query"], {"path": "checkout"})
    series = []
    for job, instances in (("skewprobe", ("a", "b", "c")), ("single", ("a",))):
        for i, instance in enumerate(instances):
            labels = f'job="{job}", instance="{instance}"'
            series += [
                {"series": f'skewprobe_inventory_pods{{{labels}, namespace="shop", '
                           f'proxy_version="1.20.3"}}', "values": "6x40"},
                {"series": f'skewprobe_inventory_pods{{{labels}, namespace="shop", '
                           f'proxy_version="1.21.0"}}', "values": "4x40"},
                {"series": f'skewprobe_inventory_pods_outside_skew{{{labels}, '
                           f'namespace="legacy", proxy_version="1.19.0"}}', "values": "2x40"},
                # Disjoint calls: shard i made 60 * (i + 1) ok calls a minute.
                {"series": f'skewprobe_requests_total{{{labels}, path="checkout", '
                           f'cohort="1.20.3", outcome="ok"}}', "values": f"0+{60 * (i + 1)}x40"},
                {"series": f'skewprobe_verdict{{{labels}, path="checkout", verdict="pass"}}',
                 "values": "1x40" if instance != "b" else "0x40"},
            ]
    rate = panels["Success rate"][0].replace("$__rate_interval", "5m")
    calls = rate.split(" / ", 1)[1].replace("$path", ".*")
    exprs = {
        panels["Pods per proxy version"][0]: [("1.20.3", 6), ("1.21.0", 4)],
        panels["Pods outside the supported skew"][0]: [("legacy", "1.19.0", 2)],
    }
    tests = []
    for job, calls_per_s, gate in (("skewprobe", 6, 0), ("single", 1, 1)):
        for expr, want in exprs.items():
            samples = [{"labels": "{" + ", ".join(
                f'{k}="{v}"' for k, v in zip(
                    ("namespace", "proxy_version") if len(w) == 3 else ("proxy_version",),
                    w[:-1], strict=True)) + "}", "value": w[-1]} for w in want]
            tests.append({"expr": expr.replace("$job", job), "eval_time": "5m",
                          "exp_samples": samples})
        tests.append({"expr": f'skewprobe:inventory_version_share{{job="{job}"}}',
                      "eval_time": "5m", "exp_samples": [
                          {"labels": f'skewprobe:inventory_version_share{{job="{job}", '
                                     'proxy_version="1.20.3"}', "value": 0.6},
                          {"labels": f'skewprobe:inventory_version_share{{job="{job}", '
                                     'proxy_version="1.21.0"}', "value": 0.4}]})
        tests.append({"expr": calls.replace("$job", job), "eval_time": "10m", "exp_samples": [
            {"labels": '{cohort="1.20.3", path="checkout"}', "value": calls_per_s}]})
        gate_query = query.replace(f'job="{RELEASE}"', f'job="{job}"')
        tests.append({"expr": gate_query, "eval_time": "5m",
                      "exp_samples": [{"labels": "{}", "value": gate}]})
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
            "interval": "1m", "input_series": series, "promql_expr_test": tests,
            "alert_rule_test": [{"eval_time": "30m", "alertname":
                                 "SkewprobePodsOutsideSupportedSkew", "exp_alerts": [
                {"exp_labels": {"job": job, "namespace": "legacy", "proxy_version": "1.19.0",
                                "severity": "critical"}} for job in ("single", "skewprobe")]}],
        }]}))
    done = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


# --- values.schema.json -----------------------------------------------------------------------


def chart_config_schema() -> dict[str, Any]:
    """The probe config's schema as the chart's `config` value takes it (draft-07 for helm:
    the 2020-12 keywords it does not know, like dependentRequired, are ignored there)."""
    schema = copy.deepcopy(SCHEMA)
    schema.pop("$schema", None)
    schema.pop("title", None)
    for key in CHART_OWNED:
        schema["properties"].pop(key)
    schema["description"] = ("the probe's config (probes/_schema.py), less `listen` and"
                             " `store` which the chart sets")
    return schema


def test_values_schema_embeds_the_probe_config_schema() -> None:
    path = ROOT / PROBE / "values.schema.json"
    values_schema = json.loads(path.read_text())
    if os.environ.get(UPDATE_SCHEMA_ENV):
        values_schema["properties"]["config"] = chart_config_schema()
        path.write_text(json.dumps(values_schema, indent=2) + "\n")
    assert values_schema["properties"]["config"] == chart_config_schema(), (
        f"probes/_schema.py changed: run `{UPDATE_SCHEMA_ENV}=1 pytest "
        "tests/integration/test_charts.py`")


@needs_helm
def test_bad_values_fail_with_a_clear_message(tmp_path: Path) -> None:
    bad_rate = _helm("lint", "--strict", str(ROOT / PROBE), "--set", "config.paths[0].rate=fast")
    assert bad_rate.returncode != 0 and "config.paths.0.rate" in bad_rate.stdout + bad_rate.stderr
    owned = _helm("template", "x", str(ROOT / PROBE), "--skip-schema-validation",
                  "--set", "config.listen=0.0.0.0:1")
    assert owned.returncode != 0 and "config.listen is set by the chart" in owned.stderr
    missing = _helm("template", "x", str(ROOT / TARGET), "--set-json",
                    'profiles={"versions":{"1.20.3":{}}}')
    assert missing.returncode != 0 and '"reference" is not in profiles.versions' in missing.stderr
    # The one-path-per-release value is gone: say where the path goes now.
    path = _helm("template", "x", str(ROOT / PROBE), "--set", "flagger.enabled=true",
                 "--set", "flagger.path=checkout")
    assert path.returncode != 0 and "templateVariables" in path.stderr


# --- the target chart -------------------------------------------------------------------------


@needs_helm
@pytest.mark.parametrize("name", TARGET_VALUES)
def test_target_is_injected_hardened_and_its_args_parse(name: str) -> None:
    values = TARGET_VALUES[name]
    docs = render(TARGET, values)
    pod = _pod(docs)
    meta, spec = pod["metadata"], pod["spec"]
    mesh = values.get("mesh", "istio")
    if mesh == "istio":
        assert meta["annotations"]["sidecar.istio.io/inject"] == "true"
        revision = values.get("istio", {}).get("revision")
        if revision:
            assert meta["labels"]["istio.io/rev"] == revision
        else:
            assert meta["labels"]["sidecar.istio.io/inject"] == "true"
        proxy = json.loads(meta["annotations"]["proxy.istio.io/config"])
        assert proxy["holdApplicationUntilProxyStarts"] is True
        assert one(docs, "PeerAuthentication")["spec"]["mtls"] == {"mode": "PERMISSIVE"}
    else:
        assert meta["annotations"]["linkerd.io/inject"] == "enabled"
        assert not [d for d in docs if d["kind"] == "PeerAuthentication"]
    # Hardened per container; nothing pod-wide that would bind the mesh's init container.
    assert "runAsNonRoot" not in spec["securityContext"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    _hardened(container["securityContext"])
    assert container["command"] == ["python", "-m", "targets.server"]
    argv = [a.replace("$(POD_NAME)", "target-0").replace("$(POD_NAMESPACE)", "platform-test")
            for a in container["args"]]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    args = target_args(argv)  # the target's own parser
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert parse_hostport(args.http) == ("0.0.0.0", ports["http"])
    assert parse_hostport(args.grpc) == ("0.0.0.0", ports["grpc"])
    assert args.pod == "target-0" and args.version == values.get("emulatedVersion", "reference")
    service = one(docs, "Service")
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http", "grpc": "grpc"}
    assert service["spec"]["selector"].items() <= meta["labels"].items()
    assert args.namespace == "platform-test"
    # Each file the target is given is in the projected config volume, from its ConfigMap,
    # and parses with the target's own parser.
    files = {key: doc["metadata"]["name"] for doc in docs if doc["kind"] == "ConfigMap"
             for key in doc["data"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    projected = ({s["configMap"]["name"] for s in volumes["config"]["projected"]["sources"]}
                 if "config" in volumes else set())
    assert projected == set(files.values())
    if "profiles" in values:
        assert Path(args.profiles) == Path(mounts["config"]) / "profiles.yaml"
        text = data(docs, files["profiles.yaml"])["profiles.yaml"]
        assert parse_profiles(text).profile(args.version).version == args.version
    else:
        assert args.profiles is None
    if "relay" in values:
        assert Path(args.relay) == Path(mounts["config"]) / "relay.yaml"
        relay = parse_relay(data(docs, files["relay.yaml"])["relay.yaml"])
        assert set(relay.destinations) == set(values["relay"]["destinations"])
    else:
        assert args.relay is None and "relay.yaml" not in files


def data(docs: list[dict[str, Any]], configmap: str) -> dict[str, str]:
    (doc,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == configmap]
    return dict(doc["data"])


@needs_helm
def test_target_relay_without_destinations_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(json.dumps({"relay": {"timeout": "2s"}}))
    out = _helm("template", "t", str(ROOT / TARGET), "-f", str(path))
    assert out.returncode != 0 and "relay needs destinations" in out.stderr, out.stderr


@needs_helm
def test_probe_defaults_discover_the_target_chart() -> None:
    config = yaml.safe_load(probe_config(render(PROBE)))
    kubernetes = config["targets"]["kubernetes"]
    target = _pod(render(TARGET))
    selector = dict(term.split("=", 1) for term in kubernetes["selector"].split(","))
    assert selector.items() <= target["metadata"]["labels"].items()
    named = {p["name"] for c in target["spec"]["containers"] for p in c["ports"]}
    assert {kubernetes["port"]} | {p["port"] for p in config["paths"]} <= named
    probe_user = _pod(render(PROBE))["spec"]["containers"][0]["securityContext"]["runAsUser"]
    assert target["spec"]["containers"][0]["securityContext"]["runAsUser"] == probe_user


# --- Dockerfile -------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip()
             .startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def _copied_sources() -> list[str]:
    sources = []
    for op, rest in _dockerfile():
        if op == "COPY" and not rest.startswith("--from"):
            sources += rest.split()[:-1]
    return sources


def _dockerignored(path: str) -> bool:
    """Docker's .dockerignore: the last matching pattern wins; a pattern matching a parent
    directory matches everything under it."""
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, c) for c in candidates):
            ignored = not negate
    return ignored


def test_dockerfile_copies_existing_sources_inside_the_build_context() -> None:
    sources = _copied_sources()
    assert set(sources) == {"pyproject.toml", "README.md", "probes", "targets"}
    for source in sources:
        assert (ROOT / source).exists()
    for path in ("pyproject.toml", "README.md", "probes/cli/__init__.py", "targets/server.py",
                 "targets/examples/profiles.yaml", "targets/proto/target_pb2.py"):
        assert not _dockerignored(path), path
    for path in (".venv/bin/python", "tests/integration/test_api.py", ".git/HEAD",
                 "probes/__pycache__/x.pyc",
                 "charts/skewprobe/values.yaml", "skewprobe.db"):
        assert _dockerignored(path), path


def test_dockerfile_entrypoint_user_and_base_image() -> None:
    instructions = _dockerfile()
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for op, rest in instructions
            if op == "ARG" and "=" in rest}
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    assert all(rest.split()[0] == "${PYTHON_IMAGE}" for op, rest in instructions if op == "FROM")
    final = dict(instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM"):])
    assert json.loads(final["ENTRYPOINT"]) == ["skewprobe"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["skewprobe"] == "probes.cli:main"
    uid, gid = final["USER"].split(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit()
    # The target runs from the same image; its module must exist in the package.
    assert (ROOT / "targets/server.py").is_file() and (ROOT / "targets/__init__.py").is_file()
    if HELM is not None:
        for chart in (PROBE, TARGET):
            sc = _pod(render(chart))["spec"]["containers"][0]["securityContext"]
            assert (sc["runAsUser"], sc["runAsGroup"]) == (int(uid), int(gid))


def test_wheel_builds_from_exactly_the_copied_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for source in _copied_sources():
        origin = ROOT / source
        if origin.is_dir():
            shutil.copytree(origin, src / source,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, src / source)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("skewprobe-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names
                            if n.endswith("entry_points.txt"))
    for module in ("probes/cli/__init__.py", "targets/server.py", "targets/examples/profiles.yaml",
                   "targets/proto/target_pb2.py"):
        assert module in names
    assert re.search(r"^skewprobe = probes\.cli:main$", entry_points, re.M)
