"""`skewprobe ...` as a user runs it: real processes, real store files, real pipes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import probes
from probes.cli import build_parser
from probes.store import InventoryRow, Store
from probes.verdict.service import format_table
from tests.servers.probe_run import discard_config

SKEWPROBE = [sys.executable, "-m", "probes.cli"]

# A probe of one path on a port nothing serves (the discard port): `run` starts, fails its
# calls and stops; enough to see what the command line does.
CONFIG = discard_config(window="1s", timeout="200ms")


def skewprobe(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SKEWPROBE, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=False)


# -- --version and -v --------------------------------------------------------------------------


def test_version_prints_the_package_version() -> None:
    done = skewprobe("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"skewprobe {probes.__version__}\n"
    assert probes.__version__ != "0+unknown"  # the installed distribution's version


@pytest.mark.parametrize("argv", [
    ["-v", "verdict", "--store", "x.db"],
    ["verdict", "-v", "--store", "x.db"],
    ["verdict", "--store", "x.db", "--verbose"],
    ["report", "--store", "x.db", "--from", "-1h", "--out", "r", "-v"],
    ["inventory", "-v", "--store", "x.db"],
    ["validate", "-v", "probe.yaml"],
])
def test_verbose_is_accepted_before_and_after_the_subcommand(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).verbose is True


def test_verbose_defaults_to_off_for_every_subcommand() -> None:
    assert build_parser().parse_args(["verdict", "--store", "x.db"]).verbose is False
    assert build_parser().parse_args(["validate", "probe.yaml"]).verbose is False


@pytest.mark.parametrize("where", ["before", "after"])
def test_run_logs_at_debug_with_v_on_either_side_of_the_subcommand(
    tmp_path: Path, where: str
) -> None:
    config = tmp_path / "probe.yaml"
    config.write_text(CONFIG)
    run = ["run", "--config", str(config), "--store", str(tmp_path / "p.db"),
           "--listen", "none", "--duration", "0s"]
    argv = ["-v", *run] if where == "before" else [run[0], "-v", *run[1:]]
    done = skewprobe(*argv)
    assert done.returncode == 0, done.stderr
    # asyncio says which selector its loop uses, at debug level only.
    assert "skewprobe: DEBUG asyncio: Using selector" in done.stderr
    quiet = skewprobe(*run)
    assert quiet.returncode == 0, quiet.stderr
    assert "DEBUG" not in quiet.stderr


# -- stdout closed early, and the table of an empty store ----------------------------------------


@pytest.fixture
def empty_store(tmp_path: Path) -> Path:
    """A store `skewprobe run` created and never wrote a window to."""
    path = tmp_path / "empty.db"
    Store.open(path).close()
    return path


def _with_closed_stdout(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run skewprobe with a stdout whose reader is already gone: every write gets EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*SKEWPROBE, *map(str, args)], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_a_closed_stdout_ends_quietly_with_the_verdicts_exit_code(
    empty_store: Path, extra: list[str]
) -> None:
    done = _with_closed_stdout("verdict", "--store", empty_store, *extra)
    assert done.stderr == ""
    assert done.returncode == 3  # inconclusive, as with the whole output read


def test_a_closed_stdout_ends_other_commands_quietly_too(tmp_path: Path) -> None:
    store = tmp_path / "inventory.db"
    with Store.open(store) as s:
        s.write_inventory(time.time() - 60, [InventoryRow("shop", "checkout", "1.20.3", 3)])
    for args in (["validate", "--schema"], ["inventory", "--store", store],
                 ["inventory", "--store", store, "--json"]):
        done = _with_closed_stdout(*args)
        assert (done.returncode, done.stderr) == (0, ""), args


def test_verdict_piped_to_head(empty_store: Path) -> None:
    line = f"{shlex.join([*SKEWPROBE, 'verdict', '--store', str(empty_store)])} | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.stderr == ""
    assert done.returncode == 3
    assert done.stdout.splitlines() == [
        "path  metric  baseline (none)  canary (none)  verdict"
    ]


def test_the_table_names_missing_cohorts_instead_of_printing_none(empty_store: Path) -> None:
    done = skewprobe("verdict", "--store", empty_store)
    assert done.returncode == 3, done.stderr
    assert "None" not in done.stdout
    header = done.stdout.splitlines()[0].split("  ")
    assert header == ["path", "metric", "baseline (none)", "canary (none)", "verdict"]
    one = format_table({"verdict": "inconclusive", "baseline": "1.20.3", "canary": None,
                        "paths": [], "reasons": ["one cohort"]})
    assert one.splitlines()[0] == "path  metric  baseline 1.20.3  canary (none)  verdict"


def test_verdict_at_judges_a_stopped_probe_as_it_stood_then(tmp_path: Path) -> None:
    from probes._parsing import rfc3339
    from tests.servers.stores import store_with_a_failing_canary

    store = tmp_path / "stopped.db"
    stopped = (time.time() // 10) * 10 - 3600  # the probe stopped an hour ago
    store_with_a_failing_canary(store, stopped)
    with Store.open(str(store), readonly=True) as s:
        newest = s.newest_window_end()
    assert newest is not None
    # Asked now: stale, so never a pass, but its fail stands; the reason says how to ask
    # for the verdict as it stood then.
    now = skewprobe("verdict", "--store", store, "--json")
    assert now.returncode == 1, now.stderr
    at = rfc3339(newest)
    assert any(f"skewprobe verdict --at {at}" in r for r in json.loads(now.stdout)["reasons"])
    then = skewprobe("verdict", "--store", store, "--json", "--at", at)
    assert then.returncode == 1, then.stdout
    assert json.loads(then.stdout)["window"]["to"] == at
    # Earlier, with half the data, and before any: each judged on what had ended by then.
    early = skewprobe("verdict", "--store", store, "--json", "--at", rfc3339(newest - 590))
    assert early.returncode in (1, 3) and json.loads(early.stdout)["window"]["to"] <= at
    before = skewprobe("verdict", "--store", store, "--at", rfc3339(newest - 7200))
    assert before.returncode == 3
    future = skewprobe("verdict", "--store", store, "--at", "2999-01-01T00:00:00Z")
    assert future.returncode == 2 and future.stderr.count("\n") == 1
