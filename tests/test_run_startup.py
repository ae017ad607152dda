"""`skewprobe run` refusing to start, as real processes: an API port another process holds,
and a store another `skewprobe run` is writing. Each is one line on stderr, a documented
exit code, and nothing of the refused run left behind."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.servers.ports import free_port

SKEWPROBE = [sys.executable, "-m", "probes.cli"]

# One path on a port nothing serves (the discard port): the probe runs, its calls fail fast.
CONFIG = """\
targets:
  static:
    - address: 127.0.0.1:9
      labels: {{proxy_version: "1.20.3"}}
window: 1s
listen: {listen}
paths:
  - name: checkout
    http: {{path: /api/checkout}}
    rate: 5/s
    timeout: 200ms
"""


def _config(tmp_path: Path, listen: str = "127.0.0.1:0") -> Path:
    path = tmp_path / "probe.yaml"
    path.write_text(CONFIG.format(listen=listen))
    return path


def _run(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SKEWPROBE, "run", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, check=False)


# -- the API's port is taken -------------------------------------------------------------------


def test_a_taken_api_port_is_one_line_exit_2_and_creates_no_store(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        for args in (["--listen", taken], []):  # the flag, and the config's `listen:`
            store = tmp_path / "probe.db"
            done = _run("--config", _config(tmp_path, listen=taken), "--store", store, *args)
            assert done.returncode == 2, done.stderr
            assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
            assert done.stderr.startswith(f"skewprobe: error: cannot listen on {taken}: "), (
                done.stderr)
            assert "address already in use" in done.stderr
            assert sorted(p.name for p in tmp_path.iterdir()) == ["probe.yaml"]


def test_a_listen_address_that_cannot_be_bound_is_bad_input(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is on no interface of this machine.
    done = _run("--config", _config(tmp_path), "--store", tmp_path / "probe.db",
                "--listen", f"192.0.2.1:{free_port()}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "cannot listen on 192.0.2.1:" in done.stderr
    assert not (tmp_path / "probe.db").exists()
