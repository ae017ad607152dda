"""The scheduler's own guarantees, with a prober whose timing the test controls.

The probers here are real implementations of the `Prober` protocol (they await the loop's
timers), not mocks of a client library; the end-to-end tests run the real clients on real
servers. The loop runs on virtual time (`tests/unit/virtual_time.py`) and each engine is given
its wall clock, so every intended time and latency below is exact: the bounds are the
schedule's, with no allowance for a loaded machine.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import asyncio_throttle.throttler
import numpy as np
import pytest

from probes.run.engine import Engine, EngineLimits, Prober, ResultSink
from probes.spec import PathSpec
from probes.types import CallOutcome, CallResult, Endpoint, Outcome
from tests.unit.virtual_time import virtual_loop


class SleepProber:
    """Answers ok after `delays[endpoint.name]` seconds (forever when None)."""

    def __init__(self, delays: dict[str, float | None]) -> None:
        self.delays = delays
        self.forgotten: list[str] = []

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome:
        delay = self.delays.get(endpoint.name, 0.0)
        if delay is None:
            await asyncio.Event().wait()
        await asyncio.sleep(delay or 0.0)
        return CallOutcome(Outcome.OK, status=200)

    def forget(self, endpoint: Endpoint) -> None:
        self.forgotten.append(endpoint.name)

    async def aclose(self) -> None:
        pass


class ListSink:
    def __init__(self) -> None:
        self.results: list[CallResult] = []
        self.drops: Counter[str] = Counter()

    def record(self, result: CallResult, endpoint: Endpoint) -> None:
        self.results.append(result)

    def dropped(self, path: str, reason: str, count: int = 1) -> None:
        self.drops[reason] += count


def _ep(name: str, version: str = "1.20.3") -> Endpoint:
    return Endpoint(name=name, host="127.0.0.1", port=1, labels={"proxy_version": version})


def _engine(paths: Sequence[PathSpec], probers: Mapping[str, Prober], sink: ResultSink,
            **options: Any) -> Engine:
    """An engine whose wall clock is the virtual loop's (intended times exact, no jitter)."""
    return Engine(paths, probers, sink, wall=virtual_loop().wall, **options)


async def _run_for(engine: Engine, snapshots: list[list[Endpoint]], seconds: float) -> None:
    async def source():  # type: ignore[no-untyped-def]
        for snap in snapshots:
            yield snap
            await asyncio.sleep(seconds / len(snapshots))
        await asyncio.Event().wait()

    task = asyncio.create_task(engine.run(source()))
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_open_loop_rate_holds_when_one_endpoint_hangs() -> None:
    path = PathSpec(name="p", rate_per_s=20.0, timeout_s=0.3)
    prober = SleepProber({"hung": None, "slow": 0.2, "fast": 0.0})
    sink = ListSink()
    engine = _engine([path], {"p": prober}, sink)
    await _run_for(engine, [[_ep("hung"), _ep("slow"), _ep("fast")]], 2.0)
    per_endpoint = Counter(r.endpoint for r in sink.results)
    # Open loop: every endpoint's calls leave on its schedule, 1/rate apart, the hung one's
    # while its earlier calls still wait for their timeout; a closed loop would space them by
    # the timeout (0.3 s). Bounds from the schedule, not from a count a loaded machine may
    # miss: sends it skips (behind schedule) leave gaps of whole periods, never shorter ones.
    period = 1.0 / path.rate_per_s
    for name in ("hung", "slow", "fast"):
        sent = np.sort([r.intended_at for r in sink.results if r.endpoint == name])
        gaps = np.diff(sent)
        assert gaps.size and gaps.min() == pytest.approx(period, abs=1e-4), (name, gaps)
        assert np.allclose(gaps / period, np.round(gaps / period), atol=1e-3), (name, gaps)
    # The hung endpoint got as many calls as the fast one (± one for their schedules'
    # phases), less those still within their timeout when the run ended (rate × timeout).
    in_flight = math.ceil(path.rate_per_s * path.timeout_s) + 1
    fast = per_endpoint["fast"]
    assert fast - in_flight - 1 <= per_endpoint["hung"] <= fast + 1, per_endpoint
    hung = [r for r in sink.results if r.endpoint == "hung"]
    assert {r.outcome.outcome for r in hung} == {Outcome.TIMEOUT}
    # Timed from the actual send (latency less the probe's own lag), each call took what its
    # prober did: the timeout for the hung one, the 0.2 s sleep for the slow one when it beat
    # the timeout.
    assert all(r.latency_s - r.lag_s >= path.timeout_s - 1e-3 for r in hung)
    slow_ok = [r for r in sink.results if r.endpoint == "slow" and r.ok]
    assert slow_ok and all(0.2 - 1e-3 <= r.latency_s - r.lag_s < path.timeout_s for r in slow_ok)


class StallingProber(SleepProber):
    """Blocks the whole event loop once, in its first call, as a long GC pause would."""

    def __init__(self, stall_s: float) -> None:
        super().__init__({})
        self.stall_s = stall_s
        self.stalled = False

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome:
        if not self.stalled:
            self.stalled = True
            virtual_loop().advance(self.stall_s)  # the loop blocked: no callback runs meanwhile
        return await super().call(endpoint, request_id)


async def test_latency_is_measured_from_the_intended_send_time() -> None:
    # The calls due while the loop is stalled for 0.2 s leave late (within the 0.25 s
    # catch-up limit, so they are sent, not skipped): the delay must show as lag and be
    # inside the latency, though the prober itself answers at once.
    path = PathSpec(name="p", rate_per_s=10.0, timeout_s=1.0)
    sink = ListSink()
    engine = _engine([path], {"p": StallingProber(0.2)}, sink)
    await _run_for(engine, [[_ep("a")]], 1.0)
    delayed = [r for r in sink.results if r.lag_s > 0.1]
    assert delayed, "the stall must have delayed the send due during it"
    assert all(r.latency_s >= r.lag_s for r in sink.results)
    assert all(r.latency_s > 0.1 for r in delayed)


async def test_the_rate_ceiling_holds_sends_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # asyncio-throttle at 2/s: a third send waits until the first is more than a second old,
    # where the schedule alone sends every 0.1 s. asyncio-throttle reads time.monotonic, the
    # real loop's clock: here it is given the virtual loop's.
    monkeypatch.setattr(asyncio_throttle.throttler, "time",
                        SimpleNamespace(monotonic=virtual_loop().time))
    path = PathSpec(name="p", rate_per_s=10.0, timeout_s=1.0)
    sink = ListSink()
    engine = _engine([path], {"p": SleepProber({})}, sink, limits=EngineLimits(max_rate_per_s=2))
    await _run_for(engine, [[_ep("a")]], 2.5)
    sent = np.sort([r.intended_at + r.lag_s for r in sink.results])
    assert len(sent) >= 4, sent  # held back, not stopped
    assert (sent[2:] - sent[:-2]).min() > 1.0, sent
    assert all(r.latency_s >= r.lag_s for r in sink.results)


async def test_removed_endpoints_stop_and_new_ones_start() -> None:
    path = PathSpec(name="p", rate_per_s=50.0, timeout_s=0.5)
    prober = SleepProber({})
    sink = ListSink()
    engine = _engine([path], {"p": prober}, sink)
    await _run_for(engine, [[_ep("a"), _ep("b")], [_ep("b"), _ep("c", "1.21.0")]], 1.0)
    last_a = max(r.intended_at for r in sink.results if r.endpoint == "a")
    first_c = min(r.intended_at for r in sink.results if r.endpoint == "c")
    assert last_a < first_c + 0.05
    assert prober.forgotten == ["a"]
    assert {r.cohort for r in sink.results if r.endpoint == "c"} == {"1.21.0"}
    assert engine.loops == 0  # run() stops every loop when cancelled


async def test_an_hour_of_sends_stays_on_its_schedule() -> None:
    # Open loop over a long run: every send leaves at its intended time, one period apart,
    # none skipped or doubled, so the count is the hour times the rate (± the phase).
    path = PathSpec(name="p", rate_per_s=1.0, timeout_s=0.5)
    sink = ListSink()
    engine = _engine([path], {"p": SleepProber({"a": 0.1, "b": 0.0})}, sink)
    await _run_for(engine, [[_ep("a"), _ep("b")]], 3600.0)
    for name in ("a", "b"):
        sent = np.sort([r.intended_at for r in sink.results if r.endpoint == name])
        assert len(sent) in (3599, 3600), len(sent)
        assert np.allclose(np.diff(sent), 1.0, atol=1e-4)
    assert all(r.lag_s == 0.0 for r in sink.results) and not sink.drops
    assert {round(r.latency_s, 6) for r in sink.results} == {0.1, 0.0}


async def test_in_flight_bound_drops_instead_of_queueing() -> None:
    path = PathSpec(name="p", rate_per_s=100.0, timeout_s=5.0)
    sink = ListSink()
    engine = _engine(
        [path], {"p": SleepProber({"a": None})}, sink, limits=EngineLimits(max_in_flight=5)
    )
    await _run_for(engine, [[_ep("a")]], 0.5)
    assert sink.drops["max_in_flight"] >= 30
    assert engine.in_flight == 0


async def test_selector_limits_paths_to_matching_endpoints() -> None:
    only_new = PathSpec(name="p", rate_per_s=20.0, timeout_s=0.5, selector={"proxy_version": "2"})
    sink = ListSink()
    engine = _engine([only_new], {"p": SleepProber({})}, sink)
    await _run_for(engine, [[_ep("old", "1"), _ep("new", "2")]], 0.5)
    assert {r.endpoint for r in sink.results} == {"new"}


@pytest.mark.parametrize("rate", [0.5, 7.0])
async def test_first_sends_are_spread_over_one_period(rate: float) -> None:
    path = PathSpec(name="p", rate_per_s=rate, timeout_s=0.2)
    sink = ListSink()
    engine = _engine([path], {"p": SleepProber({})}, sink)
    endpoints = [_ep(f"e{i}") for i in range(40)]
    await _run_for(engine, [endpoints], min(2.2, 1.2 / rate + 0.2))
    first = sorted(min(r.intended_at for r in sink.results if r.endpoint == e.name)
                   for e in endpoints if any(r.endpoint == e.name for r in sink.results))
    assert len(first) >= 30
    assert first[-1] - first[0] > 0.5 / rate  # not all at once


class IdProber(SleepProber):
    def __init__(self) -> None:
        super().__init__({})
        self.ids: list[str] = []

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome:
        self.ids.append(request_id)
        return await super().call(endpoint, request_id)


async def test_request_ids_are_unique_and_uuid_sized() -> None:
    prober = IdProber()
    engine = _engine([PathSpec(name="p", rate_per_s=50.0, timeout_s=0.5)], {"p": prober},
                    ListSink())
    await _run_for(engine, [[_ep("a"), _ep("b")]], 0.5)
    assert len(prober.ids) >= 20 and len(set(prober.ids)) == len(prober.ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in prober.ids)
    other = _engine([], {}, ListSink())
    assert other.request_id()[:16] != engine.request_id()[:16]  # random per engine


class StallingSink(ListSink):
    """Blocks the event loop once, as a starved or paused probe process would be."""

    def __init__(self, stall_s: float) -> None:
        super().__init__()
        self.stall_s = stall_s

    def record(self, result: CallResult, endpoint: Endpoint) -> None:
        super().record(result, endpoint)
        if self.stall_s and len(self.results) == 3:
            stall, self.stall_s = self.stall_s, 0.0
            virtual_loop().advance(stall)  # the loop blocked: no callback runs meanwhile


@pytest.mark.parametrize("rate", [20.0, 2.0])
async def test_sends_far_behind_are_skipped_not_burst(rate: float) -> None:
    # After a 0.8 s stall, sends more than max_catch_up (0.25 s) late are skipped and
    # counted; the schedule goes on from there. At 2/s the period (0.5 s) is longer than
    # the catch-up limit: the late send is skipped all the same (the loop must not spin).
    limits = EngineLimits(max_catch_up_s=0.25)
    sink = StallingSink(0.8)
    engine = _engine([PathSpec(name="p", rate_per_s=rate, timeout_s=0.2)],
                    {"p": SleepProber({})}, sink, limits=limits)
    await _run_for(engine, [[_ep("a")]], 2.5)
    assert sink.drops["behind_schedule"] >= (10 if rate == 20.0 else 1)
    after = sink.results[3:]
    assert after, "the schedule must go on after the stall"
    # Nothing was sent later than the catch-up limit.
    assert max(r.lag_s for r in after) <= limits.max_catch_up_s
    # Intended times stay on the grid start + k/rate: skipping never shifts the schedule
    # (to within a float's resolution at an epoch second, 0.24 µs).
    first = sink.results[0].intended_at
    assert all(abs(((r.intended_at - first) * rate) - round((r.intended_at - first) * rate))
               < 1e-4 for r in sink.results)


async def test_a_small_cohort_is_called_faster_up_to_the_ceiling() -> None:
    path = PathSpec(name="p", rate_per_s=2.0, timeout_s=0.3)
    sink = ListSink()
    engine = _engine([path], {"p": SleepProber({})}, sink,
                    limits=EngineLimits(cohort_balance_max=3.0))
    one_canary = [*(_ep(f"b{i}") for i in range(5)), _ep("c0", "1.21.0")]
    engine.apply(one_canary)
    # Five baseline endpoints at 2/s; the one canary endpoint at 5x would balance them, the
    # ceiling allows 3x.
    assert engine.intended_rates() == {("p", "1.20.3"): 10.0, ("p", "1.21.0"): 6.0}
    await asyncio.sleep(1.0)
    canary = sorted(r.intended_at for r in sink.results if r.endpoint == "c0")
    # Intended times are the schedule's (wall time = loop time + an offset read per call,
    # which moves by microseconds); a skipped send would leave a multiple of the period.
    gaps = np.diff(canary)
    assert len(canary) >= 2
    assert np.allclose(gaps / (1 / 6.0), np.round(gaps / (1 / 6.0)), atol=0.01), gaps
    assert np.median(gaps) == pytest.approx(1 / 6.0, abs=1e-3)
    # The canary grows to half the fleet: every endpoint back at the path's rate.
    engine.apply([*(_ep(f"b{i}") for i in range(3)),
                  *(_ep(f"c{i}", "1.21.0") for i in range(3))])
    assert engine.intended_rates() == {("p", "1.20.3"): 6.0, ("p", "1.21.0"): 6.0}
    await engine.stop()


async def test_cohort_balance_of_one_keeps_every_endpoint_at_the_path_rate() -> None:
    path = PathSpec(name="p", rate_per_s=2.0, timeout_s=0.3)
    engine = _engine([path], {"p": SleepProber({})}, ListSink(),
                    limits=EngineLimits(cohort_balance_max=1.0))
    engine.apply([_ep("b0"), _ep("b1"), _ep("c0", "1.21.0")])
    assert engine.intended_rates() == {("p", "1.20.3"): 4.0, ("p", "1.21.0"): 2.0}
    await engine.stop()
