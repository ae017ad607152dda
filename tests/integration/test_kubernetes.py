"""KubernetesSource against a fake API server speaking the real list/watch protocol.

kubernetes-asyncio talks to `tests.servers.kube_api.FakeKubeApi` through a generated
kubeconfig (or in-cluster settings over TLS): list, watch with resourceVersion, bookmarks,
410 Gone and relist, backoff, 401 credential reload, label selectors and pages.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from probes.discovery.kubernetes import KubernetesSource, WatchTiming
from probes.errors import BadInput, SourceUnavailable
from probes.spec import KubernetesSpec, VersionSource
from probes.types import Endpoint
from tests.servers import kube_pods as kp
from tests.servers.kube_api import FakeKubeApi
from tests.servers.lateness import LoopLateness
from tests.servers.tls import make_cert

FAST = WatchTiming(
    watch_timeout_s=(60.0, 60.0), backoff_initial_s=0.05, backoff_max_s=0.4, settle_s=0.0,
    connect_timeout_s=2.0, read_timeout_s=10.0,
)
GENERIC = VersionSource(label="proxy.example.com/version")


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    async with FakeKubeApi() as server:
        yield server


def _spec(api: FakeKubeApi, tmp_path: Path, **kw: object) -> KubernetesSpec:
    kw.setdefault("mesh", "generic")
    if kw["mesh"] == "generic":
        kw.setdefault("version_from", GENERIC)
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    return KubernetesSpec(kubeconfig=str(kubeconfig), **kw)  # type: ignore[arg-type]


def _app(name: str, version: str = "1.0", **kw: object) -> dict[str, object]:
    labels = {"proxy.example.com/version": version, **kw.pop("labels", {})}  # type: ignore[dict-item]
    return kp.pod(name, labels=labels, **kw)  # type: ignore[arg-type]


async def _next(snapshots: AsyncIterator[Sequence[Endpoint]]) -> list[str]:
    async with asyncio.timeout(5):
        return [e.name for e in await anext(snapshots)]


async def test_list_then_watch_follows_deletes_and_new_ready_pods(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.create(_app("checkout-x-1", ip="127.0.0.11"))
    api.create(_app("checkout-x-2", ip="127.0.0.12"))
    api.create(_app("checkout-x-3", ip="127.0.0.13", ready=False))
    source = KubernetesSource(_spec(api, tmp_path), timing=FAST)
    snapshots = source.snapshots()
    try:
        assert await _next(snapshots) == ["shop/checkout-x-1", "shop/checkout-x-2"]
        loop = asyncio.get_running_loop()
        async with LoopLateness() as late:
            started = loop.time()
            api.delete("shop", "checkout-x-1", graceful=True)  # deletionTimestamp: draining
            assert await _next(snapshots) == ["shop/checkout-x-2"]
            took = loop.time() - started
        # Promptly: one watch event on this loop (the fake API's too); no relist (asserted
        # below). The second only tells that from a wait for a window or the watch's timeout
        # (60 s); this loop's lateness, measured over the same span, comes on top.
        assert took < 1.0 + late.max_s, (took, late.max_s)
        counted = {p.name for p in source.state().pods if p.counted}
        assert counted == {"checkout-x-2", "checkout-x-3"}  # not ready still counts
        api.finish_delete("shop", "checkout-x-1")
        api.create(_app("checkout-x-4", ip="127.0.0.14", phase="Pending", ready=False))
        api.modify("shop", "checkout-x-3", _make_ready)
        assert await _next(snapshots) == ["shop/checkout-x-2", "shop/checkout-x-3"]
        assert len(api.lists()) == 1  # all of it from one watch, no relist
        stats = source.stats()["pods"]
        assert stats.lists == 1 and stats.expired == 0 and stats.events == 4
        assert source.health() == (True, "kubernetes: watching 3 pods")
    finally:
        await snapshots.aclose()


def _make_ready(pod: dict[str, object]) -> None:
    for condition in pod["status"]["conditions"]:  # type: ignore[index]
        condition["status"] = "True"


async def test_watch_resumes_from_the_last_resource_version(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.create(_app("checkout-x-1", ip="127.0.0.11"))
    api.create(_app("checkout-x-2", ip="127.0.0.12"))
    source = KubernetesSource(_spec(api, tmp_path), timing=FAST)
    snapshots = source.snapshots()
    try:
        await _next(snapshots)
        async with asyncio.timeout(5):
            await api.wait_for_watches(1)
        (first,) = api.watches()
        assert first.query["resourceVersion"] == str(api.rv)  # the list's
        assert first.query["allowWatchBookmarks"].lower() == "true"
        assert int(first.query["timeoutSeconds"]) == 60
        # The server ends the watch (its timeout); a pod is deleted before we are back.
        api.hold()
        api.end_watches()
        api.delete("shop", "checkout-x-1")
        last_rv = api.rv
        api.release()
        assert await _next(snapshots) == ["shop/checkout-x-2"]  # replayed, not missed
        resumed = api.watches()[-1]
        assert int(resumed.query["resourceVersion"]) == last_rv - 1  # where we left off
        assert len(api.lists()) == 1  # resumed, never relisted
        assert source.stats()["pods"].expired == 0
    finally:
        await snapshots.aclose()


async def test_410_gone_relists_and_drops_pods_deleted_meanwhile(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    for i in range(3):
        api.create(_app(f"checkout-x-{i}", ip=f"127.0.0.{11 + i}"))
    source = KubernetesSource(_spec(api, tmp_path), timing=FAST)
    snapshots = source.snapshots()
    try:
        assert len(await _next(snapshots)) == 3
        api.hold()
        api.end_watches()
        api.delete("shop", "checkout-x-1")  # nobody watching: only a relist can tell
        api.advance(5)
        api.compact()  # our resourceVersion is now older than the server keeps
        api.release()
        assert await _next(snapshots) == ["shop/checkout-x-0", "shop/checkout-x-2"]
        stats = source.stats()["pods"]
        assert stats.expired == 1 and stats.lists == 2
        assert stats.resource_version == str(api.rv)
        assert len(api.lists()) == 2
    finally:
        await snapshots.aclose()


async def test_bookmarks_advance_the_resource_version_so_resume_needs_no_relist(
    tmp_path: Path,
) -> None:
    async with FakeKubeApi(bookmark_every_s=0.05) as api:
        api.create(_app("checkout-x-1", ip="127.0.0.11"))
        source = KubernetesSource(_spec(api, tmp_path), timing=FAST)
        snapshots = source.snapshots()
        try:
            await _next(snapshots)
            listed_rv = api.rv
            api.advance(7)  # other kinds changed: pods saw no event
            async with asyncio.timeout(5):
                await api.wait_for_bookmark(api.rv)
            api.hold()
            api.compact()
            api.end_watches()
            api.release()
            async with asyncio.timeout(5):
                await api.wait_for_watches(2)
            resumed = api.watches()[-1]
            assert int(resumed.query["resourceVersion"]) == listed_rv + 7
            stats = source.stats()["pods"]
            assert stats.bookmarks >= 1 and stats.expired == 0 and stats.lists == 1
        finally:
            await snapshots.aclose()


async def test_errors_back_off_exponentially_then_recover(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.create(_app("checkout-x-1", ip="127.0.0.11"))
    api.fail_next(3, status=503)
    source = KubernetesSource(_spec(api, tmp_path), timing=FAST)
    snapshots = source.snapshots()
    try:
        assert await _next(snapshots) == ["shop/checkout-x-1"]
        attempts = [r.at for r in api.requests if not r.watch]
        assert len(attempts) == 4
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        # jittered doubling from 50 ms: [25, 50], [50, 100], [100, 200] ms
        assert gaps[2] > gaps[0] and gaps[0] >= 0.02
        stats = source.stats()["pods"]
        assert stats.errors == 3 and stats.last_error == "" and stats.failing_since is None
        assert source.health()[0]
    finally:
        await snapshots.aclose()


async def test_401_reloads_rotated_credentials(api: FakeKubeApi, tmp_path: Path) -> None:
    api.create(_app("checkout-x-1", ip="127.0.0.11"))
    api.token = "token-1"
    spec = _spec(api, tmp_path)
    source = KubernetesSource(spec, timing=FAST)
    snapshots = source.snapshots()
    try:
        await _next(snapshots)
        async with asyncio.timeout(5):
            await api.wait_for_watches(1)
        api.token = "token-2"  # rotated: the client still holds token-1
        api.kubeconfig(tmp_path / "kubeconfig", token="token-2")
        api.end_watches()
        async with asyncio.timeout(5):
            await api.wait_for_watches(2)  # never, if the old token were kept
            async for _ in source.inventory_updates():  # each change of state, no polling
                if source.health()[0]:
                    break
        assert [r.status for r in api.requests].count(401) == 1
        stats = source.stats()["pods"]
        assert stats.failing_since is None and stats.lists == 1 and stats.watches == 3
    finally:
        await snapshots.aclose()


async def test_in_cluster_service_account_over_tls(tmp_path: Path) -> None:
    cert = make_cert(tmp_path)
    async with FakeKubeApi(ssl_context=cert.server_context(), token="sa-token") as api:
        api.create(_app("checkout-x-1", ip="127.0.0.11"))
        sa = tmp_path / "sa"
        sa.mkdir()
        (sa / "token").write_text("sa-token")
        (sa / "ca.crt").write_text(cert.cert.read_text())
        environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
        spec = KubernetesSpec(mesh="generic", version_from=GENERIC)
        source = KubernetesSource(spec, timing=FAST, environ=environ, service_account_dir=str(sa))
        state = await source.list_once()
        assert [p.name for p in state.pods] == ["checkout-x-1"] and state.synced
        assert api.url.startswith("https://")


async def test_namespaces_selector_and_pods_leaving_the_selector(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.create(_app("checkout-x-1", ip="127.0.0.11"))
    api.create(_app("cart-x-1", ip="127.0.0.12"))
    api.create(_app("checkout-x-9", ip="127.0.0.13", namespace="staging"))
    spec = _spec(api, tmp_path, namespaces=("shop", "payments"), selector="app in (checkout)",
                 labels=("app",))
    source = KubernetesSource(spec, timing=FAST)
    snapshots = source.snapshots()
    try:
        assert await _next(snapshots) == ["shop/checkout-x-1"]
        paths = {r.path for r in api.lists()}
        assert paths == {"/api/v1/namespaces/shop/pods", "/api/v1/namespaces/payments/pods"}
        assert all(r.query["labelSelector"] == "app in (checkout)" for r in api.requests)
        api.create(_app("checkout-x-2", ip="127.0.0.14", namespace="payments"))
        assert await _next(snapshots) == ["payments/checkout-x-2", "shop/checkout-x-1"]
        api.modify("shop", "checkout-x-1", lambda p: p["metadata"]["labels"].update(app="old"))
        assert await _next(snapshots) == ["payments/checkout-x-2"]  # a DELETED for us
        assert set(source.stats()) == {"pods/shop", "pods/payments"}
    finally:
        await snapshots.aclose()


async def test_ambient_pods_follow_the_ztunnel_on_their_node(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.create(kp.ztunnel_pod("node-a", "1.22.1", started="2024-05-01T09:00:00Z"))
    api.create(kp.pod("cart-x-1", mesh="istio-ambient", ip="127.0.0.11", node="node-a"))
    api.create(kp.pod("cart-x-2", mesh="istio-ambient", ip="127.0.0.12", node="node-z"))
    api.create(kp.pod("checkout-x-1", mesh="istio", version="1.22.3", ip="127.0.0.13"))
    api.create(kp.istiod("1.22.3"))
    source = KubernetesSource(_spec(api, tmp_path, mesh="istio", namespaces=("shop",)),
                              timing=FAST)
    snapshots = source.snapshots()
    try:
        async with asyncio.timeout(5):
            endpoints = {e.name: e for e in await anext(snapshots)}
        assert endpoints["shop/cart-x-1"].labels["proxy_version"] == "1.22.1"
        assert endpoints["shop/cart-x-2"].labels["proxy_version"] == "unknown"  # no ztunnel
        assert endpoints["shop/checkout-x-1"].labels["proxy_version"] == "1.22.3"
        # ztunnel's DaemonSet rolls: a new pod on node-a, the old one terminating.
        api.create(kp.ztunnel_pod("node-a", "1.23.0", suffix="new",
                                  started="2024-05-02T09:00:00Z"))
        old = next(p for p in api.objects() if p["metadata"]["labels"].get("app") == "ztunnel"
                   and "1.22.1" in p["spec"]["containers"][0]["image"])
        api.delete("istio-system", old["metadata"]["name"], graceful=True)
        async with asyncio.timeout(5):
            endpoints = {e.name: e for e in await anext(snapshots)}
        assert endpoints["shop/cart-x-1"].labels["proxy_version"] == "1.23.0"
        ambient = next(p for p in source.state().pods if p.name == "cart-x-1")
        assert ambient.proxy.mode == "ambient" and "node-a" in ambient.proxy.source
        (plane,) = source.state().control_planes
        assert plane.version == "1.22.3"
    finally:
        await snapshots.aclose()


async def test_configured_control_plane_skips_discovery_and_rbac_gaps_do_not_block(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.create(kp.pod("checkout-x-1", mesh="istio", version="1.22.3", ip="127.0.0.11"))
    api.denied.add("/api/v1/namespaces/istio-system")  # no RBAC for the mesh namespace
    spec = _spec(api, tmp_path, mesh="istio", control_plane_version="1.23.0")
    source = KubernetesSource(spec, timing=FAST)
    snapshots = source.snapshots()
    try:
        assert await _next(snapshots) == ["shop/checkout-x-1"]
        assert not api.lists("/deployments")
        (plane,) = source.state().control_planes
        assert (plane.version, plane.source) == ("1.23.0", "config")
        ok, message = source.health()
        assert ok and "ztunnel: HTTP 403" in message
    finally:
        await snapshots.aclose()


async def test_inventory_updates_are_shared_and_coalesced(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.create(_app("checkout-x-1", ip="127.0.0.11", version="1.0"))
    source = KubernetesSource(_spec(api, tmp_path), timing=FAST)
    snapshots = source.snapshots()
    first, second = source.inventory_updates(), source.inventory_updates()
    try:
        await _next(snapshots)
        async with asyncio.timeout(5):
            a, b = await anext(first), await anext(second)
        assert a.synced and [p.proxy.version for p in a.pods] == ["1.0"] and b.pods == a.pods
        for i in range(5):  # a burst while nobody reads
            api.create(_app(f"checkout-x-{i + 2}", ip=f"127.0.0.{20 + i}", version="2.0"))
        await _next(snapshots)
        async with asyncio.timeout(5):
            latest = await anext(first)
        # Coalesced: at most one state per change of the burst, so five more reads at most.
        for _ in range(5):
            if len(latest.pods) == 6:
                break
            async with asyncio.timeout(5):
                latest = await anext(first)
        assert len(latest.pods) == 6, latest.pods
        assert sorted({p.proxy.version for p in latest.pods}) == ["1.0", "2.0"]
    finally:
        await first.aclose()
        await second.aclose()
        await snapshots.aclose()


async def test_paged_lists(api: FakeKubeApi, tmp_path: Path) -> None:
    for i in range(5):
        api.create(_app(f"checkout-x-{i}", ip=f"127.0.0.{11 + i}"))
    timing = WatchTiming(page_size=2, settle_s=0.0)
    state = await KubernetesSource(_spec(api, tmp_path), timing=timing).list_once()
    assert len(state.pods) == 5
    pages = api.lists()
    assert [r.query.get("limit") for r in pages] == ["2", "2", "2"]
    assert "continue" not in pages[0].query and all("continue" in r.query for r in pages[1:])


async def test_list_once_maps_an_unreachable_api_to_source_unavailable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    async with FakeKubeApi() as api:
        api.port = port  # the kubeconfig names a port nobody listens on
        spec = _spec(api, tmp_path)
    with pytest.raises(SourceUnavailable, match="cannot connect") as info:
        await KubernetesSource(spec, timing=FAST).list_once()
    assert info.value.exit_code == 4 and "\n" not in str(info.value)


async def test_a_broken_kubeconfig_is_bad_input(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    spec = KubernetesSpec(mesh="generic", version_from=GENERIC, kubeconfig=str(broken))
    with pytest.raises(BadInput, match="kubernetes kubeconfig"):
        await KubernetesSource(spec).list_once()
    snapshots = KubernetesSource(spec).snapshots()
    with pytest.raises(BadInput):
        await anext(snapshots)


async def test_an_unreadable_pod_is_skipped_not_fatal(
    api: FakeKubeApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = _app("broken-x-1", ip="127.0.0.10")
    broken["metadata"]["ownerReferences"] = "not a list"  # type: ignore[index]
    api.create(broken)
    api.create(_app("checkout-x-1", ip="127.0.0.11"))
    state = await KubernetesSource(_spec(api, tmp_path), timing=FAST).list_once()
    assert [p.name for p in state.pods] == ["checkout-x-1"]
    assert "cannot read shop/broken-x-1" in caplog.text
