"""Reconnect storm detection on synthetic reset times (pure; fixed seeds).

The headline case is the issue's benchmark: 500 stream-holding pods, 20 % of them restarted
at once, is a storm reported within one window; the same 100 pod restarts spread over an
hour is not. Bounds follow from the method: a bucket is a storm when its distinct endpoints
k satisfy k >= min_endpoints and P(X >= k | Poisson(mu)) <= alpha.
"""

from __future__ import annotations

import random

import pytest

from probes.streams import STORM_EVENT, ResetMark, StormDetector, StormParams, find_storms
from probes.streams.storm import _expected, _tail

HOUR = 3600.0
WINDOW = 10.0
PODS = [f"pod-{i}" for i in range(500)]


def background(rng: random.Random, per_hour: float, start: float, end: float) -> list[ResetMark]:
    """A steady Poisson stream of single-pod resets (pods picked at random)."""
    out: list[ResetMark] = []
    t = start
    while True:
        t += rng.expovariate(per_hour / HOUR)
        if t >= end:
            return out
        out.append(ResetMark(t, rng.choice(PODS), "goaway"))


def restart_at_once(rng: random.Random, at: float, pods: list[str], streams: int = 1
                    ) -> list[ResetMark]:
    """Pods drained together: every stream of each cut within one second."""
    return [ResetMark(at + rng.uniform(0.0, 1.0), pod, "goaway")
            for pod in pods for _ in range(streams)]


def test_20_percent_of_500_pods_at_once_is_a_storm_within_one_window():
    rng = random.Random(1)
    storm_at = 2 * HOUR
    restarted = rng.sample(PODS, 100)
    resets = background(rng, 20.0, 0.0, 3 * HOUR) + restart_at_once(rng, storm_at, restarted, 4)
    detector = StormDetector()
    detector.watch("s", "1.20.3", 0.0)
    found = []
    # Fed as the recorder would (in time order), polled at every window boundary.
    resets.sort()
    fed = 0
    t = WINDOW
    while t <= 3 * HOUR:
        while fed < len(resets) and resets[fed].at <= t:
            detector.add("s", "1.20.3", resets[fed])
            fed += 1
        for storm in detector.poll(t):
            found.append((t, storm))
        t += WINDOW
    assert len(found) == 1
    reported_at, storm = found[0]
    assert storm_at <= storm.start < storm_at + 1.0
    # Within one window of the storm's end (its last bucket must be complete first).
    assert reported_at - storm.end <= StormParams().bucket_s + WINDOW
    assert set(restarted) <= set(storm.endpoints)
    # Four streams per pod: every stream reset is counted, the pods once each.
    assert storm.resets >= 400
    assert len(storm.endpoints) <= 100 + 2  # at most a background reset or two alongside
    assert storm.p_value <= StormParams().alpha
    event = storm.to_event()
    assert event.kind == STORM_EVENT and event.cohort == "1.20.3" and event.path == "s"
    assert event.detail["endpoints_count"] == len(storm.endpoints)
    assert event.detail["reasons"] == {"goaway": storm.resets}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_restarts_spread_over_an_hour_are_not_a_storm(seed):
    rng = random.Random(seed)
    restarted = rng.sample(PODS, 100)
    spread = [
        ResetMark(HOUR + rng.uniform(0.0, HOUR) + s * 0.01, pod, "goaway")
        for pod in restarted for s in range(4)
    ]
    resets = background(rng, 20.0, 0.0, 3 * HOUR) + spread
    assert find_storms(resets, observed_from=0.0, until=3 * HOUR) == []


def test_a_steady_high_rate_gives_no_false_storm():
    # 2,000 pod resets an hour (a max-connection-age churn): each bucket is tested against
    # alpha = 1e-6, so ~2,000 tests expect 0.002 false storms.
    rng = random.Random(7)
    resets = background(rng, 2000.0, 0.0, 2 * HOUR)
    assert len(resets) > 3500
    assert find_storms(resets, observed_from=0.0, until=2 * HOUR) == []


def test_one_pod_with_many_streams_is_not_a_storm_but_three_pods_are():
    one = [ResetMark(100.0 + i * 0.001, "pod-0", "rst_stream") for i in range(50)]
    assert find_storms(one, observed_from=0.0, until=HOUR) == []
    three = [ResetMark(3000.0 + i * 0.1, f"pod-{i}", "goaway") for i in range(3)]
    storms = find_storms(three, observed_from=0.0, until=HOUR)
    assert [len(s.endpoints) for s in storms] == [3]
    # The bar after 3,000 quiet seconds: 3 endpoints in a bucket are a storm, 2 are not;
    # after only 1,000 s, 3 are not yet (the rate's upper bound is still higher).
    mu = _expected(0, 3000.0, 0.99) * 5.0
    assert _tail(3, mu) <= 1e-6 < _tail(2, mu)
    early = [ResetMark(1000.0 + i * 0.1, f"pod-{i}", "goaway") for i in range(3)]
    assert find_storms(early, observed_from=0.0, until=HOUR) == []


def test_right_after_start_only_a_large_cluster_counts():
    # Observed for 2 s only: the rate's upper bound is high, so 5 pods is not enough,
    # 100 is.
    small = [ResetMark(2.0 + i * 0.01, f"pod-{i}", "goaway") for i in range(5)]
    assert find_storms(small, observed_from=0.0, until=60.0) == []
    big = [ResetMark(2.0 + i * 0.01, f"pod-{i}", "goaway") for i in range(100)]
    assert len(find_storms(big, observed_from=0.0, until=60.0)) == 1


def test_a_storm_does_not_raise_the_bar_for_the_next():
    first = [ResetMark(1800.0 + i * 0.01, f"pod-{i}", "goaway") for i in range(100)]
    second = [ResetMark(2400.0 + i * 0.01, f"pod-{i + 100}", "goaway") for i in range(5)]
    storms = find_storms(first + second, observed_from=0.0, until=HOUR)
    assert [len(s.endpoints) for s in storms] == [100, 5]
    assert storms[1].baseline_events == 0  # the first storm is not part of the steady rate


def test_batches_in_quick_succession_are_one_storm_and_long_ones_are_split():
    rng = random.Random(3)
    batches = []
    for b in range(4):  # a batch of 10 pods every 3 s: one rolling storm
        batches += restart_at_once(rng, 1000.0 + 3.0 * b, PODS[b * 10:(b + 1) * 10])
    storms = find_storms(batches, observed_from=0.0, until=HOUR)
    assert len(storms) == 1
    assert len(storms[0].endpoints) == 40 and 9.0 <= storms[0].span_s <= 10.0
    params = StormParams(max_span_s=5.0)
    split = find_storms(batches, observed_from=0.0, until=HOUR, params=params)
    assert len(split) == 2
    assert sum(len(s.endpoints) for s in split) == 40


def test_online_polling_cadence_does_not_change_the_result():
    rng = random.Random(11)
    resets = background(rng, 200.0, 0.0, HOUR)
    resets += restart_at_once(rng, 1200.0, PODS[:30], 2)
    resets += restart_at_once(rng, 2500.0, PODS[30:40])
    resets.sort()
    once = find_storms(resets, observed_from=0.0, until=HOUR)
    detector = StormDetector()
    detector.watch("", "", 0.0)
    online = []
    fed = 0
    for second in range(1, int(HOUR) + 1):
        while fed < len(resets) and resets[fed].at <= second:
            detector.add("", "", resets[fed])
            fed += 1
        online += detector.poll(float(second))
    assert len(once) == 2
    assert online == once


def test_an_open_storm_waits_for_its_bucket_to_complete():
    marks = [ResetMark(100.0 + i * 0.01, f"pod-{i}", "goaway") for i in range(20)]
    detector = StormDetector()
    detector.watch("p", "c", 0.0)
    for mark in marks:
        detector.add("p", "c", mark)
    assert detector.poll(102.0) == []  # the bucket [100, 105) is not complete
    assert detector.poll(104.0) == []
    storms = detector.poll(200.0)
    assert len(storms) == 1 and detector.poll(300.0) == []  # reported once


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError):
        StormParams(bucket_s=0)
    with pytest.raises(ValueError):
        StormParams(alpha=0.0)
