"""Kubernetes discovery at fleet scale: a watch of 2,400 pods with 10 % churn per minute.

Two child processes, each pinned to its own core and read from the outside (/proc):

- the fake API server (`tests.servers.kube_fleet`) with 2,400 Istio-injected pods in 20
  namespaces, restarting 10 % of them per minute the way a rollout does: a graceful delete
  (MODIFIED with `deletionTimestamp`), a new Pending pod, Running and Ready 3 s later, the
  old pod gone 2 s after its delete — about five watch events per restart, plus BOOKMARKs;
- the discovery: `KubernetesSource` exactly as `skewprobe run` uses it (list in pages of
  500, watch cluster-wide), printing each snapshot's removals with a timestamp.

Figures: time to the first snapshot (the initial list of 2,400 pods), CPU of discovery
(initial list, then steady state as a % of one core), its memory (RSS above the
interpreter's baseline with the libraries loaded), and the time from a pod's deletion (the
server's clock at the delete) to the snapshot that no longer has it (removed from probing).

    .venv/bin/python benchmarks/k8s_watch.py --quick            # 60 s of churn, ~1.5 min
    .venv/bin/python benchmarks/k8s_watch.py --duration 300     # 5 minutes of churn
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._harness import PYTHON, Child, children, cpu_seconds, memory_kib, pinned


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def _discovery(kubeconfig: str, duration_s: float) -> None:
    """The measured process: discovery only, printing what the orchestrator times."""
    from probes.discovery.kubernetes import KubernetesSource
    from probes.spec import KubernetesSpec

    _say(baseline_rss_kib=_rss_kib())
    source = KubernetesSource(KubernetesSpec(mesh="istio", port="http", kubeconfig=kubeconfig))
    started, cpu0 = time.monotonic(), time.process_time()
    previous: set[str] | None = None
    snapshots = 0
    stream = source.snapshots()
    try:
        async with asyncio.timeout(duration_s + 120):
            async for snapshot in stream:
                now = time.time()
                names = {e.name for e in snapshot}
                snapshots += 1
                if previous is None:
                    _say(synced=len(names), wall=now, after_s=time.monotonic() - started,
                         cpu_s=time.process_time() - cpu0, rss_kib=_rss_kib())
                    deadline = time.monotonic() + duration_s
                elif removed := previous - names:
                    _say(removed=sorted(removed), at=now)
                previous = names
                if time.monotonic() >= deadline:
                    break
    finally:
        await stream.aclose()
    stats = {name: s.events for name, s in source.stats().items()}
    _say(done=snapshots, events=stats, pods=len(source.state().pods),
         expired=sum(s.expired for s in source.stats().values()))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2400)
    parser.add_argument("--churn", type=float, default=0.10, help="fraction restarted per min")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of churn")
    parser.add_argument("--quick", action="store_true", help="60 s of churn")
    parser.add_argument("--discovery-child", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    duration = 60.0 if args.quick else args.duration
    if args.discovery_child:
        asyncio.run(_discovery(args.discovery_child, duration))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="skewprobe-k8s-bench-"))
    kubeconfig = tmp / "kubeconfig"
    with children() as started:
        server = Child("kube-api", pinned(1, [
            PYTHON, "-m", "tests.servers.kube_fleet", "--pods", str(args.pods),
            "--churn", str(args.churn), "--kubeconfig", str(kubeconfig),
        ]), log=tmp / "kube-api.log")
        started.append(server)
        server.wait_line(r'"ready"', 300)
        discovery = Child("discovery", pinned(0, [
            PYTHON, __file__, "--discovery-child", str(kubeconfig), "--duration", str(duration),
        ]), log=tmp / "discovery.log")
        started.append(discovery)
        base = json.loads(discovery.wait_line(r"baseline_rss_kib", 60).string)
        synced = json.loads(discovery.wait_line(r'"synced"', 300).string)
        cpu_at_sync, wall_at_sync = cpu_seconds(discovery.pid), time.monotonic()
        done = json.loads(discovery.wait_line(r'"done"', duration + 180).string)
        cpu_end, wall_end = cpu_seconds(discovery.pid), time.monotonic()
        memory = memory_kib(discovery.pid)
    sync_wall = synced["wall"]  # deletions after the first snapshot must show as removals
    deleted: dict[str, float] = {}
    for line in server.lines:
        if '"deleted"' in line:
            event = json.loads(line)
            deleted[event["deleted"]] = event["at"]
    removed: dict[str, float] = {}
    for line in discovery.lines:
        if '"removed"' in line:
            event = json.loads(line)
            for name in event["removed"]:
                removed.setdefault(name, event["at"])
    latencies = [removed[n] - t for n, t in deleted.items() if n in removed and t > sync_wall]
    missed = [n for n, t in deleted.items()
              if t > sync_wall and t < sync_wall + duration - 2 and n not in removed]
    steady_cpu = (cpu_end - cpu_at_sync) / max(1e-9, wall_end - wall_at_sync)

    print(f"\n```sh\n.venv/bin/python benchmarks/k8s_watch.py "
          f"{'--quick' if args.quick else f'--duration {duration:g}'}\n```\n")
    print(f"{args.pods} pods, {args.churn:.0%} restarted per minute, {duration:g} s of churn"
          f" after the first snapshot; {os.cpu_count()} cores, each process pinned to one.\n")
    print("| figure | value |\n| --- | --- |")
    print(f"| first snapshot (list of {synced['synced']} ready pods, pages of 500) |"
          f" {synced['after_s']:.2f} s, {synced['cpu_s']:.2f} s CPU |")
    print(f"| discovery CPU, steady state under churn | {steady_cpu:.1%} of one core |")
    print(f"| watch events handled | {sum(done['events'].values())}"
          f" ({sum(done['events'].values()) / duration:.1f}/s), {done['done']} snapshots |")
    print(f"| memory: RSS above the interpreter with libraries | "
          f"{(synced['rss_kib'] - base['baseline_rss_kib']) / 1024:.1f} MiB after the list,"
          f" {(memory['VmRSS'] - base['baseline_rss_kib']) / 1024:.1f} MiB at the end"
          f" (peak RSS {memory['VmHWM'] / 1024:.0f} MiB) |")
    if latencies:
        ms = [x * 1000 for x in latencies]
        print(f"| deletion → removed from probing, {len(ms)} pods | median"
              f" {statistics.median(ms):.0f} ms, p95 {_percentile(ms, 0.95):.0f} ms,"
              f" max {max(ms):.0f} ms |")
    print(f"| deleted pods never removed | {len(missed)} |")
    print(f"| relists (410 Gone) | {done['expired']} |")
    sane = bool(latencies) and not missed and _percentile(latencies, 0.95) < 1.0
    return 0 if sane else 1


if __name__ == "__main__":
    sys.exit(main())
