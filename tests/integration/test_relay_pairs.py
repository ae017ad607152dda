"""Relay paths end to end on loopback: a real probe run through relay pods to destination pods,
results keyed by (caller, callee) version pair in the store, and the pair matrix's verdict.

Two relay pods (callers 1.20.3 and 1.21.0) each balance round robin over two destination
pods (callees 1.20.3 and 1.21.0), so every pair is measured. The destination app fails a
fixed 20 % of request ids on every attempt; the 1.21.0 caller's outbound proxy retries twice
on 503, so it sends 3 attempts for each of them: the same success rate, 1.4 attempts per
request. That pair must fail on attempts per request against the old-old pair; the old
caller with the new callee must not. Twice: with the retries emulated by the relay's
outbound side (attempts as the destination received them), and with each caller version's
calls leaving through a real HAProxy of that version (`retries 2`, `retry-on 503`; attempts
from its `x-envoy-attempt-count` response header).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes.config import parse_config
from probes.discovery.meshes import UNKNOWN
from probes.spec import JudgingSettings
from probes.store import Store
from probes.types import pair_cohort
from probes.verdict.pairs import PairMatrix, pair_matrix
from tests.servers.haproxy_procs import kill_leftovers, needs_haproxy
from tests.servers.probe_run import Windows, probe_runner, running, windows_for
from tests.servers.relay_estate import MIN_SAMPLES, NEW, OLD, PAIR_PER_S, PATH, config, estate
from tests.servers.stores import newest_window_end

# The hang guard's multiple: a decision the statistics cannot reach with this many calls per
# pair is a broken implementation, not a slow machine (counts, never seconds).
MAX_SAMPLES = 40 * MIN_SAMPLES


def as_written(store_path: str) -> float:
    """`now` as of the newest window in the store: the verdict as it stood when the probe
    wrote it (this test is about pairs, not about a loaded machine's write lag)."""
    return newest_window_end(store_path) + 1.0


def counts(store_path: str, cohort: str) -> tuple[int, int, int, int]:
    """(calls, successes, attempts summed, calls with attempts measured) over the store."""
    store = Store.open(store_path, readonly=True)
    try:
        windows = [w for w in store.read_windows() if w.cohort == cohort]
    finally:
        store.close()
    return (sum(w.requests for w in windows), sum(w.successes for w in windows),
            sum(w.attempts_sum for w in windows), sum(w.attempts_count for w in windows))


@pytest.mark.parametrize("outbound", [
    "emulated", pytest.param("haproxy", marks=needs_haproxy)])
async def test_retrying_caller_fails_on_attempts_against_old_old_at_equal_success(
    tmp_path: Path, outbound: str,
) -> None:
    store = str(tmp_path / "relay.db")
    settings = JudgingSettings(min_samples=MIN_SAMPLES, window_s=1.0, warmup_s=1.0)
    pairs = [(a, b) for a in (OLD, NEW) for b in (OLD, NEW)]
    windows = Windows()
    async with estate(outbound, tmp_path) as relays:
        runner = probe_runner(config(relays), store, on_window=windows.on_window)
        async with running(runner, stop_within_s=30):
            matrix: PairMatrix | None = None
            # A pair's fail needs its first MIN_SAMPLES calls (1.4 attempts per call against
            # 1 is no close call), so the wait is bounded by the windows those take.
            wait = windows.budget(windows_for(MIN_SAMPLES, PAIR_PER_S),
                                  f"the pair {NEW} -> {OLD} to fail")
            while True:
                await wait.next()
                fewest = min(windows.requests[PATH, pair_cohort(*p)] for p in pairs)
                if fewest < MIN_SAMPLES:
                    continue
                matrix = pair_matrix(store, settings, path=PATH, now=as_written(store),
                                     every_window=True)
                cell = matrix.cell(NEW, OLD)
                assert cell is not None
                if cell.verdict == "fail" or fewest > MAX_SAMPLES:
                    break

    # Every result is keyed by both versions: the four pairs, and the caller with an unknown
    # callee for a call no callee answered (the relay gave up: a timeout on a loaded
    # machine), which has no success and no attempts measured.
    gave_up = {c for _, c in windows.requests} - {pair_cohort(*p) for p in pairs}
    assert gave_up <= {pair_cohort(v, UNKNOWN) for v in (OLD, NEW)}, gave_up
    for cohort in gave_up:
        _, ok, _, measured = counts(store, cohort)
        assert ok == measured == 0, (cohort, ok, measured)
    assert matrix.callers == (OLD, NEW)
    assert tuple(c for c in matrix.callees if c != UNKNOWN) == (OLD, NEW)
    by_pair = {(c.caller, c.callee): c for c in matrix.cells}
    assert by_pair[OLD, OLD].verdict == "baseline"
    assert by_pair[NEW, OLD].verdict == "fail", by_pair[NEW, OLD].reason
    assert "attempts" in by_pair[NEW, OLD].reason
    # The old caller talking to the new callee retries nothing: not a failure.
    assert by_pair[OLD, NEW].verdict != "fail", by_pair[OLD, NEW].reason
    assert matrix.verdict == "fail"

    assert kill_leftovers(tmp_path) == set()  # no HAProxy outlives its estate

    # The figures behind it, from the store: every call's attempts measured (as the
    # destination saw them), one per call from the old caller, three per failed call from
    # the new one, and the same success rate within four standard errors.
    got = {p: counts(store, pair_cohort(*p)) for p in pairs}
    for (caller, _), (calls, ok, attempts, measured) in got.items():
        assert measured == calls > 0
        assert attempts == (calls if caller == OLD else ok + 3 * (calls - ok))
    (n1, ok1, _, _), (n2, ok2, _, _) = got[OLD, OLD], got[NEW, OLD]
    pooled = (ok1 + ok2) / (n1 + n2)
    assert 0 < pooled < 1
    assert abs(ok1 / n1 - ok2 / n2) < 4 * (pooled * (1 - pooled) * (1 / n1 + 1 / n2)) ** 0.5

    # `skewprobe verdict` shows the matrix, and its exit code is the matrix verdict.
    # As of the last window written (the probe has stopped; its last window may end a moment
    # after this clock reads, which `--at` would refuse as the future).
    at = str(min(as_written(store) - 1.0, time.time()))
    config_file = tmp_path / "judging.yaml"
    config_file.write_text(config(relays))
    cli = [sys.executable, "-m", "probes.cli", "verdict", "--store", store, "--at", at,
           "--config", str(config_file)]
    done = await asyncio.to_thread(subprocess.run, [*cli, "--json"], capture_output=True,
                                   text=True, timeout=120, check=False)
    # The command judges as a gate does, leaving out windows written while this (shared,
    # perhaps loaded) machine overloaded the probe: it must say what the same rule says.
    expected = pair_matrix(store, parse_config(config(relays)).judging,
                           path=PATH, now=float(at))
    exit_code = {"pass": 0, "fail": 1, "inconclusive": 3}[expected.verdict]
    assert done.returncode == exit_code, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == expected.verdict
    [relay] = doc["pairs"]
    assert relay == json.loads(json.dumps(expected.to_json()))
    assert relay["callers"] == [OLD, NEW]
    assert [c for c in relay["callees"] if c != UNKNOWN] == [OLD, NEW]
    text = await asyncio.to_thread(subprocess.run, cli, capture_output=True, text=True,
                                   timeout=120, check=False)
    assert text.returncode == exit_code
    assert f"{PATH}: caller \\ callee" in text.stdout
    assert f"pairs verdict: {expected.verdict}" in text.stdout
