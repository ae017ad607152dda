"""A real HAProxy as a caller's outbound proxy: the relay's calls leave through it.

The fleet's HAProxy mode (`targets.haproxy`) puts HAProxy on a pod's inbound side. A caller's
retries happen on its *outbound* side, so the relay can be pointed at an `HaproxyOutbound`
instead: HAProxy of one emulated version (`targets.haproxy_config.HaproxyVersion`: its
`retries`, `retry_on` and `attempt_count_header`, the response's `x-envoy-attempt-count` =
1 + HAProxy's retry count) balancing round robin over the destination's pods. The relay's
allowlist then names this proxy's address, as a mesh app names a service and its sidecar
picks the pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from targets.haproxy import HaproxyProcess, listen_socket
from targets.haproxy_config import HaproxyVersion, PodWiring, render_config
from targets.server import hostport

__all__ = ["HaproxyOutbound"]

_STOP_LIMIT_S = 5.0


class HaproxyOutbound:
    """One HAProxy process listening on `host` (a free port), proxying to `upstreams`."""

    def __init__(self, binary: str, version: HaproxyVersion, upstreams: Sequence[tuple[str, int]],
                 workdir: Path, *, name: str, host: str = "127.0.0.1"):
        self.version = version
        self.host = host
        self._binary = binary
        self._upstreams = tuple(upstreams)
        self._config = workdir / f"{name}.cfg"
        self._log = workdir / f"{name}.log"
        self._port: int | None = None
        self.process: HaproxyProcess | None = None

    @property
    def address(self) -> str:
        if self._port is None:
            raise RuntimeError("outbound proxy not started")
        return hostport(self.host, self._port)

    async def start(self) -> None:
        """Bind, write the config, start HAProxy. Connections queue on the bound socket
        until HAProxy takes them, so none is refused while it starts."""
        sock = listen_socket(self.host, 0)
        try:
            self._port = sock.getsockname()[1]
            wiring = PodWiring(pod=self._config.stem, http_fd=sock.fileno(), grpc_fd=None,
                               app_host=self.host, app_http_port=0, app_grpc_port=None,
                               upstreams=self._upstreams)
            self._config.write_text(render_config(self.version, wiring), encoding="utf-8")
            self.process = HaproxyProcess(self._binary, self._config, self._log,
                                          (sock.fileno(),))
            await self.process.start()
        finally:
            sock.close()  # HAProxy holds its own copy

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop(soft=False, limit_s=_STOP_LIMIT_S)

    async def __aenter__(self) -> HaproxyOutbound:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()
