"""The verdict settings `run` records in its store, read back by `skewprobe verdict --store`
and `skewprobe report` when no --config is given (issue 31, point 5): the latest at the
time judged wins, a later version's extra keys are read past, and each says which it used."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from probes._parsing import rfc3339
from probes.errors import StoreCorrupt
from probes.spec import CohortSpec, JudgingSettings, Tolerances
from probes.store import Event, Store
from probes.verdict.settings import SETTINGS_EVENT, resolve, settings_event, stored_settings
from tests.servers.report_store import T0, build

LOOSE = JudgingSettings(tolerances=Tolerances(success_rate_drop_pp=5.0, latency_p99_ratio=2.0),
                        alpha=0.05, min_samples=30, warmup_s=0.0,
                        cohort=CohortSpec(baseline="1.20.3"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("settings") / "base.db", minutes=10.0)


@pytest.fixture
def store(built: Path, tmp_path: Path) -> Path:
    path = tmp_path / "probe.db"
    shutil.copy(built, path)
    return path


def test_the_latest_settings_at_the_time_judged_win(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as s:
        assert stored_settings(s, T0) is None
        s.write_events([settings_event(JudgingSettings(), T0),
                        settings_event(LOOSE, T0 + 300)])
        assert stored_settings(s, T0 + 299) == (JudgingSettings(), T0)
        assert stored_settings(s, T0 + 300) == (LOOSE, T0 + 300)
    # Without a config the store's; with one, the config's; with neither, the defaults'.
    found = resolve(None, str(tmp_path / "s.db"), T0 + 400)
    assert (found.settings, found.origin, found.at) == (LOOSE, "store", T0 + 300)
    assert "recorded them at " + rfc3339(T0 + 300) in found.note()
    config = tmp_path / "c.yaml"
    config.write_text("paths: [{name: a, http: {path: /}, rate: 1/s}]\n"
                      "targets: {static: [{address: '127.0.0.1:9'}]}\n"
                      "verdict: {alpha: 0.02}\n")
    assert resolve(str(config), str(tmp_path / "s.db"), T0 + 400).origin == "config"
    assert resolve(str(config), str(tmp_path / "s.db"), T0 + 400).settings.alpha == 0.02
    assert resolve(None, str(tmp_path / "s.db"), T0 - 1).origin == "defaults"


def test_a_later_versions_settings_are_read_for_the_keys_known(tmp_path: Path) -> None:
    detail = {**settings_event(LOOSE, T0).detail, "version": 2, "new_knob": [1, 2],
              "tolerances": {**settings_event(LOOSE, T0).detail["tolerances"], "other": 3}}
    with Store.open(tmp_path / "s.db") as s:
        s.write_events([Event(SETTINGS_EVENT, T0, detail=detail)])
        assert stored_settings(s, T0) == (LOOSE, T0)
        s.write_events([Event(SETTINGS_EVENT, T0 + 1, detail={"alpha": "many"})])
        with pytest.raises(StoreCorrupt, match="malformed verdict settings"):
            stored_settings(s, T0 + 1)


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "probes.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_verdict_and_report_judge_with_the_recorded_settings_and_say_so(
    store: Path, tmp_path: Path,
) -> None:
    at = rfc3339(T0 + 600)
    before = json.loads(_cli("verdict", "--store", store, "--at", at, "--json").stdout)
    assert before["settings"]["from"] == "defaults"
    with Store.open(store) as s:
        s.write_events([settings_event(LOOSE, T0 - 60)])
    done = _cli("verdict", "--store", store, "--at", at, "--json")
    after = json.loads(done.stdout)
    assert "verdict settings from the store" in done.stderr
    assert after["settings"]["from"] == "store"
    assert after["settings"]["tolerances"]["success_rate_drop_pp"] == 5.0
    assert after["settings"]["cohort"]["baseline"] == "1.20.3"
    # The verdict JSON's own keys are all there; the tolerances judged with are LOOSE's.
    assert set(before) == set(after) >= {"verdict", "baseline", "canary", "window", "paths",
                                        "reasons"}
    metric = after["paths"][0]["metrics"]["success_rate"]
    assert metric["tolerance"]["max_drop_pp"] == 5.0
    assert before["paths"][0]["metrics"]["success_rate"]["tolerance"]["max_drop_pp"] == 0.1
    # Text output: the table on stdout, which settings on stderr.
    text = _cli("verdict", "--store", store, "--at", at)
    assert "verdict settings from the store" in text.stderr and "overall:" in text.stdout
    # The report replays with them too, and its JSON says so.
    out = tmp_path / "report"
    done = _cli("report", "--store", store, "--from", rfc3339(T0), "--to", at, "--out", out)
    assert done.returncode == 0, done.stderr
    assert "verdict settings from the store" in done.stderr
    settings = json.loads((out / "report.json").read_text())["settings"]
    assert settings["from"] == "store"
    assert settings["alpha"] == 0.05 and settings["tolerances"]["success_rate_drop_pp"] == 5.0
