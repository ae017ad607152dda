"""The relay prober: one call *through* a relay pod, classified as the destination's outcome.

The endpoint is a relay pod (the reference target with a relay allowlist); the prober asks
it `GET /relay/<destination>` and reads its JSON answer (`targets.relay.RelayAnswer`): the
destination's outcome, status or gRPC code, the attempts the relay's outbound proxy made, and
which pod answered. The outcome is re-judged here against the path's `expect` (the relay
only says "below 400" or "OK"); the answering pod's proxy version is the `cohort_hint`, and
the engine keys the result by the pair (relay pod's version, answering pod's version).

When the relay itself cannot answer (refused, a 5xx of its own, a 403 for a destination not
in its allowlist), that is the outcome, and the callee is unknown. The relay's
`answered_by` and `address` go into the detail as `pod=... address=...`.

Stale routing: with `relay.callees` set, the engine shows the prober every discovery snapshot
(`observe`). An answer from a pod of the destination that discovery has *removed*, or a
refused connection to an address that only a removed pod held, is `stale_endpoint` once the
removal is older than the path's timeout (a call sent before the removal may still land
there). A pod discovery has not seen yet is not judged: the probe's own watch may lag the
mesh's.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from probes._exceptions import BadInput
from probes._spec import PathSpec
from probes._types import CallOutcome, Endpoint, Outcome
from probes.clients._base import USER_AGENT, host_port, inner_budget_s, keepalive_s
from probes.clients._classify import classify_exception, classify_grpc_code, classify_status

RELAY_ROUTE = "/relay/"
# A relay answer is a small JSON document; anything larger is not one.
ANSWER_LIMIT = 64 << 10
_KNOWN = frozenset(Outcome.FIXED)
_NOT_REACHED = frozenset({Outcome.CONNECT_REFUSED, Outcome.CONNECT_TIMEOUT})
# Removed pods and addresses remembered at most (oldest forgotten first).
MAX_GONE = 10_000
# The label discovery puts each pod's proxy version in (the default cohort label).
VERSION_LABEL = "proxy_version"


class _Removed:
    """Names removed from discovery, with when, bounded in number."""

    def __init__(self) -> None:
        self.current: set[str] = set()
        self.gone: OrderedDict[str, float] = OrderedDict()

    def update(self, now_present: set[str], now: float) -> None:
        for name in self.current - now_present:
            self.gone[name] = now
            self.gone.move_to_end(name)
        for name in now_present:
            self.gone.pop(name, None)
        while len(self.gone) > MAX_GONE:
            self.gone.popitem(last=False)
        self.current = now_present

    def removed_before(self, name: str, when: float) -> bool:
        removed = self.gone.get(name)
        return removed is not None and removed < when


class RelayProber:
    """`GET /relay/<destination>` on each relay pod, over one pooled HTTP/1.1 client."""

    def __init__(self, path: PathSpec, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if path.relay is None:
            raise BadInput(f"path {path.name}: not a relay path")
        self._path = path
        self._callees = dict(path.relay.callees)
        self._clock = clock
        self._pods = _Removed()
        self._addresses = _Removed()
        # Each destination pod's proxy version as discovery last showed it.
        self._versions: dict[str, str] = {}
        self._route = RELAY_ROUTE + path.relay.destination
        self._expected = frozenset(path.expect.status)
        self._codes = tuple(path.expect.grpc_codes)
        budget = inner_budget_s(path.timeout_s)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(budget), trust_env=False, follow_redirects=False,
            headers={"user-agent": USER_AGENT},
            limits=httpx.Limits(keepalive_expiry=keepalive_s(path.rate_per_s)),
        )

    async def call(self, endpoint: Endpoint, request_id: str) -> CallOutcome:
        port = endpoint.port_for(self._path.port)
        url = f"http://{host_port(endpoint.host, port)}{self._route}"
        try:
            response = await self._client.get(url, headers={"x-request-id": request_id})
            body = response.content[:ANSWER_LIMIT + 1]
        except (httpx.HTTPError, OSError) as exc:
            outcome, detail = classify_exception(exc)
            return CallOutcome(outcome, detail=f"relay: {detail}")
        if response.status_code == 403:
            return CallOutcome(Outcome.PROBE_ERROR, status=403,
                               detail=f"relay refused {self._route}: not in its allowlist")
        if response.status_code != 200:
            return CallOutcome(classify_status(response.status_code, ()),
                               status=response.status_code,
                               detail=f"relay answered {response.status_code}")
        try:
            doc = json.loads(body) if len(body) <= ANSWER_LIMIT else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return CallOutcome(Outcome.PROTOCOL_ERROR, detail="relay answer is not JSON")
        return self._judge(doc)

    def _judge(self, doc: dict[str, Any]) -> CallOutcome:
        status = doc.get("status")
        code = doc.get("grpc_code")
        detail = str(doc.get("detail") or "")
        if isinstance(status, int):
            outcome = classify_status(status, self._expected)
        elif isinstance(code, str) and code:
            outcome = classify_grpc_code(code, self._codes, detail)
        else:
            given = doc.get("outcome")
            outcome = given if given in _KNOWN else Outcome.PROTOCOL_ERROR
        attempts = doc.get("attempts")
        found = doc.get("answered_by")
        answered: dict[str, Any] = found if isinstance(found, dict) else {}
        callee = answered.get("proxy_version")
        pod, address = str(answered.get("pod") or ""), str(doc.get("address") or "")
        if self._stale(pod, address, outcome, str(callee or "")):
            outcome = Outcome.STALE_ENDPOINT
        where = f"pod={pod or '-'} address={address or '-'}"
        return CallOutcome(
            outcome,
            status=status if isinstance(status, int) else None,
            attempts=attempts if isinstance(attempts, int) and attempts > 0 else None,
            cohort_hint=callee if isinstance(callee, str) and callee else None,
            detail=f"{where} {detail}".rstrip(),
        )

    def observe(self, endpoints: Sequence[Endpoint]) -> None:
        """The discovery snapshot now: which of the destination's pods and addresses exist."""
        if not self._callees:
            return
        pods: set[str] = set()
        addresses: set[str] = set()
        for e in endpoints:
            if all(e.labels.get(k) == v for k, v in self._callees.items()):
                name = e.labels.get("pod") or e.name
                pods.add(name)
                if e.labels.get(VERSION_LABEL):
                    self._versions[name] = e.labels[VERSION_LABEL]
                addresses.update(host_port(e.host, p) for p in {e.port, *e.ports.values()})
        now = self._clock()
        self._pods.update(pods, now)
        self._addresses.update(addresses, now)

    def _stale(self, pod: str, address: str, outcome: str, version: str) -> bool:
        if not self._callees:
            return False
        settled = self._clock() - self._path.timeout_s
        if pod:
            # A pod back under its name on another proxy version was restarted (a sidecar
            # upgrade), not left behind: discovery has only not shown it back yet.
            known = self._versions.get(pod)
            restarted = bool(known and version and version != known)
            return not restarted and self._pods.removed_before(pod, settled)
        return outcome in _NOT_REACHED and self._addresses.removed_before(address, settled)

    def forget(self, endpoint: Endpoint) -> None:
        """Pooled per host by httpx; idle connections expire on their own."""

    async def aclose(self) -> None:
        await self._client.aclose()
