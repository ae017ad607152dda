"""An emulated control plane: which endpoint lists reach which callers' outbound proxies.

A real control plane (istiod, linkerd-destination) pushes each service's endpoints to every
sidecar it supports. A proxy outside the supported skew stops accepting configuration and
keeps routing by the last list it took: traffic from those callers goes to pods that no longer
exist, or to an address now held by another pod. `EmulatedMesh` does that for the relay's
outbound side (`targets.relay.EndpointView`): one view per caller proxy version, updated on
every endpoint change or control-plane move only while that version is within the supported
skew of the emulated control plane (judged as `skewprobe inventory` judges it,
`probes.inventory.judge_skew`).

    mesh = EmulatedMesh("1.21.0")
    old, new = mesh.view("1.20.3"), mesh.view("1.21.0")
    mesh.set_endpoints("catalog", ["127.0.0.2:18080", "127.0.0.3:18080"])
    mesh.move_control_plane("1.22.0")      # 1.20.3 is now two minors behind: frozen
    mesh.set_endpoints("catalog", ["127.0.0.4:18080"])   # only the 1.21.0 view sees this
"""

from __future__ import annotations

from collections.abc import Sequence

from probes.discovery.meshes import ControlPlane
from probes.inventory import judge_skew
from probes.spec import SkewPolicy
from targets.relay import RoundRobinView

__all__ = ["EmulatedMesh"]

_BEHIND, _AHEAD = 1, 0  # the published policy of Istio and Linkerd: one minor behind


class EmulatedMesh:
    """Endpoint lists per service, pushed to each caller version's view while it is in skew."""

    def __init__(self, control_plane: str, *, behind: int = _BEHIND, ahead: int = _AHEAD):
        self.control_plane = control_plane
        self._policy = SkewPolicy(behind=behind, ahead=ahead)
        self._services: dict[str, tuple[str, ...]] = {}
        self._views: dict[str, RoundRobinView] = {}

    def accepts(self, version: str) -> bool:
        """Does a proxy of `version` still take configuration from this control plane?"""
        found = judge_skew(version, ControlPlane(self.control_plane), self._policy)
        return found.status == "ok"

    def view(self, version: str) -> RoundRobinView:
        """The outbound endpoint view of callers on `version` (one per version, shared by its
        pods: they all took the same pushes). A new view starts from the lists now."""
        view = self._views.get(version)
        if view is None:
            view = RoundRobinView(self._services)
            self._views[version] = view
        return view

    def addresses(self, service: str) -> tuple[str, ...]:
        """The service's endpoints as the control plane knows them."""
        return self._services.get(service, ())

    def set_endpoints(self, service: str, addresses: Sequence[str]) -> None:
        self._services[service] = tuple(addresses)
        self._push()

    def move_control_plane(self, version: str) -> None:
        self.control_plane = version
        self._push()

    def _push(self) -> None:
        for version, view in self._views.items():
            if self.accepts(version):
                for service, addresses in self._services.items():
                    view.update(service, addresses)
