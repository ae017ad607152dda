"""Warm-up only where a start is known (issue 31, point 3), on a real fleet probed by a real
`ProbeRunner`: endpoints present when the probe starts, with no start time (static or file
targets without `start_time`), are of unknown age and judged at once; a pod the probe sees
restart is cold for `warmup` from then.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

from probes._parsing import parse_time
from probes.api import VerdictQuery
from probes.store import Store
from probes.verdict.service import compute_verdict
from targets.fleet import Fleet
from tests.servers.probe_run import Windows, example_fleet, probe_runner, running

OLD, NEW = "1.20.3", "1.21.0"
# Windows waited for at most per phase: a hang guard (each phase ends on counts).
MAX_WINDOWS = 90


def publish(fleet: Fleet, path: Path) -> None:
    """The fleet's endpoints as file targets without their start times (as static targets
    or a hand-written file have none)."""
    endpoints = []
    for e in fleet.endpoints():
        doc = e.to_json()
        doc["labels"] = {k: v for k, v in dict(doc["labels"]).items() if k != "start_time"}
        endpoints.append(doc)
    path.write_text(json.dumps({"endpoints": endpoints}))


def config(targets: Path) -> str:
    # The default warm-up (2 min): longer than this test runs.
    return (f"targets: {{file: {{path: {targets}}}}}\n"
            "window: 1s\n"
            "verdict: {min_samples: 50}\n"
            "paths:\n"
            "  - name: checkout\n    http: {path: /api/checkout}\n    rate: 20/s\n"
            "    timeout: 500ms\n")


def calls(db: Path, until: float) -> dict[tuple[str, str], list[int]]:
    """Each pod's (endpoint, cohort) calls per window, in order, in windows before `until`."""
    out: dict[tuple[str, str], list[int]] = {}
    with Store.open(db, readonly=True) as s:
        for w in s.read_endpoint_windows(until=until):
            out.setdefault((w.endpoint, w.cohort), []).append(w.requests)
    return out


async def test_present_pods_are_judged_at_once_and_a_restart_seen_warms_up(
    tmp_path: Path,
) -> None:
    db, targets = tmp_path / "probe.db", tmp_path / "targets.json"
    host = f"127.{random.randint(64, 250)}.{random.randint(0, 255)}.1"
    windows = Windows()
    async with example_fleet(tmp_path / "fleet.json", base_host=host, seed=21,
                             notice_s=0.1) as fleet:
        await fleet.restart(0, NEW)
        await fleet.restart(1, NEW)
        publish(fleet, targets)
        runner = probe_runner(config(targets), str(db), on_window=windows.on_window)
        async with running(runner, stop_within_s=30):
            wait = windows.budget(MAX_WINDOWS, "400 canary calls")
            for _ in range(MAX_WINDOWS):
                await wait.next()
                if windows.requests["checkout", NEW] >= 400:
                    break
            early = dict(await runner.verdict_json(VerdictQuery()))
            canary_before = windows.requests["checkout", NEW]
            restarted = fleet.endpoints()[2].name
            await fleet.restart(2, NEW)
            publish(fleet, targets)
            late: dict[str, Any] = {}
            agreed = False
            wait = windows.budget(MAX_WINDOWS, "400 more canary calls and a comparison")
            for _ in range(MAX_WINDOWS):
                await wait.next()
                if windows.requests["checkout", NEW] < canary_before + 400:
                    continue
                # The store alone (as `skewprobe verdict --store`) judges the pods' starts as
                # the running probe did: compared when no window arrived in between.
                before = runner.windows_written
                late = dict(await runner.verdict_json(VerdictQuery()))
                stored = compute_verdict(str(db), runner.config.judging,
                                         now=time.time())
                if runner.windows_written == before:
                    assert stored["paths"] == late["paths"]
                    agreed = True
                    break

    # Early: the four pods were there when the probe started, with no start time: warm,
    # but for at most each one's first window (written before the probe's first look).
    success = early["paths"][0]["metrics"]["success_rate"]
    assert "pods" in success, early["reasons"]
    assert success["counts"]["canary"]["requests"] > 0, success["reason"]
    first = calls(db, float("inf"))
    present = [k for k in first if k != (restarted, NEW)]
    assert len(present) == 4
    assert success["pods"]["warmup"]["calls"] <= sum(first[k][0] for k in present)
    assert not any("warm" in r for r in early["reasons"]), early["reasons"]

    assert agreed, f"a window arrived during every comparison in {MAX_WINDOWS} windows"
    # Late: the pod the probe saw restart onto 1.21.0 is cold for all its calls so far (2
    # min of warm-up), the others as before.
    to = late["window"]["to"]
    assert to is not None
    late_success = late["paths"][0]["metrics"]["success_rate"]
    seen = calls(db, parse_time(to, now=math.inf))  # the windows the verdict judged
    cold = sum(seen.get((restarted, NEW), []))
    assert cold > 0
    warmup = late_success["pods"]["warmup"]["calls"]
    assert cold <= warmup <= cold + sum(first[k][0] for k in present)
