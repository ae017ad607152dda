"""Static and file discovery: the file is re-read on change; a bad rewrite keeps the last list."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from probes.discovery import FileSource, StaticSource, parse_endpoints
from probes.errors import BadInput
from tests.unit.virtual_time import virtual_loop


def _write(path: Path, endpoints: list[dict[str, object]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"endpoints": endpoints}))
    os.replace(tmp, path)


def _pod(i: int, version: str) -> dict[str, object]:
    return {
        "name": f"pod-{i}",
        "address": f"127.0.0.{10 + i}:18080",
        "ports": {"grpc": 19090},
        "labels": {"pod": f"pod-{i}", "proxy_version": version},
    }


def test_parse_endpoints_reads_the_fleet_format() -> None:
    (endpoint,) = parse_endpoints(json.dumps({"endpoints": [_pod(1, "1.21.0")]}))
    assert endpoint.name == "pod-1" and endpoint.host == "127.0.0.11" and endpoint.port == 18080
    assert endpoint.port_for("grpc") == 19090 and endpoint.labels["proxy_version"] == "1.21.0"


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"endpoints": 3}',
        '{"endpoints": [{"address": "nohost"}]}',
        '{"endpoints": [{"address": "h:99999"}]}',
        '{"endpoints": [{"address": "h:1", "ports": {"a": "x"}}]}',
        "[" * 500 + "]" * 500,  # past the nesting bound: no RecursionError
        # An alias bomb: nine levels of nine aliases each, refused as it is composed.
        "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n"
            for i in range(9)),
    ],
)
def test_bad_endpoint_files_are_bad_input(text: str) -> None:
    # Each a one-line BadInput, never a traceback nor a parse that runs for minutes.
    with pytest.raises(BadInput) as info:
        parse_endpoints(text, source="eps.json")
    assert str(info.value).startswith("eps.json") and "\n" not in str(info.value)


def test_a_large_machine_written_endpoints_file_is_read() -> None:
    # 20,000 endpoints, some 200,000 values: far past a config's bound, within the file's.
    text = json.dumps({"endpoints": [_pod(i % 200, "1.21.0") for i in range(20_000)]})
    assert len(parse_endpoints(text)) == 20_000


async def test_file_source_follows_rewrites_and_survives_garbage(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    source = FileSource(str(path), refresh_s=0.02)
    snapshots = source.snapshots()
    waiter = asyncio.ensure_future(anext(snapshots))
    await asyncio.sleep(0.1)
    assert not waiter.done()  # no file yet: nothing to probe, no error
    _write(path, [_pod(0, "1.20.3"), _pod(1, "1.20.3")])
    first = await asyncio.wait_for(waiter, 2)
    assert [e.name for e in first] == ["pod-0", "pod-1"]

    _write(path, [_pod(0, "1.21.0"), _pod(1, "1.20.3")])
    second = await asyncio.wait_for(anext(snapshots), 2)
    assert second[0].labels["proxy_version"] == "1.21.0"

    path.write_text("{ half written")
    pending = asyncio.ensure_future(anext(snapshots))
    await asyncio.sleep(0.1)
    assert not pending.done()  # garbage keeps the last good list: no empty snapshot
    _write(path, [_pod(1, "1.21.0")])
    third = await asyncio.wait_for(pending, 2)
    assert [e.name for e in third] == ["pod-1"]
    await snapshots.aclose()


async def test_file_source_sees_a_rewrite_within_one_refresh(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    _write(path, [_pod(0, "1.20.3")])
    source = FileSource(str(path))  # the default refresh, on virtual time
    snapshots = source.snapshots()
    await anext(snapshots)
    loop = virtual_loop()
    await asyncio.sleep(0.3)
    written = loop.time()
    _write(path, [_pod(0, "1.21.0")])
    (endpoint,) = await anext(snapshots)
    assert endpoint.labels["proxy_version"] == "1.21.0"
    assert 0 < loop.time() - written <= source.refresh_s
    await snapshots.aclose()


async def test_static_source_yields_once() -> None:
    (endpoint,) = parse_endpoints(json.dumps([_pod(2, "1.20.3")]))
    snapshots = StaticSource([endpoint]).snapshots()
    assert await anext(snapshots) == (endpoint,)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(snapshots), 0.05)
