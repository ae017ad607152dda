"""The verdict's settings kept in the store: `run` records how it judges, so `skewprobe
verdict --store` and `report` judge the same way without the run's config.

`run` writes a `settings` event when it opens the store: detail {"version": 1, "alpha",
"min_samples", "window_s", "warmup_s", "tolerances": {...}, "cohort": {"by", "baseline",
"canary"}}. The latest such event at or before the time judged wins (a probe restarted
with another config judges from then on by it). Readers take the keys they know and the
defaults for the rest, so a later version that adds keys still reads here; a store without
the event (written before it existed) is judged with the built-in defaults, as before.

Which settings were used is said: `resolve` returns where they came from ("config",
"store", "defaults"), which `settings_json` puts in the verdict JSON under `settings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from probes._parsing import rfc3339
from probes.errors import StoreCorrupt
from probes.spec import CohortSpec, JudgingSettings, Tolerances
from probes.store import SETTINGS_EVENT, Event, Store

__all__ = ["SETTINGS_EVENT", "SETTINGS_VERSION", "Resolved", "load_judging_config", "resolve",
           "settings_event", "settings_json", "stored_settings"]

SETTINGS_VERSION = 1


def load_judging_config(path: str | None) -> JudgingSettings:
    """The judging settings of the config file at `path` (None: the built-in defaults)."""
    if path is None:
        return JudgingSettings()
    # Imported here: the config's validation (jsonschema, yaml) is a tenth of a second
    # of `verdict --store`'s start, which reads the settings the store recorded.
    from probes.config import load_config

    return load_config(path).judging


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """The settings a verdict judges with, and where they came from (`origin`: "config",
    "store" or "defaults"; `at`: when the run wrote them, for "store")."""

    settings: JudgingSettings
    origin: str
    at: float | None = None

    def note(self) -> str:
        """One line for stderr saying which settings were used."""
        if self.origin == "store" and self.at is not None:
            return (f"verdict settings from the store, as `skewprobe run` recorded them at "
                    f"{rfc3339(self.at)} (--config to judge otherwise)")
        return f"verdict settings from the {self.origin}"


def _detail(settings: JudgingSettings) -> dict[str, Any]:
    return {
        "version": SETTINGS_VERSION,
        "alpha": settings.alpha,
        "min_samples": settings.min_samples,
        "window_s": settings.window_s,
        "warmup_s": settings.warmup_s,
        "tolerances": dataclasses.asdict(settings.tolerances),
        "cohort": dataclasses.asdict(settings.cohort),
    }


def settings_event(settings: JudgingSettings, at: float) -> Event:
    """The event `run` writes: how its verdicts judge from `at` on."""
    return Event(SETTINGS_EVENT, at, detail=_detail(settings))


def _from_detail(detail: Mapping[str, Any], where: str) -> JudgingSettings:
    """The settings of a stored event: known keys read, the others left at their defaults."""
    try:
        tol = {f.name: float(detail["tolerances"][f.name])
               for f in dataclasses.fields(Tolerances) if f.name in detail.get("tolerances", {})}
        coh = {f.name: detail["cohort"][f.name]
               for f in dataclasses.fields(CohortSpec) if f.name in detail.get("cohort", {})}
        top: dict[str, Any] = {k: cast(detail[k]) for k, cast in (
            ("alpha", float), ("min_samples", int), ("window_s", float), ("warmup_s", float))
            if k in detail}
        return JudgingSettings(tolerances=Tolerances(**tol), cohort=CohortSpec(**coh), **top)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise StoreCorrupt(f"{where}: malformed verdict settings event ({exc})") from exc


def stored_settings(store: Store, at: float) -> tuple[JudgingSettings, float] | None:
    """The settings the latest run recorded at or before `at`, and when (None: none)."""
    events = store.read_events(until=at + 1e-6, kinds=[SETTINGS_EVENT])
    if not events:
        return None
    last = events[-1]
    return _from_detail(last.detail, store.path), last.at


def resolve(config: str | None, store_path: str | None, at: float) -> Resolved:
    """The settings to judge with at `at`: the `config` file's if given, else those the
    store at `store_path` recorded, else the built-in defaults."""
    if config is not None:
        return Resolved(load_judging_config(config), "config")
    if store_path is not None:
        with Store.open(store_path, readonly=True) as store:
            found = stored_settings(store, at)
        if found is not None:
            return Resolved(found[0], "store", found[1])
    return Resolved(JudgingSettings(), "defaults")


def settings_json(resolved: Resolved) -> dict[str, Any]:
    """The verdict JSON's `settings`: where they came from, and what they were."""
    detail = _detail(resolved.settings)
    del detail["version"]
    return {"from": resolved.origin,
            **({"recorded_at": rfc3339(resolved.at)} if resolved.at is not None else {}),
            **detail}
