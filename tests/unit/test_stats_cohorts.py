"""probes.stats.cohorts: version ordering and the choice of baseline and canary."""

from __future__ import annotations

import pytest

from probes.stats.cohorts import pick_cohorts, version_key


def test_versions_order_numerically_not_as_strings() -> None:
    names = ["1.21.0", "1.9.0", "1.20.3", "v1.10", "1.21.0-rc.1", "1.21.0-rc.10", "1.21.0-beta"]
    ordered = sorted(names, key=lambda n: version_key(n) or ((), 0, ()))
    assert ordered == [
        "1.9.0", "v1.10", "1.20.3", "1.21.0-beta", "1.21.0-rc.1", "1.21.0-rc.10", "1.21.0",
    ]


@pytest.mark.parametrize("name", ["none", "", "unknown", "latest", "1.2.x", "sidecar-less"])
def test_non_versions_have_no_key(name: str) -> None:
    assert version_key(name) is None


def test_prefixed_and_build_metadata_versions() -> None:
    assert version_key("stable-2.14.10") == version_key("2.14.10")
    assert version_key("1.21.0+build.7") == version_key("1.21.0")
    assert version_key("1.21") == version_key("1.21.0")


def test_oldest_is_baseline_newest_is_canary_and_non_versions_are_skipped() -> None:
    choice = pick_cohorts(["1.21.0", "none", "1.9.0", "1.20.3"])
    assert (choice.baseline, choice.canary) == ("1.9.0", "1.21.0")
    text = " ".join(choice.reasons)
    assert "'none'" in text and "not version names" in text
    assert "1.20.3" in text  # the middle version is named as not compared


def test_named_cohorts_win_and_the_other_side_is_picked_relative_to_them() -> None:
    assert pick_cohorts(["1.20.3", "1.21.0", "1.22.0"], canary="1.21.0").baseline == "1.20.3"
    assert pick_cohorts(["1.20.3", "1.21.0", "1.22.0"], baseline="1.21.0").canary == "1.22.0"
    named = pick_cohorts(["1.20.3"], baseline="none", canary="1.20.3")
    assert (named.baseline, named.canary) == ("none", "1.20.3")


def test_one_version_or_none_gives_no_pair_with_a_reason() -> None:
    one = pick_cohorts(["1.21.0", "none"])
    assert one.canary is None or one.baseline is None
    assert any("need two proxy versions" in r for r in one.reasons)
    empty = pick_cohorts([])
    assert (empty.baseline, empty.canary) == (None, None)
