"""Stream memory: what N held grpc.aio streams cost a process, one channel per endpoint.

The probe holds one gRPC channel per (stream path, endpoint), as a real caller would, so
its memory at 2,400 endpoints is mostly per-channel. This measures that floor without the
probe around it: the fleet (`python -m targets.fleet`, one core) serves `Subscribe`; a
child process (the other core) opens one channel and one server stream per pod with
grpc.aio directly, reads the messages, and after a settle time reports its RSS, the
Python objects the GC tracks and the CPU it used; malloc's bytes in use (grpc core's share)
and Python's allocated blocks (the Python side's) split the figure. Each variant of
channel options (and of glibc's malloc arenas, the resolver and the target scheme) runs in
a fresh child, so the figures are comparable.

    .venv/bin/python benchmarks/stream_memory.py                 # 2,400 streams, all variants
    .venv/bin/python benchmarks/stream_memory.py --pods 600 --variants default
    .venv/bin/python benchmarks/stream_memory.py --pods 300 --heaptrack   # who allocates

`--heaptrack` runs the probe's variant under heaptrack with one stream and with all, and
prints what each further stream keeps allocated in malloc, by owner and size
(`_heaptrack.py`): grpc core's share, which no channel option above moved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _harness as h
import _heaptrack

from probes.clients._connection import channel_options
from probes.spec import GrpcSpec

# The probe's own channel options, then variants that might shrink a channel's buffers.
_BASE = channel_options(GrpcSpec())
_SMALL_READS = [("grpc.experimental.tcp_read_chunk_size", 1024),
                ("grpc.experimental.tcp_min_read_chunk_size", 256),
                ("grpc.experimental.tcp_max_read_chunk_size", 8192)]
_SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 4096), ("grpc.http2.bdp_probe", 0)]
_NO_HPACK = [("grpc.http2.hpack_table_size.decoder", 0),
             ("grpc.http2.hpack_table_size.encoder", 0)]
_CHANNELZ_ON = [o for o in _BASE if o[0] != "grpc.enable_channelz"]
VARIANTS: dict[str, tuple[list[tuple[str, str | int]], dict[str, str]]] = {
    "default": (_BASE, {}),
    "small read chunks": ([*_BASE, *_SMALL_READS], {}),
    "small flow-control window": ([*_BASE, *_SMALL_WINDOW], {}),
    "no HPACK tables": ([*_BASE, *_NO_HPACK], {}),
    "MALLOC_ARENA_MAX=2": (_BASE, {"MALLOC_ARENA_MAX": "2"}),
    # The probe turns channelz off (probes/clients/_grpc.py); this is grpc's default.
    "channelz on": (_CHANNELZ_ON, {}),
    "channelz on + trace memory 0": (
        [*_CHANNELZ_ON, ("grpc.max_channel_trace_event_memory_per_node", 0)], {}),
    "small write buffer": ([*_BASE, ("grpc.http2.write_buffer_size", 4096)], {}),
    "ipv4: target (no DNS resolver)": (_BASE, {"STREAM_MEMORY_SCHEME": "ipv4:"}),
    "native DNS resolver": (_BASE, {"GRPC_DNS_RESOLVER": "native"}),
}

# The child: hold one stream per endpoint, then report (stdout, one JSON line).
_HOLDER = """
import asyncio, ctypes, gc, json, os, sys, time
import grpc.aio
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
from targets.proto import target_pb2
listed = sys.argv[1]
endpoints = json.loads(open(listed[1:]).read() if listed.startswith("@") else listed)
options, settle = json.loads(sys.argv[2]), float(sys.argv[3])
request = target_pb2.SubscribeRequest(interval_ms=10000).SerializeToString()
opened = []
async def hold(address):
    target = os.environ.get("STREAM_MEMORY_SCHEME", "") + address
    channel = grpc.aio.insecure_channel(target, options=[tuple(o) for o in options])
    call = channel.unary_stream("/skewprobe.target.v1.Target/Subscribe")(request)
    await call.initial_metadata()
    opened.append(address)
    async for _ in call:
        pass
async def main():
    tasks = [asyncio.create_task(hold(a)) for a in endpoints]
    await asyncio.sleep(settle)
    rss = int(open(f"/proc/{os.getpid()}/status").read().split("VmRSS:")[1].split()[0])
    m = mallinfo2()
    print(json.dumps({"opened": len(opened), "rss_kib": rss, "tracked": len(gc.get_objects()),
                      "malloc_kib": (m.uordblks + m.hblkhd) // 1024,
                      "blocks": sys.getallocatedblocks(),
                      "cpu_s": time.process_time()}), flush=True)
    os._exit(0)
asyncio.run(main())
"""


def _grpc_addresses(endpoints_file: Path) -> list[str]:
    doc = json.loads(endpoints_file.read_text(encoding="utf-8"))
    return [f"{e['address'].rpartition(':')[0]}:{e['ports']['grpc']}" for e in doc["endpoints"]]


def _hold(addresses: list[str], variant: str, args: argparse.Namespace,
          heaptrack: Path | None = None) -> dict[str, float]:
    options, env = VARIANTS[variant]
    holder, endpoints = ["-c", _HOLDER], json.dumps(addresses)
    if heaptrack is not None:
        # Files, not -c and a long argument: heaptrack keeps the command line as one line
        # of its data, and a long one left the recording empty.
        script, listed = heaptrack.with_suffix(".py"), heaptrack.with_suffix(".json")
        script.write_text(_HOLDER, encoding="utf-8")
        listed.write_text(endpoints, encoding="utf-8")
        holder, endpoints = [str(script)], f"@{listed}"
    cmd = [h.PYTHON, *holder, endpoints, json.dumps(options), str(args.settle)]
    if heaptrack is not None:
        cmd = ["heaptrack", "-o", str(heaptrack), *cmd]
    cmd = h.pinned(args.probe_core, cmd)
    done = subprocess.run(cmd, cwd=h.REPO, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=args.settle + 120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"holder ({variant}) exited {done.returncode}: {done.stderr[-500:]}")
    return json.loads(next(line for line in reversed(done.stdout.splitlines())
                           if line.startswith("{")))


def _heaptrack_table(addresses: list[str], args: argparse.Namespace, tmp: Path) -> str:
    one, many = tmp / "one", tmp / "many"
    _hold(addresses[:1], "default", args, heaptrack=one)
    _hold(addresses, "default", args, heaptrack=many)
    added = _heaptrack.per_unit(
        _heaptrack.live_allocations(Path(f"{many}.zst")),
        _heaptrack.live_allocations(Path(f"{one}.zst")), max(1, len(addresses) - 1))
    by_owner: dict[str, float] = {}
    for (owner, _size), (nbytes, _n) in added.items():
        by_owner[owner] = by_owner.get(owner, 0.0) + nbytes
    total = sum(by_owner.values())
    rows = [[owner, "all", "", f"{nbytes / 1024:.1f}"]
            for owner, nbytes in sorted(by_owner.items(), key=lambda kv: -kv[1])[:4]]
    top = sorted(added.items(), key=lambda kv: -kv[1][0])[:14]
    rows += [[owner, f"{size:,}", f"{n:.1f}", f"{nbytes / 1024:.2f}"]
             for (owner, size), (nbytes, n) in top]
    return (f"## malloc per further stream (heaptrack, {len(addresses):,} streams vs 1): "
            f"{total / 1024:.1f} KiB\n\n"
            + h.md_table(["owner", "size B", "count per stream", "KiB per stream"], rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=2400)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds before reading (15)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--probe-core", type=int, default=0)
    ap.add_argument("--fleet-core", type=int, default=1)
    ap.add_argument("--base-host", default="127.77.0.1")
    ap.add_argument("--heaptrack", action="store_true",
                    help="instead of the variants: who allocates a stream's malloc memory"
                         " (needs heaptrack and zstd; use --pods 300, it is slow)")
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants: {', '.join(unknown)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="skewprobe-streammem-") as tmp:
        endpoints = Path(tmp) / "endpoints.json"
        with h.children() as kids:
            fleet = h.Child("fleet", h.pinned(args.fleet_core, [
                h.PYTHON, "-m", "targets.fleet", "--pods", str(args.pods), "--from", "1.20.3",
                "--endpoints-file", str(endpoints), "--base-host", args.base_host,
                "--http-port", "0", "--quiet", "--drain", "0", "--drain-notice", "0",
            ]), log=Path(tmp) / "fleet.err")
            kids.append(fleet)
            fleet.wait_line(r"^fleet: ", timeout_s=max(60.0, args.pods / 10))
            addresses = _grpc_addresses(endpoints)
            if args.heaptrack:
                print(_heaptrack_table(addresses, args, Path(tmp)))
                return 0
            one = _hold(addresses[:1], "default", args)
            for variant in variants:
                r = _hold(addresses, variant, args)
                others = max(1, len(addresses) - 1)
                per_stream = (r["rss_kib"] - one["rss_kib"]) / others
                rows.append([variant, f"{r['opened']:,}", f"{r['rss_kib'] / 1024:.0f}",
                             f"{per_stream:.1f}",
                             f"{(r['malloc_kib'] - one['malloc_kib']) / others:.1f}",
                             f"{(r['blocks'] - one['blocks']) / others:.0f}",
                             f"{(r['tracked'] - one['tracked']) / others:.0f}",
                             f"{r['cpu_s']:.1f}"])
    print(f"## stream memory: {len(addresses):,} grpc.aio streams, one channel each "
          f"(1 stream: {one['rss_kib'] / 1024:.0f} MiB, {one['tracked']:,} tracked objects)\n")
    print(h.md_table(["variant", "streams open", "RSS MiB", "KiB per stream",
                      "malloc KiB per stream", "Python blocks per stream",
                      "GC-tracked objects per stream", "CPU s (start-up included)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
