"""The callee side of skewprobe: what the probe calls in demos and tests, and what a platform
deploys inside the mesh as its canary callee.

- `targets.server.TargetServer`: one reference-target pod (HTTP/1.1 + h2c, gRPC `Target`
  and health) emulating a sidecar proxy version, with faults from `targets.profile`.
- `targets.fleet.Fleet`: many pods on loopback addresses, an endpoints file for discovery,
  and a simulated rollout that really restarts listeners; its sidecars emulated, or real
  HAProxy processes (`targets.haproxy`), and with a relay allowlist every pod a relay pod
  whose outbound side is its version's: emulated, or in HAProxy mode a real outbound HAProxy
  per version (`targets.haproxy_outbound`) whose server list follows the emulated control
  plane (`targets.meshview`).

Names are re-exported lazily, so `python -m targets.server` / `targets.fleet` run their
module once (an eager import here would load it twice, with a runpy warning).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from targets.fleet import EventKind, Fleet, FleetEvent, PodEndpoint
    from targets.profile import (
        Faults,
        HeaderRules,
        Latency,
        OutboundPolicy,
        ProfileSet,
        RetryPolicy,
        VersionProfile,
        load_profiles,
        parse_profiles,
    )
    from targets.server import TargetServer

_HOME = {
    "EventKind": "targets.fleet",
    "Faults": "targets.profile",
    "Fleet": "targets.fleet",
    "FleetEvent": "targets.fleet",
    "HeaderRules": "targets.profile",
    "Latency": "targets.profile",
    "OutboundPolicy": "targets.profile",
    "PodEndpoint": "targets.fleet",
    "ProfileSet": "targets.profile",
    "RetryPolicy": "targets.profile",
    "TargetServer": "targets.server",
    "VersionProfile": "targets.profile",
    "load_profiles": "targets.profile",
    "parse_profiles": "targets.profile",
}

__all__ = [
    "EventKind",
    "Faults",
    "Fleet",
    "FleetEvent",
    "HeaderRules",
    "Latency",
    "OutboundPolicy",
    "PodEndpoint",
    "ProfileSet",
    "RetryPolicy",
    "TargetServer",
    "VersionProfile",
    "load_profiles",
    "parse_profiles",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'targets' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
