"""The test process's own peak resident memory over a block, from /proc/self/status.

Python's allocators keep freed memory, so the RSS after a block says little; the kernel's
high-water mark (VmHWM), reset at the start through /proc/self/clear_refs, says how high the
block drove it. Linux only: elsewhere the test skips.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import TracebackType

import pytest

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    assert match is not None, field
    return int(match.group(1))


class PeakRss:
    """`with PeakRss() as rss: ...`, then `rss.growth_mib`: the peak RSS during the block
    above the RSS at its start."""

    def __init__(self) -> None:
        self.start_kib = 0
        self.peak_kib = 0

    def __enter__(self) -> PeakRss:
        try:
            _CLEAR_REFS.write_text("5")  # reset VmHWM to the current RSS
        except OSError as exc:
            pytest.skip(f"cannot reset the peak RSS of this process: {exc}")
        self.start_kib = _kib("VmRSS")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.peak_kib = _kib("VmHWM")

    @property
    def growth_mib(self) -> float:
        return (self.peak_kib - self.start_kib) / 1024
