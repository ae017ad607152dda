"""Printing a command's output when its reader may go away (`skewprobe verdict | head -1`)."""

from __future__ import annotations

import os
import sys


def emit(text: str) -> None:
    """Print `text` to stdout. When the reader went away, the rest of the output goes
    nowhere and the command still ends with its own exit code: a verdict (or a skew check)
    does not change because nobody read all of it."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        quiet_stdout()


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so neither a later print nor the flush at exit raises
    BrokenPipeError again (Python's docs, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (embedded, captured)
        pass
