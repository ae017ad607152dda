"""SIGTERM and SIGINT stop `skewprobe run`: both set its `stopping` event, and the handlers
are taken off again when the run ends."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

__all__ = ["stop_on_signals"]


def stop_on_signals(stopping: asyncio.Event) -> Callable[[], None]:
    """Set `stopping` on SIGTERM or SIGINT; returns what restores the loop's handlers."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stopping.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return restore
