"""One writer per store: `skewprobe run` holds an exclusive lock beside the store file.

Two probes writing one store (a rolling update on a shared volume starts the new pod before
the old one stops) would each replace the other's windows, since a window's key is its
(start, path, cohort): the store would keep one probe's counts and silently lose the rest. So
the writer takes `flock(LOCK_EX | LOCK_NB)` on `<store>.lock` before opening the store, and a
second writer is refused with `StoreLocked` (exit 4), naming the holder.

- flock(2) on a file of its own, not on the database: SQLite takes POSIX record locks on the
  database, and closing any descriptor of a file drops all of a process's POSIX locks on it;
  flock locks are separate from those.
- The kernel releases the lock when the holder's process ends however it ends (`kill -9`,
  OOM kill), so a dead writer never blocks the next one; the file itself may stay behind
  and is reused. A writer that stops cleanly removes it.
- Readers (`verdict`, `report`, `inventory --store`, the API) never take it: SQLite's WAL lets
  them read while the writer writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket

from probes.errors import StoreError, StoreLocked

__all__ = ["LOCK_SUFFIX", "WriterLock"]

LOCK_SUFFIX = ".lock"


class WriterLock:
    """The exclusive writer lock of one store; `acquire` it, `release` it (idempotent)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, store_path: str) -> WriterLock:
        """Lock `store_path` for writing, or raise StoreLocked (another writer holds it)
        or StoreError (the lock file cannot be created)."""
        path = store_path + LOCK_SUFFIX
        while True:
            fd = _open(store_path, path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise StoreLocked(
                    f"{store_path}: another `skewprobe run` is writing this store"
                    f"{f' ({holder})' if holder else ''}: one writer per store; stop it first,"
                    " or give this probe its own --store"
                ) from None
            except OSError as exc:  # ENOLCK: a filesystem without locks
                os.close(fd)
                raise StoreError(f"{path}: cannot lock: {exc.strerror or exc}") from None
            # A writer that stopped between our open and our flock removed the file we
            # opened: a lock on it guards nothing, so lock the path's file as it is now.
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        return cls(path, fd)

    def release(self) -> None:
        """Remove the lock file and unlock (the kernel also unlocks when the process ends).
        Removed while still held, so no other writer can be holding the file removed."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _open(store_path: str, path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(
            f"{store_path}: cannot create the writer lock {path}: {exc.strerror or exc}"
        ) from None


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it ("pid 7 on probe-0"); empty if unknown."""
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace")
    except OSError:
        return ""
    return text.strip().splitlines()[0] if text.strip() else ""
