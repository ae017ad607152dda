"""Live heap allocations from a heaptrack recording, by owner and size.

heaptrack (Debian package `heaptrack`) records every malloc and free with its call stack.
grpcio's core is stripped, so its frames have no names; what still tells its allocations
apart is their size and which library made them. This reads heaptrack's own data stream
(`heaptrack_interpret`'s output, zstd-compressed) and returns the bytes still allocated at
the end of the recording, keyed by (owner, size): owner is "grpc core" for calls from
cygrpc's shared object, "C++ new" for `operator new` (grpc core's C++ objects),
"python" for CPython's allocator falling back to malloc (objects over 512 bytes), or the
library and function that called malloc. Python's small objects live in pymalloc's
mmap'ed arenas, which heaptrack does not see: `stream_memory.py` counts them as blocks.

The stream's line types used: `s` string, `i` instruction pointer (module, function),
`t` trace node (ip, parent), `a` allocation info (size, trace), `+`/`-` an allocation
or free of an allocation info (all numbers hex).
"""

from __future__ import annotations

import collections
import subprocess
from pathlib import Path

Key = tuple[str, int]


def live_allocations(recording: Path) -> dict[Key, tuple[int, int]]:
    """(owner, size) → (bytes, count) allocated and not freed when the recording ended."""
    text = subprocess.run(["zstd", "-dc", str(recording)], capture_output=True, check=True,
                          text=True, errors="replace").stdout
    strings: list[str] = []
    ips: list[tuple[int, int]] = []  # (module string index, function string index or 0)
    traces: list[tuple[int, int]] = [(0, 0)]  # (ip index, parent trace index)
    infos: list[tuple[int, int]] = []  # (size, trace index)
    live: collections.Counter[int] = collections.Counter()
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "s":
            strings.append(rest.partition(" ")[2])
        elif kind == "i":
            fields = [int(x, 16) for x in rest.split()]
            ips.append((fields[1], fields[2] if len(fields) > 2 else 0))
        elif kind == "t":
            ip, parent = (int(x, 16) for x in rest.split())
            traces.append((ip, parent))
        elif kind == "a":
            size, trace = (int(x, 16) for x in rest.split())
            infos.append((size, trace))
        elif kind == "+":
            live[int(rest, 16)] += 1
        elif kind == "-":
            live[int(rest, 16)] -= 1

    def owner(trace: int) -> str:
        while trace:
            ip, trace = traces[trace]
            module_index, function_index = ips[ip - 1]
            module = strings[module_index - 1].rsplit("/", 1)[-1] if module_index else "?"
            function = strings[function_index - 1] if function_index else ""
            if "heaptrack" in module or module.startswith("libc.so"):
                continue  # malloc itself and heaptrack's hooks
            if "cygrpc" in module:
                return "grpc core"
            if "operator new" in function:
                return "C++ new"
            if "libpython" in module:
                return "python"
            return f"{module}:{function or '?'}"
        return "?"

    out: dict[Key, tuple[int, int]] = {}
    for info, count in live.items():
        if count <= 0:
            continue
        size, trace = infos[info]
        key = (owner(trace), size)
        total, n = out.get(key, (0, 0))
        out[key] = (total + size * count, n + count)
    return out


def per_unit(many: dict[Key, tuple[int, int]], one: dict[Key, tuple[int, int]],
             units: int) -> dict[Key, tuple[float, float]]:
    """What `units` more of something (streams) added: (bytes, count) per unit and key."""
    keys = set(many) | set(one)
    return {k: ((many.get(k, (0, 0))[0] - one.get(k, (0, 0))[0]) / units,
                (many.get(k, (0, 0))[1] - one.get(k, (0, 0))[1]) / units) for k in keys}
