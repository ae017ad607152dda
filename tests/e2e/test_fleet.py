"""The local fleet: distinct loopback pods, a rollout that really restarts listeners, the
endpoints file, the events, and `python -m targets.fleet`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from probes.errors import BadInput
from targets.fleet import EventKind, Fleet, pod_hosts
from targets.profile import load_profiles
from targets.proto import target_pb2, target_pb2_grpc
from tests.servers.grpc_streams import read_to_the_end

ROOT = Path(__file__).resolve().parents[2]
PROFILES = load_profiles(ROOT / "targets" / "examples" / "profiles.yaml")


def base_host() -> str:
    """A random block of 127/8 so parallel test runs do not share pod addresses."""
    return f"127.{random.randint(64, 250)}.{random.randint(0, 255)}.1"


def read_endpoints(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    endpoints = doc["endpoints"]
    assert isinstance(endpoints, list)
    return endpoints


async def test_pods_have_own_addresses_same_ports_and_labels(tmp_path: Path) -> None:
    file = tmp_path / "endpoints.json"
    fleet = Fleet(pods=4, version="1.20.3", profiles=PROFILES, base_host=base_host(),
                  namespace="shop", service="checkout", endpoints_file=file)
    before = time.time()
    async with fleet:
        published = read_endpoints(file)
        hosts = {p.host for p in fleet.pods}
        assert len(hosts) == 4 and all(h.startswith("127.") for h in hosts)
        assert len({(p.http_port, p.grpc_port) for p in fleet.pods}) == 1
        first = fleet.pods[0]
        # Each pod's start, as discovery labels a Kubernetes pod (the verdict's warm-up).
        started = published[0]["labels"].pop("start_time")
        # The label has milliseconds, truncated: compare whole milliseconds.
        started_ms = round(datetime.fromisoformat(started).timestamp() * 1000)
        assert math.floor(before * 1000) <= started_ms <= time.time() * 1000
        assert published[0] == {
            "name": "checkout-0", "address": f"{first.host}:{first.http_port}",
            "ports": {"http": first.http_port, "grpc": first.grpc_port},
            "labels": {"pod": "checkout-0", "namespace": "shop", "service": "checkout",
                       "proxy_version": "1.20.3"},
        }
        async with httpx.AsyncClient() as client:
            for entry in published:
                r = await client.get(f"http://{entry['address']}/api/catalog")
                assert r.json()["pod"] == entry["name"]
    assert read_endpoints(file) == []  # a stopped fleet publishes no endpoints


async def test_restart_closes_held_connections_and_new_ones_see_the_new_version(
    tmp_path: Path,
) -> None:
    file = tmp_path / "endpoints.json"
    fleet = Fleet(pods=2, version="1.20.3", profiles=PROFILES, base_host=base_host(),
                  endpoints_file=file, drain_s=0.5)
    async with fleet:
        pod = fleet.pods[0]
        # An HTTP/1.1 keep-alive connection, idle, held open across the restart.
        reader, writer = await asyncio.open_connection(pod.host, pod.http_port)
        writer.write(b"GET /api/checkout HTTP/1.1\r\nhost: p\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b"x-proxy-version: 1.20.3" in head
        async with grpc.aio.insecure_channel(f"{pod.host}:{pod.grpc_port}") as channel:
            opened = time.monotonic()
            stream = target_pb2_grpc.TargetStub(channel).Subscribe(
                target_pb2.SubscribeRequest(interval_ms=50))
            await stream.read()
            restart = asyncio.create_task(fleet.restart(0, "1.21.0"))
            started = await fleet.wait_for(lambda e: e.kind == EventKind.RESTART_STARTED)
            assert started.pod == pod.pod
            # the restarting pod left the endpoint list before its listener closed
            assert [e["name"] for e in read_endpoints(file)] == [fleet.pods[1].pod]
            await restart
            # the held connection was closed by the restart (EOF after the body)
            rest = await asyncio.wait_for(reader.read(), 5)
            assert rest.endswith(b"}")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await read_to_the_end(stream, interval_s=0.05, opened_at=opened)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        new = fleet.pods[0]
        assert new is not pod and (new.host, new.http_port) == (pod.host, pod.http_port)
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://{new.host}:{new.http_port}/api/checkout")
        assert r.headers["x-proxy-version"] == "1.21.0"
        assert r.headers["x-envoy-attempt-count"] == "2"
        versions = {e["name"]: e["labels"]["proxy_version"] for e in read_endpoints(file)}
        assert versions == {new.pod: "1.21.0", fleet.pods[1].pod: "1.20.3"}
        # The restarted pod keeps its name and starts anew: its start_time is the restart's.
        starts = {e["name"]: e["labels"]["start_time"] for e in read_endpoints(file)}
        finished = fleet.history()[-1]
        assert finished.kind == EventKind.RESTART_FINISHED
        assert starts[new.pod] > starts[fleet.pods[1].pod]
        assert datetime.fromisoformat(starts[new.pod]).timestamp() <= finished.at + 1e-3
        assert fleet.version_counts() == {"1.20.3": 1, "1.21.0": 1}


async def test_rollout_order_batches_interval_and_events(tmp_path: Path) -> None:
    fleet = Fleet(pods=5, version="1.20.3", profiles=PROFILES, base_host=base_host(),
                  grpc_port=None, drain_s=0.0)
    async with fleet:
        seen: list[str] = []

        async def watch() -> None:
            async for event in fleet.events():
                seen.append(event.kind)
                if event.kind == EventKind.ROLLOUT_FINISHED:
                    return

        watcher = asyncio.create_task(watch())
        await fleet.rollout("1.21.0", interval_s=0.3, batch_size=2, order="reverse")
        await asyncio.wait_for(watcher, 5)
        history = fleet.history()
        starts = [e for e in history if e.kind == EventKind.RESTART_STARTED]
        assert [e.pod for e in starts] == [f"target-{i}" for i in (4, 3, 2, 1, 0)]
        assert [e.kind for e in history] == seen
        # two pods per batch: both start before either finishes
        assert seen[:5] == ["rollout_started", "restart_started", "restart_started",
                            "restart_finished", "restart_finished"]
        gaps = [starts[i].at - starts[i - 2].at for i in (2, 4)]
        assert all(0.29 <= g < 1.5 for g in gaps), gaps
        assert fleet.version_counts() == {"1.21.0": 5}
        assert all(e.labels["proxy_version"] == "1.21.0" for e in fleet.endpoints())


async def test_endpoints_file_is_replaced_atomically(tmp_path: Path) -> None:
    file = tmp_path / "endpoints.json"
    fleet = Fleet(pods=30, version="1.20.3", profiles=PROFILES, base_host=base_host(),
                  grpc_port=None, endpoints_file=file, drain_s=0.0)
    async with fleet:
        inodes = {file.stat().st_ino}
        generations = []

        async def reader() -> int:
            reads = 0
            for _ in range(2000):  # bounded: read while the rollout rewrites the file
                doc = json.loads(file.read_text())  # never a half-written file
                generations.append(doc["generation"])
                inodes.add(file.stat().st_ino)
                reads += 1
                await asyncio.sleep(0)
            return reads

        reading = asyncio.create_task(reader())
        await fleet.rollout("1.21.0", interval_s=0.0)
        assert await reading == 2000
        assert generations == sorted(generations)  # never goes back
        assert len(inodes) > 1  # each publish is a new file renamed over the old
        assert os.listdir(tmp_path) == ["endpoints.json"]  # no temp file left behind
        final = json.loads(file.read_text())
        assert final["generation"] == fleet.generation == 1 + 2 * 30
        assert {e["labels"]["proxy_version"] for e in final["endpoints"]} == {"1.21.0"}


async def test_stop_ends_a_running_rollout_after_its_batch() -> None:
    fleet = Fleet(pods=4, version="1.20.3", profiles=PROFILES, base_host=base_host(),
                  grpc_port=None, drain_s=0.0)
    await fleet.start()
    interval_s = 30.0
    rollout = asyncio.create_task(fleet.rollout("1.21.0", interval_s=interval_s))
    await fleet.wait_for(lambda e: e.kind == EventKind.RESTART_FINISHED)
    t0 = time.monotonic()
    await fleet.stop()
    await asyncio.wait_for(rollout, interval_s)
    # It did not wait out the interval before the next batch (the events below say it
    # started no other restart).
    assert time.monotonic() - t0 < interval_s
    kinds = [e.kind for e in fleet.history()]
    assert kinds.count(EventKind.RESTART_STARTED) == 1 and kinds[-1] == "rollout_finished"


async def test_six_hundred_http_pods_in_one_process() -> None:
    # No start-up time budget: a loaded machine starts them more slowly, not wrongly.
    block = random.randint(64, 250)
    fleet = Fleet(pods=600, version="1.20.3", base_host=f"127.{block}.0.1", grpc_port=None)
    async with fleet:
        assert len({p.host for p in fleet.pods}) == 600
        assert fleet.pods[-1].host.startswith(f"127.{block}.2.")  # .0 and .255 are skipped
        async with httpx.AsyncClient() as client:
            for pod in fleet.pods[::97]:
                r = await client.get(f"http://{pod.host}:{pod.http_port}/")
                assert r.json()["pod"] == pod.pod
        await fleet.restart(599, "1.21.0")
        assert fleet.version_counts() == {"1.20.3": 599, "1.21.0": 1}


def test_pod_hosts_and_bad_input() -> None:
    assert pod_hosts("127.0.0.254", 3) == ["127.0.0.254", "127.0.1.1", "127.0.1.2"]
    with pytest.raises(BadInput):
        pod_hosts("10.0.0.1", 1)
    with pytest.raises(BadInput):
        pod_hosts("127.255.255.250", 10)
    with pytest.raises(BadInput):
        Fleet(pods=0, version="1")


async def test_cli_rolls_out_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    file = tmp_path / "fleet.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "targets.fleet", "--pods", "3", "--from", "1.20.3",
        "--to", "1.21.0", "--rollout-after", "200ms", "--interval", "100ms",
        "--endpoints-file", str(file), "--profiles", str(ROOT / "targets/examples/profiles.yaml"),
        "--base-host", base_host(), "--http-port", "0", "--grpc-port", "0",
        "--drain", "100ms", "--drain-notice", "0",
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        lines = []
        async with asyncio.timeout(20):  # the fleet prints one line per event
            while line := (await proc.stdout.readline()).decode():
                lines.append(line)
                if " rollout_finished " in line:
                    break
        assert lines[0].startswith("fleet: 3 pods"), lines
        assert sum(" restart_finished " in line for line in lines) == 3, lines
        assert {e["labels"]["proxy_version"] for e in read_endpoints(file)} == {"1.21.0"}
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, err
        assert read_endpoints(file) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()


def test_cli_unknown_version_is_one_line_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "targets.fleet", "--pods", "2", "--from", "1.20.3", "--to", "3.0",
         "--profiles", str(ROOT / "targets/examples/profiles.yaml"), "--base-host", base_host(),
         "--http-port", "0", "--grpc-port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 2
    assert "'3.0' is not defined" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
