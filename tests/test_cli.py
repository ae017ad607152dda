"""`skewprobe ...` as a user runs it: real processes, real store files, real pipes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import probes
from probes.cli import build_parser

SKEWPROBE = [sys.executable, "-m", "probes.cli"]

# A probe of one path on a port nothing serves (the discard port): `run` starts, fails its
# calls and stops; enough to see what the command line does.
CONFIG = """\
targets:
  static:
    - address: 127.0.0.1:9
      labels: {proxy_version: "1.20.3"}
window: 1s
paths:
  - name: checkout
    http: {path: /api/checkout}
    rate: 5/s
    timeout: 200ms
"""


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
