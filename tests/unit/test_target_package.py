"""The `targets` package's public names are exactly its `__all__`, resolved lazily."""

from __future__ import annotations

import pytest

import targets
from targets import fleet, profile, server


def test_all_names_resolve_to_their_modules() -> None:
    assert sorted(targets.__all__) == targets.__all__
    homes = {**vars(fleet), **vars(profile), **vars(server)}
    for name in targets.__all__:
        assert getattr(targets, name) is homes[name]
    assert set(targets.__all__) <= set(dir(targets))
    with pytest.raises(AttributeError):
        _ = targets.nothing_here  # type: ignore[attr-defined]
