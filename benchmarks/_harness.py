"""Shared plumbing for the benchmarks: pinned child processes, /proc readings, scrapes.

Not a benchmark itself (the leading underscore keeps `run_all.py` from running it). The
benchmarks measure the real product: `skewprobe run` and the targets run as separate
processes, each pinned to its own core with `taskset`, and are read from the outside
(/proc for CPU and memory, `/metrics` for what the probe says about itself, the SQLite
store for its latency histograms), so no harness code runs inside the measured process.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")


def skewprobe_cmd() -> list[str]:
    """The installed console script next to this interpreter, else `python -m probes.cli`."""
    script = Path(PYTHON).with_name("skewprobe")
    return [str(script)] if script.exists() else [PYTHON, "-m", "probes.cli"]


def pinned(core: int | None, cmd: Sequence[str]) -> list[str]:
    """`cmd` pinned to one core with taskset (unpinned when core is None or taskset is absent)."""
    if core is None or shutil.which("taskset") is None:
        return list(cmd)
    return ["taskset", "-c", str(core), *cmd]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# --- child processes ---------------------------------------------------------------------


class Child:
    """A child process whose stdout is read line by line with a deadline."""

    def __init__(self, name: str, cmd: Sequence[str], *, log: Path) -> None:
        self.name = name
        self.cmd = list(cmd)
        self._log = log.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            self.cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1,
            preexec_fn=_die_with_parent,
        )
        self.lines: list[str] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_line(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Block until a stdout line matches `pattern`; raise if the child dies or times out."""
        regex = re.compile(pattern)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.name}: no line matching {pattern!r} in {timeout_s}s")
                if not sel.select(left):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"{self.name} exited ({self.proc.wait()}): {self.cmd}")
                self.lines.append(line.rstrip("\n"))
                if (match := regex.search(line)) is not None:
                    return match

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait; SIGKILL if it does not end in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.lines.extend(line.rstrip("\n") for line in self.proc.stdout)
            self.proc.stdout.close()
        if not self._log.closed:
            self._log.close()
        return int(self.proc.returncode)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the benchmark dies, even by SIGKILL (Linux),
    so no target is left loading the machine after an interrupted run."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def children() -> Iterator[list[Child]]:
    """Children appended to the list are stopped on the way out, last started first; a
    SIGTERM to the benchmark is a way out too."""
    started: list[Child] = []
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield started
    finally:
        signal.signal(signal.SIGTERM, previous)
        for child in reversed(started):
            child.stop()


# --- /proc ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS in KiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def system_times() -> dict[str, float]:
    """Seconds all cores spent per /proc/stat category since boot, plus "busy" (not idle,
    not iowait, not steal: work done on this machine's cores)."""
    values = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    out = {name: v / CLK_TCK for name, v in zip(_STAT_FIELDS, values, strict=True)}
    out["busy"] = sum(out[k] for k in ("user", "nice", "system", "irq", "softirq"))
    return out


def machine_speed_s(loops: int = 3) -> float:
    """Seconds this machine's CPython takes for a fixed pure-Python loop (best of `loops`).

    The machines are shared at the hypervisor level: the same code has run 2.5x slower on
    the same machine an hour apart, with nothing else in the VM and no steal shown. Every
    figure that depends on CPU speed is printed beside this, so runs can be compared.
    """
    best = float("inf")
    for _ in range(loops):
        began = time.process_time()
        total = 0
        for i in range(5_000_000):
            total += i
        best = min(best, time.process_time() - began)
    return best


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass(frozen=True)
class Snapshot:
    """One moment of a run, read from outside the measured processes."""

    mono: float
    wall: float
    cpu: Mapping[int, float]
    system: Mapping[str, float]
    metrics: str
    load: str
    scrape_s: float = 0.0


def snapshot(pids: Sequence[int], metrics_url: str | None) -> Snapshot:
    """Scrape first, then read the clocks and /proc: an overloaded probe answers its scrape
    late (the API shares its event loop), and the counters are those of the moment it did."""
    began = time.monotonic()
    text = scrape(metrics_url, timeout_s=60.0) if metrics_url else ""
    return Snapshot(
        scrape_s=time.monotonic() - began,
        mono=time.monotonic(),
        wall=time.time(),
        cpu={pid: cpu_seconds(pid) for pid in pids},
        system=system_times(),
        metrics=text,
        load=loadavg(),
    )


# --- the probe's own /metrics ----------------------------------------------------------------


def scrape(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def wait_http(url: str, contains: str, timeout_s: float) -> str:
    """Poll `url` until its body contains `contains`. An external process offers no event
    to wait on, so this is a bounded poll (a readiness check, not product code)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            last = scrape(url, timeout_s=2.0)
        except OSError as exc:
            last = str(exc)
        else:
            if contains in last:
                return last
        time.sleep(0.25)
    raise RuntimeError(f"{url}: no {contains!r} within {timeout_s}s (last: {last[:200]!r})")


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def counter_by(text: str, name: str, label: str) -> dict[str, float]:
    """Sum of counter `name` (its `_total` sample) per value of `label`."""
    out: dict[str, float] = {}
    for sample, labels, value in samples(text):
        if sample == f"{name}_total":
            key = labels.get(label, "")
            out[key] = out.get(key, 0.0) + value
    return out


def gauge(text: str, name: str) -> float:
    """The value of an unlabelled gauge (NaN when absent)."""
    for sample, _labels, value in samples(text):
        if sample == name:
            return value
    return float("nan")


def by_label(text: str, sample_name: str, label: str) -> dict[str, float]:
    """Every series of one sample name (e.g. a histogram's `_count`) by one label's value."""
    return {labels.get(label, ""): v for s, labels, v in samples(text) if s == sample_name}


def gauge_sum(text: str, name: str) -> float:
    """The sum of every series of gauge `name` (0 when absent)."""
    return sum(v for s, _, v in samples(text) if s == name)


def wait_streams(url: str, want: int, timeout_s: float) -> tuple[float, str]:
    """Poll /metrics until `skewprobe_streams_open` sums to `want` (a bounded readiness poll
    of an outside process). Returns the wall time it first did and the scrape."""
    deadline = time.monotonic() + timeout_s
    last = -1.0
    while time.monotonic() < deadline:
        text = scrape(url, timeout_s=30.0)
        last = gauge_sum(text, "skewprobe_streams_open")
        if last == want:
            return time.time(), text
        time.sleep(0.25)
    raise RuntimeError(f"streams open {last:.0f}, not {want}, after {timeout_s:.0f}s")


def buckets(text: str, name: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) of histogram `name`, summed over its label sets."""
    acc: dict[float, float] = {}
    for sample, labels, value in samples(text):
        if sample == f"{name}_bucket":
            le = float(labels["le"])
            acc[le] = acc.get(le, 0.0) + value
    return sorted(acc.items())


def bucket_delta(
    before: list[tuple[float, float]], after: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    old = dict(before)
    return [(le, count - old.get(le, 0.0)) for le, count in after]


def bucket_quantile(cum: list[tuple[float, float]], q: float) -> tuple[float, float, float]:
    """(estimate, bucket lower, bucket upper) for quantile q of cumulative buckets.

    The estimate interpolates linearly inside the bucket, as PromQL's histogram_quantile
    does; only the bucket bounds are certain.
    """
    total = cum[-1][1]
    if total <= 0:
        return (float("nan"),) * 3
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in cum:
        if count >= rank:
            if le == float("inf"):
                return lower, lower, le
            inside = count - below
            frac = (rank - below) / inside if inside else 1.0
            return lower + (le - lower) * frac, lower, le
        lower, below = le, count
    return lower, lower, float("inf")


def fraction_at_most(cum: list[tuple[float, float]], bound: float) -> float:
    """Fraction of observations <= `bound`, where `bound` is one of the bucket edges."""
    total = cum[-1][1]
    for le, count in cum:
        if abs(le - bound) < 1e-12:
            return count / total if total else float("nan")
    raise ValueError(f"{bound} is not a bucket edge")


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- profiles (py-spy, when installed) ------------------------------------------------------


def profile(pid: int, seconds: float, out: Path, *, core: int | None) -> None:
    """Sample `pid` with py-spy for `seconds` (non-blocking: the probe is never paused)
    and write collapsed stacks ("frame;frame;... count" lines) to `out`."""
    spy = Path(PYTHON).with_name("py-spy")
    exe = str(spy) if spy.exists() else shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy into .venv)")
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
           "--rate", "200", "--nonblocking", "--format", "raw", "--output", str(out)]
    subprocess.run(pinned(core, cmd), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=seconds + 60)


def _frame_name(frame: str) -> str:
    # py-spy raw frames read "function (package/file.py:123)"; drop the line number.
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})"


def _module(frame: str) -> str:
    where = frame.rpartition(" (")[2].rstrip(")")
    return where.split("/")[0]


# The leaf frame of a thread waiting in epoll_wait: idle time, not work.
_WAITING = "EpollSelector.select (selectors.py)"


def profile_summary(collapsed: Path, top: int = 25) -> str:
    """Top functions by self and inclusive samples, and self samples by package.

    Samples whose leaf is the event loop's epoll wait are counted apart (idle, or the
    kernel's share of the wait) and left out of the shares, which are of the busy samples.
    """
    self_count: dict[str, int] = {}
    incl_count: dict[str, int] = {}
    by_module: dict[str, int] = {}
    busy = waiting = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [_frame_name(f) for f in stack.split(";")]
        leaf = frames[-1]
        if leaf == _WAITING:
            waiting += count
            continue
        busy += count
        self_count[leaf] = self_count.get(leaf, 0) + count
        for frame in set(frames):
            incl_count[frame] = incl_count.get(frame, 0) + count
        by_module[_module(leaf)] = by_module.get(_module(leaf), 0) + count
    if not busy:
        return "(no busy samples)"

    def table(counts: dict[str, int], title: str, n: int) -> str:
        rows = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
        return md_table([title, "share of busy samples"],
                        [[k, f"{v / busy:.1%}"] for k, v in rows])

    return "\n\n".join([
        f"{busy} busy samples; {waiting} more in epoll_wait (idle), left out",
        table(self_count, "self (leaf) function", top),
        table(incl_count, "inclusive function", top),
        table(by_module, "self samples by package / module", 15),
    ])


def haproxy_relay_rule() -> str:
    """An HAProxy `http-request return` line (a frontend's) answering `GET /relay/<name>`
    as a relay pod does when its destination answered 200 (`targets.relay.RelayAnswer`,
    ~330 bytes of JSON): a relay that costs next to nothing per call, so a benchmark of the
    relay prober measures the probe."""
    from probes.types import Outcome
    from targets.relay import PodIdentity, RelayAnswer

    answer = RelayAnswer(
        "bench", Outcome.OK, 0.0123, PodIdentity("relay-0", "platform", "1.20.3"), status=200,
        attempts=1, attempts_from="destination",
        answered_by=PodIdentity("catalog-0", "shop", "1.21.0"), address="10.1.2.3:8080")
    # Single quotes: HAProxy takes what is inside them as it is, JSON's quotes included.
    return ("    http-request return status 200 content-type application/json string "
            f"'{json.dumps(answer.to_json())}' if {{ path_beg /relay/ }}\n")
