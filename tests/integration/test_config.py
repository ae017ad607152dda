"""Config validation: every kind of bad input is one ConfigError naming file, line and key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from probes.config import load_config, parse_config, parse_duration, parse_rate
from probes.errors import ConfigError

GOOD = """\
targets:
  static:
    - address: 127.0.0.1:18080
      labels: {pod: checkout-0, namespace: shop, service: checkout, proxy_version: "1.20.3"}
      ports: {grpc: 19090}
cohort: {by: proxy_version}
paths:
  - name: checkout
    http: {method: GET, path: /api/checkout}
    rate: 5/s
    timeout: 1s
    expect: {status: [200]}
  - name: echo
    grpc: {method: /skewprobe.target.v1.Target/Echo}
    port: grpc
    rate: 30/min
  - name: health
    grpc: {health: ""}
    port: grpc
"""


def test_good_config_builds_typed_specs() -> None:
    config = parse_config(GOOD, file="good.yaml")
    checkout, echo, health = config.paths
    assert checkout.rate_per_s == 5.0 and checkout.timeout_s == 1.0
    assert checkout.http is not None and checkout.http.path == "/api/checkout"
    assert echo.grpc is not None and echo.grpc.health_service is None
    assert echo.rate_per_s == pytest.approx(0.5)
    assert health.grpc is not None and health.grpc.health_service == ""
    (target,) = config.static_targets
    assert target.port_for("grpc") == 19090 and target.labels["proxy_version"] == "1.20.3"
    assert config.judging.window_s == 10.0 and config.judging.alpha == 0.01


def _error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, file="bad.yaml")
    message = str(info.value)
    assert "\n" not in message
    return info.value


def test_unknown_key_names_line_and_key() -> None:
    error = _error(GOOD.replace("    rate: 5/s\n", "    rate: 5/s\n    retries: 3\n"))
    assert error.line == 11 and error.key == "paths[0].retries"
    assert str(error).startswith("bad.yaml:11: paths[0].retries: unknown key")


def test_wrong_type() -> None:
    error = _error(GOOD.replace("expect: {status: [200]}", "expect: {status: ok}"))
    assert error.line == 12 and error.key == "paths[0].expect.status"
    assert "expected array" in str(error)


def test_bad_rate_string() -> None:
    error = _error(GOOD.replace("rate: 5/s", "rate: 5 per second"))
    assert error.line == 10 and error.key == "paths[0].rate"
    assert "not a rate like 5/s" in str(error)


def test_zero_rate_and_bad_duration() -> None:
    assert _error(GOOD.replace("rate: 5/s", "rate: 0/s")).key == "paths[0].rate"
    assert _error(GOOD.replace("timeout: 1s", "timeout: soon")).key == "paths[0].timeout"


def test_a_zero_warm_up_turns_it_off_and_other_zero_durations_are_refused() -> None:
    assert parse_config(GOOD + "verdict: {warmup: 0s}\n").judging.warmup_s == 0.0
    assert _error(GOOD + "verdict: {warmup: -1s}\n").key == "verdict.warmup"
    assert _error(GOOD.replace("timeout: 1s", "timeout: 0s")).key == "paths[0].timeout"


def test_unknown_protocol() -> None:
    error = _error(GOOD.replace("http: {method: GET, path: /api/checkout}", "ftp: {path: /x}"))
    assert error.key == "paths[0].ftp" and error.line == 9


def test_two_protocols_in_one_path() -> None:
    error = _error(GOOD.replace("    rate: 5/s\n", "    grpc: {health: ''}\n    rate: 5/s\n"))
    assert error.key == "paths[0]" and "exactly one of http, grpc, stream or relay" in str(error)
    error = _error(GOOD.replace("    rate: 5/s\n",
                                "    relay: {destination: cat}\n    rate: 5/s\n"))
    assert error.key == "paths[0]" and "exactly one of http, grpc, stream or relay" in str(error)


def test_relay_path_names_a_destination() -> None:
    config = parse_config(GOOD.replace("http: {method: GET, path: /api/checkout}",
                                       "relay: {destination: catalog}"))
    relay = config.paths[0]
    assert relay.kind == "relay" and relay.relay is not None
    assert relay.relay.destination == "catalog"
    error = _error(GOOD.replace("http: {method: GET, path: /api/checkout}",
                                "relay: {destination: 'http://x/'}"))
    assert error.key == "paths[0].relay.destination"
    error = _error(GOOD.replace("http: {method: GET, path: /api/checkout}", "relay: {}"))
    assert error.key == "paths[0].relay"


def test_duplicate_path_name() -> None:
    error = _error(GOOD.replace("name: echo", "name: checkout"))
    assert error.line == 13 and "duplicate path name 'checkout'" in str(error)


def test_duplicate_yaml_key() -> None:
    error = _error(GOOD.replace("    rate: 5/s\n", "    rate: 5/s\n    rate: 6/s\n"))
    assert error.line == 11 and error.key == "paths[0].rate" and "duplicate key" in str(error)


def test_missing_named_port() -> None:
    error = _error(GOOD.replace("ports: {grpc: 19090}", "ports: {admin: 9000}"))
    assert "uses port 'grpc' that this target lacks" in str(error)


def test_no_targets_and_no_paths() -> None:
    assert "no targets" in str(_error("paths: [{name: a, http: {path: /}}]"))
    assert "paths" in str(_error("targets: {static: []}\n"))
    assert "empty" in str(_error(""))


def test_invalid_yaml_has_a_line() -> None:
    error = _error("paths:\n  - name: [unclosed\n")
    assert error.line is not None and "invalid YAML" in str(error)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(binary)


def test_parse_helpers() -> None:
    assert parse_duration("250ms") == 0.25 and parse_duration("2m") == 120.0
    assert parse_rate("1/h") == pytest.approx(1 / 3600)
    with pytest.raises(ValueError):
        parse_rate("fast")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probes.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_validate_cli_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    ok = _cli("validate", str(good))
    assert ok.returncode == 0 and "3 paths" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("rate: 5/s", "rate: lots"))
    failed = _cli("validate", str(bad))
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and f"{bad}:10: paths[0].rate" in failed.stderr
    assert "Traceback" not in failed.stderr
    missing = _cli("validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_usage_error_is_one_line() -> None:
    result = _cli("verdict")
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_schema_is_published_and_matches_examples() -> None:
    result = _cli("validate", "--schema")
    schema = json.loads(result.stdout)
    assert result.returncode == 0 and "paths" in schema["properties"]
    for example in Path("targets/examples").glob("*.yaml"):
        # Fault profiles and the relay's allowlist are the targets' files, not probe configs.
        if "profiles" not in example.name and "allowlist" not in example.name:
            load_config(example)


def alias_bomb(levels: int) -> str:
    """The billion laughs: each anchor a list of nine aliases to the one before, so the
    last one is 9**levels values in a file of a few hundred bytes."""
    lines = ['a0: &a0 [x, x, x, x, x, x, x, x, x]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join([*lines, f"paths: *a{levels}"]) + "\n"


# (file text, the error's line and what it says): past each of the bounds of
# probes._parsing, and a cycle, which no bound would stop from being walked forever.
_UNBOUNDED = {
    "alias-bomb": (alias_bomb(9), 6, "more than 100000 values once aliases are expanded"),
    "deep": ("targets: " + "[" * 500 + "]" * 500 + "\n", 1, "nested more than 64 levels"),
    "many-aliases": ("x: &x 1\npaths: [" + ", ".join(["*x"] * 1001) + "]\n", 2,
                     "more than 1000 aliases"),
    "cycle": ("paths: &p [name, *p]\n", 1, "an alias inside the node it refers to"),
    "oversize": ("paths:\n" + "  - name: p\n    rate: 5/s\n" * 6000, None,
                 "config is larger than 128 KiB"),
}


@pytest.mark.parametrize("case", sorted(_UNBOUNDED))
def test_validate_refuses_unbounded_yaml_in_one_line(tmp_path: Path, case: str) -> None:
    text, line, says = _UNBOUNDED[case]
    config = tmp_path / f"{case}.yaml"
    config.write_text(text)
    # Finishing at all is the point: the bomb held the CPU for minutes, the nesting ended in
    # a RecursionError. _cli's 60 s bound only ends the test if it hangs again.
    result = _cli("validate", str(config))
    where = f"{config}:{line}: " if line is not None else f"{config}: "
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"skewprobe: error: {where}"), result.stderr[-2000:]
    assert says in result.stderr and result.stderr.count("\n") == 1, result.stderr[-2000:]


def test_aliases_within_the_bounds_still_load() -> None:
    shared = GOOD.replace("    timeout: 1s\n", "    timeout: &t 1s\n").replace(
        "    rate: 30/min\n", "    rate: 30/min\n    timeout: *t\n")
    config = parse_config(shared)
    assert [p.timeout_s for p in config.paths][:2] == [1.0, 1.0]


def test_a_large_wrong_value_is_quoted_briefly() -> None:
    # The error quotes the value to recognise it by; 5,000 characters of it would be noise.
    long_rate = _error(GOOD.replace("rate: 5/s", "rate: '" + "9" * 5000 + "'"))
    whole_list = _error("paths: {" + ", ".join(f"k{i}: v" for i in range(5000)) + "}\n")
    for error in (long_rate, whole_list):
        assert len(str(error)) < 300 and "..." in str(error), str(error)[:400]
