"""`skewprobe report` on a synthetic store (tests/servers/report_store.py): the three files, what
they say, and that the first divergence is exactly where `judge` first says fail."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sqlite3
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from probes._parsing import parse_time
from probes.measure.overload import OVERLOAD_EVENT, OVERLOAD_WINDOWS
from probes.report._collect import MAX_LOOKS, MAX_POINTS, choose_grid, collect
from probes.report.model import _late_sends
from probes.report.write import ReportFiles, write_report
from probes.spec import DEFAULT_WARMUP_S, JudgingSettings
from probes.stats.pods import pod_grids
from probes.stats.series import overlapping
from probes.store import Event, Store
from probes.verdict.judge import judge
from tests.servers.probe_run import http_config
from tests.servers.report_store import (
    BAD_POD,
    EARLIER,
    NAMESPACE,
    PODS,
    T0,
    WINDOW_S,
    build,
    restart_at,
)

MINUTES = 30.0
SPAN = (T0, T0 + MINUTES * 60)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("store") / "report.db", minutes=MINUTES)


@pytest.fixture(scope="module")
def report(store: Path, tmp_path_factory: pytest.TempPathFactory) -> ReportFiles:
    out = tmp_path_factory.mktemp("report")
    return write_report(str(store), out, since=SPAN[0], until=SPAN[1],
                        compare=(EARLIER, EARLIER + MINUTES * 60), now=SPAN[1])


def _json(files: ReportFiles) -> dict[str, Any]:
    return json.loads(files.json.read_text())


def _path(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in doc["paths"] if p["path"] == name)


def test_html_is_self_contained_with_one_svg_per_chart(report: ReportFiles) -> None:
    html = report.html.read_text()
    assert html.startswith("<!DOCTYPE html>")
    # Nothing to fetch: no scripts, stylesheets, images, fonts or frames from anywhere.
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert not re.search(r"<(?:script|link|img|iframe|object|embed)\b", html, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?(?:https?:)?//", html, re.I)
    doc = _json(report)
    kinds = {p["path"]: p["charts"] for p in doc["paths"]}
    assert kinds["checkout"] == ["success_rate", "latency_p99_ms", "attempts_per_request",
                                 "rollout"]
    assert "stream_resets_per_hour" in kinds["orders"]  # streams: the resets chart
    assert "stream_resets_per_hour" not in kinds["catalog"]  # no streams: none
    # One <svg> per chart, of this period and (side by side) of the compared one.
    charts = sum(len(k) for k in kinds.values())
    assert html.count("<svg") == 2 * charts
    # Chart SVG ids are unique on the page (else clip paths would cross-reference).
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    for title in ("checkout: success rate", "checkout: p99 latency",
                  "orders: stream resets per stream-hour", "rollout progress"):
        assert title in html


def test_json_has_the_first_divergence_of_the_regressed_path(report: ReportFiles) -> None:
    doc = _json(report)
    assert doc["schema"] == "skewprobe-report/1"
    assert doc["period"]["baseline"] == "1.20.3" and doc["period"]["canary"] == "1.21.0"
    checkout = _path(doc, "checkout")
    first = checkout["first_divergence"]
    assert first["metric"] == "success_rate"
    at = parse_time(first["at"], now=0)
    assert restart_at(T0, 0, MINUTES) < at < SPAN[1]
    # The share of pods on the canary then comes from the inventory snapshot nearest to it
    # (snapshots lag restarts), and the report says which snapshot that was.
    snap = min((T0 + 60 * m for m in range(int(MINUTES) + 1)), key=lambda t: abs(t - at))
    on_new = sum(restart_at(T0, j, MINUTES) <= snap for j in range(PODS))
    assert first["canary_share"] == pytest.approx(on_new / PODS, abs=1e-3)
    assert on_new >= 1  # a crossing on the canary's data: some pod runs it
    assert first["share_source"] == "inventory" and parse_time(first["share_at"], now=0) == snap
    assert first["canary"] < 0.97 < 0.99 < first["baseline"]
    assert checkout["verdict"] == "fail"
    assert [c["verdict"] for c in checkout["verdict_changes"]][-1] == "fail"
    for quiet in ("catalog", "orders"):
        assert _path(doc, quiet)["first_divergence"] is None
        assert _path(doc, quiet)["verdict"] != "fail"
    figures = checkout["cohorts"]["1.21.0"]
    assert figures["success_rate"] < 0.97 and figures["latency_p99_ms"] > 0


def test_first_divergence_is_where_judge_first_fails(store: Path, report: ReportFiles) -> None:
    """Brute force: judge the windows up to every window boundary, with the pods as the live
    verdict has them; the report's crossing is the first boundary at which `judge` fails
    success rate on checkout (one verdict core: the replay and the live verdict agree)."""
    doc = _json(report)
    at = parse_time(_path(doc, "checkout")["first_divergence"]["at"], now=0)
    warm = DEFAULT_WARMUP_S
    with Store.open(store, readonly=True) as s:
        table = s.read_table(*SPAN)
        cols = s.read_endpoint_columns(since=T0 - warm, until=SPAN[1])
    first_fail = None
    for end in np.arange(T0 + WINDOW_S, at + WINDOW_S + 1e-6, WINDOW_S):
        keep = cols.start < end
        pods = pod_grids(cols.start[keep], cols.path[keep], cols.endpoint[keep],
                         cols.cohort[keep], cols.requests[keep], cols.errors[keep],
                         paths=cols.paths, endpoints=cols.endpoints, cohorts=cols.cohorts,
                         since=T0, warmup_s=warm)
        v = judge(table.select(table.start < end), now=float(end), since=T0,
                  window_s=WINDOW_S, pods=pods)
        checkout = v.path("checkout")
        assert checkout is not None
        metric = checkout.metric("success_rate")
        if metric is not None and metric.verdict == "fail":
            first_fail = float(end)
            break
    assert first_fail == pytest.approx(at, abs=1e-6)  # (epoch seconds: no relative slack)


def test_markdown_names_the_worst_endpoints(report: ReportFiles) -> None:
    md = report.markdown.read_text()
    assert md.startswith("# skewprobe report:")
    section = md.split("## Worst endpoints (pods) by errors", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ")][1:]
    assert rows and rows[0].split(" | ")[0] == f"| {BAD_POD}"
    assert f"| {NAMESPACE} | 1.21.0 |" in rows[0]
    doc = _json(report)
    worst = doc["worst_endpoints"][0]
    assert worst["pod"] == BAD_POD and worst["namespace"] == NAMESPACE
    assert 0.2 < worst["error_rate"] < 0.3 and worst["paths"] == {"checkout": worst["errors"]}
    assert _path(doc, "checkout")["worst_pods"][0]["pod"] == BAD_POD
    assert "## First divergence per path and metric" in md and "| checkout | success rate |" in md


def test_compare_to_shows_the_same_path_regressed_last_time(report: ReportFiles) -> None:
    doc = _json(report)
    compared = doc["compared"]
    assert compared is not None
    assert compared["baseline"] == "1.19.0" and compared["canary"] == "1.20.3"
    checkout = _path(doc, "checkout")["compared"]
    assert checkout["first_divergence"]["metric"] == "success_rate"
    assert parse_time(checkout["first_divergence"]["at"], now=0) < T0
    assert "the same path regressed last time" in checkout["note"]
    assert _path(doc, "catalog")["compared"]["first_divergence"] is None
    html = report.html.read_text()
    assert "compared period" in html and "the same path regressed last time" in html
    assert "## Compared period:" in report.markdown.read_text()


def test_events_of_every_kind_are_reported(report: ReportFiles) -> None:
    doc = _json(report)
    assert doc["period"]["events"] == {"restart": 4, "rollout-step": 1, "storm": 1}
    kinds = {e["kind"] for e in doc["events"]}
    assert kinds == {"restart", "rollout-step", "storm"}
    html = report.html.read_text()
    assert "rollout-step" in html  # a kind nothing knows about is still marked


def test_without_inventory_the_share_is_of_probed_endpoints(tmp_path: Path) -> None:
    db = build(tmp_path / "noinv.db", minutes=MINUTES, inventory=False, earlier=False)
    files = write_report(str(db), tmp_path / "out", since=SPAN[0], until=SPAN[1], now=SPAN[1])
    doc = _json(files)
    assert doc["period"]["rollout_source"] == "probed endpoints"
    assert any("no inventory snapshots" in n for n in doc["period"]["notes"])
    first = _path(doc, "checkout")["first_divergence"]
    assert first["share_source"] == "probed endpoints"
    # Probed endpoints of checkout on 1.21.0 in the bucket of the crossing: pods 0.. moved.
    at = parse_time(first["at"], now=0)
    on_new = sum(restart_at(T0, j, MINUTES) <= at - WINDOW_S for j in range(PODS))
    assert first["canary_share"] == pytest.approx(on_new / PODS, abs=1e-3)
    assert doc["compared"] is None


def test_only_the_paths_asked_for(store: Path, tmp_path: Path) -> None:
    files = write_report(str(store), tmp_path, since=SPAN[0], until=SPAN[1],
                         paths=["checkout"], now=SPAN[1])
    doc = _json(files)
    assert [p["path"] for p in doc["paths"]] == ["checkout"]
    # α is shared over the paths judged, as `skewprobe verdict --path` does.
    assert doc["period"]["alpha_share"] == pytest.approx(0.01 / 4)


@pytest.mark.parametrize(("since", "until"), [(T0, T0 + 7 * 86400), (T0, T0 + 60),
                                              (T0 + 0.5, T0 + 86400.5)])
def test_grid_keeps_charts_readable(since: float, until: float) -> None:
    grid = choose_grid(since, until, WINDOW_S)
    assert grid.count <= MAX_POINTS and grid.looks <= MAX_LOOKS
    assert grid.step % WINDOW_S == 0  # a bucket is whole windows
    assert grid.start <= since and grid.stop >= until
    assert grid.start % grid.step == 0  # aligned like the windows
    assert grid.bucket_of(grid.start) == 0 and grid.bucket_of(grid.stop) == -1
    assert grid.look_ends[-1] == grid.stop


def test_one_cohort_only_is_reported_without_a_comparison(tmp_path: Path) -> None:
    from probes.measure.histogram import BUCKET_COUNT
    from probes.types import PathWindow

    latency = [0] * BUCKET_COUNT
    latency[900] = 50
    db = tmp_path / "one.db"
    with Store.open(db) as s:
        s.write([PathWindow(T0 + 10 * i, 10.0, "checkout", "1.20.3", {"ok": 50},
                            tuple(latency)) for i in range(30)])
    files = write_report(str(db), tmp_path / "out", since=T0, until=T0 + 300, now=T0 + 300)
    doc = _json(files)
    (path,) = doc["paths"]
    assert path["verdict"] == "no comparison" and path["first_divergence"] is None
    assert doc["period"]["canary"] is None
    assert any("no baseline and canary" in n for n in doc["period"]["notes"])
    assert files.html.read_text().count("<svg") == len(path["charts"]) == 3


def test_each_path_says_how_the_live_verdict_judges_it_per_pod(report: ReportFiles) -> None:
    doc = _json(report)
    checkout = _path(doc, "checkout")["success_rate_per_pod"]
    assert checkout is not None
    pods = checkout["pods"]
    # The canary's worst pod is the one the store made sick (25 % errors against 5 %).
    assert pods["worst"] == BAD_POD and pods["canary"] >= 2
    # Every pod's first 2 minutes in a cohort are recorded apart, with their errors.
    assert pods["warmup"]["calls"] > 0
    catalog = _path(doc, "catalog")["success_rate_per_pod"]
    assert catalog is not None and catalog["verdict"] != "fail"
    assert doc["settings"]["warmup_s"] == 120.0
    md = report.markdown.read_text()
    assert "## The pod as the unit (success rate, at the end of the range)" in md
    # The warm-up band tells the live verdict's warm-up (baseline and canary) as it is.
    band = _path(doc, "checkout")["warmup"]
    assert (band["calls"], band["errors"]) == (pods["warmup"]["calls"],
                                               pods["warmup"]["errors"])
    assert f"warm-up (first 2 min of each pod): {band['calls']:,} calls, " \
           f"{band['errors']:,} errors, kept out of the comparison" in md
    assert "success rate per pod at the end of this range" in report.html.read_text()
    assert _path(doc, "checkout")["success_rate_replay"] == "pods"


def _by_pod(store: Path) -> dict[tuple[str, str, str], list[tuple[float, int, int]]]:
    """The store's endpoint windows of the range (and the warm-up before it), per (path,
    cohort, pod): (start, calls, errors), read row by row."""
    with Store.open(store, readonly=True) as s:
        cols = s.read_endpoint_columns(since=T0 - DEFAULT_WARMUP_S, until=SPAN[1])
    out: dict[tuple[str, str, str], list[tuple[float, int, int]]] = {}
    for t, p, e, c, n, k in zip(cols.start, cols.path, cols.endpoint, cols.cohort,
                                cols.requests, cols.errors, strict=True):
        key = (cols.paths[p], cols.cohorts[c], cols.endpoints[e])
        out.setdefault(key, []).append((float(t), int(n), int(k)))
    return out


def test_the_warm_up_band_counts_are_exact(store: Path, report: ReportFiles) -> None:
    """Each pod's first 2 minutes (from the first window the store shows it in) counted
    by hand from the store's rows: the band's calls and errors per cohort and per pod."""
    doc = _json(report)
    rows = _by_pod(store)
    for path in ("catalog", "checkout", "orders"):
        band = _path(doc, path)["warmup"]
        assert band is not None and band["seconds"] == DEFAULT_WARMUP_S
        assert set(band["cohorts"]) == {"1.20.3", "1.21.0"}
        for cohort, got in band["cohorts"].items():
            want = {}
            for (p, c, pod), windows in rows.items():
                if (p, c) != (path, cohort):
                    continue
                first = min(t for t, _, _ in windows)
                warm = [(n, k) for t, n, k in windows
                        if SPAN[0] <= t < first + DEFAULT_WARMUP_S]
                if warm:
                    want[pod] = (sum(n for n, _ in warm), sum(k for _, k in warm))
            assert {x["pod"]: (x["calls"], x["errors"]) for x in got["pods"]} == want
            assert got["calls"] == sum(n for n, _ in want.values())
            assert got["errors"] == sum(k for _, k in want.values())
        # Four pods moved to 1.21.0, each warming up for 12 windows of 40 calls.
        assert band["cohorts"]["1.21.0"]["calls"] == 4 * 12 * 40
        assert band["calls"] == sum(c["calls"] for c in band["cohorts"].values())
    checkout = _path(doc, "checkout")["warmup"]
    line = (f"warm-up (first 2 min of each pod): {checkout['calls']:,} calls, "
            f"{checkout['errors']:,} errors, kept out of the comparison")
    assert f"- **checkout**: {line}" in report.markdown.read_text()
    assert escape(line) in report.html.read_text()
    md_rows = [r for r in report.markdown.read_text().splitlines()
               if r.startswith("| checkout | 1.21.0 | 4 | 1,920 |")]
    assert md_rows == [f"| checkout | 1.21.0 | 4 | 1,920 | "
                       f"{checkout['cohorts']['1.21.0']['errors']:,} | "
                       f"{100 * checkout['cohorts']['1.21.0']['errors'] / 1920:.2f}% |"]


def test_the_concentration_finding_is_in_every_output(store: Path, report: ReportFiles) -> None:
    """checkout's canary errors sit mostly on one pod (25 % errors against 5 % on the
    others): the live rule says concentrated, and HTML, Markdown and JSON all name it with
    its share of the canary's errors, counted here by hand over the compared windows."""
    doc = _json(report)
    rows = _by_pod(store)
    warm_calls: dict[str, dict[float, int]] = {"1.20.3": {}, "1.21.0": {}}
    errors: dict[str, int] = {}
    for (path, cohort, _pod), windows in rows.items():
        if path != "checkout":
            continue
        first = min(t for t, _, _ in windows)
        for t, n, _ in windows:
            if t >= max(SPAN[0], first + DEFAULT_WARMUP_S) and n:
                warm_calls[cohort][t] = warm_calls[cohort].get(t, 0) + n
    both = set(warm_calls["1.20.3"]) & set(warm_calls["1.21.0"])  # windows compared
    for (path, cohort, pod), windows in rows.items():
        if path == "checkout" and cohort == "1.21.0":
            first = min(t for t, _, _ in windows)
            errors[pod] = sum(k for t, _, k in windows
                              if t in both and t >= first + DEFAULT_WARMUP_S)
    share = errors[BAD_POD] / sum(errors.values())
    assert share > 0.5 and max(errors, key=errors.__getitem__) == BAD_POD
    finding = f"concentrated on {BAD_POD} ({100 * share:.0f} % of the canary's errors)"

    checkout = _path(doc, "checkout")
    assert checkout["success_rate_per_pod"]["pods"]["concentrated"] is True  # the live rule
    assert checkout["concentration"] == {"pod": BAD_POD, "share": pytest.approx(share, abs=1e-3),
                                         "finding": finding}
    assert finding in checkout["success_rate_per_pod"]["reason"]  # the live verdict's words
    assert f"- **checkout**: **finding: {finding}**" in report.markdown.read_text()
    assert f"<b>finding: {escape(finding)}</b>" in report.html.read_text()
    for quiet in ("catalog", "orders"):
        assert _path(doc, quiet)["concentration"] is None
        assert f"- **{quiet}**: **finding" not in report.markdown.read_text()


def test_without_endpoint_windows_the_replay_pools_and_says_so(tmp_path: Path) -> None:
    db = build(tmp_path / "noeps.db", minutes=MINUTES, earlier=False, endpoints=False)
    files = write_report(str(db), tmp_path / "out", since=SPAN[0], until=SPAN[1], now=SPAN[1])
    doc = _json(files)
    checkout = _path(doc, "checkout")
    assert checkout["success_rate_replay"] == "pooled"
    assert checkout["warmup"] is None and checkout["concentration"] is None
    assert checkout["first_divergence"]["metric"] == "success_rate"  # pooled, it still fails
    said = ("success rate replayed on calls pooled per cohort: the store has no per-pod "
            "(endpoint) windows for this path")
    assert said in files.markdown.read_text() and said in files.html.read_text()
    assert "warm-up (first" not in files.markdown.read_text()


def test_merged_pod_strata_are_looked_at_when_their_last_window_ends(
        store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pods × windows grid too large for `MAX_GRID_CELLS` is judged in strata of
    adjacent windows; the replay reads each stratum's state once its last window ended."""
    from probes.stats import pod_cells
    from probes.stats.pods import pod_states, pod_track

    monkeypatch.setattr(pod_cells, "MAX_GRID_CELLS", 500)  # checkout: 10 pods x 150 windows
    files = write_report(str(store), tmp_path, since=SPAN[0], until=SPAN[1],
                         paths=["checkout"], now=SPAN[1])
    doc = _json(files)
    checkout = _path(doc, "checkout")
    origin = parse_time(checkout["origin"], now=0)
    at = parse_time(checkout["first_divergence"]["at"], now=0)
    with Store.open(store, readonly=True) as s:
        cols = s.read_endpoint_columns(since=origin - DEFAULT_WARMUP_S, until=SPAN[1],
                                       paths=["checkout"])
    grid = pod_grids(cols.start, cols.path, cols.endpoint, cols.cohort, cols.requests,
                     cols.errors, paths=cols.paths, endpoints=cols.endpoints,
                     cohorts=cols.cohorts, since=origin, warmup_s=DEFAULT_WARMUP_S)["checkout"]
    assert grid.calls.shape[1] == 50  # strata of 3 windows
    track = pod_track(grid.calls, grid.errors, grid.of("1.21.0"), 1.0, 0.001,
                      log_threshold=math.log(4 / 0.01))
    states = pod_states(track, math.log(4 / 0.01))
    k = int(np.argmax(states == "fail"))
    assert states[k] == "fail" and (states[:k] != "fail").all()
    assert at == pytest.approx(float(grid.starts[k]) + 3 * WINDOW_S, abs=1e-6)


def test_the_config_sets_the_warm_up(store: Path, tmp_path: Path) -> None:
    """`verdict.warmup` reaches the report as it reaches the live verdict."""
    from probes.verdict.settings import load_judging_config

    (tmp_path / "endpoints.yaml").write_text("[]\n")
    cfg = tmp_path / "probe.yaml"
    cfg.write_text(http_config(tmp_path / "endpoints.yaml", rate="1/s", warmup="1m")
                   .replace("window: 1s", "window: 10s"))
    files = write_report(str(store), tmp_path / "out", since=SPAN[0], until=SPAN[1],
                         paths=["checkout"], settings=load_judging_config(str(cfg)),
                         now=SPAN[1])
    doc = _json(files)
    assert doc["settings"]["warmup_s"] == 60.0
    band = _path(doc, "checkout")["warmup"]
    assert band["seconds"] == 60.0
    assert band["cohorts"]["1.21.0"]["calls"] == 4 * 6 * 40  # 6 windows of 40 calls a pod
    assert band["calls"] == _path(doc, "checkout")["success_rate_per_pod"]["pods"]["warmup"][
        "calls"]
    assert "warm-up (first 1 min of each pod)" in files.markdown.read_text()


def test_the_probed_share_counts_only_endpoints_with_a_version() -> None:
    """Three checkout pods on 1.20.3, three on 1.21.0 and an etcd endpoint without the
    cohort label: half the pods are on 1.21.0 (not 3 of 7, 43 %); etcd is counted apart."""
    from probes.report._collect import TimeGrid
    from probes.report._endpoints import EndpointTotal
    from probes.report._rollout import from_endpoints

    def total(endpoint: str, cohort: str) -> EndpointTotal:
        return EndpointTotal(0.0, "checkout", endpoint, cohort, "shop", endpoint, 10, 0)

    totals = [total(f"old-{i}", "1.20.3") for i in range(3)]
    totals += [total(f"new-{i}", "1.21.0") for i in range(3)] + [total("etcd-0", "unknown")]
    rollout = from_endpoints(totals, TimeGrid(0.0, 60.0, 1, 1))
    assert rollout.versions == ("1.20.3", "1.21.0")
    assert rollout.share_at("1.21.0", 0.0) == 0.5
    assert rollout.pods.tolist() == [6.0] and rollout.unversioned.tolist() == [1.0]


def test_the_replay_leaves_late_sends_out_of_latency_as_the_verdict_does(
    tmp_path: Path,
) -> None:
    # The probe was overloaded for a minute from T0 + 5 min, its sends 40 ms late: the
    # report's figures leave that minute's latency out (as the verdict's p99 does), and
    # keep its calls and errors.
    db = build(tmp_path / "late.db", minutes=10.0, earlier=False)
    declared, cleared = T0 + 330, T0 + 390
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE path_windows SET lag_max_s = 0.04 WHERE start >= ? AND start < ?",
                     (T0 + 300, cleared))
    with Store.open(db) as s:
        s.write_events([Event(OVERLOAD_EVENT, declared, detail={"reason": "late"}),
                        Event(OVERLOAD_EVENT, cleared, detail={"reason": None})])
    with Store.open(db, readonly=True) as s:
        late = _late_sends(s, T0, T0 + 600, None, JudgingSettings())
        # The span starts the rule's horizon before the event that declared it.
        assert late["exclude"] == [(declared - OVERLOAD_WINDOWS * late["window_s"], cleared)]
        kept, full = collect(s, T0, T0 + 600, None, **late), collect(s, T0, T0 + 600, None)
        windows = s.read_windows(since=T0, until=T0 + 600)
    out = overlapping(np.array([w.start for w in windows]), late["window_s"], late["exclude"])
    left_out = sum(sum(w.latency) for w, o in zip(windows, out, strict=True) if o)
    assert left_out > 0
    assert full.pooled.latency.sum() - kept.pooled.latency.sum() == left_out
    assert np.array_equal(full.pooled.requests, kept.pooled.requests)
    assert np.array_equal(full.pooled.errors, kept.pooled.errors)
    # With a margin that the lateness is a small share of, nothing is left out.
    loose = JudgingSettings(tolerances=dataclasses.replace(JudgingSettings().tolerances,
                                                    latency_p99_margin_ms=100.0))
    with Store.open(db, readonly=True) as s:
        assert _late_sends(s, T0, T0 + 600, None, loose)["exclude"] == []
