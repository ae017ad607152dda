"""Prometheus as the shared store: the verdict read from a real Prometheus scraping three sharded
probe processes, run as the Helm chart's `shards: 3` runs them (each pod's arguments and
config as rendered), agrees with the verdict from their merged SQLite stores, every shard's
/verdict says so, and a stopped Prometheus is SourceUnavailable (exit 4 / HTTP 503), never a
pass.

What "agree" means, and why (see `probes.store.prometheus`):
- the same verdict per path and overall, and no metric that passes from one source and
  fails from the other;
- counts differ only by when a call is seen. The store files a call under its intended send
  time; Prometheus sees it at the first scrape after it was recorded (scrape interval 1 s,
  timeout 0.5 s, plus the probe's lag). So for every window boundary t, with S(t) the store's
  calls intended before t and P(t) the calls Prometheus saw by t (both counted from before
  the probes started):  S(t - 3 s) <= P(t) <= S(t + 1 s)  (1 s: a scrape's timestamp is its
  start, the counters are read a few ms later). Over the whole run P = S minus the calls
  after the last scrape before the probes stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np
import pytest

from probes.api import ApiApp, VerdictQuery
from probes.config import load_config
from probes.discovery.shard import shard_of
from probes.errors import EXIT_UNAVAILABLE, BadInput, SourceUnavailable
from probes.measure.histogram import LOWER, UPPER
from probes.metrics import PROMETHEUS_DURATION_BUCKETS
from probes.spec import JudgingSettings
from probes.store import Store
from probes.store._prom_table import Samples, bucket_counts, increases, level_changes
from probes.store.prometheus import PrometheusSettings, PrometheusSource, _one_of
from probes.types import PathWindow
from probes.verdict.entry import Query, verdict
from probes.verdict.judge import judge
from probes.verdict.service import with_doubts
from tests.servers.helm import HELM, NAMESPACE, PROBE, RELEASE, probe_config, render, shard_argv
from tests.servers.ports import free_port, refused_port
from tests.servers.probe_run import example_fleet
from tests.servers.prometheus import PrometheusServer, needs_prometheus

W = 1.0  # window = query step = scrape interval
# A sample carries its scrape's start as its time, but the probe reads its counters when it
# answers, up to this much later (a loaded probe answers late; a later answer is no sample).
SCRAPE_TIMEOUT_S = 0.9

# -- counter arithmetic (no server) --------------------------------------------------------


def _from_prometheus(prometheus: PrometheusSettings, judging: JudgingSettings,
                     **query: Any) -> Mapping[str, Any]:
    """The verdict JSON from Prometheus, through the one entry the CLI and a gate use."""
    return verdict(Query(**query), judging, prometheus).to_json()


def _samples(labels: Sequence[dict[str, str]], rows: Sequence[Sequence[float]]) -> Samples:
    return Samples(tuple(labels), np.array(rows, dtype=np.float64))


def test_increases_gaps_absent_series_and_resets_per_target() -> None:
    nan = math.nan
    a = {"instance": "a", "path": "p", "cohort": "1", "outcome": "ok"}
    a_err = {**a, "outcome": "http_5xx"}
    b = {**a, "instance": "b"}
    s = _samples([a, a_err, b], [
        [10, 2, nan],    # at the range start: b does not exist yet
        [13, 2, 4],      # b created during window 0: all 4 count
        [nan, nan, 6],   # a missed a scrape: its calls land in the next window
        [20, 3, 9],
        [1, 3, 12],      # a restarted: every series of a restarts, even a_err (3 -> 3)
        [2, 4, 12],
    ])
    inc = increases(s)
    assert inc.tolist() == [
        [3, 0, 4],
        [0, 0, 2],
        [7, 1, 3],
        [1, 3, 3],       # a: 1 from zero; a_err: 3 from zero (not 0: its target restarted)
        [1, 1, 0],
    ]
    # Summed over the run it is each probe's calls, restart included.
    assert inc.sum() == ((20 - 10) + 1 + 1) + ((3 - 2) + 3 + 1) + 12


def test_level_changes_of_a_gauge_keep_the_last_level() -> None:
    s = _samples([{"instance": "a"}], [[math.nan], [3], [math.nan], [1]])
    assert level_changes(s)[:, 0].tolist() == [3, 0, -2]


def test_matchers_escape_regex_and_quotes() -> None:
    assert _one_of("path", ["a"]) == 'path="a"'
    assert _one_of("path", ["b.c", 'x"y']) == 'path=~"b\\\\.c|x\\"y"'


def test_with_doubts_turns_pass_into_inconclusive_never_fail_into_pass() -> None:
    result = {"verdict": "pass", "reasons": [], "paths": [
        {"path": "a", "verdict": "pass", "reasons": ["ok"]},
        {"path": "b", "verdict": "fail", "reasons": ["worse"]},
    ]}
    out = with_doubts(result, ["probe x down"])
    assert out["verdict"] == "inconclusive" and out["reasons"][0] == "probe x down"
    assert [p["verdict"] for p in out["paths"]] == ["inconclusive", "fail"]
    assert out["paths"][0]["reasons"] == ["probe x down", "ok"]
    assert with_doubts({**result, "verdict": "fail"}, ["d"])["verdict"] == "fail"
    assert with_doubts(result, []) is result


def test_bad_settings_are_bad_input() -> None:
    for url in ("not a url", "ftp://127.0.0.1:1", "http://"):
        with pytest.raises(BadInput):
            PrometheusSource(PrometheusSettings(url=url))
    with pytest.raises(BadInput):
        PrometheusSource(PrometheusSettings(url="http://127.0.0.1:9", step_s=0))


# -- errors from servers that are not a working Prometheus -----------------------------------


def test_refused_is_unavailable() -> None:
    with refused_port() as port:
        settings = PrometheusSettings(url=f"http://127.0.0.1:{port}", timeout_s=2)
        with PrometheusSource(settings) as source, pytest.raises(SourceUnavailable) as err:
            source.read_table(since=time.time() - 30)
    assert err.value.exit_code == EXIT_UNAVAILABLE


class _Html(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = b"<html>login required</html>"
        status = 200 if "query_range" in self.path else 502
        self.send_response(status)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _html_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_an_answer_that_is_not_the_prometheus_api_is_unavailable() -> None:
    with _html_server() as url, PrometheusSource(PrometheusSettings(url=url)) as source:
        with pytest.raises(SourceUnavailable, match="not a Prometheus API answer"):
            source.read_table(since=time.time() - 30)
        with pytest.raises(SourceUnavailable, match="HTTP 502"):
            source.paths()


# -- a real Prometheus scraping two sharded probe processes ----------------------------------


def _cli_has(command: str, option: str) -> bool:
    from probes.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return option in action.choices[command]._option_string_actions
    return False


SHARDS = 3
CONFIG_PATH = "/etc/skewprobe/probe.yaml"  # where the chart mounts the ConfigMap


class ChartShards(NamedTuple):
    config: str  # the rendered probe.yaml
    argvs: list[list[str]]  # each pod's `skewprobe` arguments, as the kubelet passes them
    gate: str  # the MetricTemplate's query, Flagger's `{{ variables.path }}` left in
    panels: dict[str, list[str]]  # the dashboard's queries by panel title


def _chart_shards(endpoints: Path, prometheus_url: str) -> ChartShards:
    """The chart's `shards: 3` with this test's targets and paths."""
    paths = [{"name": name, "http": {"path": url}, "rate": "20/s", "timeout": "500ms"}
             for name, url in (("checkout", "/api/checkout"), ("catalog", "/api/catalog"))]
    docs = render(PROBE, {
        "shards": SHARDS,
        "serviceMonitor": {"enabled": True, "interval": "1s", "scrapeTimeout": "900ms"},
        "sharding": {"prometheusUrl": prometheus_url},
        "flagger": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
        "config": {"targets": {"kubernetes": None, "file": {"path": str(endpoints)}},
                   "window": "1s", "verdict": {"min_samples": 100, "warmup": "1s"},
                   "paths": paths},
    })
    argvs = [shard_argv(docs, i) for i in range(SHARDS)]
    for argv in argvs:
        assert argv[:3] == ["run", "--config", CONFIG_PATH], argv
    (gate,) = [d["spec"]["query"] for d in docs if d["kind"] == "MetricTemplate"]
    (board,) = [json.loads(d["data"]["skewprobe.json"]) for d in docs
                if d["kind"] == "ConfigMap" and "skewprobe.json" in d["data"]]
    panels = {p["title"]: [t["expr"] for t in p.get("targets", ())] for p in board["panels"]}
    return ChartShards(probe_config(docs), argvs, gate, panels)


def _merge(windows: Sequence[PathWindow]) -> list[PathWindow]:
    """The windows of several stores summed per (start, path, cohort)."""
    groups: dict[tuple[float, str, str], list[PathWindow]] = {}
    for w in windows:
        groups.setdefault((w.start, w.path, w.cohort), []).append(w)
    out = []
    for (start, path, cohort), ws in sorted(groups.items()):
        outcomes: Counter[str] = Counter()
        resets: Counter[str] = Counter()
        for w in ws:
            outcomes.update(w.outcomes)
            resets.update(w.stream_resets)
        out.append(PathWindow(
            start=start, length=ws[0].length, path=path, cohort=cohort, outcomes=outcomes,
            latency=tuple(np.sum([w.latency for w in ws], axis=0).tolist()),
            attempts_sum=sum(w.attempts_sum for w in ws),
            attempts_count=sum(w.attempts_count for w in ws),
            churn=sum(w.churn for w in ws), lag_max_s=max(w.lag_max_s for w in ws),
            streams_opened=sum(w.streams_opened for w in ws),
            stream_seconds=sum(w.stream_seconds for w in ws), stream_resets=resets,
        ))
    return out


async def _until(what: str, check: Any, limit_s: float) -> Any:
    """Poll another process' state (no event crosses the process boundary), bounded."""
    deadline = time.monotonic() + limit_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


def _verdicts(result: Any) -> dict[str, str]:
    paths = result.paths if hasattr(result, "paths") else result["paths"]
    return {(p.path if hasattr(p, "path") else p["path"]):
            (p.verdict if hasattr(p, "verdict") else p["verdict"]) for p in paths}


def _no_contradiction(a: Any, b: Any) -> None:
    """No metric passes from one source and fails from the other."""
    for pa in a.paths:
        pb = b.path(pa.path)
        for ma in pa.metrics:
            mb = pb.metric(ma.name) if pb else None
            if mb is not None:
                assert {ma.verdict, mb.verdict} != {"pass", "fail"}, (pa.path, ma, mb)


@pytest.mark.slow
@needs_prometheus
@pytest.mark.skipif(HELM is None, reason="helm not found: run scripts/install-helm.sh")
async def test_three_sharded_probes_from_the_chart_through_prometheus_agree_with_their_stores(
    tmp_path: Path,
) -> None:
    endpoints = tmp_path / "endpoints.json"
    fleet = example_fleet(endpoints, pods=6, base_host="127.0.0.150", seed=11, notice_s=0.2)
    pods = [f"target-{i}" for i in range(6)]
    shards = {p: shard_of(_endpoint(p), SHARDS) for p in pods}
    # The first three pods restart into the canary: one in each shard, so every probe sees it.
    assert {shards[f"target-{i}"] for i in range(3)} == set(range(SHARDS))

    listens = [f"127.0.0.1:{free_port()}" for _ in range(SHARDS)]
    stores = [tmp_path / f"shard{i}.db" for i in range(SHARDS)]
    # The labels the chart's ServiceMonitor gives the shards' series: job (the Service's
    # name) and the release's namespace.
    prom = PrometheusServer(tmp_path, listens, job=RELEASE, labels={"namespace": NAMESPACE},
                            interval_s=W, timeout_s=SCRAPE_TIMEOUT_S)
    chart = _chart_shards(endpoints, prom.url)
    argvs = chart.argvs
    config = tmp_path / "probe.yaml"
    config.write_text(chart.config)
    # Every shard judges from Prometheus what the chart tells it to.
    chart_config = load_config(str(config))
    assert chart_config.source == "prometheus" and chart_config.prometheus is not None
    settings = chart_config.prometheus
    assert settings.url == prom.url and settings.step_s == W
    procs: list[asyncio.subprocess.Process] = []
    logs = _open_logs(tmp_path)
    source: PrometheusSource | None = None
    try:
        await fleet.start()
        await prom.wait_ready()
        source = PrometheusSource(settings)
        async with httpx.AsyncClient(base_url=prom.url, timeout=5) as api:
            def scraping(query: str) -> Any:
                async def check() -> bool:
                    r = await api.get("/api/v1/query", params={"query": query})
                    return bool(r.json()["data"]["result"])

                return check

            # Prometheus applies discovered targets up to 5 s after it starts: wait until it
            # scrapes (and fails, `up` 0) every address, then start the probes, so each is
            # scraped within a second of listening and no call predates its first scrape by
            # more than the bound in `_check_counts`.
            await _until("scrapes attempted", scraping(f"count(up) == {SHARDS}"), 30)
            t_begin = time.time()
            for i in range(SHARDS):
                argv = [*argvs[i][:2], str(config), *argvs[i][3:],
                        "--store", str(stores[i]), "--listen", listens[i]]
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "probes.cli", *argv,
                    stdout=logs[i], stderr=logs[i], env={**os.environ, "PYTHONUNBUFFERED": "1"},
                ))
            await _until("every probe scraped", scraping(f"sum(up) == {SHARDS}"), 30)
            await asyncio.sleep(3)  # baseline only
            t_rollout = time.time()
            await fleet.rollout("1.21.0", interval_s=0.2, limit=SHARDS)
            await asyncio.sleep(12)
            # /verdict on any shard (the Service picks one) judges every shard's series.
            for listen in listens:
                # A hang guard, not a bound: a loaded probe answers late, but answers.
                answer = (await api.get(f"http://{listen}/verdict", timeout=60)).json()
                if not any("overloaded" in r for r in answer["reasons"]):
                    assert _verdicts(answer)["checkout"] == "fail", (listen, answer)
                canary = {p["path"]: p["samples"]["canary"] for p in answer["paths"]}
                assert canary["checkout"] > 0, (listen, answer)
            await _check_chart_queries(api, chart)
            t_stop = time.time()
            for p in procs:
                p.send_signal(signal.SIGTERM)
            codes = [await asyncio.wait_for(p.wait(), 15) for p in procs]
            assert codes == [0] * SHARDS, [
                (tmp_path / f"probe{i}.log").read_text() for i in range(SHARDS)]

            await _until("every probe marked down", scraping("sum(up) == 0"), 10)
        await fleet.stop(0.0)

        # Sharding: the stores hold disjoint endpoint sets that cover the fleet.
        seen = []
        for i, path in enumerate(stores):
            with Store.open(path, readonly=True) as store:
                names = {e.endpoint for e in store.read_endpoint_windows()}
            assert names and all(shards[n] == i for n in names), (i, names)
            seen.append(names)
        assert set().union(*seen) == set(pods) and sum(map(len, seen)) == len(pods)

        windows = []
        for path in stores:
            with Store.open(path, readonly=True) as store:
                windows += store.read_windows()
        merged = _merge(windows)
        first = math.floor(t_begin) - 2
        # Where the source's newest window ends now and at every later read (it answers a
        # step before its clock): every read below covers the same windows.
        end = math.floor(time.time() / W) * W - W
        table = await asyncio.to_thread(source.read_table, since=first, until=end)
        _check_counts(table, merged, first, end, t_stop)
        await asyncio.to_thread(_check_long_rows, source, table, first, end)

        # The verdicts over the rollout, from both sources, on the same windows.
        a, b = math.floor(t_rollout), math.floor(t_stop) - 2
        in_range = [w for w in merged if a <= w.start < b]
        from_stores = judge(in_range, min_samples=100, window_s=W, now=b, since=a)
        prom_table = await asyncio.to_thread(source.read_table, since=a, until=b)
        assert len(prom_table.latency_les) == 239  # the exported buckets, not the store's
        from_prom = judge(prom_table, min_samples=100, window_s=W, now=b, since=a)
        assert from_stores.path("checkout").verdict == "fail", from_stores.to_json()
        assert _verdicts(from_prom) == _verdicts(from_stores), (
            from_prom.to_json(), from_stores.to_json())
        assert from_prom.verdict == from_stores.verdict == "fail"
        assert (from_prom.baseline, from_prom.canary) == ("1.20.3", "1.21.0")
        _no_contradiction(from_prom, from_stores)
        retries = from_prom.path("checkout").metric("attempts_per_request")
        assert retries is not None and retries.verdict == "fail"

        # The service path (origin found in Prometheus, probes' health) as a gate reads it.
        judging = JudgingSettings(min_samples=100, window_s=W)
        health = await asyncio.to_thread(source.health, b)
        # Asked at b + W, Prometheus answers for b (a step before: every scrape stored).
        result = await asyncio.to_thread(_from_prometheus, settings, judging,
                                         now=b + W)
        origin = min(w.start for w in merged if w.cohort == "1.21.0")
        from_stores_default = judge(
            [w for w in merged if origin <= w.start < b], min_samples=100, window_s=W, now=b,
            since=origin)
        if health.overloaded:  # a starved probe on a loaded machine: never judged from
            assert result["verdict"] == "inconclusive"
            assert any("overloaded" in r for r in result["reasons"])
        else:
            assert _verdicts(result) == _verdicts(from_stores_default), result
        assert abs(_parse(result["window"]["from"]) - origin) <= 2 * W
        only = await asyncio.to_thread(
            _from_prometheus, settings, judging, path="checkout", now=b)
        assert [p["path"] for p in only["paths"]] == ["checkout"]
        with pytest.raises(BadInput, match="no data for path"):
            await asyncio.to_thread(
                _from_prometheus, settings, judging, path="nope", now=b)
        # After the probes stopped, Prometheus says so, and nothing could pass.
        later = await asyncio.to_thread(source.health)
        assert later.down == tuple(sorted(listens)) and later.doubts()

        with pytest.raises(BadInput, match="bad_data"):
            bad = PrometheusSettings(url=prom.url, selector='job=~"(("', step_s=W)
            with PrometheusSource(bad) as broken:
                await asyncio.to_thread(broken.read_table, since=a, until=b)

        # Prometheus stopped: SourceUnavailable (exit 4), HTTP 503, never a pass.
        prom.stop()
        with pytest.raises(SourceUnavailable) as err:
            await asyncio.to_thread(_from_prometheus, settings, judging, now=b)
        assert err.value.exit_code == EXIT_UNAVAILABLE

        async def verdict_fn(query: VerdictQuery) -> Any:
            return await asyncio.to_thread(
                _from_prometheus, settings, judging, path=query.path, now=time.time())

        from prometheus_client import CollectorRegistry

        app = ApiApp(CollectorRegistry(), verdict=verdict_fn, health=lambda: (True, "ok"))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://probe") as client:
            answer = await client.get("/verdict")
            assert answer.status_code == 503 and "prometheus" in answer.json()["error"]
            gate = await client.post("/gate", json={"name": "x", "namespace": "y"})
            assert gate.status_code == 503
        if _cli_has("verdict", "--prometheus"):
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "probes.cli", "verdict", "--prometheus", prom.url,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            _, errout = await asyncio.wait_for(cli.communicate(), 30)
            assert cli.returncode == EXIT_UNAVAILABLE, errout.decode()
            assert b"Traceback" not in errout and errout.decode().count("\n") == 1
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        for f in logs:
            f.close()
        if source is not None:
            source.close()
        prom.stop()
        await fleet.stop(0.0)


async def _check_chart_queries(api: httpx.AsyncClient, chart: ChartShards) -> None:
    """The chart's gate and dashboard over the three shards' series in this Prometheus: one
    answer per path (and cohort), not one per shard."""
    async def query(expr: str) -> list[dict[str, Any]]:
        r = await api.get("/api/v1/query", params={"query": expr})
        assert r.status_code == 200, (expr, r.text)
        return list(r.json()["data"]["result"])

    # Every shard exports the merged verdict; the MetricTemplate (min over the shards) is one
    # sample, 0 for checkout: no shard can say pass for a path that fails.
    gate = await query(chart.gate.replace("{{ variables.path }}", "checkout"))
    assert [float(s["value"][1]) for s in gate] == [0.0], gate
    board = {title: [e.replace("$job", RELEASE).replace("$path", ".*")
                     .replace("$__rate_interval", "10s") for e in exprs]
             for title, exprs in chart.panels.items()}
    for title in ("Success rate", "Latency p99", "Upstream attempts per request"):
        result = await query(board[title][0])
        keys = [(s["metric"]["path"], s["metric"]["cohort"]) for s in result]
        assert len(keys) == len(set(keys)) and {p for p, _ in keys} == {"checkout", "catalog"}, (
            title, result)
        assert {c for _, c in keys} == {"1.20.3", "1.21.0"}, (title, result)
    lag = await query(board["Schedule lag p99"][0])
    assert len(lag) == SHARDS, lag  # one line per shard
    (verdict,) = [s for s in await query(board["Verdict per path"][0])
                  if s["metric"]["path"] == "checkout"]
    assert float(verdict["value"][1]) in (0.0, 2.0), verdict  # fail, or inconclusive (overload)


def _check_long_rows(source: PrometheusSource, table: Any, first: float, end: float) -> None:
    """A range read as windows / long rows / windows sums to exactly the same as in windows
    (rows end on the same instants), latency included."""
    source.fine_rows, source.coarse_rows = 3, 4
    try:
        coarse = source.read_table(since=first, until=end)
    finally:
        del source.fine_rows, source.coarse_rows  # back to the class defaults
    lengths = sorted(set(coarse.length.tolist()))
    assert len(lengths) == 2 and lengths[0] == W and lengths[1] % W == 0, lengths
    assert len(coarse) < len(table)
    for path in table.paths:
        for cohort in table.cohorts:
            assert coarse.totals(path, cohort) == table.totals(path, cohort), (path, cohort)
    for t in (table, coarse):
        assert t.latency_by_group(np.zeros(len(t), dtype=np.int64), 1).sum() == t.requests.sum()
    np.testing.assert_array_equal(
        coarse.latency_by_group(np.where(coarse.cohort == 0, 0, 1), 2),
        table.latency_by_group(np.where(table.cohort == 0, 0, 1), 2),
    )
    # Latency over a span from its two ends (the usual way) or in rows (after a probe
    # restarted or stopped): the same counts.
    metric, les = "skewprobe_request_duration_seconds_bucket", table.latency_les
    ends = bucket_counts(source._samples(metric, [], first, [], end=end), les)
    rows = bucket_counts(source._samples(metric, [], first, source._grid(first, round(
        (end - first) / W))), les)
    assert ends.keys() == rows.keys() and len(ends) == 4
    for key, counts in ends.items():
        np.testing.assert_array_equal(counts, rows[key])


def _open_logs(tmp: Path) -> list[Any]:
    return [(tmp / f"probe{i}.log").open("wb") for i in range(SHARDS)]


def _endpoint(name: str) -> Any:
    from probes.types import Endpoint

    return Endpoint(name=name, host="127.0.0.1", port=1)


def _parse(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _check_counts(table: Any, merged: Sequence[PathWindow], first: float, end: float,
                  t_stop: float) -> None:
    """S(t - 3 s) <= P(t) <= S(t + 1 s + d) at every window boundary, per path x cohort, for
    requests, errors, measured attempts and the latency histogram at every exported edge
    (d: the scrape timeout in whole windows, how much later than its time a sample's
    counters may have been read); over the whole run P <= S and S - P <= the calls of the
    last 3 s before the stop."""
    late = math.ceil(SCRAPE_TIMEOUT_S / W) * W
    edges = table.latency_edges[1][:-1]  # the finite `le` values
    assert np.array_equal(edges, PROMETHEUS_DURATION_BUCKETS)  # the probes judge from it
    keys = {(w.path, w.cohort) for w in merged}
    assert {(table.paths[p], table.cohorts[c]) for p, c in zip(table.path, table.cohort,
                                                                strict=True)} == keys
    steps = np.arange(first, end + W, W)
    for path, cohort in sorted(keys):
        mine = [w for w in merged if (w.path, w.cohort) == (path, cohort)]
        rows = (np.array(table.paths)[table.path] == path) & (
            np.array(table.cohorts)[table.cohort] == cohort)

        def store_cum(t: float, pick: Any, mine: list[PathWindow] = mine) -> np.ndarray:
            return np.sum([pick(w) for w in mine if w.start < t] or [pick(mine[0]) * 0], axis=0)

        def prom_cum(t: float, column: np.ndarray, rows: np.ndarray = rows) -> np.ndarray:
            return column[rows & (table.start < t)].sum(axis=0)

        lat = np.array([w.latency for w in mine])
        # Store latency at each `le`: buckets wholly below it, and also the one straddling it.
        below = np.searchsorted(UPPER, edges, side="right")  # fine buckets with U <= e
        straddle = np.searchsorted(LOWER, edges, side="right")  # ... with L <= e
        measures = {
            "requests": (lambda w: np.array(w.requests), table.requests),
            "errors": (lambda w: np.array(w.requests - w.successes),
                       table.requests - table.successes),
            "attempts_count": (lambda w: np.array(w.attempts_count), table.attempts_count),
        }
        for t in steps:
            for name, (pick, column) in measures.items():
                p = prom_cum(t, column)
                lo, hi = store_cum(t - 3 * W, pick), store_cum(t + W + late, pick)
                if not lo <= p <= hi:
                    # What a reader needs to tell the mechanism: both sides' rows near t.
                    near = [(w.start - first, int(pick(w))) for w in mine
                            if t - 4 * W <= w.start < t + 4 * W]
                    prom_rows = [(float(a - first), int(v)) for a, v in zip(
                        table.start[rows], column[rows], strict=True) if t - 4 * W <= a < t + 4 * W]
                    raise AssertionError((path, cohort, name, t - first, lo, p, hi,
                                          "store", near, "prometheus", prom_rows))
            group = np.where(rows & (table.start < t), 0, -1)
            cum_lat = np.cumsum(table.latency_by_group(group, 1)[0])[:-1]
            fine = lat[[w.start < t + late for w in mine]].sum(axis=0)
            fine_early = lat[[w.start < t - 3 * W for w in mine]].sum(axis=0)
            c_hi, c_lo = np.cumsum(fine), np.cumsum(fine_early)
            hi = np.where(straddle > 0, c_hi[np.maximum(straddle - 1, 0)], 0)
            lo = np.where(below > 0, c_lo[np.maximum(below - 1, 0)], 0)
            assert np.all(lo <= cum_lat) and np.all(cum_lat <= hi), (path, cohort, t - first)
        total_s = sum(w.requests for w in mine)
        total_p = int(table.requests[rows].sum())
        tail = sum(w.requests for w in mine if w.start >= math.floor(t_stop) - 3 * W)
        assert 0 <= total_s - total_p <= tail, (path, cohort, total_s, total_p, tail)
