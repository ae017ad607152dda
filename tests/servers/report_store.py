"""A synthetic store for the report tests, written through the Store API.

Two rollouts of the same fleet, a day apart: last time 1.19.0 → 1.20.3 (`EARLIER`), now
1.20.3 → 1.21.0 (`T0`). Each lasts `minutes` minutes of `WINDOW_S` windows; from minute 5
the new version takes over a growing share of the six pods (inventory snapshots every
minute say so). Paths: `checkout` regresses on the new version both times (5 % errors,
most of them on one pod, `checkout-0-new` in namespace `shop`); `catalog` does not;
`orders` holds long-lived streams. Pod restarts are events, plus one reconnect storm and
one event of a kind nothing knows about (`rollout-step`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from probes.measure.histogram import BUCKET_COUNT, index_of
from probes.store import Event, InventoryRow, Store
from probes.types import EndpointWindow, PathWindow, pair_cohort

T0 = 1_790_000_000.0  # 2026-09-21T12:53:20Z, a multiple of 10 s
EARLIER = T0 - 86_400.0
WINDOW_S = 10.0
PODS = 6
NAMESPACE = "shop"
PATHS = ("catalog", "checkout", "orders")
BAD_POD = "checkout-0-new"
CALLS = 40  # per pod per window


def restart_at(start: float, pod: int, minutes: float) -> float:
    """Pods 0..3 move to the new version at minutes 5, 8, 11, 14 (scaled); 4 and 5 never."""
    if pod >= 4:
        return math.inf
    return start + 60.0 * minutes * (5 + 3 * pod) / 30.0


def _window(rng: np.random.Generator, start: float, path: str, cohort: str, pods: int,
            new: bool) -> PathWindow:
    n = CALLS * pods
    err = 0.05 if (new and path == "checkout") else 0.001
    e = int(rng.binomial(n, err))
    lat = rng.lognormal(math.log(0.02), 0.3, n)
    kw: dict = {"attempts_sum": n + int(rng.binomial(n, 0.02)), "attempts_count": n}
    if path == "orders":
        kw.update(streams_opened=pods, stream_seconds=WINDOW_S * pods,
                  stream_resets={"goaway": int(rng.poisson(0.01 * pods))})
    return PathWindow(
        start=start, length=WINDOW_S, path=path, cohort=cohort,
        outcomes={"ok": n - e, "http_5xx": e},
        latency=tuple(np.bincount(index_of(lat), minlength=BUCKET_COUNT).tolist()), **kw,
    )


def write_rollout(store: Store, start: float, old: str, new: str, *, minutes: float = 30.0,
                  seed: int = 1, inventory: bool = True, events: bool = True,
                  endpoints_too: bool = True) -> None:
    rng = np.random.default_rng(seed)
    steps = int(minutes * 60 / WINDOW_S)
    windows: list[PathWindow] = []
    endpoints: list[EndpointWindow] = []
    for k in range(steps):
        t = start + k * WINDOW_S
        moved = [restart_at(start, j, minutes) <= t for j in range(PODS)]
        for path in PATHS:
            for cohort, is_new in ((old, False), (new, True)):
                pods = [j for j in range(PODS) if moved[j] == is_new]
                if not pods:
                    continue
                windows.append(_window(rng, t, path, cohort, len(pods), is_new))
                for j in pods:
                    name = f"{path}-{j}" + ("-new" if is_new else "")
                    bad = 0.25 if (name == BAD_POD) else (
                        0.05 if (is_new and path == "checkout") else 0.001)
                    endpoints.append(EndpointWindow(
                        t, path, name, cohort, CALLS, int(rng.binomial(CALLS, bad)),
                        {"pod": name, "namespace": NAMESPACE, "proxy_version": cohort}))
        if len(windows) > 300:
            store.write(windows, endpoints if endpoints_too else [])
            windows, endpoints = [], []
    store.write(windows, endpoints if endpoints_too else [])
    if inventory:
        for m in range(int(minutes) + 1):
            at = start + 60.0 * m
            on_new = sum(restart_at(start, j, minutes) <= at for j in range(PODS))
            rows = [InventoryRow(NAMESPACE, "shop-api", v, n)
                    for v, n in ((old, PODS - on_new), (new, on_new)) if n]
            rows.append(InventoryRow(NAMESPACE, "legacy-batch", "none", 2))
            store.write_inventory(at, rows)
    if events:
        store.write_events(
            [Event("restart", restart_at(start, j, minutes), endpoint=f"pod-{j}",
                   detail={"to": new}) for j in range(4)]
            + [Event("storm", start + 60.0 * minutes * 0.6, path="orders", cohort=new,
                     detail={"resets": 12, "endpoints_count": 3}),
               Event("rollout-step", start + 60.0 * 2, detail={"step": 1})])


def build(path: Path, *, minutes: float = 30.0, inventory: bool = True,
          earlier: bool = True, endpoints: bool = True) -> Path:
    """The store file at `path` (both rollouts unless `earlier` is False; without
    per-pod endpoint windows in the current one if `endpoints` is False)."""
    with Store.open(path) as store:
        write_rollout(store, T0, "1.20.3", "1.21.0", minutes=minutes, inventory=inventory,
                      endpoints_too=endpoints)
        if earlier:
            write_rollout(store, EARLIER, "1.19.0", "1.20.3", minutes=minutes, seed=2,
                          inventory=inventory)
    return path


# A relay path (calls through relay pods, keyed by caller -> callee version pair) beside or
# instead of the direct ones: the new callers' outbound proxy retries every call once (2
# attempts per request, the same success rate), and from `STALE_FROM_MIN` the old callers
# route `STALE_SHARE` of their calls to pods that are gone (a control plane moved past them).
RELAY_PATH = "relay-catalog"
RELAY_OLD, RELAY_NEW = "1.20.3", "1.21.0"
RELAY_PODS = 2  # per caller version; each balances over both callee versions
STALE_SHARE = 0.03
STALE_FROM_MIN = 10.0


def write_relay(store: Store, start: float, *, minutes: float = 30.0, seed: int = 3) -> None:
    rng = np.random.default_rng(seed)
    windows: list[PathWindow] = []
    endpoints: list[EndpointWindow] = []
    for k in range(int(minutes * 60 / WINDOW_S)):
        t = start + k * WINDOW_S
        stale_now = t >= start + 60.0 * STALE_FROM_MIN
        for caller in (RELAY_OLD, RELAY_NEW):
            for callee in (RELAY_OLD, RELAY_NEW):
                n = CALLS * RELAY_PODS
                stale = (int(rng.binomial(n, STALE_SHARE))
                         if stale_now and caller == RELAY_OLD else 0)
                e = int(rng.binomial(n - stale, 0.001))
                lat = rng.lognormal(math.log(0.03), 0.3, n)
                windows.append(PathWindow(
                    start=t, length=WINDOW_S, path=RELAY_PATH,
                    cohort=pair_cohort(caller, callee),
                    outcomes={"ok": n - e - stale, "http_5xx": e, "stale_endpoint": stale},
                    latency=tuple(np.bincount(index_of(lat), minlength=BUCKET_COUNT).tolist()),
                    attempts_sum=n * (2 if caller == RELAY_NEW else 1), attempts_count=n))
                for j in range(RELAY_PODS):
                    pod = f"relay-{caller}-{j}"
                    endpoints.append(EndpointWindow(
                        t, RELAY_PATH, pod, pair_cohort(caller, callee), CALLS,
                        (e + stale) // RELAY_PODS + (j < (e + stale) % RELAY_PODS),
                        {"pod": pod, "namespace": "platform-test", "proxy_version": caller}))
        if len(windows) > 300:
            store.write(windows, endpoints)
            windows, endpoints = [], []
    store.write(windows, endpoints)


def build_relay(path: Path, *, minutes: float = 30.0, direct: bool = True) -> Path:
    """A store with the relay path, and the current rollout's direct paths if `direct`."""
    with Store.open(path) as store:
        if direct:
            write_rollout(store, T0, "1.20.3", "1.21.0", minutes=minutes)
        write_relay(store, T0, minutes=minutes)
    return path
