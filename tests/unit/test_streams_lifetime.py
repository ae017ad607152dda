"""The lifetime check on synthetic lifetimes (pure; fixed seeds)."""

from __future__ import annotations

import random

from probes.clients import EndReason, OpenStream
from probes.streams import Lifetime, find_cap, lifetime_report

HOUR = 3600.0


def capped(rng: random.Random, cap: float, n: int, reason: str = "rst_stream") -> list[Lifetime]:
    """Streams cut at `cap` (minus up to 5 %), ending at times spread over many caps."""
    return [Lifetime(cap * rng.uniform(0.95, 1.0), rng.uniform(0.0, 20 * cap), reason)
            for _ in range(n)]


def uncapped(rng: random.Random, n: int) -> list[Lifetime]:
    """Streams that live until their pod restarts: lifetimes spread over hours."""
    return [Lifetime(rng.expovariate(1 / (2 * HOUR)), rng.uniform(0.0, 10 * HOUR), "goaway")
            for _ in range(n)]


def test_a_cap_is_found_near_its_value_with_its_reason():
    rng = random.Random(1)
    cut = capped(rng, 60.0, 200)
    ended = cut + uncapped(rng, 10)  # a few restarts besides the cap
    finding = find_cap(ended, open_ages=[rng.uniform(0, 58) for _ in range(50)])
    assert finding.capped, finding.why
    assert finding.cap_s is not None and 57.0 <= finding.cap_s <= 60.0
    assert finding.band is not None
    assert finding.band[0] <= min(e.lifetime_s for e in cut)
    assert finding.band[1] >= max(e.lifetime_s for e in cut)
    assert finding.reasons["rst_stream"] == 200
    assert finding.fraction > 0.9
    assert "capped near" in finding.why and "rst_stream 200" in finding.why


def test_lifetimes_spread_over_hours_are_not_capped():
    rng = random.Random(2)
    finding = find_cap(uncapped(rng, 300))
    assert not finding.capped
    assert "spread out" in finding.why


def test_one_burst_of_same_aged_streams_is_not_a_cap():
    # 100 streams opened together at probe start, all cut by one restart an hour later:
    # same lifetime, but one burst, not repeated cuts.
    rng = random.Random(3)
    burst = [Lifetime(HOUR + rng.uniform(0, 2), HOUR + rng.uniform(0, 2), "goaway")
             for _ in range(100)]
    finding = find_cap(burst)
    assert not finding.capped
    assert "ended together" in finding.why


def test_open_streams_older_than_the_band_contradict_a_cap():
    rng = random.Random(4)
    ended = capped(rng, 60.0, 100)
    finding = find_cap(ended, open_ages=[30.0] * 10 + [5 * HOUR] * 5)
    assert not finding.capped
    assert "5 of 15 open streams are older" in finding.why


def test_client_side_ends_are_not_evidence_of_a_cap():
    rng = random.Random(5)
    rotated = [Lifetime(300.0 * rng.uniform(0.9, 1.0), rng.uniform(0, 10 * HOUR),
                        EndReason.CLIENT_ROTATED) for _ in range(100)]
    stopped = [Lifetime(20.0, rng.uniform(0, HOUR), EndReason.CLIENT_STOPPED)
               for _ in range(50)]
    finding = find_cap(rotated + stopped)
    assert not finding.capped
    assert finding.ended == 0 and "too few" in finding.why


def test_report_counts_streams_older_than_the_threshold_per_cohort():
    rng = random.Random(6)

    def stream(cohort: str, age: float) -> OpenStream:
        return OpenStream("feed", f"pod-{age}", cohort, 0, 0.0, age)

    opened = [stream("1.20.3", a) for a in (10.0, 2 * HOUR, 3 * HOUR, 0.5 * HOUR)]
    opened += [stream("1.21.0", a) for a in (20.0, 40.0)]
    reports = lifetime_report(
        {("feed", "1.20.3"): uncapped(rng, 50), ("feed", "1.21.0"): capped(rng, 60.0, 50)},
        opened,
        threshold_s=HOUR,
    )
    by_cohort = {r.cohort: r for r in reports}
    old, new = by_cohort["1.20.3"], by_cohort["1.21.0"]
    assert (old.open_streams, old.aged, old.oldest_s) == (4, 2, 3 * HOUR)
    assert not old.cap.capped
    assert "upgrading this tier now resets 2 of 4 open streams aged > 60 min" in old.summary
    assert "oldest 3 h" in old.summary
    assert new.cap.capped and new.aged == 0
    assert new.summary.startswith("lifetimes capped near")


def test_a_cohort_with_open_streams_only_is_reported():
    reports = lifetime_report({}, [OpenStream("feed", "pod-0", "1.20.3", 0, 0.0, 2 * HOUR)])
    assert len(reports) == 1
    assert reports[0].aged == 1 and not reports[0].cap.capped
