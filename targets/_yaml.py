"""YAML with line numbers, for the callee side's files (fault profiles, HAProxy versions).

Each mapping loads as a `LineMap` that remembers its own line and each key's, so every
validation error is a one-line `ConfigError` naming file, line and key; a duplicate key is
an error rather than PyYAML's silent last-one-wins. `LineParser` is the base of the
validators: `fail()` places a message, `mapping()` checks a mapping's keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from probes._parsing import BoundedSafeLoader, YamlLimitError, parse_duration, read_bounded
from probes.errors import ConfigError

__all__ = ["LineMap", "LineParser", "load_yaml", "read_yaml_file"]


class LineMap(dict[Any, Any]):
    """A YAML mapping that remembers its line and the line of each key."""

    line: int | None = None
    lines: dict[Any, int]


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int):
        super().__init__(key)
        self.key = key
        self.line = line


class _LineLoader(BoundedSafeLoader):
    pass


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> LineMap:
    loader.flatten_mapping(node)
    out = LineMap()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool) or key is None:
            key = str(key)
        line = key_node.start_mark.line + 1
        if key in out:
            raise _DuplicateKey(str(key), line)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = line
    return out


# The stubs allow only PyYAML's own loader classes here; this one is a SafeLoader in all but
# name (probes._parsing).
_LineLoader.add_constructor(  # type: ignore[type-var]
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)


def read_yaml_file(path: str | Path, what: str) -> tuple[str, str]:
    """(text, source name) of a file; an unreadable or oversized one is a ConfigError naming
    `what`."""
    return read_bounded(path, what), str(path)


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML into LineMaps; syntax errors and duplicate keys are ConfigErrors."""
    loader = _LineLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else None
        # Past a bound the YAML is valid, only too big for one of these files.
        what = (exc.problem or "") if isinstance(exc, YamlLimitError) else (
            f"invalid YAML: {exc.problem}")
        raise ConfigError(what, file=source, line=line) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", file=source) from exc
    except _DuplicateKey as exc:
        raise ConfigError("duplicate key", file=source, line=exc.line, key=exc.key) from exc
    finally:
        loader.dispose()


class LineParser:
    """Base of the validators: errors placed at a mapping's key, or at the mapping."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, message: str, key: str, where: Any = None, name: Any = None) -> ConfigError:
        line = None
        if isinstance(where, LineMap):
            line = where.lines.get(name, where.line) if name is not None else where.line
        return ConfigError(message, file=self.source, line=line, key=key)

    def duration(
        self, m: LineMap, name: str, key: str, *, required: bool = False, positive: bool = False
    ) -> float | None:
        """`m[name]` in seconds (`250ms`, `2m`, `0`), None when absent and not `required`."""
        if name not in m:
            if required:
                raise self.fail("missing (a duration such as 30s)", f"{key}.{name}", m)
            return None
        value = m[name]
        try:
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise ValueError(f"{value!r} is not a duration like 500ms, 1s, 2m, 1h")
            seconds = parse_duration(str(value))
        except ValueError as exc:
            raise self.fail(str(exc), f"{key}.{name}", m, name) from None
        if positive and seconds <= 0:
            raise self.fail("must be > 0", f"{key}.{name}", m, name)
        return seconds

    def mapping(self, value: Any, key: str, parent: Any, name: Any, allowed: set[str]) -> LineMap:
        """`value` as a LineMap whose keys are all in `allowed` (None is an empty mapping)."""
        if value is None:
            value = LineMap()
            value.lines = {}
        if not isinstance(value, dict):
            raise self.fail(f"must be a mapping, not {type(value).__name__}", key, parent, name)
        m = value if isinstance(value, LineMap) else LineMap(value)
        if not hasattr(m, "lines"):
            m.lines = {}
        for k in m:
            if k not in allowed:
                raise self.fail(
                    f"unknown key (allowed: {', '.join(sorted(allowed))})", f"{key}.{k}", m, k
                )
        return m
