"""Hostile targets next to a healthy one: each is classified, none slows the others.

Real servers on loopback (the reference target and tests/servers/hostile.py), the real
HTTP prober, the real engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from probes._spec import HttpSpec, PathSpec
from probes._types import Endpoint, Outcome
from probes.clients import build_prober
from probes.engine import Engine
from targets.profile import parse_profiles
from targets.server import TargetServer
from tests.servers.hostile import HostileServer, closed_port
from tests.test_engine import ListSink

RATE = 20.0
SECONDS = 3.0


def _path(name: str, http_path: str, timeout_s: float = 0.5) -> PathSpec:
    return PathSpec(
        name=name,
        rate_per_s=RATE,
        timeout_s=timeout_s,
        http=HttpSpec(path=http_path),
        selector={"kind": name},
    )


async def test_hostile_targets_are_classified_and_do_not_slow_the_healthy_one() -> None:
    profiles = parse_profiles('versions: {"1.20.3": {attempt_count_header: true}}')
    paths = [
        _path("healthy", "/api/checkout"),
        _path("hang", "/hang"),
        _path("reset", "/reset"),
        _path("garbage", "/garbage"),
        _path("big", f"/big/{50 * 1024 * 1024}", timeout_s=2.0),
        _path("refused", "/"),
    ]
    async with contextlib.AsyncExitStack() as stack:
        target = TargetServer(profiles.profile("1.20.3"), host="127.0.0.1", grpc_port=None)
        await target.start()
        stack.push_async_callback(target.stop, 0.0)
        hostile = await stack.enter_async_context(HostileServer())
        refused_port = stack.enter_context(closed_port())

        def ep(kind: str, port: int) -> Endpoint:
            return Endpoint(name=kind, host="127.0.0.1", port=port,
                            labels={"kind": kind, "proxy_version": "1.20.3"})

        endpoints = [ep("healthy", target.http_port), ep("refused", refused_port)]
        endpoints += [ep(k, hostile.port) for k in ("hang", "reset", "garbage", "big")]
        probers = {p.name: build_prober(p) for p in paths}
        sink = ListSink()
        engine = Engine(paths, probers, sink)

        async def snapshots():  # type: ignore[no-untyped-def]
            yield endpoints
            await asyncio.Event().wait()

        task = asyncio.create_task(engine.run(snapshots()))
        await asyncio.sleep(SECONDS)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for prober in probers.values():
            await prober.aclose()

    by_path: dict[str, Counter[str]] = {}
    for result in sink.results:
        by_path.setdefault(result.path, Counter())[result.outcome.outcome] += 1
    expected = RATE * SECONDS
    healthy = [r for r in sink.results if r.path == "healthy"]
    # The open loop holds the healthy path's rate while five neighbours misbehave.
    assert len(healthy) >= expected - 2, by_path
    assert by_path["healthy"] == Counter({Outcome.OK: len(healthy)})
    assert all(r.outcome.attempts == 1 for r in healthy)
    assert set(by_path["hang"]) == {Outcome.TIMEOUT}
    assert set(by_path["reset"]) == {Outcome.RESET}
    assert set(by_path["garbage"]) == {Outcome.PROTOCOL_ERROR}
    assert set(by_path["refused"]) == {Outcome.CONNECT_REFUSED}
    big = [r for r in sink.results if r.path == "big"]
    assert big and all(r.outcome.outcome == Outcome.OK for r in big)
    assert all("truncated" in r.outcome.detail for r in big)
    for name in ("reset", "garbage", "refused"):
        assert sum(by_path[name].values()) >= expected - 2, (name, by_path[name])
    # Hung calls finish at their timeout; those still running at the stop are cancelled.
    assert sum(by_path["hang"].values()) >= (SECONDS - 0.5) * RATE - 2
