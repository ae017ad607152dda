"""A real Prometheus on loopback for end-to-end tests (the Debian package's binary)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.servers.ports import free_port

__all__ = ["PROMETHEUS", "PrometheusServer", "needs_prometheus"]

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus is not installed (Debian package prometheus)")


class PrometheusServer:
    """`prometheus` on 127.0.0.1 with a temp TSDB, ready when it logs so."""

    def __init__(self, tmp: Path, targets: Sequence[str], *, job: str,
                 labels: dict[str, str] | None = None, interval_s: float = 1.0,
                 timeout_s: float = 0.9) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": f"{interval_s:g}s",
                       "scrape_timeout": f"{timeout_s * 1000:.0f}ms"},
            "scrape_configs": [{"job_name": job, "static_configs": [
                {"targets": list(targets), "labels": labels or {}}]}],
        }))
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=info"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.ready = threading.Event()
        self.log: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if "Server is ready to receive web requests" in line:
                self.ready.set()

    async def wait_ready(self, limit_s: float = 30.0) -> None:
        if not await asyncio.to_thread(self.ready.wait, limit_s):
            raise AssertionError("prometheus did not start:\n" + "".join(self.log[-20:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
