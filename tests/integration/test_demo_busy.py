"""`skewprobe demo` on a busy machine: an overloaded probe still judges the calls it made,
so the demo's regression shows; where it does not, the demo says the machine was too busy,
with its own exit code. The end of the demo (`_finish`) on stores a probe wrote."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from probes.cli.demo import _finish
from probes.config import parse_config
from probes.errors import EXIT_BUSY, MachineBusy
from probes.measure.overload import OVERLOAD_EVENT
from probes.store import Event, Store
from tests.servers.probe_run import discard_config
from tests.servers.stores import store_with_a_failing_canary

BUSY = "31 % of sends were late (more than 10 ms behind schedule)"


def _store(path: Path, *, overloaded_from_start: bool, failing: bool = True) -> None:
    """Ten minutes of a failing canary (or a healthy one); overloaded from the first window
    to the end, or for the last minute only."""
    store_with_a_failing_canary(path, time.time(), failing=failing)
    with Store.open(path) as s:
        first_last = s.time_range()
        assert first_last is not None
        at = first_last[0] if overloaded_from_start else first_last[1] - 60
        s.write_events([Event(OVERLOAD_EVENT, at, detail={"reason": "probe overloaded: x"})])


def test_a_demo_overloaded_all_along_still_shows_its_failure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Late sends leave windows out of p99 alone: the errors of every window still judge.
    store = tmp_path / "demo.db"
    _store(store, overloaded_from_start=True)
    config = parse_config(discard_config())
    assert _finish(str(store), config, [], str(tmp_path / "report"), BUSY) == 0
    table = capsys.readouterr().out
    assert "overall: FAIL" in table, table
    assert "no data" not in table


def test_a_busy_demo_whose_regression_did_not_show_says_the_machine_is_too_busy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "demo.db"
    _store(store, overloaded_from_start=True, failing=False)
    config = parse_config(discard_config())
    with pytest.raises(MachineBusy) as err:
        _finish(str(store), config, [], str(tmp_path / "report"), BUSY)
    assert err.value.exit_code == EXIT_BUSY == 5
    message = str(err.value)
    assert message.startswith(f"this machine is too busy: {BUSY}, ") and "\n" not in message
    assert message.endswith("rerun on a quieter machine")
    assert "overall: FAIL" not in capsys.readouterr().out


def test_a_demo_that_still_shows_its_failure_ends_as_usual(tmp_path: Path) -> None:
    store = tmp_path / "demo.db"
    _store(store, overloaded_from_start=False)
    config = parse_config(discard_config())
    assert _finish(str(store), config, [], str(tmp_path / "report"), BUSY) == 0


def test_the_demo_records_its_fleets_control_plane(tmp_path: Path) -> None:
    """For `skewprobe plan --store` and `inventory --store` on the demo's store: the fleet's
    emulated mesh runs its --from version."""
    from probes.cli.demo import BASELINE, _record_control_plane
    from probes.inventory import CONTROL_PLANE_EVENT, planes_from_detail

    store = tmp_path / "demo.db"
    _store(store, overloaded_from_start=False)
    _record_control_plane(str(store), 1_790_000_000.0)
    with Store.open(store, readonly=True) as s:
        events = s.read_events(kinds=[CONTROL_PLANE_EVENT])
    assert [p.version for p in planes_from_detail(events[-1].detail)] == [BASELINE]
