"""The gate contracts of the API, served by hypercorn on loopback and called with httpx."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config
from prometheus_client import CollectorRegistry, Counter

from probes._exceptions import BadInput, StoreError
from probes.api import ApiApp, VerdictQuery
from tests.servers.ports import free_port


class Verdicts:
    """Answers with a verdict chosen by the query's path, as the verdict service would."""

    def __init__(self) -> None:
        self.queries: list[VerdictQuery] = []

    async def __call__(self, query: VerdictQuery) -> Mapping[str, Any]:
        self.queries.append(query)
        if query.path == "broken-store":
            raise StoreError("store unreadable: disk I/O error")
        if query.path == "unknown":
            raise BadInput("no path named 'unknown'")
        verdict = query.path if query.path in ("pass", "fail") else "inconclusive"
        return {"verdict": verdict, "paths": [], "reasons": []}


@pytest.fixture
async def api() -> AsyncIterator[tuple[str, Verdicts]]:
    registry = CollectorRegistry()
    Counter("skewprobe_test_calls", "x", registry=registry).inc()
    verdicts = Verdicts()
    app = ApiApp(registry, verdict=verdicts, health=lambda: (True, "probing 3 endpoints"))
    port = free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = config.errorlog = None
    stop = asyncio.Event()
    task = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        for _ in range(100):
            try:
                await client.get(f"{base}/healthz")
                break
            except httpx.ConnectError:
                await asyncio.sleep(0.02)
    yield base, verdicts
    stop.set()
    await task


async def test_verdict_is_200_for_every_computed_verdict(api: tuple[str, Verdicts]) -> None:
    base, verdicts = api
    async with httpx.AsyncClient(base_url=base) as client:
        for state in ("pass", "fail", "inconclusive"):
            response = await client.get("/verdict", params={"path": state, "since": "30m"})
            assert response.status_code == 200
            assert response.json()["verdict"] == state
        assert verdicts.queries[0] == VerdictQuery(path="pass", since="30m")
        broken = await client.get("/verdict", params={"path": "broken-store"})
        assert broken.status_code == 503 and "store unreadable" in broken.json()["error"]


async def test_bad_queries_never_read_as_pass(api: tuple[str, Verdicts]) -> None:
    base, _ = api
    async with httpx.AsyncClient(base_url=base) as client:
        for params in ({"path": "unknown"}, {"colour": "blue"}, {"path": ["pass", "fail"]}):
            response = await client.get("/verdict", params=params)
            assert response.status_code == 400 and response.json()["verdict"] == "inconclusive"


async def test_gate_is_200_only_on_pass(api: tuple[str, Verdicts]) -> None:
    base, verdicts = api
    async with httpx.AsyncClient(base_url=base) as client:
        flagger = {"name": "podinfo", "namespace": "test", "phase": "Progressing",
                   "checksum": "abc", "metadata": {"path": "pass", "canary": "1.21.0"}}
        assert (await client.post("/gate", json=flagger)).status_code == 200
        assert verdicts.queries[-1] == VerdictQuery(path="pass", canary="1.21.0")
        for path in ("fail", "inconclusive", "unknown"):
            flagger["metadata"] = {"path": path}
            assert (await client.post("/gate", json=flagger)).status_code == 409
        assert (await client.post("/gate", content=b"{not json")).status_code == 400
        assert (await client.post("/gate", json={"metadata": {"path": 3}})).status_code == 400
        assert (await client.get("/gate")).status_code == 405


async def test_metrics_and_health(api: tuple[str, Verdicts]) -> None:
    base, _ = api
    async with httpx.AsyncClient(base_url=base) as client:
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200 and "skewprobe_test_calls_total 1.0" in metrics.text
        health = await client.get("/healthz")
        assert health.json() == {"ok": True, "reason": "probing 3 endpoints"}
        assert (await client.get("/nope")).status_code == 404


async def test_bearer_token_protects_everything_but_healthz() -> None:
    async def verdict(query: VerdictQuery) -> Mapping[str, Any]:
        return {"verdict": "pass"}

    app = ApiApp(CollectorRegistry(), verdict=verdict, health=lambda: (True, ""), token="s3cret")
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
        assert (await client.get("/verdict")).status_code == 401
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/healthz")).status_code == 200
        ok = await client.get("/verdict", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
