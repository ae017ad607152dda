"""Pod and Deployment objects shaped as the Kubernetes API returns them.

The fields and their nesting follow what `kubectl get pod -o json` shows for pods injected by
Istio 1.22 (sidecar and native sidecar), captured by Istio ambient (and the ztunnel
DaemonSet pod on their node), injected by Linkerd stable-2.14, and not injected at all;
and for the istiod and linkerd-destination Deployments. Managed fields, volumes and most
env vars are left out: the probe never reads them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

Json = dict[str, Any]

STARTED = "2024-05-01T10:00:00Z"


def _uid(*parts: str) -> str:
    h = hashlib.sha1("/".join(parts).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _hash(workload: str) -> str:
    # pod-template-hash uses the alphabet "bcdfghjklmnpqrstvwxz2456789"
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    n = int(hashlib.sha1(workload.encode()).hexdigest(), 16)
    return "".join(alphabet[(n >> (5 * i)) % len(alphabet)] for i in range(10))


def _running(name: str, image: str, started: str, ready: bool = True) -> Json:
    repo = image.split(":")[0].split("@")[0]
    return {
        "name": name,
        "state": {"running": {"startedAt": started}},
        "lastState": {},
        "ready": ready,
        "restartCount": 0,
        "image": image,
        "imageID": f"{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
        "containerID": f"containerd://{hashlib.sha256((name + image).encode()).hexdigest()}",
        "started": True,
    }


def _completed(name: str, image: str, started: str) -> Json:
    status = _running(name, image, started)
    status["state"] = {"terminated": {"exitCode": 0, "reason": "Completed",
                                      "startedAt": started, "finishedAt": started}}
    status["started"] = False
    return status


def _conditions(ready: bool, started: str) -> list[Json]:
    value = "True" if ready else "False"
    return [
        {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": None,
         "lastTransitionTime": started},
        {"type": "Initialized", "status": "True", "lastProbeTime": None,
         "lastTransitionTime": started},
        {"type": "Ready", "status": value, "lastProbeTime": None, "lastTransitionTime": started},
        {"type": "ContainersReady", "status": value, "lastProbeTime": None,
         "lastTransitionTime": started},
        {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
         "lastTransitionTime": started},
    ]


def _istio_proxy(image: str) -> Json:
    return {
        "name": "istio-proxy",
        "image": image,
        "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local",
                 "--proxyLogLevel=warning", "--proxyComponentLogLevel=misc:error",
                 "--log_output_level=default:info"],
        "ports": [{"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"}],
        "env": [{"name": "PILOT_CERT_PROVIDER", "value": "istiod"},
                {"name": "ISTIO_META_WORKLOAD_NAME", "value": "app"}],
        "resources": {"limits": {"cpu": "2", "memory": "1Gi"},
                      "requests": {"cpu": "100m", "memory": "128Mi"}},
        "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021,
                                       "scheme": "HTTP"},
                           "periodSeconds": 15, "timeoutSeconds": 3, "failureThreshold": 4},
        "securityContext": {"runAsUser": 1337, "runAsGroup": 1337, "runAsNonRoot": True,
                            "readOnlyRootFilesystem": True, "privileged": False},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }


def _istio_init(image: str) -> Json:
    return {
        "name": "istio-init",
        "image": image,
        "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
                 "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020",
                 "--log_output_level=default:info"],
        "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
                            "runAsUser": 0, "runAsNonRoot": False},
        "imagePullPolicy": "IfNotPresent",
    }


def pod(
    name: str,
    *,
    namespace: str = "shop",
    mesh: str = "plain",
    version: str = "1.22.3",
    workload: str | None = None,
    ip: str = "10.0.0.10",
    node: str = "node-a",
    port: int = 8080,
    port_name: str = "http",
    grpc_port: int | None = None,
    ready: bool = True,
    phase: str = "Running",
    started: str = STARTED,
    image_variant: str = "",
    status_image: str | None = None,
    spec_image: str | None = None,
    revision: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: str = "Deployment",
) -> Json:
    """One Pod. `mesh`: plain, istio, istio-native, istio-ambient, linkerd, linkerd-native.

    `workload` names the Deployment (ReplicaSet `<workload>-<hash>` as owner), or with
    `owner` StatefulSet / DaemonSet / None (a bare pod). `status_image` overrides the
    running image reported in status (e.g. a digest); `spec_image` the spec's.
    """
    workload = workload or name.rsplit("-", 2)[0]
    template_hash = _hash(workload)
    meta: Json = {
        "name": name,
        "generateName": f"{workload}-{template_hash}-",
        "namespace": namespace,
        "uid": _uid(namespace, name, started),
        "resourceVersion": "1",
        "creationTimestamp": started,
        "labels": {"app": workload, "pod-template-hash": template_hash, **(labels or {})},
        "annotations": dict(annotations or {}),
    }
    if owner == "Deployment":
        meta["ownerReferences"] = [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{workload}-{template_hash}",
            "uid": _uid(namespace, workload, "rs"), "controller": True,
            "blockOwnerDeletion": True,
        }]
    elif owner:
        meta["labels"].pop("pod-template-hash")
        meta["ownerReferences"] = [{
            "apiVersion": "apps/v1", "kind": owner, "name": workload,
            "uid": _uid(namespace, workload, owner), "controller": True,
            "blockOwnerDeletion": True,
        }]
    else:
        meta["labels"].pop("pod-template-hash")
        meta.pop("generateName")
    ports = [{"name": port_name, "containerPort": port, "protocol": "TCP"}]
    if grpc_port is not None:
        ports.append({"name": "grpc", "containerPort": grpc_port, "protocol": "TCP"})
    app: Json = {
        "name": workload,
        "image": f"registry.example.com/shop/{workload}:2024.05.1",
        "ports": ports,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    spec: Json = {
        "containers": [app],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "nodeName": node,
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    status: Json = {
        "phase": phase,
        "conditions": _conditions(ready, started),
        "hostIP": "192.0.2.10",
        "hostIPs": [{"ip": "192.0.2.10"}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": started,
        "containerStatuses": [_running(workload, app["image"], started, ready)],
        "qosClass": "Burstable",
    }
    if phase == "Pending":
        status = {"phase": "Pending", "conditions": _conditions(False, started)[-1:],
                  "qosClass": "Burstable"}
        if node:
            status.update(hostIP="192.0.2.10", startTime=started)
    if mesh.startswith("istio") and mesh != "istio-ambient":
        _inject_istio(meta, spec, status, version, image_variant, status_image, spec_image,
                      revision, native=mesh == "istio-native", ready=ready, started=started,
                      running=phase == "Running")
    elif mesh == "istio-ambient":
        meta["annotations"]["ambient.istio.io/redirection"] = "enabled"
    elif mesh.startswith("linkerd"):
        _inject_linkerd(meta, spec, status, version, status_image, spec_image,
                        native=mesh == "linkerd-native", ready=ready, started=started,
                        running=phase == "Running")
    elif mesh != "plain":
        raise ValueError(f"unknown mesh {mesh}")
    if not meta["annotations"]:
        meta.pop("annotations")
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}


def _inject_istio(
    meta: Json, spec: Json, status: Json, version: str, variant: str, status_image: str | None,
    spec_image: str | None, revision: str | None, *, native: bool, ready: bool, started: str,
    running: bool,
) -> None:
    image = spec_image or f"docker.io/istio/proxyv2:{version}{variant}"
    rev = revision or "default"
    meta["labels"].update({
        "security.istio.io/tlsMode": "istio",
        "service.istio.io/canonical-name": meta["labels"]["app"],
        "service.istio.io/canonical-revision": "latest",
    })
    if revision:
        meta["labels"]["istio.io/rev"] = revision
    meta["annotations"].update({
        "istio.io/rev": rev,
        "kubectl.kubernetes.io/default-container": meta["labels"]["app"],
        "kubectl.kubernetes.io/default-logs-container": meta["labels"]["app"],
        "prometheus.io/path": "/stats/prometheus",
        "prometheus.io/port": "15020",
        "prometheus.io/scrape": "true",
        "sidecar.istio.io/status": json.dumps({
            "initContainers": ["istio-init"] + (["istio-proxy"] if native else []),
            "containers": [] if native else ["istio-proxy"],
            "volumes": ["workload-socket", "credential-socket", "workload-certs",
                        "istio-envoy", "istio-data", "istio-podinfo", "istio-token",
                        "istiod-ca-cert"],
            "imagePullSecrets": None,
            "revision": rev,
        }, separators=(",", ":")),
    })
    proxy = _istio_proxy(image)
    shown = status_image or image
    spec["initContainers"] = [_istio_init(image)]
    if running:
        status["initContainerStatuses"] = [_completed("istio-init", image, started)]
    if native:
        proxy["restartPolicy"] = "Always"
        spec["initContainers"].append(proxy)
        if running:
            status["initContainerStatuses"].append(_running("istio-proxy", shown, started, ready))
    else:
        spec["containers"].append(proxy)
        if running:
            status["containerStatuses"].append(_running("istio-proxy", shown, started, ready))


def _inject_linkerd(
    meta: Json, spec: Json, status: Json, version: str, status_image: str | None,
    spec_image: str | None, *, native: bool, ready: bool, started: str, running: bool,
) -> None:
    image = spec_image or f"cr.l5d.io/linkerd/proxy:{version}"
    meta["labels"].update({
        "linkerd.io/control-plane-ns": "linkerd",
        "linkerd.io/proxy-deployment": meta["labels"]["app"],
        "linkerd.io/workload-ns": meta["namespace"],
    })
    meta["annotations"].update({
        "linkerd.io/created-by": f"linkerd/proxy-injector {version}",
        "linkerd.io/inject": "enabled",
        "linkerd.io/proxy-version": version,
        "linkerd.io/trust-root-sha256": hashlib.sha256(b"root").hexdigest(),
        "viz.linkerd.io/tap-enabled": "true",
    })
    proxy = {
        "name": "linkerd-proxy",
        "image": image,
        "ports": [{"name": "linkerd-proxy", "containerPort": 4143, "protocol": "TCP"},
                  {"name": "linkerd-admin", "containerPort": 4191, "protocol": "TCP"}],
        "env": [{"name": "LINKERD2_PROXY_LOG", "value": "warn,linkerd=info"}],
        "securityContext": {"runAsUser": 2102, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True},
        "imagePullPolicy": "IfNotPresent",
    }
    init: Json = {"name": "linkerd-init", "image": "cr.l5d.io/linkerd/proxy-init:v2.2.3",
            "args": ["--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140",
                     "--proxy-uid", "2102", "--inbound-ports-to-ignore", "4190,4191,4567,4568"]}
    shown = status_image or image
    spec["initContainers"] = [init]
    if running:
        status["initContainerStatuses"] = [_completed("linkerd-init", init["image"], started)]
    if native:
        proxy["restartPolicy"] = "Always"
        spec["initContainers"].append(proxy)
        if running:
            status["initContainerStatuses"].append(
                _running("linkerd-proxy", shown, started, ready))
    else:
        spec["containers"].insert(0, proxy)  # the injector puts the proxy first
        if running:
            status["containerStatuses"].insert(
                0, _running("linkerd-proxy", shown, started, ready))


def ztunnel_pod(node: str, version: str, *, suffix: str = "", started: str = STARTED,
                terminating: bool = False) -> Json:
    """A pod of Istio's ztunnel DaemonSet (its container is named istio-proxy)."""
    name = f"ztunnel-{_hash(node + suffix)[:5]}"
    image = f"docker.io/istio/ztunnel:{version}-distroless"
    meta: Json = {
        "name": name,
        "generateName": "ztunnel-",
        "namespace": "istio-system",
        "uid": _uid("istio-system", name, started),
        "resourceVersion": "1",
        "creationTimestamp": started,
        "labels": {"app": "ztunnel", "app.kubernetes.io/name": "ztunnel",
                   "controller-revision-hash": _hash(version)[:10],
                   "istio.io/dataplane-mode": "none", "pod-template-generation": "3",
                   "sidecar.istio.io/inject": "false"},
        "annotations": {"prometheus.io/port": "15020", "prometheus.io/scrape": "true",
                        "sidecar.istio.io/inject": "false"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ztunnel",
                             "uid": _uid("istio-system", "ztunnel"), "controller": True,
                             "blockOwnerDeletion": True}],
    }
    if terminating:
        meta["deletionTimestamp"] = started
        meta["deletionGracePeriodSeconds"] = 30
    return {
        "kind": "Pod", "apiVersion": "v1", "metadata": meta,
        "spec": {
            "containers": [{
                "name": "istio-proxy", "image": image,
                "args": ["proxy", "ztunnel"],
                "ports": [{"name": "ztunnel-stats", "containerPort": 15020, "protocol": "TCP"}],
                "securityContext": {"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN",
                                                             "NET_RAW"]}},
            }],
            "nodeName": node, "serviceAccountName": "ztunnel", "priorityClassName":
            "system-node-critical", "terminationGracePeriodSeconds": 30,
        },
        "status": {
            "phase": "Running", "conditions": _conditions(True, started),
            "hostIP": "192.0.2.10", "podIP": "10.0.9.1", "podIPs": [{"ip": "10.0.9.1"}],
            "startTime": started,
            "containerStatuses": [_running("istio-proxy", image, started)],
            "qosClass": "Burstable",
        },
    }


def _deployment(name: str, namespace: str, labels: Json, containers: list[Json]) -> Json:
    return {
        "kind": "Deployment", "apiVersion": "apps/v1",
        "metadata": {"name": name, "namespace": namespace, "uid": _uid(namespace, name),
                     "resourceVersion": "1", "generation": 4,
                     "creationTimestamp": "2024-01-10T08:00:00Z", "labels": labels,
                     "annotations": {"deployment.kubernetes.io/revision": "4"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {k: v for k, v in labels.items() if k == "app"}},
            "template": {"metadata": {"labels": dict(labels)},
                         "spec": {"containers": containers, "serviceAccountName": name}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "100%"}},
        },
        "status": {"observedGeneration": 4, "replicas": 2, "updatedReplicas": 2,
                   "readyReplicas": 2, "availableReplicas": 2},
    }


def istiod(version: str, *, revision: str | None = None, variant: str = "") -> Json:
    """The istiod Deployment (named istiod-<revision> for a revisioned install)."""
    name = f"istiod-{revision}" if revision else "istiod"
    labels = {"app": "istiod", "istio": "pilot", "istio.io/rev": revision or "default",
              "install.operator.istio.io/owning-resource": "unknown",
              "operator.istio.io/component": "Pilot"}
    return _deployment(name, "istio-system", labels, [{
        "name": "discovery", "image": f"docker.io/istio/pilot:{version}{variant}",
        "args": ["discovery", "--monitoringAddr=:15014", "--log_output_level=default:info",
                 "--domain", "cluster.local", "--keepaliveMaxServerConnectionAge", "30m"],
        "ports": [{"containerPort": 8080, "protocol": "TCP"},
                  {"containerPort": 15010, "protocol": "TCP"},
                  {"containerPort": 15017, "protocol": "TCP"}],
    }])


def linkerd_destination(version: str) -> Json:
    labels = {"app.kubernetes.io/name": "destination", "app.kubernetes.io/part-of": "Linkerd",
              "app.kubernetes.io/version": version,
              "linkerd.io/control-plane-component": "destination",
              "linkerd.io/control-plane-ns": "linkerd"}
    return _deployment("linkerd-destination", "linkerd", labels, [
        {"name": "linkerd-proxy", "image": f"cr.l5d.io/linkerd/proxy:{version}"},
        {"name": "destination", "image": f"cr.l5d.io/linkerd/controller:{version}",
         "args": ["destination", "-addr=:8086", "-controller-namespace=linkerd"]},
        {"name": "sp-validator", "image": f"cr.l5d.io/linkerd/controller:{version}"},
        {"name": "policy", "image": f"cr.l5d.io/linkerd/policy-controller:{version}"},
    ])


def terminating(obj: Json, at: str = "2024-05-02T10:00:00Z") -> Json:
    """The same object as the API shows it once its deletion started."""
    out = copy.deepcopy(obj)
    out["metadata"]["deletionTimestamp"] = at
    out["metadata"]["deletionGracePeriodSeconds"] = 30
    return out


def namespace(name: str, *, labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None) -> Json:
    """A Namespace as `kubectl get ns -o json` shows it (labels carry injection, revision)."""
    return {
        "kind": "Namespace", "apiVersion": "v1",
        "metadata": {
            "name": name, "uid": _uid("ns", name), "resourceVersion": "1",
            "creationTimestamp": STARTED,
            "labels": {"kubernetes.io/metadata.name": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }
