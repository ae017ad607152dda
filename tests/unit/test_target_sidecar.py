"""The emulated sidecar's decisions, without the wire: bounded attempt memory, per-id faults."""

from __future__ import annotations

from targets.profile import Faults, HeaderRules, RetryPolicy, VersionProfile
from targets.sidecar import AttemptCounter, Sidecar, grpc_code_for_http, rewrite_headers
from tests.unit.virtual_time import FakeClock, virtual_loop


def test_attempt_counter_counts_per_id_and_forgets_after_ttl() -> None:
    clock = FakeClock(1000.0)
    counter = AttemptCounter(ttl_s=10.0, capacity=100, clock=clock)
    assert [counter.hit("a"), counter.hit("a"), counter.hit("b"), counter.hit("a")] == [1, 2, 1, 3]
    clock.now += 11
    counter.hit("c")  # inserting evicts what expired
    assert len(counter) == 1
    assert counter.hit("a") == 1


def test_attempt_counter_is_bounded_by_capacity() -> None:
    counter = AttemptCounter(ttl_s=1e9, capacity=50, clock=FakeClock(1000.0))
    for i in range(1000):
        counter.hit(f"id-{i}")
    assert len(counter) == 50
    assert counter.hit("id-999") == 2  # the newest are kept
    assert counter.hit("id-0") == 1  # the oldest were dropped


async def test_persistent_errors_fail_every_attempt_of_the_same_id() -> None:
    faults = Faults(error_rate=0.3, retries=RetryPolicy(num_retries=2))
    car = Sidecar(VersionProfile("v"), pod="p", seed=7)
    outcomes = {}
    for i in range(400):
        fwd = await car.forward(faults, f"r{i}")
        outcomes[f"r{i}"] = fwd
        # a failed request was retried twice and failed each time; a good one went once
        assert fwd.attempts == (3 if not fwd.ok else 1)
    failed = [rid for rid, fwd in outcomes.items() if not fwd.ok]
    # Binomial(400, 0.3): mean 120, sd 9.2; ±5 sd
    assert 74 <= len(failed) <= 166
    # the decision belongs to the id: a fresh sidecar with the same seed agrees exactly
    again = Sidecar(VersionProfile("v"), pod="q", seed=7)
    assert [rid for rid in outcomes if not (await again.forward(faults, rid)).ok] == failed
    other = Sidecar(VersionProfile("v"), pod="q", seed=8)
    assert [rid for rid in outcomes if not (await other.forward(faults, rid)).ok] != failed


async def test_transient_errors_fail_only_the_first_attempt() -> None:
    car = Sidecar(VersionProfile("v"), pod="p", seed=1)
    no_retry = Faults(transient_error_rate=1.0)
    first = await car.forward(no_retry, "x")
    second = await car.forward(no_retry, "x")  # the client retries with the same id
    assert (first.status, first.app_attempts) == (503, 1)
    assert (second.status, second.app_attempts) == (200, 2)
    retried = await car.forward(Faults(transient_error_rate=1.0,
                                       retries=RetryPolicy(num_retries=1)), "y")
    assert (retried.status, retried.attempts, retried.app_attempts) == (200, 2, 2)


async def test_retries_only_on_listed_statuses() -> None:
    car = Sidecar(VersionProfile("v"), pod="p", seed=1)
    faults = Faults(error_rate=1.0, error_status=500, retries=RetryPolicy(num_retries=3))
    fwd = await car.forward(faults, "z")
    assert (fwd.status, fwd.attempts) == (500, 1)


async def test_retries_wait_their_backoff_and_none_after_the_last() -> None:
    car = Sidecar(VersionProfile("v"), pod="p", seed=1)
    faults = Faults(error_rate=1.0, retries=RetryPolicy(num_retries=2, backoff_s=0.25))
    loop = virtual_loop()
    start = loop.time()
    fwd = await car.forward(faults, "w")
    assert (fwd.status, fwd.attempts) == (503, 3)
    assert loop.time() - start == 0.5  # two waits, between three attempts


def test_missing_request_id_gets_one_per_request() -> None:
    car = Sidecar(VersionProfile("v"), pod="p", seed=1)
    assert car.request_id("given") == "given"
    assert car.request_id(None) != car.request_id(None)


def test_header_rules_and_status_mapping() -> None:
    rules = HeaderRules(add=(("x-new", "1"),), remove=frozenset({"x-drop"}),
                        rename={"x-old": "x-renamed"})
    out = rewrite_headers(rules, [("x-drop", "a"), ("x-old", "b"), ("x-keep", "c")])
    assert out == [("x-renamed", "b"), ("x-keep", "c"), ("x-new", "1")]
    assert grpc_code_for_http(503) == "UNAVAILABLE"
    assert grpc_code_for_http(400) == "INTERNAL"
    assert grpc_code_for_http(418) == "UNKNOWN"
