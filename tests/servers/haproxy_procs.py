"""HAProxy in tests: skip where it is not installed, and find and kill the HAProxy processes
a test started, to prove none outlive it.

A test's HAProxy processes are the ones whose config lies in the test's own work directory,
so these never touch another test's (or the machine's) HAProxy.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from targets.haproxy_process import find_haproxy

# The mark of every test that runs real HAProxy processes.
needs_haproxy = pytest.mark.skipif(
    find_haproxy() is None,
    reason="haproxy is not installed (apt-get install haproxy; .ci/run installs it)",
)


def haproxy_pids(workdir: Path) -> set[int]:
    """Live HAProxy processes whose config is in `workdir` (zombies have no cmdline)."""
    marker = str(workdir).encode()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            args = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args[0].endswith(b"haproxy") and any(marker in a for a in args):
            found.add(int(entry.name))
    return found


def kill_leftovers(workdir: Path) -> set[int]:
    """Kill (only) HAProxy processes started with a config in `workdir`; return them, so
    the test can assert there were none."""
    leftover = haproxy_pids(workdir)
    for pid in leftover:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leftover
