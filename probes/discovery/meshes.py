"""The callee's proxy version, read from its Pod object: one extractor per mesh.

An extractor turns a Pod (the JSON the Kubernetes API returns, as a dict) into a
`ProxyInfo`; the mesh is chosen in config (`targets.kubernetes.mesh`) and looked up in
`EXTRACTORS`. What each mesh writes where:

- **Istio** has no annotation with the proxy version: it is the tag of the `istio-proxy`
  container's image (`docker.io/istio/proxyv2:1.22.3`, `…:1.22.3-distroless` → `1.22.3`),
  found in `containers` or, for native sidecars, in `initContainers` with
  `restartPolicy: Always`. The running image in `status.(init)containerStatuses[].image` wins
  over the spec (a pod's image field is mutable; the running container is what answers);
  an image pinned by digest has no tag, and then the `sidecar.istio.io/proxyImage`
  annotation (the platform's override at injection) names the version. The revision is
  `istio.io/rev` (label, else annotation, else the injector's `sidecar.istio.io/status`).
  Ambient pods (`istio.io/dataplane-mode: ambient`, or the CNI's
  `ambient.istio.io/redirection: enabled`) have no sidecar: their traffic goes through the
  ztunnel of their node, so they report mode `ambient` and the discovery source fills in
  that ztunnel's version (`node_proxy` reads ztunnel pods).
- **Linkerd** writes `linkerd.io/proxy-version` on injected pods; the `linkerd-proxy`
  container's image tag is the fallback.
- **Generic**: a label, an annotation, a container's image tag, or a response header
  (the version is then only known per response; pods report `unknown`).

A pod without a proxy is cohort `none`: missing injection is a finding, not an error. A
proxy whose version cannot be read is `unknown`.

Each extractor also knows its control plane (the istiod / linkerd-destination Deployment and
its image tag) so skew can be judged against the version actually deployed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from probes.spec import KubernetesSpec, VersionSource

__all__ = [
    "EXTRACTORS",
    "NONE",
    "UNKNOWN",
    "ControlPlane",
    "Extractor",
    "GenericExtractor",
    "IstioExtractor",
    "LinkerdExtractor",
    "NodeProxy",
    "ProxyInfo",
    "extractor_for",
    "image_repository",
    "image_tag",
]

NONE: Final = "none"
UNKNOWN: Final = "unknown"

# Image tag suffixes that name a build variant of the same version.
_VARIANTS: Final = ("-distroless", "-debug")

Json = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ProxyInfo:
    """The proxy in front of one pod.

    `mode` is `sidecar`, `native-sidecar`, `ambient`, `none` (no proxy), or for a generic
    mesh where the version came from (`label`, `annotation`, `image`, `header`). `source`
    says exactly what was read, for the inventory and for debugging a wrong cohort.
    """

    version: str
    mode: str
    revision: str = ""
    source: str = ""

    @property
    def injected(self) -> bool:
        return self.mode != NONE


@dataclass(frozen=True, slots=True)
class ControlPlane:
    """One control-plane deployment: its version, the Istio revision it serves, and where
    the version was read (`deployment istio-system/istiod`, or `config`)."""

    version: str
    revision: str = ""
    source: str = ""


@dataclass(frozen=True, slots=True)
class NodeProxy:
    """A per-node proxy (Istio's ztunnel) that carries the traffic of ambient pods."""

    node: str
    version: str
    pod: str
    created_at: str = ""  # RFC 3339; the newest pod on a node wins during its rollout
    terminating: bool = False


class Extractor(Protocol):
    """Reads the proxy version of a pod, and where the mesh's control plane runs."""

    mesh: str
    # Label selectors of the control-plane Deployments and per-node proxy pods in the
    # mesh's namespace; None when the mesh has none to discover.
    control_plane_selector: str | None
    node_proxy_selector: str | None

    def proxy(self, pod: Json) -> ProxyInfo: ...

    def control_plane(self, deployment: Json) -> ControlPlane | None: ...

    def node_proxy(self, pod: Json) -> NodeProxy | None: ...


# -- image references --------------------------------------------------------------------


def image_tag(image: str | None) -> str | None:
    """The tag of an image reference, or None when it has none (pinned by digest only).

    `my.registry:5000/istio/proxyv2:1.22.3@sha256:…` → `1.22.3`; `proxyv2@sha256:…` → None;
    `sha256:…` (how some runtimes report a digest-pulled image) → None.
    """
    if not image or image.startswith("sha256:"):
        return None
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]  # the registry may carry a :port
    _, sep, tag = name.partition(":")
    return tag if sep and tag else None


def image_repository(image: str | None) -> str:
    """The last path element of the image name: `docker.io/istio/proxyv2:1.22` → `proxyv2`."""
    if not image:
        return ""
    return image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[0]


def _strip_variant(tag: str) -> str:
    for suffix in _VARIANTS:
        if tag.endswith(suffix) and len(tag) > len(suffix):
            return _strip_variant(tag[: -len(suffix)])
    return tag


# -- pod structure -----------------------------------------------------------------------


def _meta(obj: Json) -> tuple[Json, Json]:
    meta = obj.get("metadata") or {}
    return meta.get("labels") or {}, meta.get("annotations") or {}


def _container(pod: Json, name: str) -> tuple[Json, bool] | None:
    """The container `name` and whether it is a native sidecar (restartable init container).

    A plain init container of that name is not a proxy (it ran and exited).
    """
    spec = pod.get("spec") or {}
    for container in spec.get("containers") or ():
        if container.get("name") == name:
            return container, False
    for container in spec.get("initContainers") or ():
        if container.get("name") == name and container.get("restartPolicy") == "Always":
            return container, True
    return None


def _status_image(pod: Json, name: str, native: bool) -> str | None:
    key = "initContainerStatuses" if native else "containerStatuses"
    for status in (pod.get("status") or {}).get(key) or ():
        if status.get("name") == name:
            return status.get("image") or None
    return None


def _running_tag(pod: Json, name: str, container: Json, native: bool) -> tuple[str, str] | None:
    """(tag, source) from the running image if it has a tag, else from the spec."""
    running = image_tag(_status_image(pod, name, native))
    if running:
        return running, "status.image"
    spec = image_tag(container.get("image"))
    if spec:
        return spec, "spec.image"
    return None


def _mode(native: bool) -> str:
    return "native-sidecar" if native else "sidecar"


# -- Istio -------------------------------------------------------------------------------


class IstioExtractor:
    mesh = "istio"
    control_plane_selector: str | None = "app=istiod"
    node_proxy_selector: str | None = "app=ztunnel"
    container = "istio-proxy"

    def proxy(self, pod: Json) -> ProxyInfo:
        labels, annotations = _meta(pod)
        revision = _istio_revision(labels, annotations)
        found = _container(pod, self.container)
        if found is not None:
            container, native = found
            version, source = self._version(pod, container, native, annotations)
            return ProxyInfo(version, _mode(native), revision, source)
        if labels.get("istio.io/dataplane-mode") == "ambient" or (
            annotations.get("ambient.istio.io/redirection") == "enabled"
            and labels.get("istio.io/dataplane-mode") != "none"
        ):
            # The ztunnel on the pod's node is its proxy; discovery resolves the version.
            return ProxyInfo(UNKNOWN, "ambient", revision, "ztunnel")
        return ProxyInfo(NONE, NONE)

    def _version(
        self, pod: Json, container: Json, native: bool, annotations: Json
    ) -> tuple[str, str]:
        found = _running_tag(pod, self.container, container, native)
        if found is not None:
            return _strip_variant(found[0]), found[1]
        override = image_tag(annotations.get("sidecar.istio.io/proxyImage"))
        if override:
            return _strip_variant(override), "annotation sidecar.istio.io/proxyImage"
        return UNKNOWN, "image has no tag"

    def control_plane(self, deployment: Json) -> ControlPlane | None:
        labels, _ = _meta(deployment)
        image = _template_image(deployment, names=("discovery",), repositories=("pilot",))
        tag = image_tag(image)
        if tag is None:
            return None
        return ControlPlane(
            _strip_variant(tag), labels.get("istio.io/rev") or "default", _where(deployment)
        )

    def node_proxy(self, pod: Json) -> NodeProxy | None:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return None  # not scheduled yet: carries nobody's traffic
        for name in ("istio-proxy", "ztunnel"):
            found = _container(pod, name)
            if found is not None:
                break
        else:
            containers = (pod.get("spec") or {}).get("containers") or ()
            match = [c for c in containers if image_repository(c.get("image")) == "ztunnel"]
            if not match:
                return None
            found, name = (match[0], False), match[0].get("name", "")
        container, native = found
        tagged = _running_tag(pod, name, container, native)
        meta = pod.get("metadata") or {}
        return NodeProxy(
            node=node,
            version=_strip_variant(tagged[0]) if tagged else UNKNOWN,
            pod=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
            created_at=meta.get("creationTimestamp") or "",
            terminating=bool(meta.get("deletionTimestamp")),
        )


def _istio_revision(labels: Json, annotations: Json) -> str:
    revision = labels.get("istio.io/rev") or annotations.get("istio.io/rev")
    if revision:
        return str(revision)
    status = annotations.get("sidecar.istio.io/status")
    if status:
        try:
            return str(json.loads(status).get("revision") or "")
        except (ValueError, AttributeError):
            return ""
    return ""


def _template_image(
    deployment: Json, *, names: tuple[str, ...], repositories: tuple[str, ...]
) -> str | None:
    """The image of the named container in a Deployment's pod template (or, failing the
    name, the first container whose image repository matches)."""
    template = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = template.get("containers") or ()
    for container in containers:
        if container.get("name") in names:
            return container.get("image")
    for container in containers:
        if image_repository(container.get("image")) in repositories:
            return container.get("image")
    return None


def _where(obj: Json) -> str:
    meta = obj.get("metadata") or {}
    return f"deployment {meta.get('namespace', '')}/{meta.get('name', '')}"


# -- Linkerd -----------------------------------------------------------------------------


class LinkerdExtractor:
    mesh = "linkerd"
    control_plane_selector: str | None = "linkerd.io/control-plane-component=destination"
    node_proxy_selector: str | None = None
    container = "linkerd-proxy"

    def proxy(self, pod: Json) -> ProxyInfo:
        found = _container(pod, self.container)
        if found is None:
            return ProxyInfo(NONE, NONE)
        container, native = found
        _, annotations = _meta(pod)
        version = annotations.get("linkerd.io/proxy-version")
        if version:
            return ProxyInfo(str(version), _mode(native), "", "annotation linkerd.io/proxy-version")
        tagged = _running_tag(pod, self.container, container, native)
        if tagged is not None:
            return ProxyInfo(tagged[0], _mode(native), "", tagged[1])
        return ProxyInfo(UNKNOWN, _mode(native), "", "no annotation, image has no tag")

    def control_plane(self, deployment: Json) -> ControlPlane | None:
        image = _template_image(deployment, names=("destination",), repositories=("controller",))
        tag = image_tag(image)
        return ControlPlane(tag, "", _where(deployment)) if tag else None

    def node_proxy(self, pod: Json) -> NodeProxy | None:
        return None


# -- generic -----------------------------------------------------------------------------


class GenericExtractor:
    mesh = "generic"
    control_plane_selector: str | None = None
    node_proxy_selector: str | None = None

    def __init__(self, source: VersionSource) -> None:
        self.source = source

    def proxy(self, pod: Json) -> ProxyInfo:
        src = self.source
        labels, annotations = _meta(pod)
        if src.header:
            return ProxyInfo(UNKNOWN, "header", "", f"response header {src.header}")
        if src.label:
            value = labels.get(src.label)
            return _found(value, "label", f"label {src.label}")
        if src.annotation:
            value = annotations.get(src.annotation)
            return _found(value, "annotation", f"annotation {src.annotation}")
        assert src.image is not None
        found = _container(pod, src.image)
        if found is None:
            return ProxyInfo(NONE, NONE)
        tagged = _running_tag(pod, src.image, found[0], found[1])
        if tagged is None:
            return ProxyInfo(UNKNOWN, "image", "", f"container {src.image}: image has no tag")
        return ProxyInfo(tagged[0], "image", "", f"container {src.image} {tagged[1]}")

    def control_plane(self, deployment: Json) -> ControlPlane | None:
        return None

    def node_proxy(self, pod: Json) -> NodeProxy | None:
        return None


def _found(value: Any, mode: str, source: str) -> ProxyInfo:
    if value is None or value == "":
        return ProxyInfo(NONE, NONE)
    return ProxyInfo(str(value), mode, "", source)


EXTRACTORS: Final[Mapping[str, Callable[[KubernetesSpec], Extractor]]] = {
    "istio": lambda spec: IstioExtractor(),
    "linkerd": lambda spec: LinkerdExtractor(),
    "generic": lambda spec: GenericExtractor(spec.version_from or VersionSource()),
}


def extractor_for(spec: KubernetesSpec) -> Extractor:
    """The extractor the config names (the registry is `EXTRACTORS`)."""
    try:
        factory = EXTRACTORS[spec.mesh]
    except KeyError:
        raise ValueError(f"unknown mesh {spec.mesh!r} (one of {', '.join(EXTRACTORS)})") from None
    if spec.mesh == "generic" and spec.version_from is None:
        raise ValueError("a generic mesh needs version_from")
    return factory(spec)
