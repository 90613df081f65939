"""A fake Kubernetes API server for pods: a real HTTP/1.1 server on loopback, on its own thread.

It serves what engine discovery uses, as the API server does:
- ``GET /api/v1/namespaces/NS/pods?labelSelector=...``: a PodList at the current
  resourceVersion (a consistent read);
- ``...&watch=true&resourceVersion=RV``: a chunked stream of watch events, one JSON line each:
  the history after RV, then live events; ADDED / DELETED when a pod starts / stops matching the
  selector; BOOKMARK events (only with ``allowWatchBookmarks=true``) when the test asks;
  ``timeoutSeconds`` ends the stream cleanly; a version older than the kept history is answered
  with an ERROR event carrying a 410 Expired Status (as the API server does for a watch);
  without a version (or "0"), a synthetic ADDED per matching pod first;
- a bearer token from its kubeconfig (``kubeconfig()``), else 401.

A test changes pods (``add_pod``, ``update_pod``: IP change, Ready flip, labels, termination;
``delete_pod``), ends watches (``drop_watches``: cleanly or by cutting the connection mid-
stream; ``expire_watches``: a 410 in-stream), forgets history (``compact``: watches from older
versions get 410), sends bookmarks, and makes requests fail (``fail_next``). Every call is
thread-safe (it runs on the server's loop) and returns once the server has applied it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from discovery.selector import Selector

T = TypeVar("T")
TOKEN = "fake-kube-token"
MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True)
class FakePod:
    name: str
    ip: str | None
    labels: dict[str, str] = field(default_factory=lambda: {"app": "engine"})
    ready: bool = True
    phase: str = "Running"
    ports: dict[str, int] = field(default_factory=lambda: {"http": 8000})
    deleting: bool = False  # a deletionTimestamp is set (terminating)
    uid: str = ""


class _End(enum.Enum):
    CLEAN = "clean"  # the last chunk, then the connection is reusable
    CUT = "cut"  # the connection is aborted mid-stream
    EXPIRED = "expired"  # an ERROR event with a 410 Status, then the last chunk


@dataclass(eq=False)
class _Watch:
    selector: Selector
    bookmarks: bool
    queue: asyncio.Queue[bytes | _End] = field(default_factory=asyncio.Queue)


@dataclass(frozen=True)
class _Entry:
    version: int
    old: FakePod | None
    new: FakePod | None


class FakeKube:
    """Pods in one namespace, served list + watch on 127.0.0.1 (port chosen by the kernel)."""

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace
        self.version = 1000
        self.pods: dict[str, FakePod] = {}
        self.history: list[_Entry] = []
        self.oldest = self.version  # a watch from a version below this one gets 410
        self.watches: set[_Watch] = set()
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) of each request
        self._fail: list[int] = []  # statuses for the next requests
        self._uids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-kube",
                                        daemon=True)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    # ---- lifecycle ----

    def __enter__(self) -> FakeKube:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            while True:
                self._end_all(_End.CUT)
                for writer in self._writers:
                    writer.transport.abort()  # idle keep-alive connections
                await asyncio.gather(*self._connections, return_exceptions=True)
                await asyncio.sleep(0)  # a connection accepted last starts its task
                if not self._connections:
                    break
            await self._server.wait_closed()

        self._run(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file pointing at this server (JSON is YAML), with its bearer token."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": self.namespace}}]}))
        return path

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _call(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return self._run(call())  # type: ignore[no-any-return]

    # ---- what a test does (thread-safe) ----

    def add_pod(self, name: str, ip: str | None, **fields: Any) -> int:
        """Create a pod (``FakePod`` fields as keywords); returns the new resourceVersion."""
        return self._call(lambda: self._change(name, FakePod(
            name, ip, uid=f"uid-{next(self._uids)}", **fields)))

    def update_pod(self, name: str, **fields: Any) -> int:
        """Change a pod's ``ip``, ``ready``, ``labels``, ``phase``, ``ports`` or ``deleting``."""
        return self._call(lambda: self._change(name, replace(self.pods[name], **fields)))

    def delete_pod(self, name: str) -> int:
        return self._call(lambda: self._change(name, None))

    def drop_watches(self, *, clean: bool = False) -> int:
        """End every open watch: with the last chunk (``clean``) or by cutting the connection
        mid-stream; returns how many."""
        return self._call(lambda: self._end_all(_End.CLEAN if clean else _End.CUT))

    def expire_watches(self) -> int:
        """An ERROR event with 410 Gone into every open watch (then it ends), and the history
        compacted, so a watch resumed from any version seen so far gets 410 again."""
        def expire() -> int:
            self._compact()
            return self._end_all(_End.EXPIRED)

        return self._call(expire)

    def compact(self) -> None:
        """Forget the history: a watch from any version before now gets 410 (open ones go on)."""
        self._call(self._compact)

    def bookmark(self) -> int:
        """A BOOKMARK at the current version into every watch that asked for bookmarks."""
        def send() -> int:
            line = _line("BOOKMARK", {"kind": "Pod", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": str(self.version)}})
            sent = [w for w in self.watches if w.bookmarks]
            for w in sent:
                w.queue.put_nowait(line)
            return len(sent)

        return self._call(send)

    def fail_next(self, count: int, status: int = 500) -> None:
        """Answer the next ``count`` requests with ``status`` (a Status body)."""
        self._call(lambda: self._fail.extend([status] * count))

    def open_watches(self) -> int:
        return self._call(lambda: len(self.watches))

    def current_version(self) -> int:
        return self._call(lambda: self.version)

    # ---- state ----

    def _change(self, name: str, new: FakePod | None) -> int:
        old = self.pods.get(name)
        if old is None and new is None:
            raise KeyError(name)
        self.version += 1
        if new is None:
            del self.pods[name]
        else:
            self.pods[name] = new
        entry = _Entry(self.version, old, new)
        self.history.append(entry)
        for w in self.watches:
            line = self._event(w, entry)
            if line is not None:
                w.queue.put_nowait(line)
        return self.version

    def _compact(self) -> None:
        self.history.clear()
        self.oldest = self.version + 1

    def _end_all(self, end: _End) -> int:
        ended = list(self.watches)
        for w in ended:
            w.queue.put_nowait(end)
        self.watches.clear()
        return len(ended)

    def _event(self, w: _Watch, entry: _Entry) -> bytes | None:
        was = entry.old is not None and w.selector.matches(entry.old.labels)
        now = entry.new is not None and w.selector.matches(entry.new.labels)
        if now:
            assert entry.new is not None
            return _line("MODIFIED" if was else "ADDED", self._pod_json(entry.new, entry.version))
        if was:
            last = entry.new or entry.old
            assert last is not None
            return _line("DELETED", self._pod_json(last, entry.version))
        return None

    def _pod_json(self, pod: FakePod, version: int) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": pod.name, "namespace": self.namespace, "uid": pod.uid,
                                "resourceVersion": str(version), "labels": dict(pod.labels)}
        if pod.deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            meta["deletionGracePeriodSeconds"] = 30
        status: dict[str, Any] = {"phase": pod.phase, "conditions": [
            {"type": "Ready", "status": "True" if pod.ready else "False"},
            {"type": "PodScheduled", "status": "True"}]}
        if pod.ip is not None:
            status["podIP"] = pod.ip
            status["podIPs"] = [{"ip": pod.ip}]
        ports = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in pod.ports.items()]
        return {"kind": "Pod", "apiVersion": "v1", "metadata": meta,
                "spec": {"containers": [{"name": "engine", "image": "vllm", "ports": ports}]},
                "status": status}

    # ---- HTTP ----

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._connections.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is done."""
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_HEADER_BYTES:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        url = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        self.requests.append((url.path, query))
        if headers.get("authorization") != f"Bearer {TOKEN}":
            return await _status(writer, 401, "Unauthorized", "no or wrong bearer token")
        if self._fail:
            return await _status(writer, self._fail.pop(0), "InternalError", "made to fail")
        if method != "GET" or url.path != f"/api/v1/namespaces/{self.namespace}/pods":
            return await _status(writer, 404, "NotFound", f"{method} {url.path}")
        try:
            selector = Selector.parse(query.get("labelSelector", ""))
        except ValueError as exc:
            return await _status(writer, 400, "BadRequest", str(exc))
        if query.get("watch") in ("true", "1"):
            return await self._watch(writer, query, selector)
        items = [self._pod_json(p, self.version) for p in sorted(
            self.pods.values(), key=lambda p: p.name) if selector.matches(p.labels)]
        body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                           "metadata": {"resourceVersion": str(self.version)},
                           "items": items}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        return True

    async def _watch(self, writer: asyncio.StreamWriter, query: dict[str, str],
                     selector: Selector) -> bool:
        w = _Watch(selector, query.get("allowWatchBookmarks") == "true")
        since = query.get("resourceVersion", "")
        if since not in ("", "0") and int(since) < self.oldest - 1:
            w.queue.put_nowait(_End.EXPIRED)
        else:
            if since in ("", "0"):
                backlog = [_line("ADDED", self._pod_json(p, self.version))
                           for p in self.pods.values() if selector.matches(p.labels)]
            else:
                backlog = [line for e in self.history if e.version > int(since)
                           if (line := self._event(w, e)) is not None]
            for line in backlog:
                w.queue.put_nowait(line)
            self.watches.add(w)  # no await since the history was read: nothing is missed
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query else None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    item = await w.queue.get()
                    if item is _End.CUT:
                        writer.transport.abort()
                        return False
                    if item is _End.EXPIRED:
                        item = _line("ERROR", {
                            "kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": f"too old resource version: {since} ({self.oldest})",
                            "reason": "Expired", "code": 410})
                        writer.write(b"%x\r\n%s\r\n" % (len(item), item))
                        break
                    if item is _End.CLEAN:
                        break
                    writer.write(b"%x\r\n%s\r\n" % (len(item), item))
                    await writer.drain()
        except TimeoutError:
            pass  # timeoutSeconds: the server ends the watch
        finally:
            self.watches.discard(w)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


async def _status(writer: asyncio.StreamWriter, code: int, reason: str, message: str) -> bool:
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()
    writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"\r\n%s" % (code, reason.encode(), len(body), body))
    await writer.drain()
    return True
