"""A one-shot timer that wakes the event loop at an absolute loop time, to the microsecond.

Why: `loop.call_at` wakes late by up to a millisecond, because asyncio's selector rounds
every wait up to whole milliseconds (epoll_wait's unit). The engine measures latency from
the intended send time, so that lateness would be in every latency it reports. On Linux a
`timerfd` on CLOCK_MONOTONIC (the clock of `time.monotonic`, hence of `loop.time()`), armed
with an absolute deadline in nanoseconds and watched with `loop.add_reader`, makes epoll
return when the deadline passes. `os.timerfd_create` where Python has it (3.13+), else libc
through ctypes; `loop.call_at` where neither works (not Linux, or a loop whose clock is not
`time.monotonic` or that cannot watch file descriptors).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["Backend", "PreciseTimer", "available_backends"]

log = logging.getLogger("skewprobe.engine")

Backend = Literal["timerfd-os", "timerfd-ctypes", "call_at"]

_DESCRIPTIONS: dict[Backend, str] = {
    "timerfd-os": "timerfd (os.timerfd_create): wakes at the intended time",
    "timerfd-ctypes": "timerfd (libc via ctypes): wakes at the intended time",
    "call_at": "loop.call_at: wakes up to 1 ms late (no timerfd here)",
}

_TFD_TIMER_ABSTIME = 1  # <sys/timerfd.h>; TFD_NONBLOCK and TFD_CLOEXEC are O_NONBLOCK/O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _LibcTimerfd:
    """`timerfd_create` / `timerfd_settime` from libc (Python < 3.13 has no os wrapper)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self._create = libc.timerfd_create
        self._create.argtypes = [ctypes.c_int, ctypes.c_int]
        self._create.restype = ctypes.c_int
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                  ctypes.c_void_p]
        self._settime.restype = ctypes.c_int
        self._spec = _Itimerspec()

    def create(self) -> int:
        fd = int(self._create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        return fd

    def settime_abs_ns(self, fd: int, deadline_ns: int) -> None:
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(deadline_ns, 1_000_000_000)
        if self._settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")


class _OsTimerfd:
    """`os.timerfd_create` / `os.timerfd_settime_ns` (Python 3.13+)."""

    def __init__(self) -> None:
        # getattr: the type stubs for 3.11 do not have them.
        self._create: Callable[..., int] = getattr(os, "timerfd_create")  # noqa: B009
        self._settime_ns: Callable[..., Any] = getattr(os, "timerfd_settime_ns")  # noqa: B009
        self._nonblock_cloexec: int = getattr(os, "TFD_NONBLOCK") | getattr(os, "TFD_CLOEXEC")  # noqa: B009
        self._abstime: int = getattr(os, "TFD_TIMER_ABSTIME")  # noqa: B009

    def create(self) -> int:
        return self._create(time.CLOCK_MONOTONIC, flags=self._nonblock_cloexec)

    def settime_abs_ns(self, fd: int, deadline_ns: int) -> None:
        self._settime_ns(fd, flags=self._abstime, initial=deadline_ns)


def available_backends() -> tuple[Backend, ...]:
    """The backends this platform may offer, most precise first (`call_at` is always last)."""
    found: list[Backend] = []
    if sys.platform.startswith("linux"):
        if hasattr(os, "timerfd_create"):
            found.append("timerfd-os")
        found.append("timerfd-ctypes")
    found.append("call_at")
    return tuple(found)


def _loop_clock_is_monotonic(loop: asyncio.AbstractEventLoop) -> bool:
    # The deadline is given to the kernel on CLOCK_MONOTONIC: only right if the loop's clock
    # is time.monotonic (asyncio's own loops; not a test loop with a virtual clock).
    return getattr(type(loop), "time", None) is asyncio.BaseEventLoop.time


class PreciseTimer:
    """Calls `callback` once, at or after the loop time last given to `arm`, never before.

    Re-arming replaces the deadline (earlier or later); `cancel` disarms; `close` releases
    the file descriptor. `backend=None` takes the most precise one that works here.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        callback: Callable[[], None],
        *,
        backend: Backend | None = None,
    ) -> None:
        self.loop = loop
        self._callback = callback
        self._deadline: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._fd = -1
        self._fd_armed = False
        self._timerfd: _OsTimerfd | _LibcTimerfd | None = None
        self.closed = False
        tried = available_backends() if backend is None else (backend,)
        errors: list[str] = []
        for candidate in tried:
            try:
                self._open(candidate)
            except (OSError, AttributeError, NotImplementedError, RuntimeError) as exc:
                errors.append(f"{candidate}: {exc}")
                self._release_fd()
                self._timerfd = None
                continue
            self.backend: Backend = candidate
            break
        else:
            raise RuntimeError(f"no timer backend works here ({'; '.join(errors)})")
        if errors and sys.platform.startswith("linux"):
            log.warning("schedule timer: %s (%s)", _DESCRIPTIONS[self.backend],
                        "; ".join(errors))
        else:
            log.info("schedule timer: %s", _DESCRIPTIONS[self.backend])

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self.backend]

    @property
    def deadline(self) -> float | None:
        """The loop time the timer is armed for (None: disarmed)."""
        return self._deadline

    def _open(self, backend: Backend) -> None:
        if backend == "call_at":
            return
        if not _loop_clock_is_monotonic(self.loop):
            raise RuntimeError("the loop's clock is not time.monotonic")
        self._timerfd = _OsTimerfd() if backend == "timerfd-os" else _LibcTimerfd()
        self._fd = self._timerfd.create()
        # Raises NotImplementedError on loops that cannot watch descriptors (Windows' proactor).
        self.loop.add_reader(self._fd, self._on_readable)

    def arm(self, when: float, *, coarse: bool = False) -> None:
        """Fire at loop time `when` (at once if it has passed), replacing any deadline.

        `coarse=True` takes `call_at` even where a timerfd is open: up to 1 ms late, but
        it needs no system call and shares the wakes the loop makes anyway, which is what
        a caller firing more often than every millisecond wants.
        """
        if self.closed:
            raise RuntimeError("timer is closed")
        self._deadline = when
        if coarse or self._timerfd is None:
            self._disarm_fd()
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self.loop.call_at(when, self._on_call_at)
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        # Rounded up to the nanosecond (never before `when`); 0 would disarm, so at least 1.
        self._timerfd.settime_abs_ns(self._fd, max(1, math.ceil(when * 1e9)))
        self._fd_armed = True

    def _disarm_fd(self) -> None:
        if self._fd_armed and self._timerfd is not None:
            self._timerfd.settime_abs_ns(self._fd, 0)
            self._fd_armed = False

    def cancel(self) -> None:
        """Disarm (the callback is not called until the next `arm`)."""
        self._deadline = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self.closed:
            self._disarm_fd()

    def close(self) -> None:
        """Disarm and release the descriptor; idempotent."""
        if self.closed:
            return
        self.cancel()
        self.closed = True
        self._release_fd()

    def _release_fd(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        if not self.loop.is_closed():
            # NotImplementedError: never registered, the loop cannot watch descriptors.
            with contextlib.suppress(NotImplementedError):
                self.loop.remove_reader(fd)
        os.close(fd)

    def _on_call_at(self) -> None:
        self._handle = None
        deadline = self._deadline
        if deadline is None:
            return
        if self.loop.time() < deadline:
            # asyncio runs a handle up to its clock's resolution (1 ns) early.
            self._handle = self.loop.call_at(deadline, self._on_call_at)
            return
        self._deadline = None
        self._callback()

    def _on_readable(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiration count; reading clears readiness
        except BlockingIOError:
            return  # re-armed or cancelled after epoll saw it expire: nothing is due
        self._fd_armed = False  # one-shot: spent
        deadline = self._deadline
        if deadline is None:
            return
        if self.loop.time() < deadline:
            # The clock read as a float can sit a few ns short of a deadline the kernel has
            # passed: wait for it rather than ever call back early.
            self._timerfd.settime_abs_ns(self._fd, math.ceil(deadline * 1e9) + 1)  # type: ignore[union-attr]
            self._fd_armed = True
            return
        self._deadline = None
        self._callback()
