"""The gate decides on the project's own loopback fleet, with static targets and the probe's
default verdict settings (10 s windows, 2 min warm-up, α 1 %, 0.1 pp tolerance): a canary
of one pod with +3 % errors on one path fails that path within 150 s of the probe's start,
while its healthy path does not fail; with two CPU hogs beside the probe, +3 % errors on
every canary pod still fail within 150 s.

Static targets carry no start time, so every pod present at the probe's start is of
unknown age and warm: the probe judges from its first window. The bound is the issue's
150 s counted in the probe's own 10 s windows (15 of them), not in the test's wall time: a
loaded machine writes each window late, never fewer calls into the verdict than it made.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from probes.api import VerdictQuery
from targets.fleet import Fleet
from targets.profile import parse_profiles
from tests.servers.probe_run import Windows, probe_runner, running

BASELINE, CANARY = "1.20.3", "1.21.0"
PROFILES = f"""\
versions:
  "{BASELINE}": {{}}
  "{CANARY}":
    routes:
      /api/pay: {{error_rate: 0.03}}
"""
PODS = 8
# The figure: a gross regression fails within 150 s of the probe's start.
WINDOWS_TO_FAIL = 15


def static_config(fleet: Fleet) -> str:
    """Probe config text with the fleet's pods as static targets (no start time) and two
    paths at 3/s per pod, every verdict setting at its default."""
    lines = ["targets:", "  static:"]
    for e in fleet.endpoints():
        labels = {k: v for k, v in e.labels.items() if k != "start_time"}
        shown = ", ".join(f'{k}: "{v}"' for k, v in labels.items())
        lines += [f"    - address: {e.host}:{e.http_port}", f"      labels: {{{shown}}}"]
    lines.append("paths:")
    for name in ("checkout", "pay"):
        lines += [f"  - name: {name}", f"    http: {{path: /api/{name}}}", "    rate: 3/s"]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def cpu_hogs(count: int, most_s: float) -> Iterator[None]:
    """`count` processes that spin on a core each, for at most `most_s` seconds."""
    spin = f"import time\nend = time.monotonic() + {most_s}\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


async def judge_until_pay_fails(tmp_path: Path, canary_pods: int) -> dict[str, Any]:
    """Start the fleet with `canary_pods` pods on the canary, then the probe on static
    targets; the running probe's verdict after each window until `pay` fails or
    `WINDOWS_TO_FAIL` windows have been written."""
    fleet = Fleet(pods=PODS, version=BASELINE, profiles=parse_profiles(PROFILES),
                  base_host="127.0.0.90", endpoints_file=tmp_path / "endpoints.json", seed=31,
                  drain_s=0.2)
    verdict: dict[str, Any] = {}
    async with fleet:
        await fleet.rollout(CANARY, interval_s=0.1, limit=canary_pods)
        written = Windows()
        runner = probe_runner(static_config(fleet), str(tmp_path / "probe.db"),
                              on_window=written.on_window)
        async with running(runner, stop_within_s=30):
            wait = written.budget(WINDOWS_TO_FAIL, "pay to fail")
            for _ in range(WINDOWS_TO_FAIL):
                await wait.next()
                verdict = dict(await runner.verdict_json(VerdictQuery()))
                paths = {p["path"]: p for p in verdict["paths"]}
                if paths.get("pay", {}).get("verdict") == "fail":
                    break
    return verdict


def metric(verdict: dict[str, Any], path: str) -> dict[str, Any]:
    found = {p["path"]: p for p in verdict["paths"]}[path]
    return dict(found["metrics"]["success_rate"])


async def test_a_one_pod_canary_with_errors_fails_that_path_and_not_its_healthy_one(
    tmp_path: Path,
) -> None:
    verdict = await judge_until_pay_fails(tmp_path, canary_pods=1)
    pay = metric(verdict, "pay")
    assert pay["verdict"] == "fail", pay["reason"]
    assert pay["pods"]["canary"] == 1 and pay["rule"] == "pods"
    assert "one pod target-0" in pay["reason"] and "restart target-0" in pay["reason"]
    # The same pod's healthy path: within tolerance or undecided, never a fail.
    assert metric(verdict, "checkout")["verdict"] != "fail", metric(verdict, "checkout")


async def test_errors_on_every_canary_pod_fail_with_two_cpu_hogs_beside_the_probe(
    tmp_path: Path,
) -> None:
    with cpu_hogs(2, most_s=600.0):
        verdict = await judge_until_pay_fails(tmp_path, canary_pods=3)
    pay = metric(verdict, "pay")
    assert pay["verdict"] == "fail", pay["reason"]
    assert pay["pods"]["canary"] == 3
    assert metric(verdict, "checkout")["verdict"] != "fail", metric(verdict, "checkout")
