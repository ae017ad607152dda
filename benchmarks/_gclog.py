"""A gc log for a benchmarked `skewprobe run`: every collection's generation and pause,
and every event-loop callback that ran longer than 5 ms.

Run by `capacity.py --gc-log FILE` in front of the real CLI, so the product runs
unchanged; only a `gc.callbacks` hook is added. At exit it writes FILE (JSON): per
generation the number of collections and their pauses (p50, p99, max, total), every
collection longer than 5 ms with its time (so periodic stalls can be matched to the
schedule lag), and a census of the old generation taken at the start of the
`--gc-census`-th full collection: what the pauses walk, by type, with the coroutines and
their counts. Every 30 s it samples the memory: RSS, Python's heap (blocks in use,
pymalloc's arenas and the bytes live in them) and malloc's (in use, and free but kept), to
tell a leak from fragmentation; with PYTHONTRACEMALLOC=N in the environment, also the
Python heap's top growth by traceback (tracemalloc slows the probe several times over: a
few hundred endpoints at most). `--gc-young-census` adds a census of every young
collection (how the ~19 objects of grpc.aio's pending read per held stream were found);
`--heap-census` one count of the whole Python heap by type and size, ~60 s in. The young
census also counts its tuples by their items' types and names the holders of ten of them.

The long callbacks (`asyncio.Handle._run` timed; a task's step is named by its coroutine)
say what else stops the loop besides the collector: a pause that is neither shows up as a
late send with no entry here. A callback's time includes any collection that ran inside it.

Only collections between the runner's post-warm-up `gc.freeze()` and its `gc.unfreeze()`
at shutdown are logged: the steady state, not the start-up or the shutdown. The freeze is
noticed by wrapping `gc.freeze` rather than by asking `gc.get_freeze_count()`, which walks
every frozen object: called from the hook, it made each young collection take 65 ms and
was itself the pause being measured.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import atexit
import collections
import ctypes
import gc
import json
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from typing import Any

_started: list[float] = [0.0]
_frozen: list[bool] = [False]
_fulls: list[int] = [0]
_log: list[tuple[float, int, float, int]] = []  # (monotonic, generation, pause s, collected)
_census: dict[str, Any] = {}
_slow: list[tuple[float, float, str]] = []  # (monotonic, seconds, what ran)
SLOW_CALLBACK_S = 0.005


def _describe(handle: asyncio.events.Handle) -> str:
    callback = getattr(handle, "_callback", None)
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return f"task step: {owner.get_coro().__qualname__}"  # type: ignore[union-attr]
    return getattr(callback, "__qualname__", repr(callback))


def _time_callbacks() -> None:
    real_run = asyncio.events.Handle._run

    def run(handle: asyncio.events.Handle) -> None:
        started = time.perf_counter()
        real_run(handle)
        took = time.perf_counter() - started
        if took > SLOW_CALLBACK_S and _frozen[0]:
            _slow.append((time.monotonic(), took, _describe(handle)))

    asyncio.events.Handle._run = run  # type: ignore[method-assign]


def _type_name(o: object) -> str:
    return f"{type(o).__module__}.{type(o).__qualname__}"


def _coroutines(objects: list[Any], top: int,
                kinds: tuple[str, ...] = ("coroutine",)) -> list[tuple[str, int]]:
    """The commonest coroutines (or other `kinds` of frame holder) among `objects`."""
    return collections.Counter(
        getattr(o, "__qualname__", "?") for o in objects if type(o).__name__ in kinds
    ).most_common(top)


def _take_census() -> None:
    objects = gc.get_objects(2)  # the old generation, frozen objects not included
    _census.update(
        objects=len(objects),
        types=collections.Counter(_type_name(o) for o in objects).most_common(40),
        coroutines=_coroutines(objects, 15),
    )


_young_census: list[bool] = [False]
_young: list[dict[str, Any]] = []


def _census_young() -> None:
    # What a young collection walks: the objects and the references it follows. Costly
    # (the whole young generation is listed), so only with --gc-young-census.
    objects = gc.get_objects(0)
    _young.append({
        "t": time.monotonic(),
        "objects": len(objects),
        "references": sum(len(gc.get_referents(o)) for o in objects),
        "types": collections.Counter(type(o).__qualname__ for o in objects).most_common(20),
        "coroutines": _coroutines(objects, 10),
        # What the tuples hold (by their items' types) and, for a few, who holds them.
        "tuple_shapes": collections.Counter(
            "(" + ", ".join(type(x).__qualname__ for x in o[:4]) + ")"
            for o in objects if type(o) is tuple).most_common(8),
        "tuple_owners": collections.Counter(
            type(r).__qualname__ for o in [o for o in objects if type(o) is tuple][:10]
            for r in gc.get_referrers(o) if r is not objects).most_common(8),
        # For a few (bytes, bytes) pairs, who holds them, three holders up.
        "pair_holders": _holders(
            [o for o in objects if type(o) is tuple and len(o) == 2
             and all(type(x) is bytes for x in o)][:12], objects),
    })


def _holders(items: list[Any], exclude: list[Any], depth: int = 3) -> list[list[str]]:
    """Per item, the chain of its first holders (type, size, a hint of what it is)."""
    chains = []
    for item in items:
        chain, o = [repr(item)[:60]], item
        for _ in range(depth):
            refs = [r for r in gc.get_referrers(o) if r is not exclude and r is not items
                    and type(r).__name__ != "frame"]
            if not refs:
                break
            o = refs[0]
            hint = ""
            if isinstance(o, dict):
                hint = " keys " + ",".join(map(str, list(o)[:4]))[:80]
            elif isinstance(o, list | tuple | collections.deque):
                hint = f" len {len(o)}"
            elif hasattr(o, "cr_code"):
                hint = " " + o.cr_code.co_qualname
            chain.append(f"{type(o).__qualname__}{hint} (+{len(refs) - 1})")
        chains.append(chain)
    return chains


def _hook_for(census_at: int) -> Any:
    def hook(phase: str, info: dict[str, Any]) -> None:
        if not _frozen[0]:
            return
        if phase == "start":
            if info["generation"] == 2:
                _fulls[0] += 1
                if _fulls[0] == census_at:
                    _take_census()
            elif info["generation"] == 0 and _young_census[0]:
                _census_young()
            _started[0] = time.perf_counter()
        else:
            _log.append((time.monotonic(), info["generation"],
                         time.perf_counter() - _started[0], info["collected"]))

    return hook


_heap_census: list[bool] = [False]
_heap: dict[str, Any] = {}


def _census_heap() -> None:
    # The whole Python heap by type: every tracked object (frozen ones included, by
    # unfreezing for the count) and the untracked ones they hold (str, bytes, int, float),
    # with sys.getsizeof bytes, to say what the ~1 M blocks at 2,400 endpoints are.
    # From the sampler thread: the loop is stopped for the seconds this takes, once.
    real_freeze = getattr(gc.freeze, "__wrapped__", gc.freeze)
    getattr(gc.unfreeze, "__wrapped__", gc.unfreeze)()  # not the runner's: stay "frozen"
    try:
        tracked = gc.get_objects()
    finally:
        real_freeze()
    seen = {id(o) for o in tracked}
    sizes: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for o in tracked:
        name = _type_name(o)
        counts[name] += 1
        sizes[name] += sys.getsizeof(o)
    untracked = 0
    for o in tracked:
        for r in gc.get_referents(o):
            if id(r) not in seen and not gc.is_tracked(r):
                seen.add(id(r))
                untracked += 1
                name = f"untracked {type(r).__qualname__}"
                counts[name] += 1
                sizes[name] += sys.getsizeof(r)
    coroutines = _coroutines(tracked, 25, ("coroutine", "async_generator"))
    tasks = collections.Counter(
        getattr(o.get_coro(), "__qualname__", "?") for o in tracked
        if isinstance(o, asyncio.Task))
    del tracked
    _heap.update(
        coroutines=coroutines,
        tasks=tasks.most_common(15),
        t=time.monotonic(),
        tracked=len(seen) - untracked,
        untracked=untracked,
        mib=round(sum(sizes.values()) / 2**20, 1),
        by_size=[(k, counts[k], round(v / 2**20, 2)) for k, v in sizes.most_common(40)],
    )


_memory: list[dict[str, float]] = []
_traced: list[tracemalloc.Snapshot] = []  # the first after the freeze, and the latest
MEMORY_EVERY_S = 30.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _pymalloc_stats() -> dict[str, float]:
    # Python's own allocator: arenas held vs. bytes in live blocks (fragmentation inside
    # pymalloc, which neither mallinfo nor the block count shows). sys._debugmallocstats
    # writes to C's stderr, so fd 2 is pointed at a file for the call (under a millisecond;
    # a probe log line written in that instant would be lost with it).
    with tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        text = caught.read().decode("utf-8", "replace")
    wanted = {"# arenas allocated current": "pymalloc_arenas",
              "# bytes in allocated blocks": "pymalloc_live_mib",
              "# bytes in available blocks": "pymalloc_free_blocks_mib"}
    row: dict[str, float] = {}
    for line in text.splitlines():
        if "unused pools *" in line:  # pools free in held arenas (never used, or emptied)
            row["pymalloc_unused_pools_mib"] = float(line.split()[0]) * 16384 / 2**20
        key, _, value = line.partition("=")
        name = wanted.get(key.strip())
        if name is not None:
            number = float(value.strip().replace(",", ""))
            row[name] = number if name == "pymalloc_arenas" else number / 2**20
    return row


def _sample_memory() -> None:
    # Where RSS growth is: Python's own heap (pymalloc blocks in use), or malloc's heap
    # (in use vs. free but kept: fragmentation), e.g. grpc core's or SQLite's.
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
        mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        mallinfo2 = None
    mib = 1024 * 1024
    while True:
        with open("/proc/self/status", encoding="ascii") as f:
            status = dict(line.split(":", 1) for line in f)
        row = {"t": time.monotonic(), "python_blocks": float(sys.getallocatedblocks()),
               **_pymalloc_stats()}
        for key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            row[f"{key}_mib"] = int(status[key].split()[0]) / 1024
        if mallinfo2 is not None:
            m = mallinfo2()
            row.update(malloc_in_use_mib=(m.uordblks + m.hblkhd) / mib,
                       malloc_free_kept_mib=m.fordblks / mib)
        _memory.append(row)
        if _heap_census[0] and not _heap and _frozen[0] and len(_memory) >= 3:
            _census_heap()
        if tracemalloc.is_tracing() and _frozen[0]:  # PYTHONTRACEMALLOC=N in the probe's env
            snapshot = tracemalloc.take_snapshot()
            if not _traced:
                _traced.append(snapshot)
            else:
                _traced[1:] = [snapshot]
        time.sleep(MEMORY_EVERY_S)


def _summary() -> dict[str, Any]:
    out: dict[str, Any] = {"generations": {}, "long_pauses": [], "census": _census}
    for gen in (0, 1, 2):
        pauses = sorted(p for _, g, p, _ in _log if g == gen)
        if pauses:
            out["generations"][gen] = {
                "count": len(pauses),
                "p50_ms": 1000 * pauses[len(pauses) // 2],
                "p99_ms": 1000 * pauses[min(len(pauses) - 1, int(0.99 * len(pauses)))],
                "max_ms": 1000 * pauses[-1],
                "total_ms": 1000 * sum(pauses),
            }
    if _log:
        out["logged_s"] = _log[-1][0] - _log[0][0]
        out["long_pauses"] = [
            {"t": round(t - _log[0][0], 3), "gen": g, "ms": round(1000 * p, 2), "collected": c}
            for t, g, p, c in _log if p > 0.005
        ]
    start = _log[0][0] if _log else 0.0
    out["slow_callbacks"] = {
        "count": len(_slow),
        "total_ms": round(1000 * sum(s for _, s, _ in _slow), 1),
        "by_kind": collections.Counter(w for _, _, w in _slow).most_common(20),
        "list": [{"t": round(t - start, 3), "ms": round(1000 * s, 2), "what": w}
                 for t, s, w in _slow[:500]],
    }
    if len(_traced) == 2:
        out["python_heap_growth"] = [
            str(d) for d in _traced[1].compare_to(_traced[0], "traceback")[:15]]
    out["memory"] = [dict(m, t=round(m["t"] - start, 1)) for m in _memory]
    if _heap:
        out["heap_census"] = dict(_heap, t=round(_heap["t"] - start, 1))
    out["young_census"] = [dict(y, t=round(y["t"] - start, 3)) for y in _young[:200]]
    return out


def install(path: str, census_at: int, extra: str = "-") -> None:
    """Log every collection after the freeze; write the summary to `path` at exit.

    `extra` "young" also lists what each young collection walks (the first 200); "heap"
    counts the whole Python heap by type once, at the third memory sample (~60 s in)."""
    _young_census[0] = extra == "young"
    _heap_census[0] = extra == "heap"
    threading.Thread(target=_sample_memory, name="gclog-memory", daemon=True).start()
    gc.callbacks.append(_hook_for(census_at))
    _time_callbacks()
    real_freeze = gc.freeze

    def freeze() -> None:
        real_freeze()
        _frozen[0] = True

    freeze.__wrapped__ = real_freeze  # type: ignore[attr-defined]

    gc.freeze = freeze
    real_unfreeze = gc.unfreeze

    def unfreeze() -> None:  # the runner's shutdown: what follows is not the steady state
        _frozen[0] = False
        real_unfreeze()

    unfreeze.__wrapped__ = real_unfreeze  # type: ignore[attr-defined]
    gc.unfreeze = unfreeze

    def write() -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_summary(), f, indent=1)

    atexit.register(write)


if __name__ == "__main__":  # python _gclog.py FILE CENSUS_AT young|heap|- -- skewprobe args...
    install(sys.argv[1], int(sys.argv[2]), sys.argv[3])
    from probes.cli import main

    sys.exit(main(sys.argv[5:]))
