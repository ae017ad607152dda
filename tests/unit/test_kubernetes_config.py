"""The `targets.kubernetes` and `inventory` config sections: typed specs, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.config import parse_config
from probes.errors import ConfigError
from probes.spec import SkewPolicy, VersionSource

PATHS = """\
paths:
  - name: checkout
    http: {path: /api/checkout}
    port: http
"""


def _config(kubernetes: str, extra: str = "") -> str:
    return f"targets:\n  kubernetes:\n{kubernetes}{PATHS}{extra}"


def _error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, file="k.yaml")
    assert "\n" not in str(info.value)
    return info.value


def test_full_section_builds_the_spec(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    config = parse_config(_config(f"""\
    mesh: istio
    namespaces: [shop, payments]
    selector: "app in (checkout, cart), tier!=batch"
    port: http
    labels: [app, app.kubernetes.io/version]
    control_plane_version: "1.23.0"
    supported_skew: {{behind: 2}}
    kubeconfig: {kubeconfig}
    context: prod
""", "inventory: {snapshot_every: 30s}\n"))
    spec = config.kubernetes
    assert spec is not None and config.static_targets == () and config.file_targets is None
    assert spec.namespaces == ("shop", "payments") and spec.port == "http"
    assert spec.selector == "app in (checkout, cart), tier!=batch"
    assert spec.labels == ("app", "app.kubernetes.io/version")
    assert spec.supported_skew == SkewPolicy(behind=2, ahead=0)
    assert (spec.kubeconfig, spec.context, spec.in_cluster) == (str(kubeconfig), "prod", None)
    assert spec.system_namespace == "istio-system" and config.inventory_every_s == 30.0


def test_defaults_and_linkerd_namespace() -> None:
    config = parse_config(_config("    mesh: linkerd\n    in_cluster: true\n"))
    spec = config.kubernetes
    assert spec is not None and spec.namespaces == () and spec.selector == ""
    assert spec.supported_skew == SkewPolicy(behind=1, ahead=0)
    assert spec.system_namespace == "linkerd" and spec.in_cluster is True
    assert config.inventory_every_s == 60.0


def test_generic_header_source_reads_the_cohort_from_responses() -> None:
    config = parse_config(_config(
        "    mesh: generic\n    in_cluster: true\n    version_from: {header: X-Proxy-Version}\n"))
    assert config.kubernetes is not None
    assert config.kubernetes.version_from == VersionSource(header="X-Proxy-Version")
    (path,) = config.paths
    assert path.cohort_header == "x-proxy-version"


@pytest.mark.parametrize(
    ("section", "line", "key", "message"),
    [
        ("    mesh: consul\n", 3, "targets.kubernetes.mesh", "is not one of"),
        ("    mesh: generic\n", 3, "targets.kubernetes.mesh", "needs version_from"),
        ("    mesh: istio\n    version_from: {label: v}\n", 4,
         "targets.kubernetes.version_from", "for mesh: generic"),
        ("    mesh: generic\n    version_from: {label: v, annotation: w}\n", 4,
         "targets.kubernetes.version_from", "exactly one of"),
        ("    mesh: istio\n    kubeconfig: /nonexistent/kubeconfig\n", 4,
         "targets.kubernetes.kubeconfig", "no such file"),
        ("    mesh: istio\n    selector: 'app in checkout'\n", 4,
         "targets.kubernetes.selector", "not a label selector term"),
        ("    mesh: istio\n    namespaces: [Shop]\n", 4,
         "targets.kubernetes.namespaces[0]", "expected form"),
        ("    mesh: istio\n    supported_skew: {behind: -1}\n", 4,
         "targets.kubernetes.supported_skew.behind", "minimum"),
        ("    mesh: istio\n    watch: true\n", 4, "targets.kubernetes.watch", "unknown key"),
        ("    namespaces: [shop]\n", 2, "targets.kubernetes", "mesh"),
    ],
)
def test_errors_name_line_and_key(section: str, line: int, key: str, message: str) -> None:
    error = _error(_config(section))
    assert (error.line, error.key) == (line, key)
    assert message in str(error)


def test_in_cluster_and_kubeconfig_conflict(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    section = f"    mesh: istio\n    in_cluster: true\n    kubeconfig: {kubeconfig}\n"
    error = _error(_config(section))
    assert "not both" in str(error)
