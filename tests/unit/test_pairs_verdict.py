"""The verdict with its pair matrices (`probes.verdict.pairs.PairedVerdict`), and the Prometheus
verdict, which does not judge pairs and says so: never a silent pass over a relay path."""

from __future__ import annotations

from typing import Any

import jsonschema

from probes.api import openapi_spec
from probes.verdict.pairs import CallerStale, PairCell, PairedVerdict, PairMatrix

FIGURES = {"success": 0.999, "p99_ms": 12.0, "attempts": 1.0}


def _direct(verdict: str) -> dict[str, Any]:
    return {"verdict": verdict, "baseline": "1.20.3", "canary": "1.21.0",
            "window": {"from": None, "to": None}, "paths": [],
            "reasons": [] if verdict == "pass" else [f"checkout: {verdict}"]}


def _matrix(state: str, stale: str = "pass") -> PairMatrix:
    cells = (PairCell("1.20.3", "1.20.3", "baseline", 500, FIGURES),
             PairCell("1.21.0", "1.20.3", state, 500, FIGURES,
                      "" if state == "pass" else "attempts per request 2 vs 1"))
    return PairMatrix("relay-catalog", ("1.20.3", "1.21.0"), ("1.20.3",), cells,
                      (CallerStale("1.20.3", 1000, 30 if stale == "fail" else 0, 0.02, 0.04,
                                   stale),))


def _valid(doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, {"$ref": "#/components/schemas/Verdict",
                              "components": openapi_spec()["components"]})


def test_without_relay_paths_the_verdict_is_the_direct_one_unchanged() -> None:
    direct = _direct("pass")
    assert PairedVerdict(direct, ()).to_json() == direct
    assert PairedVerdict(direct, ()).verdict == "pass"


def test_a_failing_pair_fails_a_passing_verdict_and_says_which() -> None:
    judged = PairedVerdict(_direct("pass"), (_matrix("fail"),))
    doc = judged.to_json()
    _valid(doc)
    assert judged.verdict == doc["verdict"] == "fail"
    assert doc["reasons"] == [
        "relay-catalog: pair 1.21.0->1.20.3 fail: attempts per request 2 vs 1"]
    assert doc["pairs"][0]["verdict"] == "fail"
    # Stale routing alone fails it too, named per caller version.
    stale = PairedVerdict(_direct("pass"), (_matrix("pass", stale="fail"),)).to_json()
    assert stale["verdict"] == "fail"
    assert stale["reasons"] == ["relay-catalog: stale routing seen from callers on 1.20.3: "
                                "3.0 % of relay calls (30 of 1000): fail"]


def test_a_pass_needs_every_path_and_every_pair() -> None:
    assert PairedVerdict(_direct("pass"), (_matrix("pass"),)).verdict == "pass"
    assert PairedVerdict(_direct("inconclusive"), (_matrix("pass"),)).verdict == "inconclusive"
    undecided = PairedVerdict(_direct("pass"), (_matrix("inconclusive"),)).to_json()
    assert undecided["verdict"] == "inconclusive"
    assert undecided["reasons"][0].startswith("relay-catalog: pair 1.21.0->1.20.3 inconclusive")
    # Only relay paths asked: the direct part is empty, never a pass.
    alone = PairedVerdict(None, (_matrix("pass"),)).to_json()
    _valid(alone)
    assert alone["verdict"] == "pass" and alone["paths"] == [] and alone["baseline"] is None
