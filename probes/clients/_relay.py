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

The relay pod is asked over the probe's own HTTP/1.1 client (`_h1`), or its HTTP/2 one
(`_h2lean`, `relay.version: "2"`), exactly as a direct path is: this prober *is* an
`HttpProber` for `GET /relay/<destination>` that keeps the (small) answer body and reads
it, so connection reuse, timeouts, the re-send rule and the outcome classes of a failed
call are the direct paths' (BENCHMARKS.md, D22: on httpx a relay call cost 2.9x a direct one).

Stale routing: with `relay.callees` set, the engine shows the prober every discovery snapshot
(`observe`). An answer from a pod of the destination that discovery has *removed*, or a
refused connection to an address that only a removed pod held, is `stale_endpoint` once the
removal is older than the path's timeout (a call sent before the removal may still land
there). A pod discovery has not seen yet is not judged: the probe's own watch may lag the
mesh's.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from probes.clients._base import host_port
from probes.clients._classify import classify_exception, classify_grpc_code, classify_status
from probes.clients._http import HttpProber
from probes.errors import BadInput
from probes.spec import HttpSpec, PathSpec
from probes.types import CallOutcome, Endpoint, Outcome

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


class RelayProber(HttpProber):
    """`GET /relay/<destination>` on each relay pod, its JSON answer judged."""

    _wire_prefix = "relay: "

    def __init__(self, path: PathSpec, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        relay = path.relay
        if relay is None:
            raise BadInput(f"path {path.name}: not a relay path")
        if relay.version not in ("1.1", "2"):
            raise BadInput(f"path {path.name}: relay.version must be 1.1 or 2")
        self._route = RELAY_ROUTE + relay.destination
        # The relay pod asked as a direct HTTP path would be; one byte past the limit is
        # kept so that an answer too large to be one is told apart from one at the limit.
        ask = HttpSpec(method="GET", path=self._route, version=relay.version)
        super().__init__(dataclasses.replace(path, http=ask, relay=None),
                         body_limit=ANSWER_LIMIT + 1, keep_body=True)
        self._callees = dict(relay.callees)
        self._clock = clock
        self._pods = _Removed()
        self._addresses = _Removed()
        # Each destination pod's proxy version as discovery last showed it.
        self._versions: dict[str, str] = {}
        self._codes = tuple(path.expect.grpc_codes)
        self._timeout_s = path.timeout_s

    def _answer(
        self, status: int, header: Callable[[str], str | None], received: int | BaseException,
        body: bytes,
    ) -> CallOutcome:
        """The relay's own answer: its failure, or the destination's outcome it reports."""
        if isinstance(received, BaseException):
            outcome, detail = classify_exception(received)
            return CallOutcome(outcome, status=status, detail=f"relay: body: {detail}")
        if status == 403:
            return CallOutcome(Outcome.PROBE_ERROR, status=403,
                               detail=f"relay refused {self._route}: not in its allowlist")
        if status != 200:
            return CallOutcome(classify_status(status, ()), status=status,
                               detail=f"relay answered {status}")
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
        settled = self._clock() - self._timeout_s
        if pod:
            # A pod back under its name on another proxy version was restarted (a sidecar
            # upgrade), not left behind: discovery has only not shown it back yet.
            known = self._versions.get(pod)
            restarted = bool(known and version and version != known)
            return not restarted and self._pods.removed_before(pod, settled)
        return outcome in _NOT_REACHED and self._addresses.removed_before(address, settled)
