"""A real HAProxy as a caller's outbound proxy: the relay's calls leave through it.

The fleet's HAProxy mode (`targets.haproxy`) puts HAProxy on a pod's inbound side. A caller's
retries happen on its *outbound* side, so the relay can be pointed at an `HaproxyOutbound`
instead: HAProxy of one emulated version (`targets.haproxy_config.HaproxyVersion`: its
`retries`, `retry_on` and `attempt_count_header`, the response's `x-envoy-attempt-count` =
1 + HAProxy's retry count) balancing round robin over the destination's pods. The relay's
allowlist then names this proxy's address, as a mesh app names a service and its sidecar
picks the pod.

Its server list is what a control plane pushes to a sidecar (Envoy's EDS): `set_upstreams`
changes it in the running process through HAProxy's runtime API (the admin socket):
`server-template`-like slots `up0`, `up1`, ... of which the current endpoints hold one each,
`set server app_http/upN addr A port P` + `state ready` for an endpoint that arrives,
`state maint` for one that leaves. Nothing restarts, so no connection, counter or retry in
flight is lost, as none is when Envoy takes an EDS update; a caller that stops taking
updates (`targets.meshview`: outside the control plane's skew) simply is not told, and keeps
routing to the addresses it has. No health checks: a proxy routes by its list, stale or not.

Its own answers say why they are its own (`targets.sidecar`, as Envoy's response flags): `UF`
and the address in `x-upstream-host` when the connection to the endpoint it picked failed
(the relay reports that as a refused connection to that address), `UH` when it had none.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from targets.haproxy_config import HaproxyVersion, PodWiring, render_config
from targets.haproxy_process import HaproxyProcess, HaproxyUnavailable, listen_socket
from targets.server import hostport, parse_hostport

__all__ = ["BACKEND", "HaproxyOutbound", "ServerSlot"]

_STOP_LIMIT_S = 5.0
_READY_LIMIT_S = 10.0
_ADMIN_LIMIT_S = 5.0
BACKEND = "app_http"  # targets.haproxy_config's backend name
# Runtime API answers that mean the command did not do what it said.
_ERRORS = ("No such", "Unknown command", "denied", "Require", "invalid", "Invalid", "failed",
           "error", "Error")


@dataclass(frozen=True, slots=True)
class ServerSlot:
    """One server slot as HAProxy reports it (`show servers state`)."""

    name: str
    address: str  # host:port
    serving: bool  # not in maintenance, so the balancer picks it


class HaproxyOutbound:
    """One HAProxy process listening on `host` (a free port), proxying to `upstreams`.

    `slots` server slots at least (one per upstream; default 64): `set_upstreams` can hold
    that many endpoints at once. A slot freed by a leaving endpoint is given again to the same
    address first, then to new addresses only once every never-used slot is taken, so an idle
    connection HAProxy keeps to an old address is never reused for a new one.
    """

    def __init__(self, binary: str, version: HaproxyVersion, upstreams: Sequence[tuple[str, int]],
                 workdir: Path, *, name: str, host: str = "127.0.0.1", slots: int = 64):
        self.version = version
        self.host = host
        self.name = name
        self._binary = binary
        first = tuple(dict.fromkeys(upstreams))
        self.slots = max(slots, len(first), 1)
        self._config = workdir / f"{name}.cfg"
        self._log = workdir / f"{name}.log"
        self._port: int | None = None
        self._admin_dir: str | None = None
        self.process: HaproxyProcess | None = None
        self._slot_of: dict[str, int] = {hostport(h, p): i for i, (h, p) in enumerate(first)}
        self._last_slot: dict[str, int] = dict(self._slot_of)
        self._free: list[int] = list(range(len(first), self.slots))
        self._lock = asyncio.Lock()

    @property
    def address(self) -> str:
        if self._port is None:
            raise RuntimeError("outbound proxy not started")
        return hostport(self.host, self._port)

    @property
    def admin_socket(self) -> Path:
        if self._admin_dir is None:
            raise RuntimeError("outbound proxy not started")
        return Path(self._admin_dir, "admin.sock")

    @property
    def log_path(self) -> Path:
        return self._log

    @property
    def upstreams(self) -> tuple[str, ...]:
        """The endpoints (host:port) this proxy balances over, as last set."""
        return tuple(sorted(self._slot_of, key=self._slot_of.__getitem__))

    async def start(self) -> None:
        """Bind, write the config, start HAProxy; return once its admin socket answers.
        Connections queue on the bound socket until HAProxy takes them, so none is refused
        while it starts."""
        # A short private directory: a unix socket's path is limited to 107 bytes.
        self._admin_dir = tempfile.mkdtemp(prefix="skp-out-")
        sock = listen_socket(self.host, 0)
        try:
            self._port = sock.getsockname()[1]
            initial = tuple(parse_hostport(a) for a in self.upstreams)
            wiring = PodWiring(pod=self._config.stem, http_fd=sock.fileno(), grpc_fd=None,
                               app_host=self.host, app_http_port=0, app_grpc_port=None,
                               upstreams=initial, slots=self.slots,
                               admin_socket=str(self.admin_socket))
            self._config.write_text(render_config(self.version, wiring), encoding="utf-8")
            self.process = HaproxyProcess(self._binary, self._config, self._log,
                                          (sock.fileno(),))
            await self.process.start()
        except BaseException:
            self._remove_admin_dir()
            raise
        finally:
            sock.close()  # HAProxy holds its own copy
        try:
            await self._ready()
        except BaseException:
            await self.stop()
            raise

    async def _ready(self) -> None:
        assert self.process is not None
        exited = self.process.exited
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _READY_LIMIT_S
        while not exited.done() and loop.time() < deadline:
            with contextlib.suppress(OSError):
                await self._command("show info")
                return
            await asyncio.wait({exited}, timeout=0.02)
        state = f"exited with {exited.result()}" if exited.done() else "no admin socket in time"
        raise HaproxyUnavailable(f"outbound HAProxy {self.name} not ready: {state}; "
                                 f"log {self._log}")

    async def set_upstreams(self, addresses: Sequence[str]) -> bool:
        """Make HAProxy balance over `addresses` (host:port) from now on, through the runtime
        API; True if anything changed. HaproxyUnavailable when the slots run out or HAProxy
        refuses a command."""
        async with self._lock:
            want = list(dict.fromkeys(addresses))
            gone = [a for a in self._slot_of if a not in want]
            new = [a for a in want if a not in self._slot_of]
            if len(self._slot_of) - len(gone) + len(new) > self.slots:
                raise HaproxyUnavailable(
                    f"outbound HAProxy {self.name} has {self.slots} server slots; "
                    f"{len(want)} endpoints do not fit")
            commands = []
            for address in gone:
                slot = self._slot_of.pop(address)
                self._free.append(slot)
                commands.append(f"set server {BACKEND}/up{slot} state maint")
            for address in new:
                former = self._last_slot.get(address)
                slot = former if former is not None and former in self._free else self._free[0]
                self._free.remove(slot)
                self._slot_of[address] = self._last_slot[address] = slot
                host, port = parse_hostport(address)
                commands += [f"set server {BACKEND}/up{slot} addr {host} port {port}",
                             f"set server {BACKEND}/up{slot} state ready"]
            for command in commands:
                answer = await self._command(command)
                if any(word in answer for word in _ERRORS):
                    raise HaproxyUnavailable(f"outbound HAProxy {self.name} refused "
                                             f"{command!r}: {answer.strip()}")
            return bool(commands)

    async def servers(self) -> list[ServerSlot]:
        """The backend's server slots as HAProxy has them now (`show servers state`)."""
        answer = await self._command(f"show servers state {BACKEND}")
        found = []
        for line in answer.splitlines():
            cols = line.split()
            if len(cols) < 19 or not cols[0].isdigit() or cols[1] != BACKEND:
                continue
            op_state, admin_state = int(cols[5]), int(cols[6])
            found.append(ServerSlot(cols[3], hostport(cols[4], int(cols[18])),
                                    op_state == 2 and not admin_state & 0x03))
        return found

    async def _command(self, command: str) -> str:
        """One runtime API command on its own connection (HAProxy answers, then closes)."""
        async with asyncio.timeout(_ADMIN_LIMIT_S):
            reader, writer = await asyncio.open_unix_connection(str(self.admin_socket))
            try:
                writer.write(command.encode() + b"\n")
                await writer.drain()
                return (await reader.read()).decode(errors="replace")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def stop(self) -> None:
        try:
            if self.process is not None:
                await self.process.stop(soft=False, limit_s=_STOP_LIMIT_S)
        finally:
            self._remove_admin_dir()

    def _remove_admin_dir(self) -> None:
        if self._admin_dir is not None:
            shutil.rmtree(self._admin_dir, ignore_errors=True)

    async def __aenter__(self) -> HaproxyOutbound:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()
