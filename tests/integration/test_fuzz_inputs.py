"""Fuzzed inputs: configs and gate queries. Bad input is a one-line error, never a traceback,
and no query can make a fail or an inconclusive read as a pass."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import httpx
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from probes.api import ApiApp, VerdictQuery
from probes.config import parse_config
from probes.errors import BadInput, ConfigError
from tests.integration.test_config import GOOD

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["5/s", "1s", "0/s", "-1s", "http", "grpc", "/x"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(
            ["targets", "static", "paths", "name", "http", "grpc", "stream", "rate", "timeout",
             "address", "labels", "ports", "port", "expect", "status", "window", "verdict",
             "tolerances", "cohort", "by", "method", "path", "version", "file", "kubernetes"]
        ) | st.text(max_size=8), inner, max_size=5),
    ),
    max_leaves=25,
)


def _one_line(error: Exception) -> None:
    assert "\n" not in str(error) and str(error)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_random_documents_are_config_errors(document: Any) -> None:
    try:
        parse_config(yaml.safe_dump(document), file="fuzz.yaml")
    except ConfigError as exc:
        _one_line(exc)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_good_config_is_valid_or_one_line_error(data: st.DataObject) -> None:
    lines = GOOD.splitlines()
    index = data.draw(st.integers(0, len(lines) - 1))
    junk = data.draw(st.text(max_size=30))
    mode = data.draw(st.sampled_from(["replace", "insert", "truncate"]))
    if mode == "replace":
        lines[index] = junk
    elif mode == "insert":
        lines.insert(index, junk)
    else:
        lines = lines[:index]
    try:
        parse_config("\n".join(lines), file="mutated.yaml")
    except ConfigError as exc:
        _one_line(exc)


async def _verdict(query: VerdictQuery) -> Mapping[str, Any]:
    if query.path not in (None, "checkout"):
        raise BadInput(f"no data for path {query.path!r}")
    return {"verdict": "fail" if query.path == "checkout" else "inconclusive"}


_APP = ApiApp(CollectorRegistry(), verdict=_verdict, health=lambda: (True, "ok"))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4),
    st.one_of(st.binary(max_size=200), st.builds(lambda d: json.dumps(d).encode(), _values)),
)
def test_no_query_or_gate_body_turns_fail_into_pass(params: dict[str, str], body: bytes) -> None:
    async def ask() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=_APP)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
            return (await client.get("/verdict", params=params),
                    await client.post("/gate", content=body))

    verdict, gate = asyncio.run(ask())
    assert verdict.status_code in (200, 400)
    assert verdict.json().get("verdict") != "pass"
    assert gate.status_code in (400, 409)  # never 200: nothing here passes
    assert gate.json().get("verdict", "inconclusive") != "pass"
