"""A flood of API requests against a real probing runner (issue 32, points 6 and 8): the
probe does not make itself late (it never judges itself overloaded), requests for the same
verdict share its computation, and a stop in the middle of a flood is clean.

The fleet and the flood's client run in processes of their own, so this test's event loop
carries the probe alone, as `skewprobe run`'s does. The lag budget is still the end-to-end
tests' (`tests/servers/probe_run.py`): a shared two-core machine makes any probe's sends
late by more than the production 10 ms now and then, flood or no flood.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from pathlib import Path

import httpx
import pytest

from probes.measure.overload import OVERLOAD_EVENT, OVERLOAD_WINDOWS
from probes.run.runner import ProbeRunner
from probes.store import Store
from tests.integration.test_run_verdict_cache import write_history
from tests.servers.api_flood import run_flood
from tests.servers.fleet_cli import fleet_process
from tests.servers.lateness import RunQueueWait
from tests.servers.ports import free_port
from tests.servers.probe_run import (
    Windows,
    discard_config,
    http_config,
    probe_runner,
    running,
    windows_for,
)

BASELINE, CANARY = "1.20.3", "1.21.0"
CLIENTS = 50
PER_CLIENT = 10  # requests per client: 500 in all
# Windows of both cohorts written before the flood, so each verdict judges real data.
MIN_REQUESTS = 100
COMPUTED = "skewprobe_verdict_computations_total"
# A hang guard while requests reach the API: it answers 200 a second, a poll is 10 ms.
POLL_S = 0.01
POLLS_PER_REQUEST = 100
# Windows watched with no request before the flood: the overload rule's look back, and one.
QUIET_WINDOWS = OVERLOAD_WINDOWS + 1


def overloaded_since(runner: ProbeRunner, since: float,
                     queued: RunQueueWait | None = None) -> bool:
    """Did the probe judge itself overloaded at a window boundary after `since` (its
    overload events, in its store or not written yet), or is it now? With `queued`, only
    where the kernel did not keep the probe's thread waiting for a core as long as its lag
    budget over the rule's look back (a machine that busy delays any process)."""
    with Store.open(runner.options.store_path, readonly=True) as store:
        events = [*store.read_events(kinds=[OVERLOAD_EVENT]), *runner.events.pending]
    reach = (OVERLOAD_WINDOWS + 1) * runner.config.judging.window_s
    fired = [e.at for e in events if e.at >= since and e.detail.get("reason")]
    if runner.overload.reason is not None:
        fired.append(time.time())
    return any(queued is None or not queued.starved(at, reach, runner.overload.budget_s)
               for at in fired)


def computed(text: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith(COMPUTED + " "))


@pytest.mark.slow
async def test_a_flood_of_verdict_requests_shares_computations_and_keeps_the_probe_on_time(
    tmp_path: Path,
) -> None:
    endpoints = tmp_path / "endpoints.json"
    store = str(tmp_path / "flood.db")
    port = free_port()
    written = Windows()
    writes = 0

    def on_window(windows: object) -> None:
        nonlocal writes
        writes += 1
        written.on_window(windows)  # type: ignore[arg-type]

    runner = probe_runner(http_config(endpoints, rate="20/s"), store,
                          listen=f"127.0.0.1:{port}", on_window=on_window)
    fleet_args = ("--pods", "4", "--from", BASELINE, "--to", CANARY, "--rollout-after", "0s",
                  "--interval", "0s", "--batch", "2", "--restarts", "2",
                  "--profiles", str(Path(__file__).parents[2] / "targets" / "examples"
                                    / "profiles.yaml"),
                  "--endpoints-file", str(endpoints), "--no-grpc", "--quiet",
                  "--base-host", f"127.{random.randint(64, 250)}.9.1", "--http-port", "0")
    base = f"http://127.0.0.1:{port}"
    async with (
        fleet_process(*fleet_args, log=tmp_path / "fleet.err"),
        running(runner, stop_within_s=30),
        RunQueueWait() as queued,
        httpx.AsyncClient(base_url=base, timeout=60) as client,
    ):
        # 20/s on each of the two pods a cohort has once the fleet's rollout is done.
        await written.until([("checkout", BASELINE), ("checkout", CANARY)], MIN_REQUESTS,
                            within=windows_for(MIN_REQUESTS, 40.0))
        # The control: as many windows with no request. A probe overloaded then is late by
        # the machine's load, and nothing here could say what the flood adds to it.
        quiet = time.time()
        wait = written.budget(QUIET_WINDOWS, "the quiet windows")
        for _ in range(QUIET_WINDOWS):
            await wait.next()
        if overloaded_since(runner, quiet):
            pytest.skip("this machine is too busy to judge the probe's lag: the probe was "
                        "overloaded with no API request")
        began, writes_before = time.time(), writes
        before = computed((await client.get("/metrics")).text)
        # The verdict asked "now", as gates and the gauges ask it: kept until a window is
        # written; then one asked with `since`, shared only while it is being computed.
        now_codes = await run_flood(f"{base}/verdict", CLIENTS, PER_CLIENT)
        now_computed = computed((await client.get("/metrics")).text) - before
        since_codes = await run_flood(f"{base}/verdict", CLIENTS, PER_CLIENT, "since=-1m")
        since_computed = computed((await client.get("/metrics")).text) - before - now_computed
        during = writes - writes_before
        # The rule looks back OVERLOAD_WINDOWS windows: let it judge the flood's last ones.
        wait = written.budget(OVERLOAD_WINDOWS + 1, "the overload rule's look back")
        for _ in range(OVERLOAD_WINDOWS + 1):
            await wait.next()
        assert not overloaded_since(runner, began, queued)
    assert now_codes == since_codes == [200] * CLIENTS * PER_CLIENT
    # Each write (and each window boundary, at most one per write) may start a new
    # computation; the rest share one.
    assert 1 <= now_computed <= 2 * (during + 1) < CLIENTS * PER_CLIENT
    assert 1 <= since_computed < CLIENTS * PER_CLIENT


async def test_stopping_in_a_flood_answers_every_request_and_logs_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Requests waiting for slow verdicts (each a fresh read of two hours of windows) when
    the probe stops are answered 503, none cut off, and nothing is logged as an error."""
    db = tmp_path / "probe.db"
    write_history(db, time.time())
    port = free_port()
    runner = probe_runner(discard_config(window="5s", timeout="200ms"), str(db),
                          listen=f"127.0.0.1:{port}")
    limits = httpx.Limits(max_connections=CLIENTS)
    caplog.set_level(logging.WARNING)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120,
                                 limits=limits) as client:
        async with running(runner, stop_within_s=60):
            assert (await client.get("/verdict", params={"since": "-1m"})).status_code == 200
            started = runner.registry.get_sample_value(COMPUTED) or 0.0
            # Distinct queries: none shares another's computation, so most are still
            # waiting when the probe stops.
            pending = [asyncio.create_task(client.get("/verdict", params={"since": f"-{i}m"}))
                       for i in range(2, 2 + CLIENTS)]
            # Until every request is in the API (each has started its computation): one
            # still on its way when the server closes is not this test's to answer.
            for _ in range(POLLS_PER_REQUEST * CLIENTS):
                if (runner.registry.get_sample_value(COMPUTED) or 0.0) >= started + CLIENTS:
                    break
                await asyncio.sleep(POLL_S)
            else:
                pytest.fail(f"{CLIENTS} requests did not reach the API")
        answers = await asyncio.gather(*pending)
    codes = {r.status_code for r in answers}
    assert codes <= {200, 503} and 503 in codes, codes
    assert all(r.json() == {"error": "the probe is stopping"}
               for r in answers if r.status_code == 503)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
