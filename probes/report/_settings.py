"""The verdict parameters a report replays with (light: the CLI imports it at start-up)."""

from __future__ import annotations

from dataclasses import dataclass

from probes.spec import (
    DEFAULT_ALPHA,
    DEFAULT_ATTEMPTS_MAX,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_WARMUP_S,
    Tolerances,
)

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """As `probes.verdict.service.JudgingSettings`, less what a replay does not use."""

    tolerances: Tolerances = Tolerances()
    alpha: float = DEFAULT_ALPHA
    min_samples: int = DEFAULT_MIN_SAMPLES
    attempts_max: int = DEFAULT_ATTEMPTS_MAX
    warmup_s: float = DEFAULT_WARMUP_S
    origin: str = "defaults"  # where they came from: "config", "store" or "defaults"
