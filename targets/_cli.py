"""What the targets' commands (`python -m targets.server`, `python -m targets.fleet`) share:
run the command's coroutine, and say a SkewprobeError in one line with its exit code."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from probes.errors import SkewprobeError

__all__ = ["exit_with", "run_command"]


def run_command(name: str, command: Coroutine[Any, Any, None]) -> int:
    """Run `command`; 0 when it ends, or a SkewprobeError's exit code after one line on
    stderr naming the command (never a traceback for bad input or a busy port)."""
    try:
        asyncio.run(command)
    except SkewprobeError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def exit_with(main: Callable[[], int]) -> NoReturn:
    """`sys.exit(main())`, with ^C ending quietly (the command's own shutdown has run)."""
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
