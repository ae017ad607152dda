"""Reading what people write: durations (`250ms`, `2m`) and times (RFC 3339, relative
`-6h`, `now`) for configs, the command line, queries and the reference targets' profiles
alike; and the YAML skewprobe reads from files, within bounds on its size, nesting depth and
aliases.

PyYAML composes a document into nodes before building objects, and an alias is only a
pointer to a node already composed, so composing costs the text's length. What costs is
everything after it that walks the document as a tree (construction with `deep=True`, the
duplicate-key check, jsonschema): a few hundred bytes of anchors, each used nine times by the
next, is a tree of 9⁹ nodes, and 500 nested `[` exhaust Python's recursion limit. So
`BoundedSafeLoader` counts while it composes: each node's size as a tree (aliases counted
every time they are used), the nesting depth and the aliases, and stops with a
`YamlLimitError` (a `MarkedYAMLError`, so callers' YAML error handling places it on a line)
at the first node past a bound. `read_bounded` caps the bytes read before any parsing.

The events come from libyaml where PyYAML has it (six times as fast as its Python parser on
a long flow list, which is what makes a file at the size bound parse in well under a
second); composing stays in Python, where it can be counted.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from probes.errors import BadInput, ConfigError

try:
    from yaml._yaml import CParser as _Events
except ImportError:  # PyYAML built without libyaml: the same events, from Python
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Events(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)

__all__ = [
    "MAX_ALIASES",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "BoundedSafeLoader",
    "YamlLimitError",
    "parse_days",
    "parse_duration",
    "parse_time",
    "read_bounded",
    "rfc3339",
]

# A hand-written config is a few KB, a few hundred nodes, 8 levels deep at most; each bound
# is far above that, and the worst document within them is checked in a fraction of a
# second (128 KiB of a one-line list of junk: 0.3 s CPU, validated and refused).
MAX_BYTES = 128 << 10
MAX_DEPTH = 64
MAX_ALIASES = 1_000
MAX_NODES = 100_000


class YamlLimitError(yaml.MarkedYAMLError):
    """A document past one of the bounds; `problem` says which, `problem_mark` where."""


class BoundedSafeLoader(Composer, _Events, SafeConstructor, Resolver):
    """A `yaml.SafeLoader` (the same constructors and resolver) that refuses documents past
    MAX_DEPTH, MAX_ALIASES or MAX_NODES (`max_nodes` in a subclass for machine-written
    documents, larger than a hand-written config)."""

    max_nodes = MAX_NODES

    def __init__(self, stream: str) -> None:
        _Events.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._aliases = 0
        # Each finished node's size as a tree; an alias to a node not in here yet refers to
        # one of its own ancestors (a cycle, which would make every tree walk endless).
        self._tree_size: dict[int, int] = {}

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        # Called only with a node's event next; libyaml's marks are a class of its own, with
        # the same line and column.
        event: Any = self.peek_event()
        mark = event.start_mark
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlLimitError(problem=f"more than {MAX_ALIASES} aliases",
                                     problem_mark=mark)
            node = super().compose_node(parent, index)
            if node is not None and id(node) not in self._tree_size:
                raise YamlLimitError(problem="an alias inside the node it refers to (a cycle)",
                                     problem_mark=mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlLimitError(problem=f"nested more than {MAX_DEPTH} levels deep",
                                 problem_mark=mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is None:
            return None
        size = 1 + sum(self._tree_size[id(child)] for child in _children(node))
        if size > self.max_nodes:
            raise YamlLimitError(problem=f"more than {self.max_nodes} values once aliases are "
                                 "expanded", problem_mark=mark)
        self._tree_size[id(node)] = size
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def read_bounded(path: str | Path, what: str) -> str:
    """The UTF-8 text of the file at `path`, at most MAX_BYTES of it read; an unreadable or
    larger file is a one-line ConfigError naming `what` and the file."""
    file = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ConfigError(f"{what} is larger than {MAX_BYTES // 1024} KiB", file=file)
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read {what}: {reason}", file=file) from exc


_DURATION_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# An RFC 3339 time whose `+hh:mm` offset lost its sign to a space. Argo Rollouts puts a web
# metric's arguments into the URL unescaped, and a `+` in a query string decodes as a space,
# so `since=2026-12-02T09:30:00+01:00` arrives as `2026-12-02T09:30:00 01:00`. Only that
# one space, exactly where the sign belongs, is read as `+`; anything else stays an error.
_SPACED_OFFSET_RE = re.compile(
    r"^([0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?) ([0-9]{2}:[0-9]{2})$"
)


def parse_duration(text: str) -> float:
    """'250ms' → 0.25, '2m' → 120.0, '0' → 0.0 (seconds). Raises ValueError."""
    value = text.strip()
    if value == "0":
        return 0.0
    match = _DURATION_RE.match(value)
    if not match:
        raise ValueError(f"{text!r} is not a duration like 500ms, 1s, 2m, 1h")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


def parse_days(text: str) -> float:
    """`30d`, `12h`, `2.5d` → seconds: the plan's spans (pod ages, soaks) run to days."""
    value = text.strip()
    if value.endswith("d") and re.fullmatch(r"[0-9]+(?:\.[0-9]+)?d", value):
        return float(value[:-1]) * 86400.0
    try:
        return parse_duration(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration like 30d, 12h, 90m") from None


def parse_time(text: str, *, now: float) -> float:
    """Return epoch seconds for `text`.

    Accepted: `now`; a relative duration back from now (`-30m`, `30m`, `1.5h`); an RFC 3339
    timestamp (`2026-12-02T09:30:00Z`, with an offset or `Z`); epoch seconds. A `+hh:mm`
    offset may come with a space for its `+` (`2026-12-02T09:30:00 01:00`): an unescaped
    `+` in a URL's query, as Argo Rollouts sends its arguments, decodes as a space.
    """
    value = _SPACED_OFFSET_RE.sub(r"\1+\2", text.strip())
    if value == "now":
        return now
    relative = value[1:] if value.startswith("-") else value
    try:
        return _in_range(now - parse_duration(relative), text)
    except ValueError:
        pass
    try:
        return _in_range(float(value), text)
    except ValueError:
        pass
    not_a_time = BadInput(
        f"{text!r} is not a time: use RFC 3339 (2026-12-02T09:30:00Z), -30m, or now"
    )
    # fromisoformat skips whitespace before a zone (`09:30:00 -01:00`, `09:30:00 Z`); RFC 3339
    # has none there. A space may only separate the date from the time.
    if any(c.isspace() for i, c in enumerate(value) if (i, c) != (10, " ")):
        raise not_a_time
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise not_a_time from None
    if parsed.tzinfo is None:
        raise BadInput(f"{text!r} has no time zone: add Z or an offset like +01:00")
    return _in_range(parsed.timestamp(), text)


def _in_range(epoch: float, text: str) -> float:
    """`epoch` if it is a time `rfc3339` can print (years 1 to 9999), else BadInput:
    `nan`, `inf` or `1e300` would otherwise fail deep inside a verdict."""
    try:
        datetime.fromtimestamp(epoch, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise BadInput(
            f"{text!r} is out of range: use a time between the years 1 and 9999"
        ) from None
    return epoch


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z"
    )
