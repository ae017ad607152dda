"""`skewprobe inventory` end to end: live from the fake API (JSON and text), from a store."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes._parsing import rfc3339
from probes.cli.inventory import STALE_LOOKBACK_S, add_inventory_parser, run_inventory
from probes.errors import BadInput, SkewprobeError, SourceUnavailable, StoreError
from probes.inventory import CONTROL_PLANE_EVENT
from probes.store import Event, InventoryRow, Store
from probes.types import split_pair
from tests.servers import kube_pods as kp
from tests.servers.kube_api import FakeKubeApi, served_in_thread
from tests.servers.report_store import RELAY_NEW, RELAY_OLD, STALE_FROM_MIN, T0, write_relay

CONFIG = """\
targets:
  kubernetes:
    mesh: istio
    namespaces: [shop, finance]
    port: http
    kubeconfig: {kubeconfig}
paths:
  - name: checkout
    http: {{path: /api/checkout}}
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKubeApi, Path]]:
    """The fake API on its own thread and loop (the CLI runs its own `asyncio.run`)."""
    api = FakeKubeApi()
    for obj in (
        kp.pod("checkout-x-1", mesh="istio", version="1.22.3", ip="10.0.0.1"),
        kp.pod("checkout-x-2", mesh="istio-native", version="1.22.3", ip="10.0.0.2"),
        kp.pod("cart-x-1", mesh="istio", version="1.21.2", ip="10.0.0.3",
               started="2024-04-20T10:00:00Z"),
        kp.pod("ledger-x-1", mesh="istio", version="1.20.1", ip="10.0.0.4", namespace="finance",
               started="2024-03-01T10:00:00Z"),
        kp.pod("batch-x-1", ip="10.0.0.5", namespace="finance"),
        kp.pod("checkout-x-9", mesh="istio", version="1.19.0", namespace="staging"),
        kp.istiod("1.22.3"),
    ):
        api.create(obj)
    with served_in_thread(api, tmp_path, CONFIG) as config:
        yield api, config


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="skewprobe")
    add_inventory_parser(parser.add_subparsers(dest="command"))
    return run_inventory(parser.parse_args(["inventory", *argv]))


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = _run(*argv, "--json")
    return code, json.loads(capsys.readouterr().out)


def test_live_inventory_json(cluster: tuple[FakeKubeApi, Path],
                             capsys: pytest.CaptureFixture[str]) -> None:
    _, config = cluster
    code, report = _json(capsys, "--config", str(config))
    assert code == 0 and report["source"] == "kubernetes" and report["mesh"] == "istio"
    assert report["pods"] == 5 and report["probed"] == 5  # staging is not configured
    assert report["versions"] == {"1.22.3": 2, "1.21.2": 1, "1.20.1": 1, "none": 1}
    assert report["newest"] == "1.22.3" and report["fraction_on_newest"] == 0.5
    assert [t["workload"] for t in report["long_tail"]] == ["deployment/ledger", "deployment/cart"]
    assert report["control_plane"]["versions"] == [
        {"version": "1.22.3", "revision": "default", "source": "deployment istio-system/istiod"}
    ]
    (outside,) = report["skew"]["pods"]
    assert (outside["namespace"], outside["pod"], outside["proxy_version"]) == (
        "finance", "ledger-x-1", "1.20.1")
    assert _run("--config", str(config), "--fail-on-skew", "--json") == 1
    capsys.readouterr()


def test_live_inventory_what_if_and_text(cluster: tuple[FakeKubeApi, Path],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _, config = cluster
    code, report = _json(capsys, "--config", str(config), "--control-plane", "1.23.0")
    assert code == 0
    assert {p["pod"] for p in report["skew"]["pods"]} == {"ledger-x-1", "cart-x-1"}
    assert report["control_plane"]["versions"][0]["source"] == "config"
    assert _run("--config", str(config)) == 0
    text = capsys.readouterr().out
    assert "inventory: 5 pods (istio, live at" in text
    assert "proxy versions: 1.22.3: 2 (newest), 1.21.2: 1, 1.20.1: 1, none: 1 (no proxy)" in text
    assert "skew: 1 pod OUTSIDE the supported skew" in text
    tail = text.split("long tail:")[1].splitlines()
    assert tail[2].split()[:3] == ["finance", "deployment/ledger", "1/1"]


def test_unreachable_api_is_exit_4(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    config = tmp_path / "skewprobe.yaml"
    config.write_text(CONFIG.format(kubeconfig=kubeconfig))
    with pytest.raises(SourceUnavailable) as info:
        _run("--config", str(config))
    assert info.value.exit_code == 4 and "\n" not in str(info.value)


def _store(path: Path) -> None:
    with Store.open(path) as store:
        store.write_inventory(1000.0, [InventoryRow("shop", "deployment/cart", "1.21.2", 4, 900.0)])
        store.write_events([Event(CONTROL_PLANE_EVENT, 1000.0, detail={"versions": [
            {"version": "1.21.0", "revision": "default", "source": "deployment"},
        ]})])
        store.write_inventory(2000.0, [
            InventoryRow("shop", "deployment/cart", "1.22.3", 3, 500.0),
            InventoryRow("shop", "deployment/cart", "1.21.2", 1, 1900.0),
            InventoryRow("finance", "deployment/ledger", "1.20.1", 2, 86400.0),
        ])
        store.write_events([Event(CONTROL_PLANE_EVENT, 1500.0, detail={"versions": [
            {"version": "1.22.3", "revision": "default", "source": "deployment"},
        ]})])


def test_inventory_from_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "probe.db"
    _store(path)
    code, latest = _json(capsys, "--store", str(path))
    assert code == 0 and latest["source"] == "store" and latest["at"] == "1970-01-01T00:33:20Z"
    assert latest["versions"] == {"1.22.3": 3, "1.21.2": 1, "1.20.1": 2}
    assert latest["control_plane"]["versions"][0]["version"] == "1.22.3"  # the recorded one
    assert latest["skew"]["outside"] == 2 and latest["long_tail"][0]["oldest_age_s"] == 86400.0
    code, earlier = _json(capsys, "--store", str(path), "--at", "1970-01-01T00:25:00Z")
    assert earlier["versions"] == {"1.21.2": 4}
    assert earlier["control_plane"]["versions"][0]["version"] == "1.21.0"
    code, planned = _json(capsys, "--store", str(path), "--control-plane", "1.23.0")
    assert planned["skew"]["outside"] == 3  # 1.21.2 and 1.20.1 fall out
    assert latest["stale_routing"] is None  # no relay paths: nothing to say, and no line
    _run("--store", str(path))
    assert "stale routing" not in capsys.readouterr().out


def test_stale_routing_is_shown_next_to_the_skew_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A control plane moved past the old callers (1.22.0 with one minor of skew leaves
    1.20.3 outside), and their relay calls routed to pods that were gone from minute 10:
    the share each caller version saw, counted from the store's relay windows."""
    path = tmp_path / "relay.db"
    end = T0 + 20 * 60
    with Store.open(path) as store:
        write_relay(store, T0, minutes=20)
        for t in (T0, end):
            store.write_inventory(t, [
                InventoryRow("platform-test", "deployment/relay", RELAY_OLD, 2, 900.0),
                InventoryRow("platform-test", "deployment/relay", RELAY_NEW, 2, 300.0)])
        store.write_events([Event(CONTROL_PLANE_EVENT, T0, detail={"versions": [
            {"version": "1.22.0", "revision": "default", "source": "deployment"}]})])
        windows = store.read_windows(since=end - STALE_LOOKBACK_S, until=end)
    expected = {}
    for caller in (RELAY_OLD, RELAY_NEW):
        mine = [w for w in windows if split_pair(w.cohort)[0] == caller]  # type: ignore[index]
        expected[caller] = (sum(w.outcomes.get("stale_endpoint", 0) for w in mine),
                            sum(w.requests for w in mine))
    at = rfc3339(end)
    code, doc = _json(capsys, "--store", str(path), "--at", at)
    assert code == 0 and doc["skew"]["outside"] == 2
    seen = {c["caller"]: c for c in doc["stale_routing"]["callers"]}
    for caller, (stale, calls) in expected.items():
        assert (seen[caller]["stale"], seen[caller]["calls"]) == (stale, calls)
    assert expected[RELAY_OLD][0] > 0 and expected[RELAY_NEW][0] == 0
    assert seen[RELAY_OLD]["verdict"] == "fail"
    _run("--store", str(path), "--at", at)
    lines = capsys.readouterr().out.splitlines()
    skew = next(i for i, line in enumerate(lines) if line.startswith("skew: 2 pods OUTSIDE"))
    stale, calls = expected[RELAY_OLD]
    share = f"{100 * stale / calls:.1f} %"
    assert lines[-1] == (f"stale routing seen from callers on {RELAY_OLD}: {share} of relay "
                         f"calls ({stale:,} of {calls:,} from "
                         f"{rfc3339(end - STALE_LOOKBACK_S)} to {at}): fail")
    assert skew < len(lines) - 1 and not any(f"callers on {RELAY_NEW}" in x for x in lines)
    # Before the old callers' routing went stale: none seen, and said so.
    before = rfc3339(T0 + 60 * STALE_FROM_MIN)
    _run("--store", str(path), "--at", before)
    assert capsys.readouterr().out.splitlines()[-1].startswith("stale routing: none seen in ")


def test_store_errors_and_usage(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as missing:
        _run("--store", str(tmp_path / "nope.db"))
    assert missing.value.exit_code == 4
    Store.open(tmp_path / "empty.db").close()
    with pytest.raises(SourceUnavailable, match="no inventory snapshot"):
        _run("--store", str(tmp_path / "empty.db"))
    with pytest.raises(BadInput, match="--config FILE"):
        _run()
    static = tmp_path / "static.yaml"
    static.write_text("targets: {static: [{address: '127.0.0.1:1'}]}\n"
                      "paths: [{name: a, http: {path: /}}]\n")
    with pytest.raises(BadInput, match=r"no targets\.kubernetes") as info:
        _run("--config", str(static))
    assert isinstance(info.value, SkewprobeError) and info.value.exit_code == 2
