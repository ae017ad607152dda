"""List then watch one kind of Kubernetes object, as client-go's Reflector does.

The protocol (https://kubernetes.io/docs/reference/using-api/api-concepts/):

1. **List** (in pages of `limit`, following `continue`) gives the current objects and the
   collection's `resourceVersion` (RV).
2. **Watch** from that RV with `allowWatchBookmarks=true` and a server-side
   `timeoutSeconds` (random in 5–10 min, as client-go, so a fleet of probes does not
   reconnect in step). Each event carries its object's RV; BOOKMARK events carry only an
   RV, so an idle watch still advances and a resume after the server compacted its history
   does not need a relist.
3. When the server ends the watch (its timeout), **resume** from the last RV: no relist,
   no missed event.
4. **410 Gone** (an ERROR event with a `Status` of code 410, or a 410 answer: the RV is
   older than the server keeps) → **relist** at once; objects deleted while we were away
   disappear because the store is replaced, not merged. An expired `continue` token during
   a paged list restarts the list.
5. Any other failure (connection refused, 5xx, a silent connection past the read timeout)
   → retry the watch from the last RV after an exponential **backoff** with jitter
   (0.8 s doubling to 30 s, as client-go); the store keeps the last known objects so the
   probe keeps probing them. 401 reloads credentials first (expired exec / service-account
   tokens).

The store holds condensed records, not Pod JSON (`convert` maps one object to a record, or
None to drop it), and `on_change` is called only when a record really changed, so the
status heartbeats of a 2,400-pod fleet do not rebuild the probe's endpoint list.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

log = logging.getLogger("skewprobe.discovery.kubernetes")

T = TypeVar("T")
Json = Mapping[str, Any]

# Errors after which the reflector retries (anything else is a bug and is raised).
TRANSIENT: tuple[type[BaseException], ...] = (
    ApiException, aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError,
)


@dataclass(frozen=True, slots=True)
class WatchTiming:
    """Timeouts and backoff of the list/watch loop (tests shorten them)."""

    watch_timeout_s: tuple[float, float] = (300.0, 600.0)
    backoff_initial_s: float = 0.8
    backoff_max_s: float = 30.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0  # one list page; a watch gets its timeout plus this
    settle_s: float = 0.05  # events closer than this make one snapshot
    page_size: int = 500


@dataclass(slots=True)
class ReflectorStats:
    """Counters of one reflector (read them through `KubernetesSource.stats()`)."""

    lists: int = 0
    pages: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0
    expired: int = 0  # 410 Gone: each one led to a relist
    errors: int = 0
    resource_version: str = ""
    last_error: str = ""
    failing_since: float | None = None  # loop time of the first failure in a row


def describe(exc: BaseException) -> str:
    """One line for a library error."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status}: {exc.reason}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror if exc.os_error else None
        return f"cannot connect to {exc.host}:{exc.port}: {reason or exc}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def api_error(status: int, body: bytes) -> ApiException:
    """An ApiException from a non-200 answer, with the Status object's reason and message."""
    reason = f"HTTP {status}"
    try:
        data = json.loads(body)
        reason = f"{data.get('reason') or reason}: {data.get('message') or ''}".rstrip(": ")
    except (ValueError, AttributeError):
        pass
    return ApiException(status=status, reason=reason)


class _Watch(Watch):
    """kubernetes-asyncio's Watch, telling when the stream is established (HTTP 200), so a
    reflector recovering from errors is healthy again before the first event arrives."""

    def __init__(self, on_connect: Callable[[], None]) -> None:
        super().__init__(return_type="object")  # events stay dicts: records need no models
        self._on_connect = on_connect

    async def next(self) -> Any:
        if self.resp is None:
            self.resp = await self.func()
            if self.resp is not None and self.resp.status == 200:
                self._on_connect()
        return await super().next()


class _ShortWatch(Exception):
    """The server ended a watch at once with nothing in it: back off, do not spin."""


class Reflector(Generic[T]):
    """Keeps `store` (key `namespace/name` → record) equal to the server's objects.

    `call` is a kubernetes-asyncio list function (e.g. `CoreV1Api.list_namespaced_pod`)
    and `args` its positional arguments; `selector` a label selector.
    """

    def __init__(
        self,
        name: str,
        call: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        *,
        selector: str | None,
        convert: Callable[[Json], T | None],
        on_change: Callable[[], None],
        timing: WatchTiming,
        rng: random.Random,
        reauth: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self._call = call
        self._args = args
        self._selector = selector or None
        self._convert = convert
        self._on_change = on_change
        self._timing = timing
        self._rng = rng
        self._reauth = reauth
        self.store: dict[str, T] = {}
        self.synced = False  # a list has succeeded
        self.attempted = False  # a list has succeeded or failed
        self._stats = ReflectorStats()
        self._bad: set[str] = set()

    @property
    def stats(self) -> ReflectorStats:
        return replace(self._stats)

    @property
    def failing(self) -> bool:
        return self._stats.failing_since is not None

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """List, then watch and resume forever; returns only by cancellation."""
        loop = asyncio.get_running_loop()
        need_list = not self.synced
        failures = 0
        expired_in_row = 0
        while True:
            try:
                if need_list:
                    await self.list()
                    need_list = False
                await self._watch()
                failures = expired_in_row = 0
                self._ok()
                continue
            except ApiException as exc:
                if exc.status == 410:
                    # Our RV is older than the server keeps: the state is stale, relist.
                    self._stats.expired += 1
                    need_list = True
                    expired_in_row += 1
                    if expired_in_row == 1:
                        log.info("%s: %s; relisting", self.name, describe(exc))
                        continue  # at once; a second 410 in a row backs off first
                if exc.status == 401 and self._reauth is not None:
                    await self._reauth()
                error = describe(exc)
            except _ShortWatch:
                error = "the server ended the watch at once"
            except TRANSIENT as exc:
                error = describe(exc)
            except Exception as exc:
                # Not a known failure (a malformed event, a client bug): keep discovering.
                log.exception("%s: unexpected error", self.name)
                error = describe(exc)
            failures += 1
            self.attempted = True
            stats = self._stats
            stats.errors += 1
            stats.last_error = error
            if stats.failing_since is None:
                stats.failing_since = loop.time()
            delay = self._backoff(failures)
            log.warning("%s: %s; retrying in %.1fs", self.name, error, delay)
            self._on_change()  # health changed
            await asyncio.sleep(delay)

    def _ok(self) -> None:
        if self._stats.failing_since is not None:
            self._stats.failing_since = None
            self._stats.last_error = ""
            self._on_change()

    def _backoff(self, failures: int) -> float:
        t = self._timing
        ceiling = min(t.backoff_max_s, t.backoff_initial_s * 2 ** min(failures - 1, 30))
        return ceiling * (0.5 + 0.5 * self._rng.random())  # jitter: fleets do not sync up

    # -- list ----------------------------------------------------------------------------

    async def list(self) -> None:
        """Replace the store with a fresh (paged, consistent) list; raises on failure."""
        t = self._timing
        fresh: dict[str, T] = {}
        token: str | None = None
        self._bad.clear()  # say again, once, what is still unreadable
        restarts = 0
        while True:
            kwargs: dict[str, Any] = {
                "limit": t.page_size,
                "_preload_content": False,
                "_request_timeout": (t.connect_timeout_s, t.read_timeout_s),
            }
            if self._selector:
                kwargs["label_selector"] = self._selector
            if token:
                kwargs["_continue"] = token
            try:
                page = await self._get(kwargs)
            except ApiException as exc:
                if exc.status == 410 and token and restarts < 2:
                    # The continue token expired mid-list: start over for a consistent list.
                    restarts += 1
                    fresh, token = {}, None
                    continue
                raise
            self._stats.pages += 1
            for obj in page.get("items") or ():
                key, record = self._record(obj)
                if record is not None:
                    fresh[key] = record
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        changed = fresh != self.store or not self.synced
        self.store = fresh
        self._stats.resource_version = str(meta.get("resourceVersion") or "")
        self._stats.lists += 1
        self.synced = self.attempted = True
        self._ok()
        if changed:
            self._on_change()

    async def _get(self, kwargs: dict[str, Any]) -> Json:
        response = await self._call(*self._args, **kwargs)
        try:
            body = await response.read()
            if response.status != 200:
                raise api_error(response.status, body)
        finally:
            response.release()
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ValueError("the list answer is not a JSON object")
        return data

    # -- watch ---------------------------------------------------------------------------

    async def _watch(self) -> None:
        t = self._timing
        timeout = max(1, round(self._rng.uniform(*t.watch_timeout_s)))
        kwargs: dict[str, Any] = {
            "resource_version": self._stats.resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout,
            "_request_timeout": (t.connect_timeout_s, timeout + t.read_timeout_s),
        }
        if self._selector:
            kwargs["label_selector"] = self._selector
        self._stats.watches += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        seen = 0
        async with _Watch(self._ok) as watch:
            async for event in watch.stream(self._call, *self._args, **kwargs):
                seen += 1
                self._apply(str(event["type"]), event["raw_object"])
        if seen == 0 and loop.time() - started < min(1.0, timeout / 2):
            raise _ShortWatch

    def _apply(self, kind: str, obj: Json) -> None:
        stats = self._stats
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if rv:
            stats.resource_version = str(rv)
        if kind == "BOOKMARK":
            stats.bookmarks += 1
            self._ok()
            return
        stats.events += 1
        self._ok()
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if kind == "DELETED":
            changed = self.store.pop(key, None) is not None
        else:
            _, record = self._record(obj)
            old = self.store.get(key)
            if record is None:
                changed = self.store.pop(key, None) is not None
            else:
                self.store[key] = record
                changed = old != record
        if changed:
            self._on_change()

    def _record(self, obj: Json) -> tuple[str, T | None]:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        try:
            return key, self._convert(obj)
        except Exception:
            # One odd object must not stall discovery of the rest: skip it, say so once.
            if key not in self._bad:
                self._bad.add(key)
                log.exception("%s: cannot read %s; skipping it", self.name, key)
            return key, None
