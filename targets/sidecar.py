"""The emulated pod behind both listeners: an app and the sidecar proxy in front of it.

The HTTP and gRPC front ends (`targets._http`, `targets._grpc`) parse the wire and then ask
a `Sidecar` what to do: reject on a header rule, delay, forward to the app with retries. The
app's own behaviour (persistent and transient errors) is decided here too, per
`x-request-id`, so it is the same over HTTP and gRPC and reproducible under a seed:

- a persistent error hashes the request id: every attempt of that request fails, whoever
  retries it (the sidecar, the client, a real proxy in front);
- a transient error fails only the first attempt the app sees for that id;
- the app counts attempts per id (bounded: insertion order, TTL and a cap) and reports the
  count, so retries made by a real proxy can be measured from the callee.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from targets.profile import Faults, HeaderRules, VersionProfile

Clock = Callable[[], float]

OK_STATUS = 200
REJECT_STATUS = 400
VERSION_HEADER = "x-proxy-version"
ATTEMPT_COUNT_HEADER = "x-envoy-attempt-count"
# What the app says about itself, so a caller that relays knows which pod answered, and how
# many attempts its own proxy made (the x-envoy-attempt-count the request arrived with).
POD_HEADER = "x-pod-name"
NAMESPACE_HEADER = "x-pod-namespace"
SEEN_ATTEMPTS_HEADER = "x-seen-attempt-count"
# What a caller's outbound proxy says about its own answers, as Envoy can add its
# %RESPONSE_FLAGS% and %UPSTREAM_HOST% to a response: `UF` when its connection to the endpoint
# it picked failed (that endpoint in the host header), `UH` when it had no endpoint to pick.
RESPONSE_FLAGS_HEADER = "x-response-flags"
UPSTREAM_HOST_HEADER = "x-upstream-host"
UPSTREAM_CONNECT_FAILURE = "UF"
NO_HEALTHY_UPSTREAM = "UH"
_TWO_64 = float(2**64)

# The standard HTTP-to-gRPC status mapping (grpc/doc/http-grpc-status-mapping.md); Envoy
# uses it for local replies to gRPC requests.
_GRPC_FOR_HTTP = {
    400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
    429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE",
}


def grpc_code_for_http(status: int) -> str:
    """The gRPC status code name a proxy reports for an HTTP status."""
    return _GRPC_FOR_HTTP.get(status, "UNKNOWN")


class AttemptCounter:
    """Attempts the app received per request id, with bounded memory.

    Entries are kept in insertion order and dropped once older than `ttl_s` or beyond
    `capacity`, so a fleet of thousands of pods at a steady rate holds only
    min(capacity, rate * ttl) ids per pod.
    """

    def __init__(self, *, ttl_s: float = 60.0, capacity: int = 4096, clock: Clock = time.monotonic):
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._clock = clock
        self._seen: OrderedDict[str, list[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def hit(self, request_id: str) -> int:
        """Record one attempt for `request_id`; return how many the app has now seen."""
        entry = self._seen.get(request_id)
        if entry is not None:
            entry[0] += 1
            return int(entry[0])
        now = self._clock()
        seen = self._seen
        seen[request_id] = [1, now]
        horizon = now - self._ttl_s
        while seen:
            first = next(iter(seen.values()))
            if len(seen) > self._capacity or first[1] < horizon:
                seen.popitem(last=False)
            else:
                break
        return 1


@dataclass(frozen=True, slots=True)
class Forwarded:
    """What the sidecar got back from the app for one request."""

    status: int  # the app's final HTTP status (200 or an error status)
    attempts: int  # upstream attempts the sidecar made (1 + retries)
    app_attempts: int  # attempts the app has seen for this request id, all callers together

    @property
    def ok(self) -> bool:
        return self.status == OK_STATUS


class Sidecar:
    """One pod's emulated proxy (of `profile.version`) and the app it fronts."""

    def __init__(
        self,
        profile: VersionProfile,
        *,
        pod: str,
        namespace: str = "",
        seed: int | None = None,
        counter: AttemptCounter | None = None,
        clock: Clock = time.monotonic,
    ):
        self.profile = profile
        self.pod = pod
        self.namespace = namespace
        self.version = profile.version
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "big")
        self._rng = random.Random(seed)
        key = hashlib.blake2b(str(seed).encode(), digest_size=16).digest()
        # Decisions per request id hash the id under the seed: identical on every attempt
        # and every pod sharing the seed, independent between persistent and transient.
        self._persistent_key = key
        self._transient_key = hashlib.blake2b(key + b"transient", digest_size=16).digest()
        self.counter = counter if counter is not None else AttemptCounter(clock=clock)
        self._ids = itertools.count(1)

    def faults(self, route: str) -> Faults:
        return self.profile.faults_for(route)

    def request_id(self, given: str | None) -> str:
        """The request's id; like Envoy, the sidecar makes one up when the caller sent none."""
        if given:
            return given
        return f"{self.pod}-{next(self._ids)}"

    def rejects(self, faults: Faults, header_names: Iterable[str]) -> str | None:
        """The header this version refuses the request for (answered 400), if any."""
        rejected = faults.headers.reject_requests_with
        if not rejected:
            return None
        for name in header_names:
            if name in rejected:
                return name
        return None

    def delay(self, faults: Faults) -> float:
        """Seconds of latency the sidecar adds to this request (fixed plus a random tail)."""
        lat = faults.latency
        extra = lat.fixed_s
        if lat.tail_probability > 0 and self._rng.random() < lat.tail_probability:
            extra += lat.tail_s
        return extra

    async def forward(self, faults: Faults, request_id: str) -> Forwarded:
        """Send the request to the app, retrying per the version's policy."""
        policy = faults.retries
        attempts = 0
        while True:
            attempts += 1
            status, app_attempts = self.app_attempt(faults, request_id)
            if (
                status == OK_STATUS
                or attempts > policy.num_retries
                or status not in policy.retry_on
            ):
                return Forwarded(status, attempts, app_attempts)
            if policy.backoff_s > 0:
                await asyncio.sleep(policy.backoff_s)

    def app_attempt(self, faults: Faults, request_id: str) -> tuple[int, int]:
        """One attempt reaching the app: (HTTP status, attempts the app has seen for the id)."""
        seen = self.counter.hit(request_id)
        if faults.error_rate > 0 and (
            _unit(self._persistent_key, request_id) < faults.error_rate
        ):
            return faults.error_status, seen
        if faults.transient_error_rate > 0 and seen == 1 and (
            _unit(self._transient_key, request_id) < faults.transient_error_rate
        ):
            return faults.error_status, seen
        return OK_STATUS, seen

    def response_headers(
        self, faults: Faults, forwarded: Forwarded | None, request_id: str, elapsed_s: float
    ) -> list[tuple[str, str]]:
        """The headers (HTTP) or trailing metadata (gRPC) this version puts on a response."""
        headers = [(VERSION_HEADER, self.version), ("x-request-id", request_id)]
        if forwarded is not None:
            headers.append(("x-app-attempts", str(forwarded.app_attempts)))
            headers.append(("x-envoy-upstream-service-time", str(int(elapsed_s * 1000))))
            if self.profile.attempt_count_header:
                headers.append((ATTEMPT_COUNT_HEADER, str(forwarded.attempts)))
        rules = faults.headers
        if rules.rewrites_response:
            headers = rewrite_headers(rules, headers)
        return headers


    def app_headers(self, arrived_attempt_count: str | None) -> list[tuple[str, str]]:
        """The app's own headers: its pod and namespace, and the attempt count its request
        arrived with (set by the caller's proxy), echoed when there was one."""
        headers = [(POD_HEADER, self.pod)]
        if self.namespace:
            headers.append((NAMESPACE_HEADER, self.namespace))
        if arrived_attempt_count and arrived_attempt_count.isdigit():
            headers.append((SEEN_ATTEMPTS_HEADER, arrived_attempt_count))
        return headers


def rewrite_headers(rules: HeaderRules, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Apply a version's remove / rename / add rules to response headers, in that order."""
    out = []
    for name, value in headers:
        if name in rules.remove:
            continue
        out.append((rules.rename.get(name, name), value))
    out.extend(rules.add)
    return out


def _unit(key: bytes, request_id: str) -> float:
    """A uniform number in [0, 1) fixed by key and request id."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "big") / _TWO_64
