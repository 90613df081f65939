"""The Kubernetes source: pods by label selector, listed then watched (lightkube's async client).

Each pod with an IP address is an engine named after the pod, at ``scheme://podIP:port`` (the
port a number or a container port's name). It is ready while its Ready condition is True, it
runs, and it is not being deleted (a pod given a deletionTimestamp is leaving, as the
EndpointSlice controller treats it). A DELETED pod, or one that stops matching the selector,
leaves.

The watch follows client-go's reflector: LIST (a consistent read) sets the engine set and the
resourceVersion, WATCH from there applies each event and moves the version on (bookmarks too,
so a resumed watch rarely finds its version compacted). lightkube re-opens a watch the server
ends cleanly from the last version seen. A watch answered 410 Gone (its version is gone from
the server's history) relists at once; any other error relists after a doubling pause. A
relist replaces the whole set, and snapshots are diffed (discovery/endpoints.py), so a relist
neither loses nor duplicates an engine. While the API server cannot be reached, the last set
stays: an outage of the control plane does not drain the fleet.

RBAC: get, list and watch on pods in the namespace (docs/operations.md, "Discovery").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from typing import Any, cast

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig, NotReadyError, SingleConfig, operators
from lightkube.config.client_adapter import verify_cluster
from lightkube.resources.core_v1 import Pod

from discovery.endpoints import Endpoint, EngineSet, base_url
from discovery.options import KubernetesOptions
from discovery.selector import Op, Requirement, Selector

log = logging.getLogger("kvroute.discovery")

GONE = 410


@dataclass
class KubeCounters:
    lists: int = 0  # LISTs answered (the first, and every relist)
    expired: int = 0  # watches answered 410 Gone
    errors: int = 0  # failed LISTs and watches (other than 410)
    events: int = 0  # ADDED / MODIFIED / DELETED events applied
    bookmarks: int = 0


class BookmarkTransport(httpx2.AsyncBaseTransport):
    """Asks the API server for watch bookmarks (``allowWatchBookmarks=true`` on every watch
    request): lightkube's ``watch`` has no option for it, and an httpx transport is httpx's
    public hook for what a client sends."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.params.get("watch") == "true":
            request.url = request.url.copy_set_param("allowWatchBookmarks", "true")
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def kube_config(options: KubernetesOptions) -> SingleConfig:
    """The kubeconfig file's context named in the options, else the in-cluster service
    account; raises (lightkube's ConfigError, OSError, ValueError) when there is none."""
    loaded = (KubeConfig.from_file(options.kubeconfig) if options.kubeconfig is not None
              else KubeConfig.from_service_account())
    config = loaded.get(options.context)
    if config is None:
        raise ValueError(f"kubeconfig {options.kubeconfig}: no context {options.context!r}")
    if config.user is None:
        raise ValueError(f"kubeconfig {options.kubeconfig}: the context names no user")
    return config


def make_client(config: SingleConfig, namespace: str) -> AsyncClient:
    # The transport replaces lightkube's default one, so it verifies the server as that one
    # would: lightkube's own TLS context for this kubeconfig (CA, client certificate).
    assert config.user is not None, "kube_config checks it"
    tls = verify_cluster(config.cluster, config.user, config.abs_file)
    transport = BookmarkTransport(httpx2.AsyncHTTPTransport(verify=tls))
    return AsyncClient(config, namespace=namespace, transport=transport)


def _operator(r: Requirement) -> operators.Operator[Any]:
    if r.op is Op.EXISTS:
        return operators.exists()
    if r.op is Op.NOT_EXISTS:
        return operators.not_exists()
    if r.op is Op.EQUAL:
        return operators.equal(r.values[0])
    if r.op is Op.NOT_EQUAL:
        return operators.not_equal(r.values[0])
    return operators.in_(r.values) if r.op is Op.IN else operators.not_in(r.values)


LabelSelector = dict[str, str | operators.Operator[Any] | Iterable[Any] | None]


def lightkube_labels(selector: Selector) -> LabelSelector:
    """The selector as lightkube's ``labels`` (it encodes them back into the same string)."""
    return {r.key: _operator(r) for r in selector.requirements}


def pod_port(pod: Pod, port: int | str) -> int | None:
    """The port number: ``port`` itself, or the container port of that name (None: none)."""
    if isinstance(port, int):
        return port
    for container in (pod.spec.containers if pod.spec is not None else None) or ():
        for p in container.ports or ():
            if p.name == port:
                return p.containerPort
    return None


def pod_ready(pod: Pod) -> bool:
    """Running, Ready condition True, and not being deleted."""
    status, meta = pod.status, pod.metadata
    if status is None or meta is None or meta.deletionTimestamp is not None:
        return False
    if status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())


def _gone(exc: Exception) -> bool:
    """410 Gone: in a watch's ERROR event (lightkube's ApiError) or as the answer's status."""
    if isinstance(exc, ApiError):
        return exc.status.code == GONE
    return isinstance(exc, httpx2.HTTPStatusError) and exc.response.status_code == GONE


class KubernetesSource:
    """Pods matching the selector in one namespace, as a stream of engine sets."""

    def __init__(self, options: KubernetesOptions) -> None:
        self.options = options
        self.selector = Selector.parse(options.selector)
        self.config = kube_config(options)  # read now: a bad kubeconfig fails at startup
        self.namespace = options.namespace or self.config.namespace
        self.pods: dict[str, Endpoint] = {}  # by pod name: the pods with an address
        # The last version seen: of the last LIST, event or bookmark.
        self.resource_version: str | None = None
        self.counters = KubeCounters()
        self._portless: set[str] = set()  # pods already warned about (no such named port)

    async def snapshots(self) -> AsyncGenerator[EngineSet, None]:
        """Each call starts afresh (a new client, a LIST first)."""
        client = make_client(self.config, self.namespace)
        delay = self.options.retry_min
        expired_again = False  # a 410 straight after a relist: back off, as for any error
        try:
            while True:
                try:
                    await self._relist(client)
                    delay = self.options.retry_min
                    yield dict(self.pods)
                    async with contextlib.aclosing(self._watch(client)) as watch:
                        async for _ in watch:
                            expired_again = False
                            yield dict(self.pods)
                    # lightkube re-opens a watch the server ends; it stops only by raising.
                except (httpx2.HTTPError, OSError, ValueError, NotReadyError) as exc:
                    # ValueError: a body that does not decode (msgspec's errors are ValueErrors).
                    if _gone(exc):
                        self.counters.expired += 1
                        log.info("Kubernetes discovery: watch version expired (410); relisting",
                                 extra={"namespace": self.namespace,
                                        "resource_version": self.resource_version})
                        if not expired_again:
                            expired_again = True
                            continue
                    else:
                        self._failed(exc)
                await asyncio.sleep(delay)
                delay = min(2 * delay, self.options.retry_max)
        finally:
            await client.close()

    def _failed(self, exc: Exception) -> None:
        self.counters.errors += 1
        log.warning("Kubernetes discovery: list/watch failed; keeping the engines found last "
                    "and relisting", extra={"namespace": self.namespace, "error": repr(exc)})

    async def _relist(self, client: AsyncClient) -> None:
        listing = client.list(Pod, namespace=self.namespace,
                              labels=lightkube_labels(self.selector))
        pods: dict[str, Endpoint] = {}
        async for pod in listing:
            endpoint = self._endpoint(pod)
            if endpoint is not None:
                pods[endpoint.name] = endpoint
        version = listing.resourceVersion
        self.pods = pods
        self.resource_version = version
        self.counters.lists += 1

    async def _watch(self, client: AsyncClient) -> AsyncGenerator[None, None]:
        """Applies the watch's events from the current version; yields after each change."""
        timeout = int(self.options.watch_timeout * (1 + random.random()))
        events = cast(AsyncGenerator[tuple[str, Pod], None], client.watch(
            Pod, namespace=self.namespace, labels=lightkube_labels(self.selector),
            resource_version=self.resource_version, server_timeout=timeout))
        async with contextlib.aclosing(events):
            async for kind, pod in events:
                if self._apply(kind, pod):
                    yield None

    def _apply(self, kind: str, pod: Pod) -> bool:
        """One watch event; True if the engine set changed."""
        meta = pod.metadata
        if meta is not None and meta.resourceVersion:
            self.resource_version = meta.resourceVersion
        if kind == "BOOKMARK":
            self.counters.bookmarks += 1
            return False
        self.counters.events += 1
        name = meta.name if meta is not None else None
        if name is None:
            return False
        before = self.pods.get(name)
        endpoint = self._endpoint(pod) if kind in ("ADDED", "MODIFIED") else None
        if endpoint is None:
            self.pods.pop(name, None)
        else:
            self.pods[name] = endpoint
        return self.pods.get(name) != before

    def _endpoint(self, pod: Pod) -> Endpoint | None:
        meta, status = pod.metadata, pod.status
        if meta is None or not meta.name or status is None or not status.podIP:
            return None  # not scheduled or no address yet
        port = pod_port(pod, self.options.port)
        if port is None:
            if meta.name not in self._portless:
                self._portless.add(meta.name)
                log.warning("Kubernetes discovery: pod has no container port of that name",
                            extra={"pod": meta.name, "port": self.options.port})
            return None
        return Endpoint(meta.name, base_url(self.options.scheme, status.podIP, port),
                        pod_ready(pod))
