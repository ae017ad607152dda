"""HAProxy settings per emulated proxy version: the versions file, its validation, the rendered
haproxy.cfg, and `haproxy -c` on every example version."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from probes.errors import ConfigError
from targets.haproxy import HaproxySidecars, default_versions_file
from targets.haproxy_config import (
    HaproxyVersion,
    PodWiring,
    load_haproxy_versions,
    parse_haproxy_versions,
    render_config,
)
from targets.haproxy_process import check_config, find_haproxy, listen_socket

EXAMPLE = default_versions_file()
WIRING = PodWiring(pod="p-0", http_fd=5, grpc_fd=6, app_host="127.0.0.9", app_http_port=4001,
                   app_grpc_port=4002, grace_s=1.5, default_hard_stop_after_s=2.0)


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def test_example_versions_load_and_render_what_each_version_says() -> None:
    versions = load_haproxy_versions(EXAMPLE)
    assert set(versions.versions) >= {"1.20.3", "1.21.0"}
    a = lines(render_config(versions.version("1.20.3"), WIRING))
    b = lines(render_config(versions.version("1.21.0"), WIRING))
    assert "retries 0" in a and not any(line.startswith("retry-on") for line in a)
    assert "retries 2" in b and "retry-on all-retryable-errors" in b
    assert "hard-stop-after 5000ms" in a and "hard-stop-after 1000ms" in b
    assert "timeout server 30000ms" in a and "timeout server 10000ms" in b
    assert "grace 1500ms" in a  # the fleet's notice
    # Both ports: HTTP/1.1 + h2c (auto-detected) and gRPC with h2 on both sides.
    for cfg in (a, b):
        assert "bind fd@5" in cfg and "bind fd@6 proto h2" in cfg
        assert "server app 127.0.0.9:4001" in cfg and "server app 127.0.0.9:4002 proto h2" in cfg
    assert not any("x-envoy-attempt-count" in line for line in a)
    assert any("x-envoy-attempt-count" in line for line in b)


def test_tcp_grpc_mode_and_defaults() -> None:
    versions = parse_haproxy_versions('versions: {"t": {grpc: tcp, timeouts: {tunnel: 5s}}}')
    cfg = render_config(versions.version("t"), WIRING)
    grpc_part = cfg[cfg.index("frontend grpc"):]
    assert "mode tcp" in grpc_part and "proto h2" not in grpc_part
    assert "timeout tunnel 5000ms" in cfg
    # Unset keys are HAProxy's defaults (no line), except timeouts HAProxy warns about.
    assert "retries" not in cfg and "retry-on" not in cfg
    assert "timeout client 30000ms" in cfg and "timeout connect 1000ms" in cfg
    assert "hard-stop-after 2000ms" in cfg  # the fleet's drain when the version sets none


def test_http_only_pod_has_no_grpc_frontend() -> None:
    wiring = PodWiring(pod="p", http_fd=5, grpc_fd=None, app_host="127.0.0.1",
                       app_http_port=1, app_grpc_port=None)
    assert "frontend grpc" not in render_config(HaproxyVersion("v"), wiring)


def test_app_profile_has_app_faults_only_and_the_version_label() -> None:
    versions = load_haproxy_versions(EXAMPLE)
    profile = versions.app_profile("1.21.0")
    assert profile.version == "1.21.0"
    checkout = profile.faults_for("/api/checkout")
    assert checkout.error_rate == 0.1 and checkout.retries.num_retries == 0
    assert not profile.attempt_count_header
    assert profile.faults_for("/api/catalog").error_rate == 0.0
    with pytest.raises(ConfigError, match="not defined"):
        versions.app_profile("9.9.9")


@pytest.mark.parametrize(("text", "line", "key"), [
    ('versions: {"a": {retries: 11}}', 1, "versions['a'].retries"),
    ('versions:\n  "a":\n    retry_on: [sometimes]', 3, "versions['a'].retry_on"),
    ('versions:\n  "a":\n    timeouts: {server: 5 parsecs}', 3, "versions['a'].timeouts.server"),
    ('versions:\n  "a":\n    timeouts: {forever: 5s}', 3, "versions['a'].timeouts.forever"),
    ('versions:\n  "a":\n    hard_stop_after: 0', 3, "versions['a'].hard_stop_after"),
    ('versions:\n  "a":\n    grpc: udp', 3, "versions['a'].grpc"),
    ('versions:\n  "a b": {}', 2, "versions['a b']"),
    ('versions: {"a": {}}\napp:\n  routes:\n    /x: {retries: 1}', 4, "app.routes['/x'].retries"),
    ('versions: {"a": {}}\napp:\n  defaults: {error_rate: 2}', 3, "app.defaults.error_rate"),
    ('versions: {"a": {}}\nversions: {"b": {}}', 2, "versions"),
    ("versions: {}", 1, "versions"),
])
def test_errors_name_file_line_and_key(text: str, line: int, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_haproxy_versions(text, source="v.yaml")
    assert (caught.value.file, caught.value.line, caught.value.key) == ("v.yaml", line, key)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_haproxy_versions(tmp_path / "missing.yaml")


@pytest.mark.skipif(find_haproxy() is None, reason="haproxy is not installed")
async def test_haproxy_accepts_every_example_version(tmp_path: Path) -> None:
    versions = load_haproxy_versions(EXAMPLE)
    async with HaproxySidecars(versions, workdir=tmp_path) as sidecars:
        for name in versions.versions:
            text = await sidecars.check(name, drain_s=1.0, notice_s=0.5)
            assert f"haproxy/{name}" in text


async def test_outbound_config_has_slots_the_runtime_api_and_its_own_answers_marked(
    tmp_path: Path,
) -> None:
    versions = load_haproxy_versions(EXAMPLE)
    wiring = PodWiring(pod="out", http_fd=5, grpc_fd=None, app_host="127.0.0.1",
                       app_http_port=0, app_grpc_port=None,
                       upstreams=(("127.0.0.9", 4001),), slots=3,
                       admin_socket=str(tmp_path / "admin.sock"))
    old = render_config(versions.version("1.20.3"), wiring)
    new = render_config(versions.version("1.21.0"), wiring)
    for cfg in (old, new):
        got = lines(cfg)
        assert f"stats socket {tmp_path / 'admin.sock'} mode 600 level admin" in got
        servers = [x for x in got if x.startswith("server")]
        assert servers == ["server up0 127.0.0.9:4001", "server up1 127.0.0.1:1 disabled",
                           "server up2 127.0.0.1:1 disabled"]
        assert not any(" check" in x for x in got)  # a proxy routes by its list, stale or not
        assert any("x-response-flags UF" in x for x in got)
        assert any("x-response-flags UH" in x for x in got)
        assert any("x-upstream-host" in x for x in got)
    # A version that counts no attempts strips the callee's count; one that does, sets its own.
    assert "http-response del-header x-envoy-attempt-count" in lines(old)
    assert "http-response del-header x-envoy-attempt-count" not in lines(new)
    # A pod's inbound sidecar has none of it.
    assert "x-response-flags" not in render_config(versions.version("1.20.3"), WIRING)
    binary = find_haproxy()
    if binary is not None:
        socks = [listen_socket("127.0.0.1", 0)]
        try:
            wiring = dataclasses.replace(wiring, http_fd=socks[0].fileno())
            for version in ("1.20.3", "1.21.0"):
                await check_config(binary, render_config(versions.version(version), wiring),
                                   fds=(socks[0].fileno(),))
        finally:
            socks[0].close()
