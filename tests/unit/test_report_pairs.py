"""The pair matrix in `skewprobe report` (HTML, Markdown, JSON) on a synthetic store with a
relay path (tests/servers/report_store.py): each cell's state is what `skewprobe verdict
--at <end>` says of the pair (`probes.verdict.pairs.pair_matrix`, the same code), its
figures are the pair cohort's counts pooled over the range, and a relay path beside direct
ones changes nothing about theirs."""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path
from typing import Any

import pytest

from probes.report.write import ReportFiles, write_report
from probes.spec import JudgingSettings
from probes.store import Store
from probes.types import pair_cohort
from probes.verdict.pairs import pair_matrix
from tests.servers.report_store import (
    RELAY_NEW,
    RELAY_OLD,
    RELAY_PATH,
    STALE_FROM_MIN,
    T0,
    WINDOW_S,
    build,
    build_relay,
)

MINUTES = 20.0
SPAN = (T0, T0 + MINUTES * 60)
PAIRS = [(a, b) for a in (RELAY_OLD, RELAY_NEW) for b in (RELAY_OLD, RELAY_NEW)]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ReportFiles]:
    store = build_relay(tmp_path_factory.mktemp("mixed") / "r.db", minutes=MINUTES)
    out = tmp_path_factory.mktemp("mixed-report")
    return store, write_report(str(store), out, since=SPAN[0], until=SPAN[1], now=SPAN[1])


def _doc(files: ReportFiles) -> dict[str, Any]:
    return json.loads(files.json.read_text())


def _path(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in doc["paths"] if p["path"] == name)


def _pooled(store: Path, cohort: str) -> tuple[int, int, int, int, int]:
    """(calls, ok, attempts summed, attempts measured, stale) of a cohort over the store."""
    with Store.open(store, readonly=True) as s:
        windows = [w for w in s.read_windows(paths=[RELAY_PATH]) if w.cohort == cohort]
    return (sum(w.requests for w in windows), sum(w.successes for w in windows),
            sum(w.attempts_sum for w in windows), sum(w.attempts_count for w in windows),
            sum(w.outcomes.get("stale_endpoint", 0) for w in windows))


def test_json_cells_are_the_verdicts_pairs_with_the_ranges_figures(
    mixed: tuple[Path, ReportFiles],
) -> None:
    store, files = mixed
    pairs = _path(_doc(files), RELAY_PATH)["pairs"]
    expected = pair_matrix(str(store), JudgingSettings(window_s=WINDOW_S), path=RELAY_PATH,
                           now=SPAN[1])
    assert pairs["callers"] == pairs["callees"] == [RELAY_OLD, RELAY_NEW]
    assert pairs["verdict"] == expected.verdict == "fail"
    assert {(c["caller"], c["callee"]): c["verdict"] for c in pairs["cells"]} == {
        (c.caller, c.callee): c.verdict for c in expected.cells}
    assert pairs["stale"] == [s.to_json() for s in expected.stale]
    cells = {(c["caller"], c["callee"]): c for c in pairs["cells"]}
    # The new callers retry every call once: they fail on attempts, whoever answers.
    for callee in (RELAY_OLD, RELAY_NEW):
        assert cells[RELAY_NEW, callee]["verdict"] == "fail"
        assert "attempts per request" in cells[RELAY_NEW, callee]["reason"]
    assert cells[RELAY_OLD, RELAY_OLD]["verdict"] == "baseline"
    for pair in PAIRS:
        calls, ok, att_sum, att_n, _ = _pooled(store, pair_cohort(*pair))
        assert cells[pair]["requests"] == calls
        assert cells[pair]["success_rate"] == pytest.approx(ok / calls, rel=1e-5)
        assert cells[pair]["attempts_per_request"] == pytest.approx(att_sum / att_n, rel=1e-5)
        assert cells[pair]["latency_p99_ms"] is not None
    # Stale routing: from the old callers only, counted exactly, and failing them.
    stale = {s["caller"]: s for s in pairs["stale"]}
    old = [_pooled(store, pair_cohort(RELAY_OLD, b)) for b in (RELAY_OLD, RELAY_NEW)]
    assert stale[RELAY_OLD]["stale"] == sum(x[4] for x in old) > 0
    assert stale[RELAY_OLD]["calls"] == sum(x[0] for x in old)
    assert stale[RELAY_OLD]["verdict"] == "fail"
    assert stale[RELAY_NEW]["stale"] == 0


def test_html_and_markdown_show_the_matrix(mixed: tuple[Path, ReportFiles]) -> None:
    _, files = mixed
    doc = _doc(files)
    cells = {(c["caller"], c["callee"]): c for c in _path(doc, RELAY_PATH)["pairs"]["cells"]}
    html = files.html.read_text()
    table = re.search(r'<table class="pairs">(.*?)</table>', html, re.S)
    assert table is not None
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)
    assert "callee 1.20.3" in rows[0] and "callee 1.21.0" in rows[0]
    for row, caller in zip(rows[1:], (RELAY_OLD, RELAY_NEW), strict=True):
        assert f"caller {caller}" in row
        states = re.findall(r'<td class="pair (\w+)">', row)
        assert states == [cells[caller, b]["verdict"] for b in (RELAY_OLD, RELAY_NEW)]
        for callee in (RELAY_OLD, RELAY_NEW):
            assert f"{cells[caller, callee]['requests']:,} calls" in row
            assert f"{cells[caller, callee]['attempts_per_request']:.2f} attempts/req" in row
    assert escape(f"stale routing seen from callers on {RELAY_OLD}: ") in html
    md = files.markdown.read_text()
    assert f"## Pair matrix of {RELAY_PATH} (caller × callee)" in md
    assert "| caller \\ callee | callee 1.20.3 | callee 1.21.0 |" in md
    new_row = next(line for line in md.splitlines() if line.startswith(f"| caller {RELAY_NEW}"))
    assert new_row.count("**FAIL**") == 2
    # The summary names the relay path with its matrix's verdict.
    assert _path(doc, RELAY_PATH)["verdict"] == "fail"


def test_a_relay_path_changes_nothing_about_the_direct_paths(
    mixed: tuple[Path, ReportFiles], tmp_path: Path,
) -> None:
    _, files = mixed
    alone = build(tmp_path / "direct.db", minutes=MINUTES, earlier=False)
    direct = _doc(write_report(str(alone), tmp_path / "out", since=SPAN[0], until=SPAN[1],
                               now=SPAN[1]))
    doc = _doc(files)
    # Same cohorts picked, the same α share, the same first divergences and verdicts.
    for key in ("baseline", "canary", "alpha_share", "notes"):
        assert doc["period"][key] == direct["period"][key], key
    for p in direct["paths"]:
        mine = _path(doc, p["path"])
        assert mine["pairs"] is None
        for key in ("verdict", "first_divergence", "verdict_changes", "cohorts"):
            assert mine[key] == p[key], (p["path"], key)


def test_a_relay_only_store_is_reported_without_a_direct_comparison(tmp_path: Path) -> None:
    store = build_relay(tmp_path / "relay.db", minutes=MINUTES, direct=False)
    files = write_report(str(store), tmp_path / "out", since=SPAN[0], until=SPAN[1],
                         now=SPAN[1])
    doc = _doc(files)
    assert [p["path"] for p in doc["paths"]] == [RELAY_PATH]
    assert doc["period"]["baseline"] is None and doc["period"]["canary"] is None
    # No note about versions to compare: pair cohorts are not versions to pick from.
    assert not any("not version names" in n or "need two proxy versions" in n
                   for n in doc["period"]["notes"]), doc["period"]["notes"]
    assert _path(doc, RELAY_PATH)["pairs"]["verdict"] == "fail"
    # Judged as of the range's end: before the old callers' routing went stale, their
    # stale share is zero and passes.
    early = write_report(str(store), tmp_path / "early", since=SPAN[0],
                         until=SPAN[0] + 60 * (STALE_FROM_MIN - 1), now=SPAN[1])
    stale = {s["caller"]: s for s in _path(_doc(early), RELAY_PATH)["pairs"]["stale"]}
    assert stale[RELAY_OLD]["stale"] == 0 and stale[RELAY_OLD]["verdict"] == "pass"
