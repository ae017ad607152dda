"""The charts rendered with a real helm 3, for the chart tests and the end-to-end tests that
run what a chart deploys (`scripts/install-helm.sh` installs helm; tests that need it skip
when it cannot be found, or set SKEWPROBE_HELM)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROBE, TARGET = "charts/skewprobe", "charts/skewprobe-target"
RELEASE, NAMESPACE = "skewprobe", "skewprobe"  # the release the charts' examples assume
HELM = os.environ.get("SKEWPROBE_HELM") or shutil.which("helm")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=60, check=False)


@functools.cache
def _render_cached(chart: str, values_json: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        values = Path(tmp, "values.yaml")
        values.write_text(values_json)  # JSON is YAML
        done = helm("template", RELEASE, str(ROOT / chart), "--namespace", NAMESPACE,
                    "-f", str(values))
    assert done.returncode == 0, done.stderr
    return done.stdout


def render(chart: str, values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    text = _render_cached(chart, json.dumps(values or {}, sort_keys=True))
    return [d for d in yaml.safe_load_all(text) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"want one {kind}, got {len(found)}"
    return found[0]


def probe_config(docs: list[dict[str, Any]]) -> str:
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap" and "probe.yaml" in d["data"]]
    return str(configmap["data"]["probe.yaml"])


def workload(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one Deployment (one probe) or StatefulSet (`shards` > 1) that runs the pods."""
    (found,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    return found


def shard_argv(docs: list[dict[str, Any]], ordinal: int) -> list[str]:
    """Pod `ordinal`'s `skewprobe` arguments as the kubelet passes them: the StatefulSet names
    its pods `<name>-<ordinal>`, POD_NAME comes from metadata.name, and `$(POD_NAME)` in the
    arguments is expanded from the container's env."""
    owner = workload(docs)
    (container,) = owner["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container.get("env", ())}
    values = {name: e["value"] for name, e in env.items() if "value" in e}
    if "POD_NAME" in env:
        assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        values["POD_NAME"] = f"{owner['metadata']['name']}-{ordinal}"
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in container["args"]]
