"""Measurement: the shared latency bucket layout and per-window aggregation of calls."""

from __future__ import annotations

from probes.measure.histogram import BUCKET_COUNT, Histogram, index_of
from probes.measure.window import WindowAggregator

__all__ = ["BUCKET_COUNT", "Histogram", "WindowAggregator", "index_of"]
