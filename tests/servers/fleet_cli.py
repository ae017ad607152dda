"""The local fleet's command line (`python -m targets.fleet`) as a child process of a test.

A fleet in its own process keeps its apps' work off the test's event loop, so a probe run in
the test has that loop to itself, as `skewprobe run` has in production. `fleet_process()`
bounds every wait (start, each line read, stop) and always ends the child: SIGTERM (the fleet
stops its pods in order), then SIGKILL; and the kernel kills it should the test process die
first (`setpriv --pdeathsig`), as the fleet's own HAProxy sidecars are.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
# The line the fleet prints once every pod serves and the endpoints file is written.
READY = "pods of"


async def start_fleet(
    *args: str, stderr: int | IO[bytes] = asyncio.subprocess.PIPE,
) -> asyncio.subprocess.Process:
    """`python -m targets.fleet *args`, its stdout a pipe (see `read_until`)."""
    argv = [sys.executable, "-m", "targets.fleet", *args]
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
    return await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )


async def read_until(
    proc: asyncio.subprocess.Process, marker: str, timeout_s: float = 20.0,
) -> list[str]:
    """The fleet's stdout lines up to and including the first one containing `marker`;
    fails if the fleet ends first or `timeout_s` passes."""
    assert proc.stdout is not None
    seen: list[str] = []
    async with asyncio.timeout(timeout_s):
        while marker not in (line := (await proc.stdout.readline()).decode()):
            assert line, f"fleet ended before {marker!r}: {seen}"
            seen.append(line)
    return [*seen, line]


@contextlib.asynccontextmanager
async def fleet_process(
    *args: str, log: Path, ready_within_s: float = 30.0, stop_within_s: float = 15.0,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A running fleet (`args` as for `python -m targets.fleet`; use 127.0.0.0/8 addresses),
    its stderr in `log`: entered once its ready line is printed, stopped on the way out."""
    with log.open("wb") as err:
        proc = await start_fleet(*args, stderr=err)
    try:
        try:
            await read_until(proc, READY, ready_within_s)
        except (AssertionError, TimeoutError) as exc:
            raise AssertionError(f"fleet not ready: {exc!r}; stderr: {_tail(log)}") from exc
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), stop_within_s)
        except TimeoutError:
            await reap(proc)


async def terminate(proc: asyncio.subprocess.Process, within_s: float = 15.0) -> bytes:
    """SIGTERM the fleet (it stops its pods in order) and wait for it: its stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), within_s)
    return err or b""


async def reap(proc: asyncio.subprocess.Process) -> None:
    """End the fleet whatever state a failed test left it in (for a `finally`)."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-chars:]
