"""Where windows, events and inventory snapshots are kept: SQLite, the embedded default."""

from __future__ import annotations

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
    "PRESENT_EVENT",
    "RESTART_EVENT",
    "SCHEMA_VERSION",
    "SETTINGS_EVENT",
    "Event",
    "InventoryRow",
    "InventorySnapshot",
    "Store",
    "WindowTable",
]
