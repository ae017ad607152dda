"""A local fleet probed by a real `ProbeRunner`: the set-up the end-to-end tests share.

The fleet runs the example fault profiles (1.20.3 clean; 1.21.0 retries every first attempt
on /api/checkout), the probe finds it through the fleet's endpoints file, and the runner runs
in the test's own event loop until the test leaves `running()`, so no task outlives its test.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from probes.config import parse_config
from probes.run.runner import ProbeRunner, RunOptions
from probes.types import PathWindow
from targets.fleet import Fleet
from targets.profile import load_profiles

PROFILES = Path(__file__).resolve().parents[2] / "targets" / "examples" / "profiles.yaml"
# The example's regressed path and one it leaves alone.
CHECKOUT_AND_CATALOG = {"checkout": "/api/checkout", "catalog": "/api/catalog"}


def discard_config(*, window: str = "10s", timeout: str = "1s", listen: str | None = None) -> str:
    """Probe config text for one path, checkout, on a port nothing serves (the discard port,
    127.0.0.1:9, labelled 1.20.3): the probe runs and its calls fail fast. For tests about
    anything but the calls (the command line, start-up, the store, the API)."""
    return (
        "targets:\n"
        "  static:\n"
        "    - address: 127.0.0.1:9\n"
        '      labels: {proxy_version: "1.20.3"}\n'
        f"window: {window}\n"
        + (f"listen: {listen}\n" if listen is not None else "")
        + "paths:\n"
        "  - name: checkout\n"
        "    http: {path: /api/checkout}\n"
        "    rate: 5/s\n"
        f"    timeout: {timeout}\n"
    )


def http_config(
    endpoints: str | Path,
    *,
    rate: str,
    timeout: str = "500ms",
    paths: Mapping[str, str] = CHECKOUT_AND_CATALOG,
    min_samples: int = 100,
    warmup: str = "1s",
) -> str:
    """Probe config text: file discovery from `endpoints`, 1 s windows, and one HTTP path
    per `paths` entry (name -> URL path), each at `rate` under `timeout`. The fleet's pods
    start warm, so each pod's warm-up is one window (the default 2 min would outlast a test)."""
    lines = [
        f"targets: {{file: {{path: {endpoints}}}}}",
        "window: 1s",
        f"verdict: {{min_samples: {min_samples}, warmup: {warmup}}}",
        "paths:",
    ]
    for name, url_path in paths.items():
        lines += [f"  - name: {name}", f"    http: {{path: {url_path}}}",
                  f"    rate: {rate}", f"    timeout: {timeout}"]
    return "\n".join(lines) + "\n"


def example_fleet(
    endpoints: str | Path,
    *,
    base_host: str,
    seed: int,
    notice_s: float,
    pods: int = 4,
    version: str = "1.20.3",
    drain_s: float = 0.2,
    grpc_port: int | None = None,
    namespace: str = "default",
) -> Fleet:
    """A fleet (not started: `async with` it) of emulated sidecars with the example
    profiles, publishing its endpoints to `endpoints`. HTTP only unless `grpc_port` is set."""
    return Fleet(pods=pods, version=version, profiles=load_profiles(PROFILES),
                 base_host=base_host, endpoints_file=endpoints, seed=seed,
                 grpc_port=grpc_port, drain_s=drain_s, notice_s=notice_s,
                 namespace=namespace)


SHARED_LOOP_LAG_BUDGET_S = 0.100


def probe_runner(
    config: str,
    store: str,
    *,
    listen: str | None = None,
    duration_s: float | None = None,
    on_window: Callable[[Sequence[Any]], None] | None = None,
) -> ProbeRunner:
    """A runner for config text `config` writing to `store`; no API unless `listen`.

    The fleet's apps run on this test's event loop too, so the probe's sends are late by
    their work as well as its own: the overload rule's lag budget (10 ms, its own tests in
    tests/unit/test_overload.py and tests/integration/test_runner.py) would read a shared
    loop as a starved probe and make these end-to-end verdicts inconclusive on a busy CI
    machine. Here the
    budget is 100 ms; skipped calls still count as overload.
    """
    options = RunOptions(store_path=store, listen=listen, duration_s=duration_s,
                         on_window=on_window)
    runner = ProbeRunner(parse_config(config), options)
    runner.overload.budget_s = SHARED_LOOP_LAG_BUDGET_S  # the recorder counts late by it too
    return runner


@contextlib.asynccontextmanager
async def running(runner: ProbeRunner, *, stop_within_s: float) -> AsyncIterator[
        asyncio.Task[None]]:
    """Run `runner` for the body; on the way out stop it as SIGTERM would and wait for it
    (bounded), so its last window is flushed to the store before the test reads it."""
    task = asyncio.create_task(runner.run())
    try:
        yield task
    finally:
        runner.stopping.set()
        await asyncio.wait_for(task, stop_within_s)


# Only a hang guard: a running probe writes a window every second however loaded the
# machine is, so this long without one means it is stuck, not slow.
NO_WINDOW_FOR_S = 60.0
# How many times more slowly than configured a loaded machine may make a test's calls before
# a wait for them counts as hung: a probe skips late sends (the overload rule) and its
# targets answer late, but a wait still ten times over is a broken test or probe.
SLOWDOWN = 10
# Windows before the calls counted start: the file source's first read, a pod's warm-up
# window, a rollout's notice and drain.
SETTLE_WINDOWS = 10
# The example fleet's checkout on the canary fails the attempts test after a few hundred
# canary calls on average (2 attempts per call against 1).
ATTEMPTS_FAIL_CANARY_CALLS = 500


def windows_for(calls: int, per_s: float, *, window_s: float = 1.0) -> int:
    """The windows a wait for `calls` calls, made at `per_s` calls a second, may take:
    SLOWDOWN times the expected count, and SETTLE_WINDOWS. Every wait on windows is bounded
    by one of these."""
    return math.ceil(SLOWDOWN * calls / (per_s * window_s)) + SETTLE_WINDOWS


class Windows:
    """What the runner has written, window by window: pass `on_window` to `probe_runner`,
    then wait with `budget()` or `until()` instead of sleeping, and read the requests written
    per (path, cohort) so far. Tests wait on counts, so a loaded machine only makes them
    slower, never wrong; every wait is bounded in windows (`windows_for`), so a count that
    never comes fails the test instead of hanging it."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()
        self.latest_end = 0.0  # the end of the newest window written: "now" for a verdict
        self.written = 0  # times the runner wrote its windows: the budgets' clock
        self._written = asyncio.Event()

    def on_window(self, windows: Sequence[PathWindow]) -> None:
        self.written += 1
        for w in windows:
            self.requests[w.path, w.cohort] += w.requests
            self.latest_end = max(self.latest_end, w.start + w.length)
        self._written.set()

    async def _next(self) -> None:
        """Until the runner writes its next windows (fails the test if it never does)."""
        try:
            async with asyncio.timeout(NO_WINDOW_FOR_S):
                await self._written.wait()
        except TimeoutError:
            raise AssertionError(
                f"the probe wrote no window for {NO_WINDOW_FOR_S:.0f} s") from None
        self._written.clear()

    def budget(self, most: int, waiting_for: str) -> WindowBudget:
        """At most `most` windows to wait for what `waiting_for` says."""
        return WindowBudget(self, most, waiting_for)

    async def until(self, path_cohorts: Sequence[tuple[str, str]], requests: int, *,
                    within: int) -> None:
        """Until each (path, cohort) has at least `requests` requests written; fails the test
        after `within` windows without."""
        wait = self.budget(within, f"{requests} requests for each of {list(path_cohorts)}")
        while min(self.requests[pc] for pc in path_cohorts) < requests:
            await wait.next()


class WindowBudget:
    """A wait of at most `most` windows: `next()` waits for the runner's next window, and
    fails the test, saying what it waited for and what was written, once `most` were written
    since the budget began (counted as written, so a test that judges slowly, and wakes
    once for several windows, spends them all)."""

    def __init__(self, windows: Windows, most: int, waiting_for: str) -> None:
        self.windows = windows
        self.most = most
        self.waiting_for = waiting_for
        self.began = windows.written

    async def next(self) -> None:
        if self.windows.written - self.began >= self.most:
            raise AssertionError(
                f"still waiting for {self.waiting_for} after {self.most} windows; requests "
                f"written: {dict(self.windows.requests)}")
        await self.windows._next()
