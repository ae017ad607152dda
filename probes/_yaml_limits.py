"""Bounds on the YAML skewprobe reads from files: size, nesting depth and aliases.

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

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from probes.errors import ConfigError

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
    "read_bounded",
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
