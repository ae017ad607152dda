"""Where windows, events and inventory snapshots are kept: SQLite, the embedded default."""

from __future__ import annotations

from probes.store._strata import HOUR_S, ROLLUP_S
from probes.store.records import (
    APPEARED_EVENT,
    BOOKKEEPING_EVENTS,
    PRESENT_EVENT,
    RESTART_EVENT,
    SETTINGS_EVENT,
    Event,
    InventoryRow,
    InventorySnapshot,
)
from probes.store.sqlite import DEFAULT_PATH, SCHEMA_VERSION, Store
from probes.store.table import WindowTable

__all__ = [
    "APPEARED_EVENT",
    "BOOKKEEPING_EVENTS",
    "DEFAULT_PATH",
    "HOUR_S",
    "PRESENT_EVENT",
    "RESTART_EVENT",
    "ROLLUP_S",
    "SCHEMA_VERSION",
    "SETTINGS_EVENT",
    "Event",
    "InventoryRow",
    "InventorySnapshot",
    "Store",
    "WindowTable",
]
