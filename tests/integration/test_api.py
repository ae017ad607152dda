"""The gate contracts of the API, served by hypercorn on loopback and called with httpx."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config
from prometheus_client import CollectorRegistry, Counter

from probes._parsing import rfc3339
from probes.api import ApiApp, VerdictQuery
from probes.cli import main as skewprobe_main
from probes.config import parse_config
from probes.errors import BadInput, StoreError
from probes.run.runner import ProbeRunner, RunOptions
from probes.spec import JudgingSettings
from probes.store import Store
from probes.verdict.service import compute_verdict
from tests.servers.asgi import serve_app
from tests.servers.ports import free_port
from tests.servers.probe_run import discard_config
from tests.servers.stores import store_with_a_failing_canary
from tests.unit.test_verdict import NEW, OLD, _cohort_windows


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


async def test_rollback_hook_is_200_only_on_fail(api: tuple[str, Verdicts]) -> None:
    base, verdicts = api
    async with httpx.AsyncClient(base_url=base) as client:
        flagger = {"name": "podinfo", "namespace": "test", "phase": "Progressing",
                   "checksum": "abc", "metadata": {"path": "fail", "canary": "1.21.0"}}
        rolled = await client.post("/gate/rollback", json=flagger)
        assert rolled.status_code == 200 and rolled.json()["verdict"] == "fail"
        assert verdicts.queries[-1] == VerdictQuery(path="fail", canary="1.21.0")
        # Pass, undecided and unanswerable never roll back (the promotion gate holds those).
        for path in ("pass", "inconclusive", "unknown"):
            flagger["metadata"] = {"path": path}
            assert (await client.post("/gate/rollback", json=flagger)).status_code == 409
        assert (await client.post("/gate/rollback", content=b"{not json")).status_code == 400
        assert (await client.get("/gate/rollback")).status_code == 405


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


# --- `since` as Argo Rollouts sends it ---------------------------------------------------------

END = 1_700_000_000.0  # 2023-11-14T22:13:20Z: the newest window ends here
START = END - 600.0  # 60 windows of 10 s, from 22:03:20Z
SINCE_UTC = "2023-11-14T22:08:20Z"  # the 31st window's start
SINCE_PLUS = "2023-11-14T23:08:20+01:00"  # the same instant with a + offset


@pytest.fixture
def since_store(tmp_path: Path) -> str:
    """A SQLite store with both cohorts of `checkout` from START to END."""
    rng = np.random.default_rng(5)
    store = str(tmp_path / "skewprobe.db")
    with Store.open(store) as writer:
        writer.write(_cohort_windows(rng, "checkout", OLD, 60, start=START)
                     + _cohort_windows(rng, "checkout", NEW, 60, start=START))
    return store


@pytest.fixture
async def store_api(since_store: str) -> AsyncIterator[str]:
    """The real ApiApp over the real verdict service and a SQLite store, on loopback."""
    store = since_store

    async def verdict(query: VerdictQuery) -> Mapping[str, Any]:
        return await asyncio.to_thread(
            compute_verdict, store, JudgingSettings(), path=query.path,
            baseline=query.baseline, canary=query.canary, since=query.since, now=END + 1.0)

    app = ApiApp(CollectorRegistry(), verdict=verdict, health=lambda: (True, ""))
    async with serve_app(app) as base:
        yield base


async def test_since_with_an_offset_as_argo_sends_it(store_api: str) -> None:
    """Argo Rollouts puts `{{args.since}}` into the URL unescaped: the `+` of `+01:00`
    reaches the query raw and decodes as a space. That one space is read as the `+`."""
    base = store_api
    async with httpx.AsyncClient(base_url=base) as client:
        # The raw URL keeps `+` unencoded, exactly as Argo's web provider sends it.
        argo = await client.get(f"/verdict?path=checkout&since={SINCE_PLUS}")
        escaped = await client.get("/verdict", params={"path": "checkout", "since": SINCE_PLUS})
        utc = await client.get("/verdict", params={"path": "checkout", "since": SINCE_UTC})
        whole = await client.get("/verdict", params={"path": "checkout"})
        for response in (argo, escaped, utc, whole):
            assert response.status_code == 200, response.text
        assert argo.json()["window"]["from"] == SINCE_UTC
        assert argo.json() == escaped.json() == utc.json()
        assert whole.json()["window"]["from"] == "2023-11-14T22:03:20Z"
        gate = await client.post("/gate", json={"metadata": {
            "path": "checkout", "since": SINCE_PLUS.replace("+", " ")}})
        assert gate.json()["window"] == argo.json()["window"]

        # Only a single space where the sign belongs: anything else is still a bad query.
        for raw in ("2023-11-14T23:08:20++01:00",   # two spaces
                    "2023-11-14T23:08:20+-01:00",   # a space before a sign
                    "2023-11-14T23:08:20+0100",     # no colon: not an RFC 3339 offset
                    "2023-11-14T23:08+01:00",       # no seconds
                    "2023-11-14+23:08:20+01:00",    # spaces for the T and the sign
                    "2023-11-14T23:08:20Z+01:00",   # a zone and an offset
                    "2023-11-14T23:08:20%0901:00"):  # a tab
            response = await client.get(f"/verdict?path=checkout&since={raw}")
            assert response.status_code == 400, raw
            body = response.json()
            assert body["verdict"] == "inconclusive" and "is not a time" in body["error"], raw
            assert "\n" not in body["error"]


def test_cli_since_with_a_space_for_the_offset_sign(
    since_store: str, capsys: pytest.CaptureFixture[str],
) -> None:
    store = since_store
    spaced = SINCE_PLUS.replace("+", " ")
    code = skewprobe_main(["verdict", "--store", store, "--path", "checkout", "--json",
                           "--since", spaced])
    out = capsys.readouterr().out
    # Asked now, the 2023 data is stale: never a pass, but the time itself parsed.
    assert code == 3 and json.loads(out)["window"]["from"] == SINCE_UTC
    code = skewprobe_main(["verdict", "--store", store, "--since", spaced.replace(" ", "  ")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a time" in err
    assert len(err.strip().splitlines()) == 1


async def test_verdict_at_through_the_probes_own_verdict(tmp_path: Path) -> None:
    """`GET /verdict?at=` over the runner's verdict function (what `skewprobe run` serves)
    and a store whose probe stopped an hour ago: the verdict as it stood then, the probe's
    overload read for then from the store, not this probe's now."""
    store = tmp_path / "probe.db"
    store_with_a_failing_canary(store, (time.time() // 10) * 10 - 3600)
    with Store.open(str(store), readonly=True) as s:
        newest = s.newest_window_end()
    assert newest is not None
    at = rfc3339(newest)
    runner = ProbeRunner(parse_config(discard_config()),
                         RunOptions(store_path=str(store), listen=None))
    runner.overload.update(0, 0, 0)
    runner.overload.update(24_000, 0, 7)  # this probe is overloaded now
    app = ApiApp(CollectorRegistry(), verdict=runner.verdict_json, health=lambda: (True, ""))
    async with serve_app(app) as base, httpx.AsyncClient(base_url=base) as client:
        now = await client.get("/verdict")
        # Stale: the fail stands (anytime-valid), with how to ask for then.
        assert now.status_code == 200 and now.json()["verdict"] == "fail"
        assert any(f"--at {at}" in r for r in now.json()["reasons"]), now.json()["reasons"]
        then = await client.get("/verdict", params={"at": at})
        assert then.status_code == 200, then.text
        assert then.json()["verdict"] == "fail", then.json()["reasons"]
        assert then.json()["window"]["to"] == at
        # A relative `at` counts back from now; `since` relative counts back from `at`.
        relative = await client.get("/verdict", params={"at": f"-{time.time() - newest:.0f}s",
                                                        "since": "-5m"})
        assert relative.status_code == 200, relative.text
        # `at` is now minus whole seconds, so `since` lands within a second of newest - 300:
        # the comparison starts at the first window that begins at or after it.
        assert relative.json()["window"]["from"] in (rfc3339(newest - 300), rfc3339(newest - 290))
        for bad, why in (("2999-01-01T00:00:00Z", "in the future"),
                         ("yesterday", "is not a time"),
                         ("2026-01-01T00:00:00", "no time zone")):
            refused = await client.get("/verdict", params={"at": bad})
            assert refused.status_code == 400, bad
            assert refused.json()["verdict"] == "inconclusive" and why in refused.json()["error"]
        # A gate judges the rollout now: `at` in its metadata is refused, never a rollback.
        gate = await client.post("/gate/rollback", json={"metadata": {"at": at}})
        assert gate.status_code == 400 and "unknown gate metadata key(s): at" in gate.text
