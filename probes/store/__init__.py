"""Where windows, events and inventory snapshots are kept: SQLite, the embedded default."""

from __future__ import annotations

from probes.store.records import Event, InventoryRow, InventorySnapshot
from probes.store.sqlite import DEFAULT_PATH, SCHEMA_VERSION, Store
from probes.store.table import WindowTable

__all__ = [
    "DEFAULT_PATH",
    "SCHEMA_VERSION",
    "Event",
    "InventoryRow",
    "InventorySnapshot",
    "Store",
    "WindowTable",
]
