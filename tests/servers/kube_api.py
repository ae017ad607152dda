"""A fake Kubernetes API server that speaks the real list and watch protocol, on loopback.

No API server can run here, so the probe's discovery is tested against this one, with
kubernetes-asyncio pointed at it through a generated kubeconfig (or in-cluster settings).
What it implements, as the API does (api-concepts: efficient detection of changes):

- `GET /api/v1[/namespaces/{ns}]/pods`, `/apis/apps/v1[/namespaces/{ns}]/deployments` and
  `/api/v1/namespaces`:
  lists (`kind: PodList`, items without kind/apiVersion, `metadata.resourceVersion`) with
  `labelSelector` (equality and set-based), `limit` and `continue` (a consistent snapshot;
  an expired token is 410 `Expired`);
- `?watch=true`: a chunked stream of JSON lines `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|
  ERROR, "object": {...}}`; from `resourceVersion` R it replays the retained events after R,
  or answers an ERROR event carrying a 410 `Status` ("too old resource version") when R is
  older than the history it keeps; with no R (or "0") it starts with ADDED for every object.
  A label change that moves an object out of (into) the selector is a DELETED (ADDED),
  as the watch cache does. `allowWatchBookmarks` gets BOOKMARKs (an object with only
  `metadata.resourceVersion`) every `bookmark_every_s`; `timeoutSeconds` ends the stream;
- resourceVersion is one counter for every kind, as etcd's revision is;
- bearer-token auth (401 `Status` otherwise); optional TLS.

Test controls: `create`, `modify`, `delete` (graceful: first `deletionTimestamp`, then gone),
`compact` (forget history: resumes get 410), `advance` (other kinds changed), `end_watches`,
`fail_next`, `expire_continue_tokens`, and `requests` (every request's path and query).

`tests.servers.kube_fleet` drives it from the local fleet's rollout, or with synthetic churn
for benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import secrets
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

Json = dict[str, Any]

RESOURCES: Mapping[str, tuple[str, str]] = {
    # resource -> (apiVersion, kind)
    "pods": ("v1", "Pod"),
    "deployments": ("apps/v1", "Deployment"),
    "namespaces": ("v1", "Namespace"),  # cluster-scoped: listed at /api/v1/namespaces
}
_KIND_TO_RESOURCE = {kind: resource for resource, (_, kind) in RESOURCES.items()}


def status_object(code: int, reason: str, message: str) -> Json:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


# -- label selectors -------------------------------------------------------------------


_TERM = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[\w./-]+)"
    r"|(?P<skey>[\w./-]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)"
    r"|(?P<ekey>[\w./-]+)\s*(?P<eop>==|=|!=)\s*(?P<value>[\w.-]*)"
    r"|(?P<key>[\w./-]+))\s*$"
)


def parse_selector(text: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A label selector as the API parses it; raises ValueError on bad syntax."""
    if not text or not text.strip():
        return lambda labels: True
    terms, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    tests = [_requirement(term) for term in terms]
    return lambda labels: all(t(labels) for t in tests)


def _requirement(term: str) -> Callable[[Mapping[str, str]], bool]:
    m = _TERM.match(term)
    if m is None:
        raise ValueError(f"unable to parse requirement: {term!r}")
    if m["nkey"]:
        key = m["nkey"]
        return lambda labels: key not in labels
    if m["skey"]:
        key, negate = m["skey"], m["op"] == "notin"
        values = {v.strip() for v in m["values"].split(",") if v.strip()}
        return lambda labels: (labels.get(key) in values) != negate
    if m["ekey"]:
        key, value, negate = m["ekey"], m["value"], m["eop"] == "!="
        return lambda labels: (labels.get(key) == value) != negate
    key = m["key"]
    return lambda labels: key in labels


def _labels(obj: Json) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


# -- the server ------------------------------------------------------------------------


@dataclass
class _Event:
    rv: int
    resource: str
    namespace: str
    kind: str
    old: Json | None
    new: Json


@dataclass(eq=False)
class _Watcher:
    resource: str
    namespace: str | None
    selector: Callable[[Mapping[str, str]], bool]
    queue: asyncio.Queue[tuple[str, Json] | None] = field(default_factory=asyncio.Queue)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    status: int = 200
    at: float = field(default_factory=time.monotonic)

    @property
    def watch(self) -> bool:
        return self.query.get("watch", "").lower() in ("true", "1")


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class FakeKubeApi:
    """The fake API server. `await start()`, then `url`, `kubeconfig(path)`, `close()`."""

    def __init__(
        self,
        *,
        token: str | None = "skewprobe-test-token",
        bookmark_every_s: float | None = None,
        history: int = 100_000,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.token = token
        self.bookmark_every_s = bookmark_every_s
        self._ssl = ssl_context
        self.rv = 1000
        self._objects: dict[tuple[str, str, str], Json] = {}
        self._history: deque[_Event] = deque(maxlen=history)
        self._compacted = self.rv  # watches from an RV older than this get 410
        self._watchers: set[_Watcher] = set()
        self._continues: dict[str, tuple[int, list[Json]]] = {}
        self._failures: list[int] = []
        self.requests: list[Request] = []
        self.denied: set[str] = set()  # path prefixes answered 403 (RBAC)
        self.deleted_at: dict[str, float] = {}  # "ns/name" -> when its deletion started
        self._runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.watch_opened = asyncio.Condition()
        self.watches_opened = 0
        self.sent = asyncio.Condition()  # notified after each watch line is written
        self.bookmarks_sent: list[int] = []
        self._open = asyncio.Event()
        self._open.set()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/{resource}", self._handle)
        app.router.add_get("/api/v1/namespaces/{namespace}/{resource}", self._handle)
        app.router.add_get("/apis/{group}/{version}/{resource}", self._handle)
        app.router.add_get("/apis/{group}/{version}/namespaces/{namespace}/{resource}",
                           self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self._ssl)
        await site.start()
        self.host, self.port = self._runner.addresses[0][:2]

    async def close(self) -> None:
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeKubeApi:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://{self.host}:{self.port}"

    def kubeconfig(self, path: Path, *, token: str | None = None, ca: Path | None = None) -> Path:
        """Write a kubeconfig that points at this server (context `fake`)."""
        cluster: Json = {"server": self.url}
        if ca is not None:
            cluster["certificate-authority"] = str(ca)
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "probe", "user": {"token": token or self.token or "none"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "probe"}}],
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    # -- objects -------------------------------------------------------------------------

    def _key(self, obj: Json) -> tuple[str, str, str]:
        meta = obj["metadata"]
        return (_KIND_TO_RESOURCE[obj["kind"]], meta.get("namespace", ""), meta["name"])

    def get(self, namespace: str, name: str, resource: str = "pods") -> Json | None:
        found = self._objects.get((resource, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def objects(self, resource: str = "pods") -> list[Json]:
        return [copy.deepcopy(o) for (r, _, _), o in sorted(self._objects.items()) if r == resource]

    def names(self, resource: str = "pods",
              where: Callable[[Json], bool] = lambda obj: True) -> list[tuple[str, str]]:
        """(namespace, name) of the objects `where` accepts (reads, never copies, them)."""
        return [(ns, name) for (r, ns, name), obj in sorted(self._objects.items())
                if r == resource and where(obj)]

    def create(self, obj: Json) -> Json:
        key = self._key(obj)
        if key in self._objects:
            raise ValueError(f"{key} exists")
        new = copy.deepcopy(obj)
        new["metadata"].setdefault("creationTimestamp", _rfc3339(time.time()))
        self._commit(key, "ADDED", None, new)
        return copy.deepcopy(new)

    def replace(self, obj: Json) -> Json:
        key = self._key(obj)
        old = self._objects[key]
        self._commit(key, "MODIFIED", old, copy.deepcopy(obj))
        return copy.deepcopy(obj)

    def modify(self, namespace: str, name: str, change: Callable[[Json], None],
               resource: str = "pods") -> Json:
        """Apply `change` to a copy of the object and store it (a MODIFIED event)."""
        key = (resource, namespace, name)
        new = copy.deepcopy(self._objects[key])
        change(new)
        self._commit(key, "MODIFIED", self._objects[key], new)
        return copy.deepcopy(new)

    def delete(self, namespace: str, name: str, resource: str = "pods", *,
               graceful: bool = False) -> None:
        """Delete now, or (graceful) mark `deletionTimestamp` first as the API does for pods;
        `finish_delete` removes it."""
        key = (resource, namespace, name)
        old = self._objects[key]
        self.deleted_at.setdefault(f"{namespace}/{name}", time.time())
        if graceful and not old["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = _rfc3339(time.time() + 30)
            new["metadata"]["deletionGracePeriodSeconds"] = 30
            self._commit(key, "MODIFIED", old, new)
            return
        self._commit(key, "DELETED", old, copy.deepcopy(old))

    def finish_delete(self, namespace: str, name: str, resource: str = "pods") -> None:
        self.delete(namespace, name, resource)

    def advance(self, n: int = 1) -> None:
        """Other kinds changed: the shared resourceVersion moves on without pod events."""
        self.rv += n

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older RVs now get 410."""
        self._history.clear()
        self._compacted = self.rv

    def end_watches(self) -> None:
        """End every open watch cleanly, as the server does at timeoutSeconds."""
        for watcher in list(self._watchers):
            watcher.queue.put_nowait(None)

    def hold(self) -> None:
        """Hold new requests (as a partitioned network would) until `release`."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def fail_next(self, count: int, status: int = 500) -> None:
        """Answer the next `count` requests with an error Status."""
        self._failures.extend([status] * count)

    def expire_continue_tokens(self) -> None:
        self._continues.clear()

    def _commit(self, key: tuple[str, str, str], kind: str, old: Json | None, new: Json) -> None:
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        resource, namespace, _ = key
        if kind == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = new
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        event = _Event(self.rv, resource, namespace, kind, old, new)
        self._history.append(event)
        for watcher in self._watchers:
            out = self._for(watcher, event)
            if out is not None:
                watcher.queue.put_nowait(out)

    @staticmethod
    def _for(watcher: _Watcher, event: _Event) -> tuple[str, Json] | None:
        """The event as this watcher sees it (selector transitions become ADDED/DELETED)."""
        if watcher.resource != event.resource:
            return None
        if watcher.namespace is not None and watcher.namespace != event.namespace:
            return None
        new_in = watcher.selector(_labels(event.new))
        old_in = event.old is not None and watcher.selector(_labels(event.old))
        if event.kind == "DELETED":
            return ("DELETED", event.new) if old_in else None
        if event.kind == "ADDED":
            return ("ADDED", event.new) if new_in else None
        if old_in and new_in:
            return ("MODIFIED", event.new)
        if old_in:
            return ("DELETED", event.new)
        if new_in:
            return ("ADDED", event.new)
        return None

    # -- HTTP ----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await self._open.wait()
        query = dict(request.query)

        def refuse(code: int, reason: str, message: str) -> web.Response:
            self.requests.append(Request(request.method, request.path, query, code))
            return web.json_response(status_object(code, reason, message), status=code)

        if self.token is not None and request.headers.get("Authorization") != (
            f"Bearer {self.token}"
        ):
            return refuse(401, "Unauthorized", "Unauthorized")
        if any(request.path.startswith(prefix) for prefix in self.denied):
            return refuse(403, "Forbidden", f'cannot list resource at "{request.path}"')
        if self._failures:
            code = self._failures.pop(0)
            return refuse(code, "InternalError", f"injected failure {code}")
        self.requests.append(Request(request.method, request.path, query))
        resource = request.match_info["resource"]
        group = request.match_info.get("group")
        if resource not in RESOURCES or (group and f"{group}/{request.match_info['version']}"
                                         != RESOURCES[resource][0]):
            return web.json_response(
                status_object(404, "NotFound", f"the server could not find {request.path}"),
                status=404)
        namespace = request.match_info.get("namespace")
        try:
            selector = parse_selector(query.get("labelSelector"))
        except ValueError as exc:
            return web.json_response(status_object(400, "BadRequest", str(exc)), status=400)
        if _truthy(query.get("watch")):
            return await self._watch(request, resource, namespace, selector, query)
        return self._list(resource, namespace, selector, query)

    def _matching(self, resource: str, namespace: str | None,
                  selector: Callable[[Mapping[str, str]], bool]) -> list[Json]:
        return [
            obj for (r, ns, _), obj in sorted(self._objects.items())
            if r == resource and (namespace is None or ns == namespace)
            and selector(_labels(obj))
        ]

    def _list(self, resource: str, namespace: str | None,
              selector: Callable[[Mapping[str, str]], bool], query: Mapping[str, str],
              ) -> web.Response:
        token = query.get("continue")
        if token:
            if token not in self._continues:
                return web.json_response(status_object(
                    410, "Expired", "The provided continue parameter is too old to display a"
                    " consistent list result. You can start a new list without the continue"
                    " parameter."), status=410)
            rv, items = self._continues.pop(token)
        else:
            rv, items = self.rv, [copy.deepcopy(o) for o in
                                  self._matching(resource, namespace, selector)]
        limit = int(query.get("limit") or 0)
        meta: Json = {"resourceVersion": str(rv)}
        if limit and len(items) > limit:
            next_token = secrets.token_urlsafe(12)
            self._continues[next_token] = (rv, items[limit:])
            meta["continue"] = next_token
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        api_version, kind = RESOURCES[resource]
        return web.json_response(
            {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items})

    async def _watch(self, request: web.Request, resource: str, namespace: str | None,
                     selector: Callable[[Mapping[str, str]], bool], query: Mapping[str, str],
                     ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        watcher = _Watcher(resource, namespace, selector)
        since = query.get("resourceVersion") or "0"
        backlog: list[tuple[str, Json]] = []
        too_old = False
        if since == "0":
            backlog = [("ADDED", o) for o in self._matching(resource, namespace, selector)]
        elif int(since) < self._compacted:
            too_old = True
        else:
            for event in self._history:
                if event.rv > int(since):
                    out = self._for(watcher, event)
                    if out is not None:
                        backlog.append(out)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(query.get("timeoutSeconds") or 1800)
        every = self.bookmark_every_s if _truthy(query.get("allowWatchBookmarks")) else None
        self._watchers.add(watcher)
        self.watches_opened += 1
        async with self.watch_opened:
            self.watch_opened.notify_all()
        try:
            if too_old:
                await self._send(response, "ERROR", status_object(
                    410, "Expired", f"too old resource version: {since} ({self._compacted})"))
                return response
            for kind, obj in backlog:
                await self._send(response, kind, obj)
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                wait = min(left, every) if every else left
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if every and deadline - loop.time() > 0:
                        await self._send(response, "BOOKMARK", {
                            "kind": RESOURCES[resource][1], "apiVersion": RESOURCES[resource][0],
                            "metadata": {"resourceVersion": str(self.rv)}})
                        self.bookmarks_sent.append(self.rv)
                        async with self.sent:
                            self.sent.notify_all()
                    continue
                if item is None:
                    break
                await self._send(response, *item)
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        finally:
            self._watchers.discard(watcher)
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: Json) -> None:
        line = json.dumps({"type": kind, "object": obj}, separators=(",", ":")) + "\n"
        await response.write(line.encode())

    # -- waiting (tests) -----------------------------------------------------------------

    async def wait_for_bookmark(self, rv: int) -> None:
        """Until a BOOKMARK carrying `rv` or later has been written to a watch."""
        async with self.sent:
            await self.sent.wait_for(lambda: any(b >= rv for b in self.bookmarks_sent))

    async def wait_for_watches(self, n: int) -> None:
        """Until `n` watch streams have been opened since the start (resumes count)."""
        async with self.watch_opened:
            await self.watch_opened.wait_for(lambda: self.watches_opened >= n)

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    def watches(self, path: str = "/pods") -> list[Request]:
        """Successful watch requests whose path ends with `path`."""
        return [r for r in self.requests
                if r.watch and r.status == 200 and r.path.endswith(path)]

    def lists(self, path: str = "/pods") -> list[Request]:
        """Successful list requests (pages) whose path ends with `path`."""
        return [r for r in self.requests
                if not r.watch and r.status == 200 and r.path.endswith(path)]


@contextlib.contextmanager
def served_in_thread(api: FakeKubeApi, tmp_path: Path, config: str) -> Iterator[Path]:
    """`api` served on its own thread and loop (a CLI under test runs its own
    `asyncio.run`), and a probe config file: `config` with `{kubeconfig}` filled in."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(api.start(), loop).result(10)
    path = tmp_path / "skewprobe.yaml"
    path.write_text(config.format(kubeconfig=api.kubeconfig(tmp_path / "kubeconfig")))
    try:
        yield path
    finally:
        asyncio.run_coroutine_threadsafe(api.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
