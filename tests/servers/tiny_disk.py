"""A command run with a tiny private tmpfs mounted at a folder: a disk that really fills.

`unshare --mount` gives the command its own mount namespace, so the tmpfs is gone with it
and nothing of the host's mounts changes; it needs root (or user namespaces). Where it
cannot be mounted the test is skipped, with why.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

__all__ = ["on_tiny_disk"]


def on_tiny_disk(mnt: Path, size_kib: int, argv: Sequence[str], *, after: str = "",
                 timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `argv` with a `size_kib` KiB tmpfs mounted at `mnt` (made if missing); `after`:
    a shell line run once it ends, on the same mount (its output follows the command's);
    the command's exit code is the result's."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed, so no private tmpfs can be mounted")
    mnt.mkdir(exist_ok=True)
    script = (f'mount -t tmpfs -o size={size_kib}k tmpfs "$1" || exit 97; shift; '
              f'"$@"; rc=$?; {after or ":"}; exit $rc')
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", str(mnt), *argv],
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode == 97 or (proc.returncode != 0 and "unshare:" in proc.stderr):
        pytest.skip(f"cannot mount a private tmpfs here: {proc.stderr.strip()[:200]}")
    return proc
