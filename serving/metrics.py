"""Prometheus metrics of one render app, in a registry the app owns (never the global one).

A pure ASGI middleware times every HTTP request and counts it by route and status; handlers add
prompt tokens and error types. Paths outside the known routes share the label ``other`` so a
scanner cannot grow the label set without bound. With several worker processes each worker serves
its own counters (a scrape reaches one worker; ``worker`` tells them apart).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)


class HelperMetrics(NamedTuple):
    """One pool of helper processes' metrics (this worker's children)."""

    ready: Any
    renders: Any
    in_flight: Any
    restarts: Any


class RenderMetrics:
    def __init__(self, routes: Iterable[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.routes = frozenset(routes)
        self.worker = str(os.getpid())
        self.requests = Counter(
            "kvroute_render_requests", "HTTP requests answered", ["route", "status", "worker"],
            registry=self.registry,
        )
        self.errors = Counter(
            "kvroute_render_errors", "Requests answered with an error, by OpenAI error type",
            ["route", "type", "worker"], registry=self.registry,
        )
        self.latency = Histogram(
            "kvroute_render_request_seconds", "Time from request start to response end",
            ["route", "worker"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "kvroute_render_prompt_tokens", "Prompt tokens rendered", ["model", "worker"],
            registry=self.registry,
        )
        # render/service/offload.py: the helper processes rendering big bodies, and those
        # rendering requests' own chat templates under limits (render/service/sandbox.py).
        self.helpers = self._helper_metrics(
            ("kvroute_render_helpers_ready", "kvroute_render_helper_renders",
             "kvroute_render_helper_in_flight", "kvroute_render_helper_restarts"), "render helper")
        self.template_helpers = self._helper_metrics(
            ("kvroute_render_template_helpers_ready", "kvroute_render_template_renders",
             "kvroute_render_template_in_flight", "kvroute_render_template_helper_restarts"),
            "template helper")
        self.template_limits = Counter(
            "kvroute_render_template_limits",
            "Request chat templates refused for exceeding a limit (time, memory, process ended)",
            ["limit", "worker"], registry=self.registry,
        )
        # Labelled children by label values: ``labels()`` takes a lock and builds a key on each
        # call, three times per request. Both key sets are bounded (known routes, HTTP statuses,
        # served models).
        self._done: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._tokens: dict[str, Any] = {}

    def _helper_metrics(self, names: tuple[str, str, str, str], what: str) -> HelperMetrics:
        ready, renders, in_flight, restarts = names
        w = self.worker
        return HelperMetrics(
            Gauge(ready, f"{what} processes with their models loaded", ["worker"],
                  registry=self.registry).labels(w),
            Counter(renders, f"Requests rendered in a {what} process (errors too)", ["worker"],
                    registry=self.registry).labels(w),
            Gauge(in_flight, f"Requests handed to a {what} process, not back yet", ["worker"],
                  registry=self.registry).labels(w),
            Counter(restarts, f"{what} pools respawned after a process died", ["worker"],
                    registry=self.registry).labels(w),
        )

    def route_label(self, path: str) -> str:
        return path if path in self.routes else "other"

    def add_prompt_tokens(self, model: str, n: int) -> None:
        child = self._tokens.get(model)
        if child is None:
            child = self._tokens[model] = self.prompt_tokens.labels(model, self.worker)
        child.inc(n)

    def request_done(self, path: str, status: int, seconds: float) -> None:
        route = self.route_label(path)
        children = self._done.get((route, status))
        if children is None:
            children = self._done[(route, status)] = (
                self.requests.labels(route, str(status), self.worker),
                self.latency.labels(route, self.worker),
            )
        children[0].inc()
        children[1].observe(seconds)

    def add_error(self, path: str, type_: str) -> None:
        self.errors.labels(self.route_label(path), type_, self.worker).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts and times each HTTP request (status taken from the response start)."""

    def __init__(self, app: ASGIApp, metrics: RenderMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.request_done(scope["path"], status, time.perf_counter() - t0)
