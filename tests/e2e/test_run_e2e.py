"""`skewprobe run` as a real process against the local fleet during a rollout.

The fleet runs in the test's event loop; the probe is its own process, found through the
fleet's endpoints file, exactly as the demo and a file-discovery deployment run it.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from probes.errors import StoreError
from probes.report.summary import summarise
from probes.store import Store
from targets.fleet import Fleet
from tests.servers.ports import free_port
from tests.servers.probe_run import example_fleet

BASELINE, CANARY = "1.20.3", "1.21.0"
PATHS = ("checkout", "catalog", "echo")
CONFIG = """\
targets: {{file: {{path: {endpoints}}}}}
window: 1s
paths:
  - name: checkout
    http: {{path: /api/checkout}}
    rate: 20/s
    timeout: 500ms
  - name: catalog
    http: {{path: /api/catalog, version: "2"}}
    rate: 10/s
    timeout: 500ms
  - name: echo
    grpc: {{method: /skewprobe.target.v1.Target/Echo}}
    port: grpc
    rate: 10/s
    timeout: 500ms
"""


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    fleet = example_fleet(tmp_path / "endpoints.json", base_host="127.0.0.40", seed=3,
                          grpc_port=0, drain_s=0.5, notice_s=1.2)
    await fleet.start()
    yield fleet
    await fleet.stop(0.0)


async def _start_probe(tmp_path: Path, listen: str) -> asyncio.subprocess.Process:
    config = tmp_path / "probe.yaml"
    config.write_text(CONFIG.format(endpoints=tmp_path / "endpoints.json"))
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "probes.cli", "run", "--config", str(config),
        "--store", str(tmp_path / "probe.db"), "--listen", listen,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )


# Only hang guards: a loaded machine is slower to import and start the probe, never wrong.
HANG_GUARD_S = 60.0


async def _wait_healthy(base: str, probe: asyncio.subprocess.Process) -> None:
    async with httpx.AsyncClient() as client:
        until = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < until:
            assert probe.returncode is None, "the probe exited before its API came up"
            try:
                if (await client.get(f"{base}/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("probe API never came up")


YOUNG_PAUSES = re.compile(r'^skewprobe_gc_pause_seconds_count\{generation="0"\} (\S+)$',
                          re.MULTILINE)


def _answered(cohort: str) -> Callable[[str], bool]:
    """Whether an exposition counts an answered request of every path on `cohort`."""
    return lambda text: all(
        f'skewprobe_requests_total{{cohort="{cohort}",outcome="ok",path="{p}"}}' in text
        for p in PATHS)


def _young_pause(text: str) -> bool:
    """Whether an exposition counts a young collection's pause."""
    young = YOUNG_PAUSES.search(text)
    return young is not None and float(young.group(1)) > 0


async def _until_metrics(base: str, ready: Callable[[str], bool], what: str) -> str:
    """Until the probe's /metrics satisfies `ready`; returns that exposition."""
    async with httpx.AsyncClient() as client:
        until = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < until:
            text = (await client.get(f"{base}/metrics")).text
            if ready(text):
                return text
            await asyncio.sleep(0.2)
    raise AssertionError(f"/metrics never showed {what}")


async def _first_window(db: str, probe: asyncio.subprocess.Process,
                        hang_guard_s: float = HANG_GUARD_S) -> set[tuple[float, str, str, int]]:
    """The windows in the store at the first look that finds any (the probe still running);
    the hang guard only catches a probe that never writes."""
    until = time.monotonic() + hang_guard_s
    while time.monotonic() < until:
        assert probe.returncode is None, "the probe exited before writing a window"
        try:
            with Store.open(db, readonly=True) as store:
                windows = store.read_windows()
        except StoreError:
            windows = []  # not created yet
        if windows:
            return {(w.start, w.path, w.cohort, w.requests) for w in windows}
        await asyncio.sleep(0.1)
    raise AssertionError(f"no window committed in {hang_guard_s:.0f} s")


@pytest.mark.slow
async def test_run_follows_a_rollout_and_flushes_on_sigterm(fleet: Fleet, tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    probe = await _start_probe(tmp_path, f"127.0.0.1:{port}")
    try:
        await _wait_healthy(base, probe)
        # Each path answered on the old version, then, after the rollout, on the new one:
        # waited for in the probe's own counts, not for fixed seconds.
        await _until_metrics(base, _answered(BASELINE), f"every path answered on {BASELINE}")
        await fleet.rollout(CANARY, interval_s=0.5, limit=2)
        await _until_metrics(base, _answered(CANARY), f"every path answered on {CANARY}")
        # The probe's own collector pauses, from its gc.callbacks hook: young collections
        # happen in any run long enough; a broken or missing hook leaves the count at 0.
        exposition = await _until_metrics(base, _young_pause, "a young collection's pause")
        sent = time.time()
        probe.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(probe.communicate(), HANG_GUARD_S)
    finally:
        if probe.returncode is None:
            probe.kill()
            await probe.wait()
    assert probe.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr

    restarted = [e for e in fleet.history() if e.kind == "restart_finished"]
    assert len(restarted) == 2
    with Store.open(str(tmp_path / "probe.db"), readonly=True) as store:
        windows = store.read_windows()
        figures = {(f.path, f.cohort): f for f in summarise(windows)}
        last_window = store.time_range()
        endpoint_windows = store.read_endpoint_windows(paths=["checkout"], cohorts=[BASELINE])
    assert set(figures) == {(p, c) for p in ("checkout", "catalog", "echo")
                            for c in (BASELINE, CANARY)}
    # The regressed path on the new version: every request retried by the sidecar.
    assert figures[("checkout", CANARY)].attempts_per_request == pytest.approx(2.0, abs=0.05)
    # The old version never retries; an extra attempt in its cohort can only be a call the
    # probe still sent as the old version to a pod already back on the new one (discovery
    # re-reads the file each second; the fleet's notice is longer, so there are usually
    # none): at most the calls to a restarted pod from the window its restart began on.
    started = {e.pod: e.at for e in fleet.history() if e.kind == "restart_started"}
    extra = sum(w.attempts_sum - w.attempts_count for w in windows
                if (w.path, w.cohort) == ("checkout", BASELINE))
    suspect = sum(w.requests for w in endpoint_windows
                  if w.endpoint in started and w.start + 1.0 > started[w.endpoint])
    assert 0 <= extra <= suspect, (extra, suspect)
    assert figures[("catalog", CANARY)].attempts_per_request == pytest.approx(1.0)
    for fig in figures.values():
        assert "probe_error" not in fig.outcomes
    # The windows open at SIGTERM were written: the store reaches past the instant it was
    # sent (the window holding that instant ends after it).
    assert last_window is not None and last_window[1] > sent

    assert _answered(CANARY)(exposition) and _young_pause(exposition)
    promtool = shutil.which("promtool")
    if promtool is not None:
        check = await asyncio.create_subprocess_exec(
            promtool, "check", "metrics", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(check.communicate(exposition.encode()), 30)
        assert check.returncode == 0, out.decode()


@pytest.mark.slow
async def test_kill_9_keeps_committed_windows(fleet: Fleet, tmp_path: Path) -> None:
    probe = await _start_probe(tmp_path, "none")
    db = str(tmp_path / "probe.db")
    try:
        # Kill it once a window is committed (read from outside, as a reader would), not
        # after a fixed time: a loaded machine may take longer to import and start.
        committed = await _first_window(db, probe)
        probe.kill()
        await probe.wait()
    finally:
        if probe.returncode is None:
            probe.kill()
            await probe.wait()
    assert probe.returncode == -signal.SIGKILL
    with Store.open(db) as store:  # opens cleanly, recovering the WAL
        store.check()
        windows = store.read_windows()
    # What was committed before the kill is still there, whole.
    assert {(w.start, w.path, w.cohort, w.requests) for w in windows} >= committed
    assert sum(w.requests for w in windows) > 0
