"""probes.verdict.rules: the one copy of the states, gates, combine and metric mapping.

`judge` (one look) and the replay (every look) both call these; tests/unit/test_verdict_replay.py
checks that they agree on simulated rollouts, these pin the rules themselves.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from probes.spec import Tolerances
from probes.stats import bounded
from probes.verdict import rules
from probes.verdict.pairs import CallerStale, PairCell, PairMatrix
from probes.verdict.rules import CODES, STATES, State

PASS, FAIL, INC, NA = State.PASS, State.FAIL, State.INCONCLUSIVE, State.NOT_APPLICABLE


def test_states_are_the_json_strings_and_stay_so_through_json() -> None:
    assert [s.value for s in State] == ["n/a", "inconclusive", "pass", "fail"]
    doc = {"verdict": FAIL, "paths": [{"verdict": PASS}, {"verdict": INC}]}
    assert json.dumps(doc) == ('{"verdict": "fail", "paths": [{"verdict": "pass"}, '
                               '{"verdict": "inconclusive"}]}')
    assert f"{FAIL}" == "fail" and FAIL.upper() == "FAIL" and FAIL == "fail"


def test_codes_come_from_the_enum_worse_larger() -> None:
    assert [STATES[CODES[s]] for s in State] == list(State)
    assert CODES[NA] < CODES[INC] < CODES[PASS] < CODES[FAIL]
    assert list(rules.codes_of(["fail", "pass", "inconclusive", "n/a", "baseline"])) == [
        CODES[FAIL], CODES[PASS], CODES[INC], CODES[NA], CODES[INC]]
    assert rules.codes_of(np.array(["pass", "fail"])).dtype == np.int8


@pytest.mark.parametrize(
    ("states", "combined"),
    [
        ([], INC),  # nothing judged: never a pass
        ([NA, NA], INC),
        ([PASS], PASS),
        ([PASS, NA], PASS),  # a metric that does not apply does not hold a pass back
        ([PASS, INC], INC),
        ([INC, FAIL, PASS], FAIL),
        (["pass", "pass"], PASS),  # states read back from JSON
        (["pass", "baseline"], INC),  # anything that is not a state is not a pass
    ],
)
def test_combine(states: list[str], combined: State) -> None:
    assert rules.combine(states) is combined


def test_combine_codes_per_look_is_combine_of_each_look() -> None:
    rng = np.random.default_rng(4)
    codes = rng.integers(0, len(STATES), size=(4, 200)).astype(np.int8)
    many = rules.combine_codes(codes)
    assert [STATES[c] for c in many] == [
        rules.combine([STATES[c] for c in codes[:, k]]) for k in range(codes.shape[1])]
    assert {STATES[c] for c in many} == {PASS, FAIL, INC}


def test_gates_each_reason() -> None:
    g = rules.gates([0, 50, 500, 500, 500], [0, 500, 500, 500, 500],
                    both=[False, True, True, True, True], min_samples=100, window_s=10.0,
                    age_b=[0, 0, 20.0, 20.01, 0], age_c=[0, 0, 0, 0, 0],
                    overloaded=[False, False, False, False, True])
    assert list(g.apart) == [True, False, False, False, False]
    # min_samples counts only once either cohort has requests.
    assert list(g.few_baseline) == [False, True, False, False, False]
    assert not g.few_canary.any()
    # Two windows old is still fresh; a hair more is stale.
    assert list(g.stale_baseline) == [False, False, False, True, False]
    assert not g.stale_canary.any()
    # Stale data holds a pass only (`path_states`); the other gates block every decision.
    assert list(g.blocked()) == [True, True, False, False, True]
    assert list(g.stale()) == [False, False, False, True, False]
    fresh = rules.gates([500], [500], both=True, min_samples=100, window_s=10.0)
    assert not fresh.blocked().any()


def test_path_states_hold_every_metric_where_blocked() -> None:
    codes = np.array([[CODES[FAIL], CODES[PASS], CODES[NA]],
                      [CODES[PASS], CODES[PASS], CODES[NA]]], dtype=np.int8)
    path, held = rules.path_states(codes, [True, False, False])
    assert [STATES[c] for c in path] == [INC, PASS, INC]
    assert [STATES[c] for c in held[0]] == [INC, PASS, NA]  # n/a stays n/a
    # Stale data: a fail stands, a pass is held, and a path of passes is inconclusive.
    path, held = rules.path_states(codes, [False, False, False], [True, True, False])
    assert [STATES[c] for c in path] == [FAIL, INC, INC]
    assert [STATES[c] for c in held[:, 0]] == [FAIL, INC]
    assert [STATES[c] for c in held[:, 1]] == [INC, INC]


def test_decide_is_inclusive_at_the_threshold_and_fail_comes_first() -> None:
    thr = 5.0
    got = rules.decide([5.0, 4.9, 4.9, 6.0], [0.0, 5.0, 4.9, 6.0], thr)
    assert [STATES[c] for c in got] == [FAIL, PASS, INC, FAIL]


def test_which_totals_make_a_metric_apply_and_be_measured() -> None:
    one = SimpleNamespace(requests=0, latency=np.zeros(4), attempts_count=3,
                          stream_seconds=0.0, streams_opened=2)
    assert not rules.applies(rules.SUCCESS_RATE, one)
    assert not rules.applies(rules.LATENCY_P99, one)
    assert rules.applies(rules.ATTEMPTS, one)
    # Streams opened but no stream time yet: the metric applies, nothing to measure.
    assert rules.applies(rules.STREAM_RESETS, one)
    assert not rules.measured(rules.STREAM_RESETS, one)
    looks = SimpleNamespace(latency=np.array([[0, 0], [0, 3]]))
    assert list(rules.measured(rules.LATENCY_P99, looks)) == [False, True]
    assert list(rules.attempts_out_of_range([10, 5, 0, 40], [10, 10, 0, 10], 3)) == [
        False, True, False, True]


def test_the_metric_tests_carry_the_tolerances() -> None:
    tol = Tolerances(success_rate_drop_pp=1.0, attempts_ratio=1.5)
    req, err = np.array([1000.0]), np.array([10.0])
    got = rules.success_test(req, err, req, err + 5, tol)
    want = bounded.two_sample(err, req, err + 5, req, 1.0, 0.01)
    assert got.log_e_fail == want.log_e_fail and got.log_e_pass == want.log_e_pass
    # Attempts scaled to [0, 1]: 1.5× of mean attempts 1.2 with at most 3 attempts.
    att = rules.attempts_test(np.array([1200.0]), req, np.array([1200.0]), req, tol, 3)
    scaled = rules.attempts_scaled(np.array([1200.0]), req, 3)
    assert scaled[0] == pytest.approx(100.0)
    want = bounded.two_sample(scaled, req, scaled, req, 1.5, 0.25)
    assert att.log_e_pass == want.log_e_pass


def test_the_pair_matrix_combines_with_the_same_rule() -> None:
    figures = {"success": None, "p99_ms": None, "attempts": None}
    cells = (PairCell("1", "1", "baseline", 10, figures), PairCell("2", "1", "pass", 10, figures))
    stale = (CallerStale("1", 10, 0, 0.0, 0.1, PASS),)
    assert PairMatrix("p", ("1", "2"), ("1",), cells, stale).verdict is PASS
    undecided = (CallerStale("1", 10, 0, 0.0, 0.1, INC),)
    assert PairMatrix("p", ("1", "2"), ("1",), cells, undecided).verdict is INC
    # The baseline cell alone is not a pass.
    assert PairMatrix("p", ("1",), ("1",), cells[:1]).verdict is INC
