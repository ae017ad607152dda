"""The running probe's verdict cache (`probes.verdict.cache`) gives the verdict a fresh read
of the store gives, window after window: when windows are appended, when the last one is
written again (upsert), and when what it holds stops being true (a window written late
under what it pooled, a store replaced underneath, a prune, an overload span reaching back,
a pod restarted under its own name). Every comparison is of the whole verdict JSON.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from probes._parsing import rfc3339
from probes.measure.histogram import BUCKET_COUNT
from probes.measure.overload import OVERLOAD_EVENT
from probes.spec import JudgingSettings
from probes.store import Event, Store
from probes.types import EndpointWindow, PathWindow
from probes.verdict import cache as verdict_cache
from probes.verdict import grids as grids_module
from probes.verdict import service as verdict_service
from probes.verdict.cache import CachedSource, VerdictCache
from probes.verdict.service import compute_verdict

T0 = 1_790_000_000.0
W = 10.0
OLD, NEW = "1.20.3", "1.21.0"
PATHS = ("checkout", "search")
PODS = ("shop-0", "shop-1", "shop-2", "shop-3")
SETTINGS = JudgingSettings(warmup_s=30.0)


def moved(pod: int, t: float) -> bool:
    """Pod k restarts onto the new version after 2 + 3k minutes (pod 3 never)."""
    return pod < 3 and t >= T0 + 60 * (2 + 3 * pod)


def lag_at(k: int) -> float:
    """How late the probe's sends were in window k: 40 ms (more than half the p99 margin)
    around the overload spans the tests declare, so those spans leave p99 out."""
    return 0.04 if 55 <= k < 66 or 100 <= k < 126 else 0.001


def windows_at(k: int, rng: np.random.Generator, *, labels: dict[str, dict[str, str]] | None = None,
               bump: int = 0) -> tuple[list[PathWindow], list[EndpointWindow]]:
    t, lag = T0 + k * W, lag_at(k)
    paths, cells = [], []
    for path in PATHS:
        per: dict[str, list[EndpointWindow]] = {OLD: [], NEW: []}
        for i, pod in enumerate(PODS):
            cohort = NEW if moved(i, t) else OLD
            n = int(rng.poisson(40)) + bump
            e = int(rng.binomial(n, 0.02 if (pod == "shop-1" and cohort == NEW) else 0.005))
            # Each pod's calls' latency and attempts (schema v2): shop-2 is slower on the
            # new version, so p99 is judged with the pod as the unit and names a slow pod.
            slow = 60 if (pod == "shop-2" and cohort == NEW) else 0
            buckets = rng.integers(300, 700, n) + slow
            counts = np.bincount(buckets - 300, minlength=1)
            lat = {int(b) + 300: int(c) for b, c in enumerate(counts) if c}
            per[cohort].append(EndpointWindow(
                start=t, path=path, endpoint=pod, cohort=cohort, requests=n, errors=e,
                labels=(labels or {}).get(pod, {}), attempts_sum=n + int(rng.integers(0, 3)),
                attempts_count=n, latency=lat))
        for cohort, mine in per.items():
            if not mine:
                continue
            n, e = sum(c.requests for c in mine), sum(c.errors for c in mine)
            lat = np.zeros(BUCKET_COUNT, dtype=np.int64)
            for c in mine:
                for b, k in c.latency.items():
                    lat[b] += k
            paths.append(PathWindow(
                start=t, length=W, path=path, cohort=cohort,
                outcomes={"ok": n - e, "http_5xx": e}, latency=tuple(int(x) for x in lat),
                attempts_sum=sum(c.attempts_sum for c in mine), attempts_count=n,
                lag_max_s=lag,
            ))
            cells += mine
    return paths, cells


def written(store: Store, windows: int, seed: int) -> tuple[np.random.Generator, float]:
    """`windows` windows from T0 written; the generator for more, and the time after them."""
    rng = np.random.default_rng(seed)
    for k in range(windows):
        store.write(*windows_at(k, rng))
    return rng, T0 + windows * W + 1


def verdicts(db: str, cache: VerdictCache, now: float) -> tuple[Any, Any]:
    warm = compute_verdict(db, SETTINGS, now=now, overload=None, cache=cache)
    cold = compute_verdict(db, SETTINGS, now=now, overload=None)
    return warm, cold


@pytest.fixture
def estate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Store, VerdictCache]:
    # Strata of a few windows from the first minutes on, as a day's verdict has them.
    monkeypatch.setattr(verdict_service, "MAX_STRATA", 40)
    db = str(tmp_path / "probe.db")
    store = Store.open(db)
    return db, store, VerdictCache(db, reread_s=3 * W)


def test_path_windows_are_pooled_a_step_at_a_time(estate: Any) -> None:
    """Asked after every window, the cache pools the path windows when its seal has moved
    on by `_POOL_STEP_S`, not at every window: the windows after the seal are read as
    stored, never more than the re-read span and a step of them, and the verdict is a
    fresh read's at every window."""
    db, store, cache = estate
    rng, now = written(store, 40, seed=5)
    seals, tails = [], []
    for k in range(40, 75):
        store.write(*windows_at(k, rng))
        now = T0 + (k + 1) * W + 1
        warm, cold = verdicts(db, cache, now)
        assert warm == cold, k
        w = cache._windows
        assert w is not None and len(w.tail.start) and w.tail.start.min() >= w.seal
        seals.append(w.seal)
        tails.append(float(w.tail.start.max() - w.seal))
    moves = np.diff(seals)
    assert moves.max() >= verdict_cache._POOL_STEP_S and (moves == 0).sum() > len(moves) / 2
    assert all(m == 0 or m >= verdict_cache._POOL_STEP_S for m in moves), moves
    assert max(tails) < 3 * W + verdict_cache._POOL_STEP_S + W, tails
    assert cache.reads_afresh["windows"] <= 3


def test_appended_windows_give_the_verdict_a_fresh_read_gives(estate: Any) -> None:
    db, store, cache = estate
    rng = np.random.default_rng(1)
    judged = 0
    for k in range(150):
        store.write(*windows_at(k, rng))
        if k % 7 == 6:
            warm, cold = verdicts(db, cache, T0 + (k + 1) * W + 1)
            assert warm == cold, k
            judged += warm["canary"] == NEW
    assert judged > 10
    # p99 and attempts were judged with the pod as the unit, from the pooled records.
    rules = {name: m["rule"] for p in warm["paths"] for name, m in p["metrics"].items()}
    assert rules["latency_p99_ms"] == "pods", rules
    # The first reads (the recent windows, every window while one cohort had data, then from
    # the canary's origin), then only new windows; the endpoint windows again when the span
    # outgrows its strata (every 40 windows here).
    assert cache.reads_afresh["windows"] <= 3
    assert cache.reads_afresh["pods"] <= 1 + 150 // 40
    pooled = cache._windows
    assert pooled is not None and len(pooled.sealed.start) < 40  # not 2 paths x 2 x 150
    # Each pod's settled latency records are one per bucket, not one per window and bucket.
    assert cache._pods is not None
    kept = len(cache._pods.latency.pooled) + len(cache._pods.latency.loose)
    with Store.open(db, readonly=True) as s:
        stored = len(s.read_endpoint_columns(since=T0, latency=True).latency)
    assert kept < stored / 3, (kept, stored)
    # The pod-level tests summed each verdict's new strata onto the sums kept from the last
    # (`pods.TrackMemo`), every stratum again only when a pod joined (three restart onto
    # the new version) or the strata were laid out anew.
    memos = list(cache._memos.values())
    assert {k[0] for k in cache._memos} == {"success_rate", "attempts_per_request"}
    assert all(m.kept_windows > 0 for m in memos)
    assert all(m.summed_whole <= 1 + 3 + 150 // 40 < judged for m in memos), (
        [m.summed_whole for m in memos], judged)


def test_the_last_window_written_again_is_read_again(estate: Any) -> None:
    db, store, cache = estate
    rng, now = written(store, 80, seed=2)
    assert verdicts(db, cache, now)[0] == verdicts(db, cache, now)[1]
    store.write(*windows_at(79, rng, bump=25))  # the flush again, with late calls
    warm, cold = verdicts(db, cache, now)
    assert warm == cold
    assert cache.reads_afresh["windows"] <= 2


def test_a_window_written_late_under_the_pooled_rows_is_read_afresh(estate: Any) -> None:
    db, store, cache = estate
    rng = np.random.default_rng(3)
    for k in range(90):
        if k != 40:
            store.write(*windows_at(k, rng))
    now = T0 + 90 * W + 1
    warm, cold = verdicts(db, cache, now)
    assert warm == cold
    before = dict(cache.reads_afresh)
    store.write(*windows_at(40, rng, bump=200))  # kept for retry, or a second writer
    warm, cold = verdicts(db, cache, now)
    assert warm == cold
    assert cache.reads_afresh["windows"] > before["windows"]


def test_a_store_replaced_or_pruned_underneath_is_read_afresh(estate: Any,
                                                              tmp_path: Path) -> None:
    db, store, cache = estate
    _, now = written(store, 90, seed=4)
    assert verdicts(db, cache, now)[0]["canary"] == NEW
    other = str(tmp_path / "other.db")
    with Store.open(other) as o:
        rng2 = np.random.default_rng(5)
        for k in range(90):
            o.write(*windows_at(k, rng2, bump=10))
    store.close()
    os.replace(other, db)
    warm, cold = verdicts(db, cache, now)
    assert warm == cold
    with Store.open(db) as s:
        s.prune(T0 + 45 * W)
    warm, cold = verdicts(db, cache, now)
    assert warm == cold


def test_an_overload_span_reaching_into_pooled_windows_is_left_out_alike(estate: Any) -> None:
    db, store, cache = estate
    rng, now = written(store, 100, seed=6)
    assert verdicts(db, cache, now)[0]["canary"] == NEW
    before = cache.reads_afresh["windows"]
    # An overload the probe declared and cleared while these windows were pooled.
    store.write_events([Event(OVERLOAD_EVENT, T0 + 60 * W, detail={"reason": "late sends"}),
                        Event(OVERLOAD_EVENT, T0 + 66 * W, detail={"reason": None})])
    warm, cold = verdicts(db, cache, now)
    assert warm == cold
    assert any("left out of p99" in r for r in warm["reasons"]), warm["reasons"]
    assert cache.reads_afresh["windows"] > before
    for k in range(100, 120):  # and one that is still open
        store.write(*windows_at(k, rng))
    store.write_events([Event(OVERLOAD_EVENT, T0 + 112 * W, detail={"reason": "late sends"})])
    warm, cold = verdicts(db, cache, T0 + 120 * W + 1)
    assert warm == cold


def test_a_pod_restarted_under_its_own_name_is_warm_again_alike(estate: Any) -> None:
    db, store, cache = estate
    rng = np.random.default_rng(7)
    start = {"start_time": rfc3339(T0)}
    for k in range(70):
        store.write(*windows_at(k, rng, labels={p: start for p in PODS}))
    assert verdicts(db, cache, T0 + 70 * W + 1)[0]["canary"] == NEW
    again = {**{p: start for p in PODS}, "shop-3": {"start_time": rfc3339(T0 + 70 * W)}}
    for k in range(70, 100):
        store.write(*windows_at(k, rng, labels=again))
        warm, cold = verdicts(db, cache, T0 + (k + 1) * W + 1)
        assert warm == cold, k


def test_before_a_rollout_no_endpoint_window_is_read(estate: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # One cohort: nothing to compare pod by pod, so the verdict reads no endpoint windows
    # (each verdict of a probe waiting for its rollout would read all of them).
    db, store, cache = estate
    rng = np.random.default_rng(8)
    for k in range(12):  # the first two minutes: every pod still on the old version
        store.write(*windows_at(k, rng))
    reads = []
    read = Store.read_endpoint_columns

    def counted(self: Store, *args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(Store, "read_endpoint_columns", counted)
    warm, cold = verdicts(db, cache, T0 + 12 * W + 1)
    assert warm == cold and warm["canary"] is None, warm["reasons"]
    assert reads == []
    store.write(*windows_at(12, rng))  # pod 0 moves: now there is a canary to judge
    warm, cold = verdicts(db, cache, T0 + 13 * W + 1)
    assert warm == cold and warm["canary"] == NEW
    assert reads


def test_latency_entries_sliced_by_path_or_masked_give_one_verdict(
        estate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A warm verdict's few entries are sorted by path and sliced; a day's cold read, too many
    # to sort, finds each path's by a mask. Both must read the same grids.
    from probes.stats import pod_cells

    db, store, cache = estate
    _, now = written(store, 90, seed=7)
    sliced, _ = verdicts(db, cache, now)
    monkeypatch.setattr(pod_cells, "SORT_ENTRIES_MAX", 0)
    masked = compute_verdict(db, SETTINGS, now=now, overload=None)
    assert sliced == masked
    rules = {name: m["rule"] for p in masked["paths"] for name, m in p["metrics"].items()}
    assert rules["latency_p99_ms"] == "pods", rules


def _same_grids(kept: Any, fresh: Any) -> None:
    import dataclasses

    from probes.stats.pods import PodGrid

    assert kept is not None and fresh is not None
    assert list(kept) == list(fresh)
    for path in fresh:
        for f in dataclasses.fields(PodGrid):
            if f.name == "settled":  # what the cache vouches for: a fresh read, nothing
                assert fresh[path].settled is None
                continue
            a, b = getattr(kept[path], f.name), getattr(fresh[path], f.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                assert a is not None and b is not None, (path, f.name)
                np.testing.assert_array_equal(a, b, err_msg=f"{path} {f.name}")
            else:
                assert a == b, (path, f.name)


def test_the_kept_grids_are_those_a_fresh_read_lays_out(
        estate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache keeps each path's grid of the sealed strata and adds the new ones
    # (`probes.verdict.grids`): compared cell by cell with a fresh read's, window after
    # window, while a pod joins, a pod restarts under its own name, an overload span opens
    # and closes and the warm-up changes.
    db, store, cache = estate
    rng = np.random.default_rng(11)
    served: list[bool] = []
    tokens: list[tuple[int, dict[str, Any]]] = []  # each verdict's grids' `settled`
    laid, kept_grids = verdict_service._pod_grids, CachedSource.pod_grids

    def counted(self: CachedSource, **kwargs: Any) -> Any:
        out = kept_grids(self, **kwargs)
        served.append(out is not None)
        if out is not None:
            tokens.append((k, {name: g.settled for name, g in out.items()}))
        return out

    def both(source: Any, *args: Any, **kwargs: Any) -> Any:
        kept = laid(source, *args, **kwargs)
        if isinstance(source, CachedSource):
            with Store.open(db, readonly=True) as fresh:
                _same_grids(kept, laid(fresh, *args, **kwargs))
        return kept

    # Most verdicts add their strata to every path at once (`grids._appending`); a pod new
    # to its path's grid, or strata a path lacks, add them path by path.
    at_once: list[bool] = []
    appending = grids_module._appending

    def spied(*args: Any) -> Any:
        out = appending(*args)
        at_once.append(out is not None)
        return out

    monkeypatch.setattr(grids_module, "_appending", spied)
    monkeypatch.setattr(CachedSource, "pod_grids", counted)
    monkeypatch.setattr(verdict_service, "_pod_grids", both)
    restarted = {"start_time": rfc3339(T0 + 95 * W)}
    for k in range(160):
        paths, cells = windows_at(k, rng, labels={"shop-3": restarted} if k >= 95 else None)
        if k >= 70:  # a pod the cache has not seen joins the canary
            cells.append(EndpointWindow(
                start=T0 + k * W, path="checkout", endpoint="shop-9", cohort=NEW, requests=30,
                errors=k % 3, attempts_sum=31, attempts_count=30, latency={450 + k % 7: 30}))
        store.write(paths, cells)
        if k == 110:
            store.write_events([Event(OVERLOAD_EVENT, T0 + 104 * W, detail={"reason": "late"})])
        if k == 125:
            store.write_events([Event(OVERLOAD_EVENT, T0 + 125 * W, detail={"reason": None})])
        if k % 3 == 2 and k > 20:
            settings = SETTINGS if k < 140 else JudgingSettings(warmup_s=50.0)
            now = T0 + (k + 1) * W + 1
            warm = compute_verdict(db, settings, now=now, overload=None, cache=cache)
            assert warm == compute_verdict(db, settings, now=now, overload=None), k
    assert sum(served) > 30, served
    assert sum(at_once) > 30 and not all(at_once), at_once
    # The grids were laid out from the kept parts, the sealed strata added as they sealed.
    assert cache._pods is not None and cache._pods.grids.parts is not None
    assert not cache._pods.grids.pending
    # What the cache vouched for (`PodGrid.settled`, what the memos neither copy nor
    # compare): the sealed strata, growing while they were only appended to; another
    # lineage for checkout where a pod joined it (its rows moved), not for search.
    kept = sum(a[name][0] is b[name][0] and 0 < a[name][1] <= b[name][1]
               for (_, a), (_, b) in itertools.pairwise(tokens) for name in a)
    assert kept > 40, tokens
    before, after = (next(t for k_, t in tokens if k_ >= at) for at in (68, 71))
    assert after["checkout"][0] is not before["checkout"][0]
    assert after["search"][0] is before["search"][0]


@pytest.mark.parametrize("runs_max", [256, 2])  # a scatter per run; ufunc.at past the runs
@pytest.mark.parametrize("ordered", [True, False])
def test_extremes_are_each_groups_newest_and_oldest(runs_max: int, ordered: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A pooled record's newest and oldest stratum decide whether an overload span found
    # later reaches into it (`stale`): each group's true max and min, in order or not.
    from probes.verdict import cache as verdict_cache

    monkeypatch.setattr(verdict_cache, "_RUNS_MAX", runs_max)
    rng = np.random.default_rng(11)
    t = np.repeat(60.0 * np.arange(8), rng.integers(1, 40, 8))
    if not ordered:
        t = rng.permutation(t)
    group = rng.integers(0, 30, len(t))
    newest, oldest = verdict_cache._extremes(t, group, 32)  # groups 30 and 31 have none
    for g in range(32):
        mine = t[group == g]
        assert newest[g] == (mine.max() if len(mine) else -np.inf)
        assert oldest[g] == (mine.min() if len(mine) else np.inf)


@pytest.mark.parametrize("dense_max", [1 << 24, 10])  # by a table; sorted, past the table
def test_unique_without_a_sort_is_numpys_unique(dense_max: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The latency records are pooled by key through these (a restarted probe's first
    # verdict pools tens of millions): the keys, first indices and inverse must be
    # np.unique's, or records land in another pod's or bucket's row.
    from probes.verdict import cache as verdict_cache

    monkeypatch.setattr(verdict_cache, "_DENSE_MAX", dense_max)
    rng = np.random.default_rng(5)
    x = rng.integers(0, 400, 5000) * 7
    got = verdict_cache._unique_ints(x, 2800)
    want = np.unique(x, return_index=True, return_inverse=True)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w.ravel())
    times = np.array([-np.inf, 3.0, 5.0, 9.0])
    for values in ([5.0, -np.inf, 5.0, 3.0], [9.0, 3.0, 3.0], [3.0, 4.0, 5.0]):
        v = np.array(values)  # every time, some times, and one not among them (sorted)
        u, inv = verdict_cache._unique_floats(v, times)
        w_u, w_inv = np.unique(v, return_inverse=True)
        np.testing.assert_array_equal(u, w_u)
        np.testing.assert_array_equal(inv, w_inv.ravel())
