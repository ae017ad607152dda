"""The verdict parameters a report replays with (light: the CLI imports it at start-up)."""

from __future__ import annotations

from dataclasses import dataclass

from probes._spec import Tolerances

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """As `probes.verdict_service.JudgingSettings`, less what a replay does not use."""

    tolerances: Tolerances = Tolerances()
    alpha: float = 0.01
    min_samples: int = 100
    attempts_max: int = 5
