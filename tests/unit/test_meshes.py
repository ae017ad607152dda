"""Proxy-version extraction per mesh, on Pod objects shaped as the API returns them."""

from __future__ import annotations

import copy
import json

import pytest

from probes.discovery.meshes import (
    NONE,
    UNKNOWN,
    GenericExtractor,
    IstioExtractor,
    LinkerdExtractor,
    extractor_for,
    image_repository,
    image_tag,
)
from probes.spec import KubernetesSpec, VersionSource
from tests.servers import kube_pods as kp

ISTIO = IstioExtractor()
LINKERD = LinkerdExtractor()
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("image", "tag", "repo"),
    [
        ("docker.io/istio/proxyv2:1.22.3", "1.22.3", "proxyv2"),
        ("gcr.io/istio-release/proxyv2:1.22.3-distroless", "1.22.3-distroless", "proxyv2"),
        ("registry.local:5000/mesh/proxyv2:1.21.0", "1.21.0", "proxyv2"),
        ("registry.local:5000/mesh/proxyv2", None, "proxyv2"),
        (f"docker.io/istio/proxyv2@{DIGEST}", None, "proxyv2"),
        (f"docker.io/istio/proxyv2:1.22.3@{DIGEST}", "1.22.3", "proxyv2"),
        (DIGEST, None, "sha256"),
        ("", None, ""),
    ],
)
def test_image_references(image: str, tag: str | None, repo: str) -> None:
    assert image_tag(image) == tag
    assert image_repository(image) == repo


# -- Istio -------------------------------------------------------------------------------


def test_istio_sidecar_reads_the_running_image_tag() -> None:
    info = ISTIO.proxy(kp.pod("checkout-a-1", mesh="istio", version="1.22.3"))
    assert (info.version, info.mode, info.revision) == ("1.22.3", "sidecar", "default")
    assert info.source == "status.image" and info.injected


@pytest.mark.parametrize("variant", ["-distroless", "-debug"])
def test_istio_image_variants_are_the_same_version(variant: str) -> None:
    info = ISTIO.proxy(kp.pod("a-b-c", mesh="istio", version="1.21.2", image_variant=variant))
    assert info.version == "1.21.2"


def test_istio_native_sidecar_in_init_containers() -> None:
    pod = kp.pod("a-b-c", mesh="istio-native", version="1.23.0")
    assert not any(c["name"] == "istio-proxy" for c in pod["spec"]["containers"])
    info = ISTIO.proxy(pod)
    assert (info.version, info.mode, info.source) == ("1.23.0", "native-sidecar", "status.image")


def test_a_plain_init_container_named_istio_proxy_is_not_a_sidecar() -> None:
    pod = kp.pod("a-b-c", mesh="istio-native", version="1.23.0")
    for container in pod["spec"]["initContainers"]:
        container.pop("restartPolicy", None)  # ran once and exited: no proxy serves the pod
    assert ISTIO.proxy(pod).version == NONE


def test_istio_running_image_wins_over_the_spec() -> None:
    # The pod's image field was edited in place; the running container is still 1.21.2.
    pod = kp.pod("a-b-c", mesh="istio", version="1.22.3",
                 status_image="docker.io/istio/proxyv2:1.21.2")
    assert ISTIO.proxy(pod).version == "1.21.2"


def test_istio_digest_in_status_falls_back_to_the_spec_tag() -> None:
    pod = kp.pod("a-b-c", mesh="istio", version="1.22.3", status_image=DIGEST)
    info = ISTIO.proxy(pod)
    assert (info.version, info.source) == ("1.22.3", "spec.image")


def test_istio_pending_pod_has_no_status_and_reads_the_spec() -> None:
    pod = kp.pod("a-b-c", mesh="istio", version="1.22.3", phase="Pending", ready=False)
    assert "containerStatuses" not in pod["status"]
    assert ISTIO.proxy(pod).version == "1.22.3"


def test_istio_digest_pinned_image_uses_the_proxy_image_annotation() -> None:
    pinned = f"registry.local/istio/proxyv2@{DIGEST}"
    override = "registry.local/istio/proxyv2:1.22.4-distroless"
    pod = kp.pod("a-b-c", mesh="istio", spec_image=pinned, status_image=pinned,
                 annotations={"sidecar.istio.io/proxyImage": override})
    info = ISTIO.proxy(pod)
    assert (info.version, info.source) == ("1.22.4", "annotation sidecar.istio.io/proxyImage")
    del pod["metadata"]["annotations"]["sidecar.istio.io/proxyImage"]
    assert ISTIO.proxy(pod).version == UNKNOWN  # a proxy we cannot version: not "none"


def test_istio_revision_from_label_then_annotation_then_injector_status() -> None:
    pod = kp.pod("a-b-c", mesh="istio", version="1.23.0", revision="1-23-0")
    assert ISTIO.proxy(pod).revision == "1-23-0"
    del pod["metadata"]["labels"]["istio.io/rev"]
    assert ISTIO.proxy(pod).revision == "1-23-0"  # the injector's annotation
    del pod["metadata"]["annotations"]["istio.io/rev"]
    assert ISTIO.proxy(pod).revision == "1-23-0"  # sidecar.istio.io/status
    status = json.loads(pod["metadata"]["annotations"]["sidecar.istio.io/status"])
    assert status["revision"] == "1-23-0"


def test_istio_ambient_pods_wait_for_their_ztunnel() -> None:
    by_annotation = kp.pod("a-b-c", mesh="istio-ambient")
    by_label = kp.pod("a-b-d", labels={"istio.io/dataplane-mode": "ambient"})
    for pod in (by_annotation, by_label):
        info = ISTIO.proxy(pod)
        assert (info.version, info.mode) == (UNKNOWN, "ambient") and info.injected
    opted_out = kp.pod("a-b-e", mesh="istio-ambient", labels={"istio.io/dataplane-mode": "none"})
    assert ISTIO.proxy(opted_out).version == NONE


def test_uninjected_pod_is_cohort_none() -> None:
    info = ISTIO.proxy(kp.pod("a-b-c", mesh="plain"))
    assert (info.version, info.mode, info.injected) == (NONE, NONE, False)
    assert LINKERD.proxy(kp.pod("a-b-c", mesh="istio")).version == NONE


def test_ztunnel_node_proxy() -> None:
    proxy = ISTIO.node_proxy(kp.ztunnel_pod("node-b", "1.22.1"))
    assert proxy is not None
    assert (proxy.node, proxy.version, proxy.terminating) == ("node-b", "1.22.1", False)
    assert proxy.pod.startswith("istio-system/ztunnel-")
    unscheduled = kp.ztunnel_pod("node-b", "1.22.1")
    del unscheduled["spec"]["nodeName"]
    assert ISTIO.node_proxy(unscheduled) is None


def test_istiod_control_plane_with_and_without_revision() -> None:
    plain = ISTIO.control_plane(kp.istiod("1.22.3", variant="-distroless"))
    assert plain is not None
    assert (plain.version, plain.revision) == ("1.22.3", "default")
    assert plain.source == "deployment istio-system/istiod"
    canary = ISTIO.control_plane(kp.istiod("1.23.0", revision="1-23-0"))
    assert canary is not None and (canary.version, canary.revision) == ("1.23.0", "1-23-0")


# -- Linkerd -----------------------------------------------------------------------------


def test_linkerd_reads_the_proxy_version_annotation() -> None:
    info = LINKERD.proxy(kp.pod("a-b-c", mesh="linkerd", version="stable-2.14.10"))
    assert (info.version, info.mode) == ("stable-2.14.10", "sidecar")
    assert info.source == "annotation linkerd.io/proxy-version"


def test_linkerd_falls_back_to_the_proxy_image_tag() -> None:
    pod = kp.pod("a-b-c", mesh="linkerd", version="edge-24.5.1")
    del pod["metadata"]["annotations"]["linkerd.io/proxy-version"]
    info = LINKERD.proxy(pod)
    assert (info.version, info.source) == ("edge-24.5.1", "status.image")


def test_linkerd_native_sidecar() -> None:
    pod = kp.pod("a-b-c", mesh="linkerd-native", version="stable-2.15.2")
    del pod["metadata"]["annotations"]["linkerd.io/proxy-version"]
    info = LINKERD.proxy(pod)
    assert (info.version, info.mode) == ("stable-2.15.2", "native-sidecar")


def test_linkerd_destination_control_plane() -> None:
    plane = LINKERD.control_plane(kp.linkerd_destination("stable-2.14.10"))
    assert plane is not None and plane.version == "stable-2.14.10"
    assert plane.source == "deployment linkerd/linkerd-destination"


# -- generic -----------------------------------------------------------------------------


def test_generic_label_annotation_image_and_header() -> None:
    pod = kp.pod("a-b-c", mesh="istio", version="1.22.3",
                 labels={"proxy.example.com/version": "7.1"},
                 annotations={"proxy.example.com/build": "7.1.4"})
    by_label = GenericExtractor(VersionSource(label="proxy.example.com/version")).proxy(pod)
    assert (by_label.version, by_label.mode) == ("7.1", "label")
    by_annotation = GenericExtractor(VersionSource(annotation="proxy.example.com/build"))
    assert by_annotation.proxy(pod).version == "7.1.4"
    by_image = GenericExtractor(VersionSource(image="istio-proxy")).proxy(pod)
    assert (by_image.version, by_image.mode) == ("1.22.3", "image")
    by_header = GenericExtractor(VersionSource(header="x-proxy-version")).proxy(pod)
    assert (by_header.version, by_header.mode) == (UNKNOWN, "header")
    bare = kp.pod("a-b-c")
    assert GenericExtractor(VersionSource(label="proxy.example.com/version")).proxy(bare).version \
        == NONE
    assert GenericExtractor(VersionSource(image="envoy")).proxy(bare).version == NONE


def test_extractor_registry() -> None:
    assert isinstance(extractor_for(KubernetesSpec(mesh="istio")), IstioExtractor)
    assert isinstance(extractor_for(KubernetesSpec(mesh="linkerd")), LinkerdExtractor)
    generic = extractor_for(KubernetesSpec(mesh="generic", version_from=VersionSource(label="v")))
    assert isinstance(generic, GenericExtractor) and generic.control_plane_selector is None
    with pytest.raises(ValueError, match="unknown mesh"):
        extractor_for(KubernetesSpec(mesh="consul"))


def test_extraction_does_not_mutate_the_pod() -> None:
    pod = kp.pod("a-b-c", mesh="istio-native", version="1.23.0")
    before = copy.deepcopy(pod)
    ISTIO.proxy(pod)
    LINKERD.proxy(pod)
    assert pod == before
