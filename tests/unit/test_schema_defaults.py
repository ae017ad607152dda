"""The JSON Schema's `default`s say what a key left out becomes, and nothing else.

Each default is written into a config that leaves it out; the parsed config must not
change. So a default typed into the schema by hand, or a dataclass default changed
without the schema, fails here.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml

from probes._schema import SCHEMA
from probes.config import parse_config
from probes.spec import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_SAMPLES,
    Config,
    JudgingSettings,
    Tolerances,
)

# One path of each kind, so each kind's keys have a place to go.
BASE: dict[str, Any] = {
    "targets": {"static": [{"address": "127.0.0.1:8080"}], "kubernetes": {"mesh": "istio"}},
    "prometheus": {"url": "http://127.0.0.1:9090"},
    "paths": [
        {"name": "h", "http": {}},
        {"name": "g", "grpc": {}},
        {"name": "s", "stream": {}},
        {"name": "r", "relay": {"destination": "d"}},
    ],
}
_PATH_OF_KIND = {"http": 0, "grpc": 1, "stream": 2, "relay": 3}


def defaults(schema: Mapping[str, Any], where: tuple[str, ...] = ()
             ) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, default) for every key of the schema that has one; "*" for a list item."""
    for key, sub in schema.get("properties", {}).items():
        if "default" in sub:
            yield (*where, key), sub["default"]
        yield from defaults(sub, (*where, key))
        if "items" in sub:
            yield from defaults(sub["items"], (*where, key, "*"))


def with_key(where: tuple[str, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    node: Any = data
    for i, key in enumerate(where[:-1]):
        # A list item: the path of the kind whose key follows ("*" then "http": paths[0]).
        node = node[_PATH_OF_KIND.get(where[i + 1], 0)] if key == "*" else node.setdefault(key, {})
    node[where[-1]] = value
    return data


DEFAULTS = list(defaults(SCHEMA))
PLAIN = parse_config(yaml.safe_dump(BASE))


@pytest.mark.parametrize(("where", "value"), DEFAULTS, ids=[".".join(w) for w, _ in DEFAULTS])
def test_writing_a_schema_default_changes_nothing(where: tuple[str, ...], value: Any) -> None:
    written = parse_config(yaml.safe_dump(with_key(where, value)))
    assert written == PLAIN


def test_a_wrong_default_would_be_caught() -> None:
    # The check above compares the parsed configs: a different value does change them.
    assert parse_config(yaml.safe_dump(with_key(("verdict", "alpha"), 0.02))) != PLAIN
    assert parse_config(yaml.safe_dump(with_key(("window",), "11s"))) != PLAIN


def test_the_judging_keys_carry_the_judging_settings_defaults() -> None:
    found = {".".join(w): v for w, v in DEFAULTS}
    assert found["verdict.alpha"] == DEFAULT_ALPHA == JudgingSettings().alpha
    assert found["verdict.min_samples"] == DEFAULT_MIN_SAMPLES
    assert found["verdict.warmup"] == "2m" and found["window"] == "10s"
    tolerances = {f.name for f in dataclasses.fields(Tolerances)}
    assert {k.rpartition(".")[2] for k in found if k.startswith("verdict.tolerances.")} \
        == tolerances
    assert PLAIN.judging == JudgingSettings() and Config().judging == JudgingSettings()
    # Every default of the top-level settings has its key in the schema.
    for key in ("source", "listen", "store.path", "probe.max_in_flight", "probe.max_rate",
                "probe.cohort_balance_max", "inventory.snapshot_every", "cohort.by",
                "paths.*.rate", "paths.*.timeout", "prometheus.timeout", "plan.soak"):
        assert key in found, key
