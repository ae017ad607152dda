"""Pinning: whether each namespace pins its injected version (a rollback is a restart)."""

from __future__ import annotations

from typing import Any

from probes.discovery.meshes import NONE
from probes.plan._model import NamespaceInfo, PlanInput

__all__ = ["pinning"]


def pinning(inp: PlanInput) -> list[dict[str, Any]] | None:
    """Per namespace with pods: a revision label pins the injected version; Istio's default
    injector (`istio-injection=enabled`) follows whatever the default control plane is."""
    if inp.namespaces is None:
        return None
    present = sorted({g.namespace for g in inp.pods if g.version != NONE})
    out = []
    for ns in present:
        info = inp.namespaces.get(ns, NamespaceInfo(ns))
        rev = info.labels.get("istio.io/rev")
        if inp.mesh == "linkerd":
            state, detail = "n/a", "Linkerd has no revisions: the injector is the control plane's"
        elif rev:
            state, detail = "pinned", f"istio.io/rev={rev}"
        elif info.labels.get("istio-injection") == "enabled":
            state, detail = "default injector", "istio-injection=enabled: follows the default"
        else:
            revs = sorted({g.revision for g in inp.pods  # "default": the default injector's
                           if g.namespace == ns and g.revision not in ("", "default")})
            state = "pinned per pod" if revs else "not pinned"
            detail = f"pod revisions {', '.join(revs)}" if revs else "no revision label"
        out.append({"namespace": ns, "state": state, "detail": detail})
    return out
