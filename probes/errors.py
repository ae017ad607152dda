"""Every exception skewprobe raises, in one tree.

    SkewprobeError
    ├── BadInput              → exit 2: usage, config, unreadable file
    │   └── ConfigError       (names file, line and key)
    ├── StoreError            → exit 4: the store cannot be opened or read
    │   ├── StoreCorrupt
    │   └── StoreLocked       (another `skewprobe run` writes it)
    ├── SourceUnavailable     → exit 4: a data source (Prometheus, API) did not answer
    ├── DataMissing           → exit 3: the source answered, but without what is needed
    └── MachineBusy           → exit 5: `demo` only: too busy to show its result

Library errors (httpx, grpc, sqlite3, yaml) are translated at the edge where they are caught
(`raise ... from exc`), so callers only ever see these.
"""

from __future__ import annotations

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_BUSY",
    "EXIT_FAIL",
    "EXIT_INCONCLUSIVE",
    "EXIT_PASS",
    "EXIT_UNAVAILABLE",
    "BadInput",
    "ConfigError",
    "DataMissing",
    "MachineBusy",
    "SkewprobeError",
    "SourceUnavailable",
    "StoreCorrupt",
    "StoreError",
    "StoreLocked",
]

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2
EXIT_INCONCLUSIVE = 3
EXIT_UNAVAILABLE = 4
EXIT_BUSY = 5


class SkewprobeError(Exception):
    """Base of every skewprobe error; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_BAD_INPUT


class BadInput(SkewprobeError):
    exit_code = EXIT_BAD_INPUT


class ConfigError(BadInput):
    """A config that does not validate. The message names file, line and key."""

    def __init__(self, message: str, *, file: str = "", line: int | None = None, key: str = ""):
        self.file = file
        self.line = line
        self.key = key
        where = file
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        prefix = f"{where}: " if where else ""
        keypart = f"{key}: " if key else ""
        # One line whatever the YAML held: a key or value may contain line breaks.
        text = f"{prefix}{keypart}{message}"
        super().__init__(text.replace("\r", "\\r").replace("\n", "\\n"))


class StoreError(SkewprobeError):
    exit_code = EXIT_UNAVAILABLE


class StoreCorrupt(StoreError):
    pass


class StoreLocked(StoreError):
    """Another `skewprobe run` holds the store's writer lock."""


class SourceUnavailable(SkewprobeError):
    exit_code = EXIT_UNAVAILABLE


class DataMissing(SkewprobeError):
    """The data source answered but lacks a fact the answer needs (a control-plane version):
    inconclusive, never planned around."""

    exit_code = EXIT_INCONCLUSIVE


class MachineBusy(SkewprobeError):
    """`skewprobe demo` could not show its result: the probe was overloaded by the machine
    (not by its own paths), so the windows that would show it were left out."""

    exit_code = EXIT_BUSY
