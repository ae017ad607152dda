"""The API against its OpenAPI description (probes/openapi.yaml), fuzzed with schemathesis.

Four real probes' APIs (`ApiApp` served by hypercorn on loopback, token-protected) answer from
real SQLite stores judged by `probes.verdict.service`: one whose verdict is pass, one fail,
one inconclusive, and one whose store is not a database (503). Every request schemathesis
generates from the description, valid and invalid alike, goes to all four; each answer must
conform to the description (status, content type, body schema), be no server error (but the
broken store's documented 503), enforce the token, and, behind a fail or inconclusive store,
never read as a pass: no `"verdict": "pass"` from /verdict and no 200 from /gate.
"""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest
import schemathesis
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig
from prometheus_client import CollectorRegistry
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from probes.api import ROUTES, ApiApp, VerdictQuery, openapi_json, openapi_spec
from probes.cli import main
from probes.inventory import report_from_rows
from probes.spec import JudgingSettings, SkewPolicy
from probes.store import Store
from probes.store.records import InventoryRow
from probes.verdict.service import compute_verdict
from tests.unit.test_verdict import NEW, OLD, _cohort_windows

TOKEN = "fuzz-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
END = 1_700_000_000.0  # the newest window of every store ends here
NOW = END + 1.0  # fresh data: the verdicts do not depend on the wall clock

# Besides conformance (status, content type, body, headers): the token is enforced where the
# description says, and a method a route does not answer is a 405 with an Allow header.
CONFORMANCE = [
    status_code_conformance, content_type_conformance, response_schema_conformance,
    response_headers_conformance, ignored_auth, unsupported_method,
]

SCHEMA = schemathesis.openapi.from_dict(
    openapi_spec(),
    config=schemathesis.Config.from_dict({
        "seed": 20261202,
        "generation": {"mode": "all", "max-examples": 20, "deterministic": True},
        "phases": {
            "stateful": {"enabled": False},
            "coverage": {"generate-duplicate-query-parameters": True},
        },
        "auth": {"openapi": {"bearerAuth": {"bearer": TOKEN}}},
        "request-timeout": 10,  # a stalled server fails the test instead of hanging it
    }),
)


def _windows(seed: int, path: str, windows: int, base: Mapping[str, Any] | None = None,
             canary: Mapping[str, Any] | None = None) -> list[Any]:
    """Baseline and canary windows of one path, ending at END (tests/unit/test_verdict.py's)."""
    rng = np.random.default_rng(seed)
    start = END - 10 * windows
    return (_cohort_windows(rng, path, OLD, windows, start=start, **(base or {}))
            + _cohort_windows(rng, path, NEW, windows, start=start, **(canary or {})))


# The stores behind the backends. Fail and inconclusive are chosen so that no narrowing can
# honestly pass either: every path fails or lacks evidence, whichever way round the cohorts
# are named (the baseline is slower, the canary errs) and from whatever `since`.
STORES = {
    "pass": _windows(4, "checkout", 60, {"err": 0.0}, {"err": 0.0}),
    "fail": (_windows(7, "checkout", 20, {"scale": 2.0}, {"err": 0.05})
             + _windows(8, "search", 20, {"n": 20}, {"n": 20})),
    "inconclusive": (_windows(3, "checkout", 2)
                     + _windows(9, "watch", 2, {"resets_per_hour": 2.0},
                                {"resets_per_hour": 2.0})),
}


@dataclass(frozen=True)
class Backend:
    name: str  # the verdict of its store: pass, fail, inconclusive, or broken
    url: str


def _listening_fd() -> tuple[int, int]:
    """A socket already listening on a free loopback port, handed to hypercorn as `fd://`:
    connections queue from now on, so nothing waits for the server to come up."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = int(sock.getsockname()[1])
    return sock.detach(), port  # hypercorn owns (and closes) the descriptor


def _app(name: str, store: str) -> ApiApp:
    async def verdict(query: VerdictQuery) -> Mapping[str, Any]:
        return await asyncio.to_thread(
            compute_verdict, store, JudgingSettings(), path=query.path,
            baseline=query.baseline, canary=query.canary, since=query.since, now=NOW,
        )

    rows = [InventoryRow("shop", "checkout", OLD, 3, 86400.0),
            InventoryRow("shop", "checkout", NEW, 1, 600.0)]

    async def inventory() -> Mapping[str, Any]:
        return report_from_rows(rows, [], SkewPolicy(), at=NOW)

    broken = name == "broken"
    return ApiApp(
        CollectorRegistry(),
        verdict=verdict,
        health=lambda: (False, "store: not a database") if broken else (True, "probing 4"),
        inventory=None if broken else inventory,
        token=TOKEN,
    )


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Backend]]:
    """The four APIs on loopback, served by one event loop in a thread (schemathesis calls
    them with blocking requests from the test's thread)."""
    folder = tmp_path_factory.mktemp("openapi")
    apps: dict[str, ApiApp] = {}
    for name, windows in STORES.items():
        path = folder / f"{name}.db"
        with Store.open(path) as store:
            store.write(windows)
        apps[name] = _app(name, str(path))
    (folder / "broken.db").write_bytes(b"this is not a SQLite database\n" * 64)
    apps["broken"] = _app("broken", str(folder / "broken.db"))

    listeners = {name: _listening_fd() for name in apps}
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve_all() -> None:
        servers = []
        for name, app in apps.items():
            config = HypercornConfig()
            config.bind = [f"fd://{listeners[name][0]}"]
            config.accesslog = config.errorlog = None
            servers.append(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        await asyncio.gather(*servers)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve_all(),), daemon=True)
    thread.start()
    yield [Backend(name, f"http://127.0.0.1:{port}") for name, (_, port) in listeners.items()]
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    assert not thread.is_alive()
    loop.close()


def _never_passes(backend: Backend, case: schemathesis.Case, response: Any) -> None:
    """Behind a store whose verdict is not pass, no request may read as a pass."""
    if backend.name == "pass":
        return
    label = f"{backend.name} store: {case.method} {case.formatted_path}"
    if case.path == "/gate":
        assert response.status_code != 200, f"{label} passed the gate"
    if case.path == "/verdict" and response.status_code != 401:
        body = response.json()
        assert isinstance(body, dict) and body.get("verdict") != "pass", label
        if response.status_code == 200:
            assert body["verdict"] in ("fail", "inconclusive"), label


@SCHEMA.parametrize()
def test_api_conforms_and_never_passes_a_bad_verdict(
    case: schemathesis.Case, backends: list[Backend]
) -> None:
    for backend in backends:
        # The broken store's 503 is its documented answer, not a server error.
        checks = [*CONFORMANCE, *([] if backend.name == "broken" else [not_a_server_error])]
        response = case.call_and_validate(base_url=backend.url, checks=checks)
        _never_passes(backend, case, response)


def test_the_description_is_valid_openapi_and_json_schema() -> None:
    SCHEMA.validate()  # the OpenAPI 3.1 meta-schema
    for schema in openapi_spec()["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    # The validator is not a no-op: a parameter in no valid location is refused.
    broken = copy.deepcopy(openapi_spec())
    broken["components"]["parameters"]["since"]["in"] = "body"
    with pytest.raises(Exception, match="body"):
        schemathesis.openapi.from_dict(broken).validate()


# Times that parse as numbers or dates but are no time a verdict can start from: each was a
# 500 (ValueError / OverflowError inside the verdict) before parse_time checked the range.
OUT_OF_RANGE = ["nan", "inf", "-inf", "1e300", "99999999999999999h", "0001-01-01T00:00:00+01:00"]


@pytest.mark.parametrize("since", OUT_OF_RANGE)
def test_times_out_of_range_are_bad_queries_not_server_errors(
    since: str, backends: list[Backend]
) -> None:
    verdict = SCHEMA["/verdict"]["GET"].Case(query={"since": since})
    gate = SCHEMA["/gate"]["POST"].Case(body={"metadata": {"since": since}},
                                       media_type="application/json")
    for backend in backends:
        if backend.name == "broken":
            continue  # its store fails first (503), before the time is read
        checks = [*CONFORMANCE, not_a_server_error]
        response = verdict.call_and_validate(backend.url, headers=AUTH, checks=checks)
        assert response.status_code == 400 and "out of range" in response.json()["error"]
        answer = gate.call_and_validate(backend.url, headers=AUTH, checks=checks)
        assert answer.status_code == 409


def _verdict_validator() -> jsonschema.Draft202012Validator:
    components = openapi_spec()["components"]
    return jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/Verdict", "components": components},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


def test_live_verdicts_validate_against_the_verdict_schema(backends: list[Backend]) -> None:
    validator = _verdict_validator()
    seen: dict[str, Any] = {}
    for backend in backends:
        if backend.name == "broken":
            continue
        response = httpx.get(f"{backend.url}/verdict", headers=AUTH, timeout=10)
        assert response.status_code == 200
        doc = response.json()
        validator.validate(doc)
        assert doc["verdict"] == backend.name  # each store is the case it stands for
        seen[backend.name] = doc
        gate = httpx.post(f"{backend.url}/gate", headers=AUTH, timeout=10,
                          json={"name": "podinfo", "metadata": {"path": "checkout"}})
        assert gate.status_code == (200 if backend.name == "pass" else 409)
    # Metrics that do not apply are absent: no streams on checkout, streams on watch.
    (checkout,) = seen["pass"]["paths"]
    assert "stream_resets_per_hour" not in checkout["metrics"]
    watch = next(p for p in seen["inconclusive"]["paths"] if p["path"] == "watch")
    assert "stream_resets_per_hour" in watch["metrics"]
    # The schema is not a no-op: a verdict JSON with a made-up verdict is refused.
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**seen["fail"], "verdict": "ok"})


def test_description_is_served_behind_the_token_and_printed_by_the_cli(
    backends: list[Backend], capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{backends[0].url}/openapi.json"
    assert httpx.get(url, timeout=5).status_code == 401
    served = httpx.get(url, headers=AUTH, timeout=5)
    assert served.status_code == 200
    assert served.headers["content-type"] == "application/json"
    assert served.json() == openapi_spec() == json.loads(openapi_json())
    assert main(["validate", "--openapi"]) == 0
    assert json.loads(capsys.readouterr().out) == openapi_spec()


def test_every_route_of_the_app_is_described() -> None:
    described = {path: {m.upper() for m in ops} for path, ops in openapi_spec()["paths"].items()}
    assert set(described) == set(ROUTES)
    for path, methods in ROUTES.items():
        assert described[path] == set(methods) - {"HEAD"}, path

