"""A relay path judged from Prometheus: a probe with `source: prometheus` answers
`/verdict` with the caller × callee matrix built from its own series as a real Prometheus
scraped them, and fails the retrying caller's pair as the matrix from its store does;
`skewprobe verdict --prometheus` prints the same matrix.

The estate (tests/servers/relay_estate.py): callers 1.20.3 and 1.21.0, callees 1.20.3 and
1.21.0; the app fails 20 % of request ids on every attempt, and the 1.21.0 caller's
outbound proxy retries them twice: equal success rates, 1.4 attempts per request against 1.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from probes.api import VerdictQuery
from probes.discovery.meshes import UNKNOWN
from probes.spec import JudgingSettings
from probes.types import pair_cohort
from probes.verdict.pairs import pair_matrix
from tests.servers.ports import free_port
from tests.servers.probe_run import Windows, probe_runner, running, windows_for
from tests.servers.prometheus import PrometheusServer, needs_prometheus
from tests.servers.relay_estate import MIN_SAMPLES, NEW, OLD, PAIR_PER_S, PATH, config, estate
from tests.servers.stores import newest_window_end

# Hang guard in calls, not seconds: a matrix the statistics cannot decide with this many
# calls per pair is a broken implementation, not a slow machine.
MAX_SAMPLES = 40 * MIN_SAMPLES
PAIRS = [(a, b) for a in (OLD, NEW) for b in (OLD, NEW)]


def _states(matrix: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(c["caller"], c["callee"]): c["verdict"] for c in matrix["cells"]}


async def _scraped(prom: PrometheusServer, query: str) -> bool:
    async with httpx.AsyncClient(base_url=prom.url, timeout=10) as api:
        r = await api.get("/api/v1/query", params={"query": query})
        return bool(r.json()["data"]["result"])


@needs_prometheus
async def test_pair_matrix_from_prometheus_fails_the_retrying_caller_as_the_store_does(
    tmp_path: Path,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    prom = PrometheusServer(tmp_path, [listen], job="skewprobe")
    store = str(tmp_path / "relay.db")
    windows = Windows()
    try:
        await prom.wait_ready()
        # Prometheus applies its targets a few seconds after it starts: wait until it tries.
        for _ in range(120):
            if await _scraped(prom, "count(up) == 1"):
                break
            await asyncio.sleep(0.25)
        async with estate("emulated", tmp_path) as relays:
            text = config(relays, extra=(f"source: prometheus\nprometheus: "
                                         f"{{url: '{prom.url}', step: 1s, lookback: 10m}}\n"))
            runner = probe_runner(text, store, listen=listen, on_window=windows.on_window)
            async with running(runner, stop_within_s=30):
                body: dict[str, Any] = {}
                # The fail needs each pair's first MIN_SAMPLES calls, as Prometheus scraped
                # them (a scrape a second): bounded by the windows those take.
                wait = windows.budget(windows_for(MIN_SAMPLES, PAIR_PER_S),
                                      f"the pair {NEW} -> {OLD} to fail from Prometheus")
                while True:
                    await wait.next()
                    if windows.requests[PATH, pair_cohort(NEW, OLD)] < MIN_SAMPLES:
                        continue
                    # GET /verdict's own code: the runner judges from Prometheus. The CLI
                    # asks for the same instant later, after more scrapes were stored: the
                    # source answers a step before its clock, so both read the same samples.
                    decided = math.floor(time.time() * 1000) / 1000  # as `--at` reads it
                    body = dict(await runner.verdict_json(VerdictQuery(at=f"{decided:.3f}")))
                    fewest = min(windows.requests[PATH, pair_cohort(*p)] for p in PAIRS)
                    judged = _states(body["pairs"][0]) if body.get("pairs") else {}
                    if judged.get((NEW, OLD)) == "fail" or fewest > MAX_SAMPLES:
                        break

        [matrix] = body["pairs"]
        assert matrix["path"] == PATH
        # A call no callee answered (the relay gave up: a timeout on a loaded machine) is the
        # caller's pair with callee `unknown`; every other cell is one of the four pairs.
        assert matrix["callers"] == [OLD, NEW]
        assert [c for c in matrix["callees"] if c != UNKNOWN] == [OLD, NEW]
        states = {pair: state for pair, state in _states(matrix).items() if pair[1] != UNKNOWN}
        assert set(states) == set(PAIRS)
        assert states[OLD, OLD] == "baseline"
        assert states[NEW, OLD] == "fail", matrix
        assert "attempts" in next(c["reason"] for c in matrix["cells"]
                                  if (c["caller"], c["callee"]) == (NEW, OLD))
        # The old caller talking to the new callee retries nothing: not a failure.
        assert states[OLD, NEW] != "fail", matrix
        assert {s["caller"] for s in matrix["stale"]} == {OLD, NEW}
        assert body["verdict"] == "fail"
        assert any(f"pair {pair_cohort(NEW, OLD)} fail: attempts per request" in r
                   for r in body["reasons"]), body["reasons"]
        # Counted from the series, not the store: each cell's calls are those Prometheus saw,
        # at most what the store holds for the pair (it sees a call a scrape later).
        store_matrix = pair_matrix(store, JudgingSettings(min_samples=MIN_SAMPLES, window_s=1.0,
                                                          warmup_s=1.0),
                                   path=PATH, now=newest_window_end(store) + 1.0,
                                   every_window=True)
        held = {(c.caller, c.callee): c.requests for c in store_matrix.cells}
        for cell in matrix["cells"]:
            assert 0 < cell["requests"] <= held[cell["caller"], cell["callee"]], cell
        assert store_matrix.cell(NEW, OLD) is not None
        assert store_matrix.cell(NEW, OLD).verdict == "fail"  # type: ignore[union-attr]

        # `skewprobe verdict --prometheus` judges with the same code: the matrix, exit 1.
        config_file = tmp_path / "judging.yaml"
        config_file.write_text(text)
        cli = [sys.executable, "-m", "probes.cli", "verdict", "--prometheus", prom.url,
               "--config", str(config_file), "--at", f"{decided:.3f}"]
        done = await asyncio.to_thread(subprocess.run, [*cli, "--json"], capture_output=True,
                                       text=True, timeout=120, check=False)
        assert done.returncode == 1, done.stderr
        doc = json.loads(done.stdout)
        [relay] = doc["pairs"]
        assert _states(relay)[NEW, OLD] == "fail"
        table = await asyncio.to_thread(subprocess.run, cli, capture_output=True, text=True,
                                        timeout=120, check=False)
        assert table.returncode == 1, table.stderr
        assert f"{PATH}: caller \\ callee" in table.stdout
    finally:
        prom.stop()
