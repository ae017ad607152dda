"""`skewprobe run` refusing to start, as real processes: an API port another process holds,
and a store another `skewprobe run` is writing. Each is one line on stderr, a documented
exit code, and nothing of the refused run left behind."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.servers.ports import free_port
from tests.servers.probe_run import discard_config

SKEWPROBE = [sys.executable, "-m", "probes.cli"]

def _config(tmp_path: Path, listen: str = "127.0.0.1:0") -> Path:
    path = tmp_path / "probe.yaml"
    path.write_text(discard_config(window="1s", timeout="200ms", listen=listen))
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


# -- a second writer on one store ---------------------------------------------------------------


def _windows(store: Path) -> int:
    from probes.store import Store

    with Store.open(str(store), readonly=True) as s:
        return len(s.read_windows())


def _wait_for_windows(store: Path, writer: subprocess.Popen[str], at_least: int) -> int:
    """Until the writer has committed `at_least` windows (polling the store, as a reader
    would); a hang guard, not a budget: a running probe commits one every second."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert writer.poll() is None, writer.stderr.read() if writer.stderr else ""
        if store.exists():
            with contextlib.suppress(Exception):
                if (n := _windows(store)) >= at_least:
                    return n
        time.sleep(0.2)
    raise AssertionError(f"no {at_least} windows in {store} within 120 s")


def test_a_second_writer_is_refused_and_a_killed_one_blocks_nothing(tmp_path: Path) -> None:
    store = tmp_path / "probe.db"
    config = _config(tmp_path)
    first = subprocess.Popen([*SKEWPROBE, "run", "--config", str(config), "--store", str(store),
                              "--listen", "none"], stderr=subprocess.PIPE, text=True)
    try:
        before = _wait_for_windows(store, first, 2)
        second = _run("--config", config, "--store", store, "--listen", "none",
                      "--duration", "5s")
        assert second.returncode == 4, second.stderr
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
        assert "another `skewprobe run` is writing this store" in second.stderr
        assert f"pid {first.pid} " in second.stderr
        # Readers never take the lock, and the first writer lost nothing.
        verdict = subprocess.run([*SKEWPROBE, "verdict", "--store", str(store)],
                                 capture_output=True, text=True, timeout=60, check=False)
        assert verdict.returncode == 3, verdict.stderr  # one cohort only: inconclusive
        assert _wait_for_windows(store, first, before + 1) > before
    finally:
        first.kill()  # SIGKILL: no clean shutdown, the lock file stays behind
        first.wait(timeout=30)
        assert first.stderr is not None
        first.stderr.close()
    kept = _windows(store)
    assert (tmp_path / "probe.db.lock").exists()
    third = _run("--config", config, "--store", store, "--listen", "none", "--duration", "2s")
    assert third.returncode == 0, third.stderr
    assert _windows(store) > kept  # the third wrote, and the first's windows are all there
    assert not (tmp_path / "probe.db.lock").exists()  # a clean stop removes it


def test_a_demo_on_a_store_being_written_is_refused_before_it_removes_anything(
    tmp_path: Path,
) -> None:
    """`demo` starts from an empty store (it removes the old one): on a store another probe
    is writing, it must be refused first, or the live probe's windows are gone."""
    store = tmp_path / "probe.db"
    first = subprocess.Popen([*SKEWPROBE, "run", "--config", str(_config(tmp_path)),
                              "--store", str(store), "--listen", "none"],
                             stderr=subprocess.PIPE, text=True)
    try:
        before = _wait_for_windows(store, first, 2)
        demo = subprocess.run(
            [*SKEWPROBE, "demo", "--store", str(store), "--pods", "2", "--rollout", "1s",
             "--quiet", "--out", str(tmp_path / "report")],
            capture_output=True, text=True, timeout=120, check=False)
        assert demo.returncode == 4, demo.stderr
        assert demo.stderr.count("\n") == 1 and "Traceback" not in demo.stderr
        assert "another `skewprobe run` is writing this store" in demo.stderr
        assert demo.stdout == ""  # refused before the fleet started
        assert not (tmp_path / "report").exists()
        # The store is the first writer's still, every window of it, and it keeps writing.
        assert _windows(store) >= before
        assert _wait_for_windows(store, first, before + 1) > before
    finally:
        first.terminate()
        first.wait(timeout=60)
        assert first.stderr is not None
        first.stderr.close()
    assert first.returncode == 0
