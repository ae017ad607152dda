"""What `skewprobe run` says: a progress line every so often, a warning when every endpoint
is down, a summary at the end (none with --quiet); and what it refuses or cannot do: a
damaged store at start, windows a full disk would not take (exit 4, how many)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from probes.config import parse_config
from probes.errors import EXIT_UNAVAILABLE
from probes.run.runner import ProbeRunner, RunOptions
from probes.store import Store
from tests.servers.hostile import HostileServer
from tests.servers.probe_run import discard_config
from tests.servers.tiny_disk import on_tiny_disk

SKEWPROBE = [sys.executable, "-m", "probes.cli"]


def _two_targets(up_port: int) -> str:
    """One endpoint that answers (1.20.3) and one nothing serves (1.21.0, the discard port)."""
    return (
        "targets:\n  static:\n"
        f"    - {{address: 127.0.0.1:{up_port}, labels: {{proxy_version: 1.20.3}}}}\n"
        "    - {address: 127.0.0.1:9, labels: {proxy_version: 1.21.0}}\n"
        "window: 1s\npaths:\n"
        "  - {name: checkout, http: {path: /status/200}, rate: 10/s, timeout: 200ms}\n"
    )


def _messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "skewprobe.progress" and r.levelno == level]


async def test_progress_lines_count_calls_per_cohort_and_endpoints_up_and_down(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="skewprobe.progress")
    store = tmp_path / "probe.db"
    async with HostileServer() as up:
        # A line a second: three in the run, the last over its third second of calls.
        runner = ProbeRunner(parse_config(_two_targets(up.port)), RunOptions(
            store_path=str(store), listen=None, duration_s=3.6, progress_every_s=1.0))
        await asyncio.wait_for(runner.run(), 20)
    lines = [m for m in _messages(caplog, logging.INFO) if "calls in the last" in m]
    assert lines, caplog.text
    # By the last line both endpoints have been called for a whole second.
    last = lines[-1]
    assert "endpoints 1 up, 1 down" in last, last
    assert "1.20.3 " in last and "(0 errors)" in last and "errors, 100.0 %" in last, last
    assert "windows written; verdict " in last
    summary = [m for m in _messages(caplog, logging.INFO) if m.startswith("run ended after")]
    assert len(summary) == 1 and f"windows written to {store}" in summary[0], summary
    assert "verdict inconclusive" in summary[0]  # 1.21.0 never answered: nothing to judge
    report = [m for m in _messages(caplog, logging.INFO) if "skewprobe report" in m]
    assert report and f"skewprobe report --store {store} --from " in report[0]


async def test_a_run_whose_endpoints_are_all_down_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="skewprobe.progress")
    # "All down" after half the progress interval (0.5 s here, 30 s at the default).
    runner = ProbeRunner(parse_config(discard_config(window="1s", timeout="200ms")),
                         RunOptions(store_path=str(tmp_path / "probe.db"), listen=None,
                                    duration_s=2.0, progress_every_s=1.0))
    await asyncio.wait_for(runner.run(), 20)
    warnings = _messages(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("all 1 endpoints are down: none answered a call in ")


def _run(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SKEWPROBE, "run", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_the_summary_is_shown_unless_quiet(tmp_path: Path) -> None:
    config = tmp_path / "probe.yaml"
    config.write_text(discard_config(window="1s", timeout="200ms"))
    store = tmp_path / "probe.db"
    loud = _run("--config", config, "--store", store, "--listen", "none", "--duration", "2s")
    assert loud.returncode == 0, loud.stderr
    assert "skewprobe.cost: expected cost" in loud.stderr
    assert "skewprobe.progress: run ended after " in loud.stderr
    assert f"skewprobe report --store {store} --from " in loud.stderr
    quiet = _run("--config", config, "--store", store, "--listen", "none", "--duration", "2s",
                 "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""


def _damaged_store(path: Path) -> None:
    """A real store whose table pages were overwritten with random bytes (header and schema
    page kept, so it still opens as a skewprobe store)."""
    from tests.servers.stores import store_with_a_failing_canary

    store_with_a_failing_canary(path, now=1_790_000_000.0)
    with path.open("r+b") as f:
        f.seek(4096 * 3)
        f.write(np.random.default_rng(0).bytes(4096 * 8))


def test_a_damaged_store_is_refused_at_start(tmp_path: Path) -> None:
    store = tmp_path / "probe.db"
    _damaged_store(store)
    before = store.read_bytes()
    config = tmp_path / "probe.yaml"
    config.write_text(discard_config(window="1s", timeout="200ms"))
    done = _run("--config", config, "--store", store, "--listen", "none", "--duration", "5s")
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"skewprobe: error: {store}: check: ")
    assert store.read_bytes() == before  # nothing written into it


def test_windows_a_full_disk_would_not_take_are_counted_and_exit_4(tmp_path: Path) -> None:
    """The store is made on a small tmpfs; once its first windows are in, a filler takes the
    rest of the disk: every later window is refused, and the run ends saying how many."""
    mnt = tmp_path / "mnt"
    config = tmp_path / "probe.yaml"
    config.write_text(discard_config(window="1s", timeout="200ms"))
    store = mnt / "probe.db"
    # The filler waits for the store's first commit (at most 600 × 0.1 s: a hang guard, the
    # first window is due a second after start), then fills the disk; whenever that is, the
    # final flush at the end of the 6 s has windows to write and finds the disk full.
    script = (f'i=0; until [ -s "{store}-wal" ] || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); '
              f'done; cat /dev/zero > "{mnt}/filler" 2>/dev/null; echo filled')
    done = on_tiny_disk(mnt, 1024, [
        "sh", "-c", f'({script}) & exec "$@"', "sh", *SKEWPROBE, "run", "--config",
        str(config), "--store", str(store), "--listen", "none", "--duration", "6s"])
    assert "filled" in done.stdout
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"skewprobe: error: {store}: "), done.stderr
    assert " windows could not be written and are lost (" in last and "disk full" in last
    lost = int(last.removeprefix(f"skewprobe: error: {store}: ").split()[0].replace(",", ""))
    assert lost >= 1
    assert f"({lost:,} could not be written)" in done.stderr, done.stderr  # the summary too


def test_store_check_passes_a_sound_store(tmp_path: Path) -> None:
    """The check `run` makes at start finds nothing wrong with a store it wrote itself."""
    from tests.servers.stores import store_with_a_failing_canary

    store_with_a_failing_canary(tmp_path / "s.db", now=1_790_000_000.0)
    with Store.open(tmp_path / "s.db") as s:
        s.check()


def test_a_run_on_static_targets_records_the_inventory_plan_and_inventory_read(
        tmp_path: Path) -> None:
    config = tmp_path / "probe.yaml"
    config.write_text(discard_config(window="1s", timeout="200ms"))
    store = tmp_path / "probe.db"
    done = _run("--config", config, "--store", store, "--listen", "none", "--duration", "2s",
                "--quiet")
    assert done.returncode == 0, done.stderr

    def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*SKEWPROBE, *map(str, args)], capture_output=True, text=True,
                              timeout=60, check=False)

    inventory = cli("inventory", "--store", store)
    assert inventory.returncode == 0, inventory.stderr
    assert "proxy versions: 1.20.3: 1" in inventory.stdout
    # Static targets record no control plane: it is given (without it: exit 3, one line).
    plan = cli("plan", "--store", store, "--to", "1.21.0", "--control-plane", "1.21.0")
    assert plan.returncode == 0, plan.stderr
    assert f"pods from: store {store} (inventory snapshot at " in plan.stdout
    # A store without snapshots: the error names no time when none was given.
    from tests.servers.stores import store_with_a_failing_canary

    bare = tmp_path / "bare.db"
    store_with_a_failing_canary(bare, now=1_790_000_000.0)
    for command in (["inventory"], ["plan", "--to", "1.21.0"]):
        refused = cli(*command, "--store", bare)
        assert refused.returncode == EXIT_UNAVAILABLE, refused.stderr
        assert refused.stderr == (f"skewprobe: error: {bare}: no inventory snapshot (a run "
                                  "records one after its first window)\n")
