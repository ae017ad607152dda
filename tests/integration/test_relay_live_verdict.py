"""A running probe's `GET /verdict` and `POST /gate` carry the relay path's pair matrix, the
same `skewprobe verdict --store` shows (`probes.verdict.entry.verdict` for both), and a
failing pair fails the gate.

The store holds 20 minutes of a relay path (tests/servers/report_store.py) ending just
after now: the new callers' outbound proxy retries every call once (2 attempts per request
at the same success rate), and the old callers route 3 % of their calls to pods that are
gone from minute 10. The probe's API (`ApiApp` over the runner's own verdict function,
served on loopback) judges it now.
"""

from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from probes.api import ApiApp, openapi_spec
from probes.cli import main
from probes.config import parse_config
from probes.run.runner import ProbeRunner, RunOptions
from probes.store import Store
from probes.types import pair_cohort
from tests.servers.asgi import serve_app
from tests.servers.report_store import (
    RELAY_NEW,
    RELAY_OLD,
    RELAY_PATH,
    WINDOW_S,
    write_relay,
)

MINUTES = 20.0
CONFIG = f"""
targets:
  static:
    - {{address: "127.0.0.1:9", name: relay-0, labels: {{proxy_version: "{RELAY_OLD}"}}}}
paths:
  - name: {RELAY_PATH}
    relay: {{destination: catalog}}
    rate: 1/s
    timeout: 1s
"""


def _store(path: Path) -> str:
    # Windows until a little after now: whenever the test asks, its newest ended window is
    # fresh (the verdict's staleness gate), and the figures hold still (stationary data).
    end = (time.time() // WINDOW_S) * WINDOW_S + 3 * WINDOW_S
    with Store.open(path) as store:
        write_relay(store, end - MINUTES * 60, minutes=MINUTES)
    return str(path)


def _states(matrix: dict[str, Any]) -> dict[str, str]:
    return {pair_cohort(c["caller"], c["callee"]): c["verdict"] for c in matrix["cells"]}


def _validate(body: dict[str, Any]) -> None:
    """The body against the OpenAPI description's `Verdict` schema (JSON Schema 2020-12)."""
    spec = openapi_spec()
    jsonschema.validate(body, {"$ref": "#/components/schemas/Verdict",
                               "components": spec["components"]})


async def test_verdict_and_gate_carry_the_pair_matrix_and_fail_on_a_failing_pair(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path / "relay.db")
    runner = ProbeRunner(parse_config(CONFIG), RunOptions(store_path=store, listen=None))
    app = ApiApp(CollectorRegistry(), verdict=runner.verdict_json, health=lambda: (True, ""))
    async with serve_app(app) as base, httpx.AsyncClient(base_url=base, timeout=60) as client:
        verdict = await client.get("/verdict")
        gate = await client.post("/gate", json={"name": "catalog", "metadata": {}})
        rollback = await client.post("/gate/rollback")
        only = await client.get("/verdict", params={"path": RELAY_PATH})
        # One instant for the API and the CLI to compare at: a live ask and a later
        # command count the windows ended by their own clocks, which may straddle a window.
        at = str(int(time.time()))
        then = await client.get("/verdict", params={"at": at})

    assert verdict.status_code == 200, verdict.text
    body = verdict.json()
    _validate(body)
    [matrix] = body["pairs"]
    assert matrix["path"] == RELAY_PATH
    assert matrix["callers"] == matrix["callees"] == [RELAY_OLD, RELAY_NEW]
    states = _states(matrix)
    # The retrying callers fail on attempts against the old-old pair, whoever answers.
    assert states[pair_cohort(RELAY_OLD, RELAY_OLD)] == "baseline"
    assert states[pair_cohort(RELAY_NEW, RELAY_OLD)] == "fail"
    assert states[pair_cohort(RELAY_NEW, RELAY_NEW)] == "fail"
    stale = {s["caller"]: s for s in matrix["stale"]}
    assert stale[RELAY_OLD]["verdict"] == "fail" and stale[RELAY_OLD]["stale"] > 0
    assert stale[RELAY_NEW]["stale"] == 0
    assert matrix["verdict"] == body["verdict"] == "fail"
    assert any(f"pair {pair_cohort(RELAY_NEW, RELAY_OLD)} fail: attempts per request" in r
               for r in body["reasons"]), body["reasons"]
    assert any(f"stale routing seen from callers on {RELAY_OLD}" in r for r in body["reasons"])
    # No direct path: the direct part of the verdict is empty, not a pass.
    assert body["paths"] == [] and body["baseline"] is None

    # A failing pair fails the gate (409) and asks for a rollback (200), with the matrix.
    assert gate.status_code == 409 and gate.json()["verdict"] == "fail"
    assert _states(gate.json()["pairs"][0]) == states
    assert rollback.status_code == 200 and rollback.json()["verdict"] == "fail"
    assert only.status_code == 200 and _states(only.json()["pairs"][0]) == states

    # `skewprobe verdict --store` judges with the same code: the same matrix, exit 1, and
    # at the same instant the same reasons, word for word.
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["verdict", "--store", store, "--json", "--at", at])
    assert code == 1
    cli = json.loads(out.getvalue())
    assert then.status_code == 200, then.text
    assert _states(cli["pairs"][0]) == _states(then.json()["pairs"][0]) == states
    assert cli["reasons"] == then.json()["reasons"]
    assert len(cli["reasons"]) == len(body["reasons"])

    # The skewprobe_verdict gauges a MetricTemplate reads carry the relay path too.
    registry = runner.registry
    await runner.gauges.publish()
    text = generate_latest(registry).decode()
    assert f'skewprobe_verdict{{path="{RELAY_PATH}",verdict="fail"}} 1.0' in text
