"""Fault profiles: the shipped examples, route merging, and one clear error per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes._parsing import parse_duration
from probes.errors import ConfigError
from targets.profile import Faults, load_profiles, parse_profiles
from tests.integration.test_config import alias_bomb

EXAMPLES = Path(__file__).resolve().parents[2] / "targets" / "examples"


def test_example_regresses_checkout_only() -> None:
    profiles = load_profiles(EXAMPLES / "profiles.yaml")
    base, canary = profiles.profile("1.20.3"), profiles.profile("1.21.0")
    assert base.faults_for("/api/checkout") == Faults()
    assert base.attempt_count_header and canary.attempt_count_header
    checkout = canary.faults_for("/api/checkout")
    assert checkout.error_rate == pytest.approx(0.01)
    assert checkout.transient_error_rate == 1.0
    assert checkout.retries.num_retries == 1 and checkout.retries.retry_on == {503}
    for route in ("/api/catalog", "/", "/skewprobe.target.v1.Target/Echo"):
        assert canary.faults_for(route) == base.faults_for(route) == Faults()


def test_outbound_policy_is_the_callers_side_and_absent_unless_given() -> None:
    profiles = parse_profiles(
        'versions:\n  "a": {}\n  "b":\n    outbound:\n      retries: {num_retries: 2}\n'
        '  "c":\n    outbound: {attempt_count_header: false}\n')
    assert profiles.profile("a").outbound is None
    b = profiles.profile("b").outbound
    assert b is not None and b.attempt_count_header
    assert (b.retries.num_retries, b.retries.retry_on) == (2, {503})
    c = profiles.profile("c").outbound
    assert c is not None and not c.attempt_count_header and c.retries.num_retries == 0


def test_example_reference_version_parses_every_knob() -> None:
    ref = load_profiles(EXAMPLES / "profiles.yaml").profile("1.22.0-example")
    assert ref.max_connection_age_s == 300 and ref.max_connection_age_grace_s == 10
    sub = ref.faults_for("/skewprobe.target.v1.Target/Subscribe")
    assert sub.max_stream_duration_s == 60 and sub.stream_reset_code == "INTERNAL"
    # a route inherits the defaults' keys it does not set
    assert sub.latency.fixed_s == pytest.approx(0.002)
    assert sub.headers.rename["x-request-id"] == "x-trace-id"
    catalog = ref.faults_for("/api/catalog")
    assert catalog.retries.retry_on == {502, 503, 504}
    assert catalog.retries.backoff_s == pytest.approx(0.025)


def test_route_keys_replace_defaults_keys() -> None:
    profiles = parse_profiles(
        """
versions:
  "2.0":
    defaults: {error_rate: 0.5, latency: {fixed: 10ms}}
    routes:
      /a: {error_rate: 0.1}
"""
    )
    v = profiles.profile("2.0")
    assert v.faults_for("/a").error_rate == pytest.approx(0.1)
    assert v.faults_for("/a").latency.fixed_s == pytest.approx(0.01)
    assert v.faults_for("/b").error_rate == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        ('versions:\n  "1.0":\n    eror_rate: 0.1\n', 3, "versions['1.0'].eror_rate",
         "unknown key"),
        ("versions:\n  1.2: {}\n", 2, "versions[1.2]", "quoted string"),
        ('versions:\n  "1":\n    defaults: {error_rate: 1.5}\n', 3,
         "versions['1'].defaults.error_rate", "between 0 and 1"),
        ('versions:\n  "1":\n    defaults:\n      latency: {fixed: 20}\n', 4,
         "versions['1'].defaults.latency.fixed", "not a duration"),
        ('versions:\n  "1":\n    routes:\n      api: {}\n', 4,
         "versions['1'].routes['api']", "starting with /"),
        ('versions:\n  "1":\n    routes:\n      /a:\n        retries: {num_retries: -1}\n', 5,
         "versions['1'].routes['/a'].retries.num_retries", "0-10"),
        ('versions:\n  "1":\n    defaults:\n      headers: {remove: ["bad header"]}\n', 4,
         "versions['1'].defaults.headers.remove", "not a valid header name"),
        ('versions:\n  "1":\n    defaults:\n      latency: {tail_probability: 0.1}\n', 4,
         "versions['1'].defaults.latency.tail", "needs a tail"),
        ('versions:\n  "1":\n    defaults:\n      max_stream_duration: {after: 1s, code: NOPE}\n',
         4, "versions['1'].defaults.max_stream_duration.code", "gRPC status code"),
        ('versions:\n  "1":\n    attempt_count_header: yes please\n', 3,
         "versions['1'].attempt_count_header", "true or false"),
        ('versions:\n  "1": {}\n  "1": {}\n', 3, "1", "duplicate"),
        ('versions:\n  "1":\n    outbound: {retry: 1}\n', 3, "versions['1'].outbound.retry",
         "unknown key"),
        ('versions:\n  "1":\n    outbound:\n      retries: {retry_on: [200]}\n', 4,
         "versions['1'].outbound.retries.retry_on", "400-599"),
        ("versions: [1, 2]\n", 1, "versions", "non-empty mapping"),
        ("other: {}\n", 1, "(top level).other", "unknown key"),
    ],
)
def test_errors_name_file_line_and_key(text: str, line: int, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_profiles(text, source="p.yaml")
    err = info.value
    assert (err.file, err.line, err.key) == ("p.yaml", line, key)
    assert words in str(err)
    assert str(err).startswith(f"p.yaml:{line}: {key}: ")
    assert "\n" not in str(err)


def test_invalid_yaml_and_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^p\.yaml:3: invalid YAML"):
        parse_profiles("versions:\n  a: [1,\n", source="p.yaml")
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read profile file") as info:
        load_profiles(missing)
    assert info.value.file == str(missing)


def test_profiles_are_read_within_the_config_bounds(tmp_path: Path) -> None:
    # The callee side's files go through the same bounded loader as the probe's config.
    with pytest.raises(ConfigError, match=r"^p\.yaml:6: more than 100000 values"):
        parse_profiles(alias_bomb(9), source="p.yaml")
    with pytest.raises(ConfigError, match=r"^p\.yaml:1: nested more than 64 levels"):
        parse_profiles("versions: " + "[" * 500 + "]" * 500, source="p.yaml")
    big = tmp_path / "big.yaml"
    big.write_text("versions: {}\n" + "#" * (200 << 10))
    with pytest.raises(ConfigError, match=r"profile file is larger than 128 KiB"):
        load_profiles(big)


def test_unknown_version_names_file_and_known_ones() -> None:
    profiles = parse_profiles('versions:\n  "1.0": {}\n', source="p.yaml")
    with pytest.raises(ConfigError, match=r"'9\.9' is not defined \(defined: 1\.0\)") as info:
        profiles.profile("9.9")
    assert info.value.file == "p.yaml" and info.value.key == "versions['9.9']"


def test_parse_duration() -> None:
    assert parse_duration("250ms") == pytest.approx(0.25)
    assert parse_duration("1.5s") == pytest.approx(1.5)
    assert parse_duration("2m") == 120 and parse_duration("1h") == 3600
    assert parse_duration("0") == 0
    for bad in ("20", "1d", "-1s", "s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
