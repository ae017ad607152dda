"""Long-lived streams, analysed: reconnect storms, the lifetime check, and the recorder.

    StreamRecorder        the StreamSink the prober reports to: windows (opens, stream
                          time, resets), metrics, storm detection, the lifetime log
    StormDetector         online reset clustering per path x cohort → Storm → store Event
    find_storms           the same, as a pure function over reset times
    find_cap              is a maximum stream lifetime in effect? (pure)
    lifetime_report       cap + "upgrading now resets N streams aged > 1 h" per path x cohort

The prober itself (`StreamProber`) and the end reasons (`EndReason`) live in
`probes.clients`, at the wire's edge.
"""

from __future__ import annotations

from probes.streams.lifetime import CapFinding, Lifetime, LifetimeReport, find_cap, lifetime_report
from probes.streams.recorder import StreamRecorder
from probes.streams.storm import (
    STORM_EVENT,
    ResetMark,
    Storm,
    StormDetector,
    StormParams,
    find_storms,
)

__all__ = [
    "STORM_EVENT",
    "CapFinding",
    "Lifetime",
    "LifetimeReport",
    "ResetMark",
    "Storm",
    "StormDetector",
    "StormParams",
    "StreamRecorder",
    "find_cap",
    "find_storms",
    "lifetime_report",
]
