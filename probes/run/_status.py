"""What `skewprobe run` says about itself: the cost line at start, the progress lines, the
summary at the end, and `/healthz`.

The cost line (`cost_logged`, logger `skewprobe.cost`, shown at the default level by
`probes.cli`) is logged once at start: what the paths will cost (`probes.measure.cost`),
with a warning if it is more than one probe can use. `judge_health` is `/healthz`: whether
the probe is doing its job, in one line.

The progress lines (logger `skewprobe.progress`): at INFO (the CLI's default for `run`;
`--quiet` raises it to WARNING) a line every `every_s` (a minute) with the calls and errors
per cohort since the last line, how many endpoints answered, the verdict's state and the
windows written; and a summary when the run ends (calls, windows, the store, the verdict,
the command for the report). At WARNING, whatever the level: a run whose endpoints all
stopped answering (or none was discovered) says so once, within `down_after_s` (30 s at the
default), and again when they answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from probes._parsing import rfc3339
from probes.discovery import DiscoverySource
from probes.measure.cost import cpu_limit_cores, estimate
from probes.run.engine import Engine
from probes.spec import PathSpec
from probes.types import Endpoint, Outcome

__all__ = ["NO_ANSWER", "ProgressReporter", "RunState", "cost_logged", "judge_health"]


log = logging.getLogger("skewprobe.progress")

# Outcomes in which the endpoint itself never answered: only these make it "down".
NO_ANSWER: Final = frozenset({
    Outcome.CONNECT_REFUSED, Outcome.CONNECT_TIMEOUT, Outcome.DNS_ERROR, Outcome.TIMEOUT,
    Outcome.TLS_ERROR, Outcome.RESET, Outcome.PROBE_ERROR, Outcome.grpc("UNAVAILABLE"),
    Outcome.grpc("DEADLINE_EXCEEDED"),
})


class Tally(Protocol):
    """The recorder's running totals (`probes.run.runner.Recorder`)."""

    calls_by_cohort: dict[str, int]
    errors_by_cohort: dict[str, int]
    # Endpoints that answered a call (an outcome not in NO_ANSWER); the reporter empties it.
    answered: set[str]


class RunState(Protocol):
    """What the reporter reads from the runner (`probes.run.runner.ProbeRunner`)."""

    @property
    def recorder(self) -> Tally: ...

    @property
    def endpoint_count(self) -> int: ...
    @property
    def windows_written(self) -> int: ...
    @property
    def windows_unwritten(self) -> int: ...
    @property
    def last_verdict(self) -> Mapping[str, Any] | None: ...


@dataclass
class _Counts:
    """The recorder's running totals, as the reporter last saw them."""

    calls: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _per_cohort(calls: Counter[str], errors: Counter[str]) -> str:
    parts = []
    for cohort, n in sorted(calls.items()):
        e = errors[cohort]
        share = f", {100 * e / n:.1f} %" if e else ""
        parts.append(f"{cohort} {n:,} ({e:,} errors{share})")
    return "; ".join(parts) or "none"


def verdict_words(verdict: Mapping[str, Any] | None) -> str:
    """A verdict JSON as a few words: its state and, unless a pass, why: the first reason
    of the first path in that state, else the verdict's own first reason."""
    if verdict is None:
        return "none yet"
    state = str(verdict.get("verdict"))
    reasons = [f"{p['path']}: {p['reasons'][0]}" for p in verdict.get("paths", [])
               if p.get("verdict") == state and p.get("reasons")]
    reasons += verdict.get("reasons", [])
    return state if state == "pass" or not reasons else f"{state} ({reasons[0]})"


class ProgressReporter:
    """`run()` as a task of the run; `finish()` once the run has ended. Without `calls`
    (only stream paths: their messages are not calls) nothing is said of endpoints up or
    down."""

    def __init__(self, state: RunState, *, every_s: float = 60.0,
                 down_after_s: float = 30.0, calls: bool = True) -> None:
        self.state = state
        self.every_s = every_s
        self.down_after_s = down_after_s
        self.calls = calls
        # Checks for "all down" this often: a third of its threshold, so it is said in time.
        self.check_s = min(every_s, down_after_s / 3)
        self.started = time.time()
        self._seen = _Counts()
        # No endpoint has answered since then (None: one answered at the last check).
        self._silent_since: float | None = self.started
        self._said_down = False

    async def run(self) -> None:
        # The run starts now: its silence too, whenever the reporter was made.
        self.started = self._silent_since = time.time()
        next_line = time.monotonic() + self.every_s
        up: set[str] = set()
        while True:
            await asyncio.sleep(self.check_s)
            recorder = self.state.recorder
            answered, recorder.answered = recorder.answered, set()
            up |= answered
            if self.calls:
                self._check_down(answered, time.time())
            if time.monotonic() >= next_line:
                next_line += self.every_s
                if log.isEnabledFor(logging.INFO):
                    log.info("%s", self._line(up))
                up = set()

    def _check_down(self, answered: set[str], now: float) -> None:
        n = self.state.endpoint_count
        if answered:
            if self._said_down:
                log.warning("endpoints answer again: %d of %d answered in the last %s",
                            len(answered), n, _duration(self.check_s))
            self._silent_since, self._said_down = None, False
            return
        if self._silent_since is None:
            self._silent_since = now - self.check_s  # the last answer came before that
        if self._said_down or now - self._silent_since < self.down_after_s:
            return
        self._said_down = True
        silent = _duration(now - self._silent_since)
        if n == 0:
            log.warning("no endpoints discovered in %s: check the config's targets", silent)
        else:
            log.warning("all %d endpoints are down: none answered a call in %s (refused,"
                        " timed out or unreachable); probing goes on", n, silent)

    def _line(self, up: set[str]) -> str:
        calls, errors = self._delta()
        n = self.state.endpoint_count
        endpoints = f"{len(up)} up, {max(0, n - len(up))} down" if self.calls else f"{n}"
        return (f"{_duration(time.time() - self.started)}: calls in the last "
                f"{_duration(self.every_s)}: {_per_cohort(calls, errors)}; endpoints "
                f"{endpoints}; {self.state.windows_written:,} windows written; verdict "
                f"{verdict_words(self.state.last_verdict)}")

    def _delta(self) -> tuple[Counter[str], Counter[str]]:
        calls, errors = self._totals()
        delta = (calls - self._seen.calls, errors - self._seen.errors)
        self._seen = _Counts(calls, errors)
        return delta

    def _totals(self) -> tuple[Counter[str], Counter[str]]:
        recorder = self.state.recorder
        return Counter(recorder.calls_by_cohort), Counter(recorder.errors_by_cohort)

    def finish(self, store: str, verdict: Callable[[], Mapping[str, Any] | None]) -> None:
        """The run's summary: what it did, where it went, and how to read it (`verdict()`
        is only asked for when the summary is shown: it reads the whole store)."""
        if not log.isEnabledFor(logging.INFO):
            return
        calls, errors = self._totals()
        lost = self.state.windows_unwritten
        log.info("run ended after %s: calls %s; %s windows written to %s%s; verdict %s",
                 _duration(time.time() - self.started), _per_cohort(calls, errors),
                 f"{self.state.windows_written:,}", store,
                 f" ({lost:,} could not be written)" if lost else "", verdict_words(verdict()))
        log.info("the report: skewprobe report --store %s --from %s --out skewprobe-report;"
                 " the verdict: skewprobe verdict --store %s", store, rfc3339(self.started),
                 store)


def judge_health(store_error: str | None, kubernetes: DiscoverySource | None,
                 endpoints: int) -> tuple[bool, str]:
    """(healthy, why): unhealthy while the store refuses writes or, with Kubernetes
    discovery (`kubernetes`, its source), while the API is down."""
    if store_error:
        return False, f"store: {store_error}"
    if kubernetes is not None:
        # False while the API is down (the last known pods are still probed): meant for
        # readiness, not liveness, or an API outage becomes a restart loop.
        ok, line = kubernetes.health()  # type: ignore[attr-defined]
        if not ok:
            return False, line
    if not endpoints:
        return True, "no endpoints discovered yet"
    return True, f"probing {endpoints} endpoints"


cost_log = logging.getLogger("skewprobe.cost")


async def cost_logged(
    snapshots: AsyncIterator[Sequence[Endpoint]], paths: Sequence[PathSpec], engine: Engine
) -> AsyncIterator[Sequence[Endpoint]]:
    """The snapshots, unchanged; once the engine has scheduled the first endpoints (it asks
    for the next snapshot right after applying one), what they will cost is logged once."""
    logged = False
    async for snapshot in snapshots:
        yield snapshot
        if not logged and engine.endpoints:
            logged = True
            rates: dict[str, float] = {}
            for (path, _), rate in engine.intended_rates().items():
                rates[path] = rates.get(path, 0.0) + rate
            cost = estimate(paths, rates, engine.held_streams(), cgroup_cores=cpu_limit_cores())
            cost_log.info("%s", cost.line())
            if (warning := cost.warning()) is not None:
                cost_log.warning("%s", warning)
