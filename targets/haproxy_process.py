"""Running HAProxy: finding the binary, checking a configuration (`haproxy -c`), the
listening sockets it inherits, and one child process stopped by signals.

What both HAProxy roles of the local fleet share: the pods' sidecars (`targets.haproxy`) and
the relay callers' outbound proxies (`targets.haproxy_outbound`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from probes.errors import BadInput, SkewprobeError
from targets.server import LISTEN_BACKLOG, hostport

__all__ = [
    "TERM_WAIT_S",
    "HaproxyProcess",
    "HaproxyUnavailable",
    "check_config",
    "find_haproxy",
    "haproxy_version",
    "listen_socket",
]

# How long a SIGTERM'd HAProxy gets before SIGKILL.
TERM_WAIT_S = 2.0


class HaproxyUnavailable(SkewprobeError):
    """HAProxy is not installed, or could not start or validate a configuration."""


def find_haproxy() -> str | None:
    """The haproxy binary: on PATH, else Debian's /usr/sbin/haproxy (sbin is not on every PATH)."""
    found = shutil.which("haproxy")
    if found is None and os.access("/usr/sbin/haproxy", os.X_OK):
        found = "/usr/sbin/haproxy"
    return found


async def haproxy_version(binary: str) -> str:
    """"2.6.12-1+deb12u4" from `haproxy -v`."""
    _, out = await _run_once(binary, "-v")
    words = out.split()
    return words[2] if len(words) > 2 and words[:2] == ["HAProxy", "version"] else "unknown"


async def check_config(binary: str, text: str, *, fds: tuple[int, ...] = ()) -> None:
    """Validate a configuration with `haproxy -c`; HaproxyUnavailable with HAProxy's alerts.
    `fds` are the listening sockets its `bind fd@N` lines name (HAProxy checks them)."""
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", prefix="skewprobe-check-") as cfg:
        cfg.write(text)
        cfg.flush()
        code, out = await _run_once(binary, "-c", "-f", cfg.name, fds=fds)
    if code != 0:
        alerts = [line.strip() for line in out.splitlines() if "ALERT" in line]
        raise HaproxyUnavailable("haproxy -c rejected the configuration: "
                                 + (" | ".join(alerts[:3]) or f"exit {code}"))


async def _run_once(binary: str, *args: str, fds: tuple[int, ...] = ()) -> tuple[int, str]:
    try:
        proc = await asyncio.create_subprocess_exec(
            binary, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, pass_fds=fds)
    except OSError as exc:
        raise HaproxyUnavailable(f"cannot run {binary}: {exc.strerror or exc}") from exc
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening socket for HAProxy to inherit (`pass_fds`), with SO_REUSEADDR so a
    restarted pod binds the address its predecessor just closed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise BadInput(f"cannot listen on {hostport(host, port)}: {exc.strerror}") from exc
    return sock


class HaproxyProcess:
    """One HAProxy child process (foreground, `-db`), stopped by signals.

    `fds` are inherited listening sockets; the caller closes its copies once `start()`
    returns, so that HAProxy's unbind on soft-stop really closes them.
    """

    def __init__(self, binary: str, config: Path, log: Path, fds: tuple[int, ...]):
        self.binary = binary
        self.config = config
        self.log = log
        self._fds = fds
        self._proc: asyncio.subprocess.Process | None = None
        self._exited: asyncio.Task[int] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    async def start(self) -> None:
        binary = shutil.which(self.binary)
        if binary is None:  # checked here: behind setpriv it would only be an exit status
            raise HaproxyUnavailable(f"cannot run {self.binary}: not an executable")
        argv = [binary, "-db", "-f", str(self.config)]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            # The kernel kills HAProxy when the fleet dies, even by SIGKILL.
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        log = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            os.write(log, f"--- {stamp} skewprobe: starting {self.config.name}\n".encode())
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=self._fds, start_new_session=True,
            )
        except OSError as exc:
            raise HaproxyUnavailable(f"cannot run {self.binary}: {exc.strerror or exc}") from exc
        finally:
            os.close(log)
        self._exited = asyncio.create_task(self._proc.wait())

    async def wait(self) -> int:
        """Wait for HAProxy to exit; its exit status."""
        assert self._exited is not None, "not started"
        return await asyncio.shield(self._exited)

    @property
    def exited(self) -> asyncio.Task[int]:
        assert self._exited is not None, "not started"
        return self._exited

    def signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    async def stop(self, *, soft: bool, limit_s: float) -> int:
        """SIGUSR1 (soft) or SIGTERM, then wait up to `limit_s` for the exit; escalate to
        SIGTERM, then SIGKILL, if HAProxy does not go. Returns the exit status."""
        if self._exited is None:
            return 0
        self.signal(signal.SIGUSR1 if soft else signal.SIGTERM)
        for sig, wait_s in ((signal.SIGTERM, limit_s), (signal.SIGKILL, TERM_WAIT_S)):
            done, _ = await asyncio.wait({self._exited}, timeout=wait_s)
            if done:
                break
            self.signal(sig)
        return await self.wait()
