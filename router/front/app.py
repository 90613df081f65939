"""The router's ASGI app: OpenAI + token-in endpoints, render endpoints, probes; lifespan owns all.

    POST /v1/chat/completions, /v1/completions      render -> route -> engine -> pipeline (SSE/JSON)
    POST /inference/v1/generate                     token-in GenerateRequest -> token-out
    POST /inference/v1/abort_requests               {"request_ids": [...]}
    POST /v1/load_lora_adapter, /v1/unload_lora_adapter  LoRA adapters at run time, with
                                                    VLLM_ALLOW_RUNTIME_LORA_UPDATING (lora.py)
    POST /v1/chat/completions/render, /v1/completions/render, /tokenize, /detokenize  (render's)
    GET  /v1/models, /metrics; /health (liveness), /ready (readiness) — never behind the API key
    POST/GET /admin/engines, DELETE /admin/engines/NAME   join, list, drain and remove engines
                                                    (admin key only; 404 without one: control.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from discovery.sources import open_source
from output.detokenize import TokenDecoder
from output.sse import RAW_SEND
from radix import PrefixIndex
from render.protocol import GenerateRequest
from render.service import server as render_server
from render.service.config import DEFAULT_RENDER_THREADS, ModelSpec, RenderLimits, model_spec
from render.service.loading import Codecs, load_served
from render.service.state import STATE_KEY as RENDER_KEY
from render.service.state import Models, RenderState, render_pool
from router.config import ConfigError, RouterConfig
from router.front import control, handlers, lora
from router.front.fast_path import FastPath
from router.front.render_client import RenderClient
from router.front.shutdown import cut_open_requests
from router.front.state import STATE_KEY as ROUTER_KEY
from router.front.state import Lifecycle, RouterState, router_state
from router.kvfeed.kv_subscriber import KVSubscriber
from router.link.engine_client import EngineClient
from router.link.engine_state import EngineStatus
from router.link.http_client import HttpEngineClient
from router.link.transport import EngineLinks
from router.obs.metrics import RouterMetrics
from router.routing.adapters import Adapters
from router.routing.admission import Admission
from router.routing.discovered import Reconciler, http_spec
from router.routing.dispatch import Dispatcher
from router.routing.drain import Drains
from router.routing.engine_memory import EngineMemory
from router.routing.fleet import Fleet
from router.routing.policy import Policy
from serving.errors import (
    APIError,
    AuthenticationError,
    ClientGoneError,
    EngineLinkError,
    NotFoundError,
    OverloadedError,
    ShuttingDownError,
)
from serving.guard import ApiKey, RequestIdSend
from serving.http_errors import ErrorPath, error_response
from serving.metrics import RenderMetrics

log = logging.getLogger("kvroute.router")

PROBES = frozenset({"/health", "/ping", "/ready", "/metrics"})
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


ADMIN = "/admin/"


class Guard:
    """Pure ASGI: x-request-id in/out, bearer API key on public paths, the admin key (and only
    it) on ``/admin/*`` (which is not there without one: 404), draining refusals."""

    def __init__(self, app: ASGIApp, api_key: ApiKey, admin_key: ApiKey | None,
                 lifecycle: Lifecycle) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_key = admin_key
        self.lifecycle = lifecycle

    def _refusal(self, scope: Scope) -> APIError | None:
        path = scope["path"]
        if path.startswith(ADMIN):
            if self.admin_key is None:
                return NotFoundError("Not Found")  # no admin key configured: no admin endpoints
            if not self.admin_key.admits(scope["headers"]):
                return AuthenticationError("Invalid or missing admin key.")
            return None
        if path not in PROBES and not self.api_key.admits(scope["headers"]):
            return AuthenticationError()
        if self.lifecycle.draining and path not in PROBES and scope["method"] == "POST":
            return ShuttingDownError()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send_with_id = RequestIdSend(scope["headers"], send)
        # An unfit x-request-id first, then the keys, then the drain.
        refusal = send_with_id.refusal or self._refusal(scope)
        if refusal is not None:
            await error_response(refusal)(scope, receive, send_with_id)
            return
        await self.app(scope, receive, send_with_id)


class RouterApp(Starlette):
    """Starlette, plus the server's own ``send`` in the scope for SSE body chunks, and the model
    POSTs served by router/front/fast_path.py ahead of the middleware stack when it takes them.

    Starlette's ServerErrorMiddleware (outermost), Guard and ExceptionMiddleware each wrap
    ``send``; none of them acts on body messages, yet each wrapper costs per token.
    """

    fast: FastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND] = send
        try:
            fast = self.fast
            if fast is not None and scope["type"] == "http":
                opener = fast.take(scope)
                if opener is not None:
                    scope["app"] = self
                    await fast(opener, scope, receive, send)
                    return
            await super().__call__(scope, receive, send)
        finally:
            # The server's ``send`` is a method of its per-request object, which holds this
            # scope: left in, the pair is a reference cycle, and everything the request held
            # (its stream, channel, scope and headers) waits for the cyclic collector instead of
            # going at once, whose passes then stall whichever request is running.
            del scope[RAW_SEND]


def router_errors() -> ErrorPath:
    """The router's error path: refusals and departures counted in its metrics, render's errors
    in render's (as the render service counts them)."""

    def observe(request: Request, err: APIError) -> None:
        st = router_state(request.scope["state"])
        if isinstance(err, OverloadedError):
            st.router_metrics.rejected.labels(str(err.status)).inc()
        elif isinstance(err, ClientGoneError):
            st.router_metrics.requests.labels(request.url.path, "499").inc()
        elif not isinstance(err, EngineLinkError):
            st.render.metrics.add_error(request.url.path, err.type)

    return ErrorPath(observe)


async def health(request: Request) -> Response:
    return Response(b"", status_code=200)


async def ready(request: Request) -> Response:
    st = router_state(request.scope["state"])
    if st.lifecycle.draining:
        return Response(b"draining", status_code=503)
    if not st.dispatcher.healthy():
        return Response(b"no engine ready", status_code=503)
    return Response(b"ready", status_code=200)


async def metrics_endpoint(request: Request) -> Response:
    st = router_state(request.scope["state"])
    body = st.router_metrics.exposition() + st.render.metrics.exposition()
    return Response(body, media_type=PROMETHEUS)


def _engine_snapshot(client: EngineLinks) -> Callable[[], dict[str, dict[str, float]]]:
    def read() -> dict[str, dict[str, float]]:
        out = {}
        for name, eng in client.engines.items():
            stats = eng.scheduler_stats or {}
            out[name] = {
                "engine_healthy": float(eng.status is EngineStatus.READY),
                "engine_running_requests": float(stats.get("num_running_reqs", 0)),
                "engine_waiting_requests": float(stats.get("num_waiting_reqs", 0)),
                "engine_kv_cache_usage": float(stats.get("kv_cache_usage", 0.0)),
            }
        return out

    return read


def model_of(cfg: RouterConfig) -> ModelSpec:
    """The model the router renders for, named as `kvroute render` would name it."""
    return model_spec(
        Path(cfg.model), cfg.served_model_name,
        tokenizer=Path(cfg.tokenizer) if cfg.tokenizer else None,
        chat_template=Path(cfg.chat_template) if cfg.chat_template else None,
        max_model_len=cfg.max_model_len, tool_call_parser=cfg.tool_call_parser,
        reasoning_parser=cfg.reasoning_parser,
        enable_auto_tool_choice=cfg.enable_auto_tool_choice)


def create_app(cfg: RouterConfig,
               on_ready: Callable[[RouterState], None] | None = None) -> Starlette:
    """The router app; its lifespan builds every socket, task and index and tears them down.
    ``on_ready(live)`` runs once the lifespan has built them, before the first request."""
    lifecycle = Lifecycle()
    spec = model_of(cfg)
    for module in cfg.lora_modules:
        if module.name == spec.served_model_name:
            raise ConfigError(f"lora_modules: the LoRA adapter {module.name!r} conflicts with "
                              "the served base model's name")
    limits = RenderLimits(max_body_bytes=cfg.limits.max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, object]]:
        lifecycle.idle = asyncio.Event()
        lifecycle.idle.set()
        # First, before any socket: a kubeconfig or service account that cannot be read fails
        # the startup.
        source = open_source(cfg.discovery.source) if cfg.discovery is not None else None
        registry, parsers = await asyncio.to_thread(
            lambda: load_served([spec], limits=cfg.limits.request,
                                structured_outputs=cfg.structured_outputs))
        models = Models(registry, int(time.time()), parsers)
        pool = await asyncio.to_thread(render_pool, DEFAULT_RENDER_THREADS, registry)
        render = RenderState(models, (spec.model,), limits, pool, Codecs(),
                             RenderMetrics(render_server.ROUTE_PATHS), None)
        remote = RenderClient(cfg.render_url) if cfg.render_url else None
        metrics = RouterMetrics()
        index = PrefixIndex(max_blocks=cfg.limits.max_index_blocks)
        client = EngineLinks(
            cfg.engines,
            EngineClient(client_index=cfg.link.client_index,
                         dead_after=cfg.limits.engine_dead_after,
                         max_msg_size=cfg.link.max_output_msg_bytes,
                         allowed_peers=cfg.link.allowed_peers,
                         idle_probe_after=cfg.limits.engine_idle_probe),
            HttpEngineClient(cfg.link, dead_after=cfg.limits.engine_dead_after,
                             max_logprobs=cfg.limits.max_logprobs))
        await client.start()
        kv = KVSubscriber(index, max_msg_size=cfg.link.max_kv_msg_bytes,
                          allowed_peers=cfg.link.allowed_peers)
        await kv.start()
        adapters = Adapters(client, models.registry)
        adapters.add_static(cfg.lora_modules)
        if cfg.allow_runtime_lora_updating:
            log.warning("LoRA dynamic loading & unloading is enabled: POST "
                        "/v1/load_lora_adapter and /v1/unload_lora_adapter change what every "
                        "engine serves (keep them behind the API key)")
        admission = Admission(cfg.limits.max_in_flight_per_engine, cfg.limits.max_queue,
                              cfg.limits.queue_timeout, cfg.limits.retry_after)
        caps = {id(r): r.max_model_len for r in models.registry}

        def set_context(max_model_len: int) -> None:
            # Render admits what every ready engine can take (each model: at most its own).
            for r in models.registry:
                r.max_model_len = min(caps[id(r)], max_model_len)

        # A configured --max-model-len is kept; else the engines' own lengths rule.
        fleet = Fleet(client, kv, index, admission, cfg.engines,
                      max_model_len=min(caps.values()),
                      on_context=None if cfg.max_model_len is not None else set_context,
                      adapters=adapters, memory=EngineMemory(cfg.state_dir))
        metrics.queue_depth.set_function(lambda: admission.queued)
        metrics.watch_engines(_engine_snapshot(client))
        metrics.watch_kv_events(fleet.kv_snapshot)
        dispatcher = Dispatcher(client, Policy(cfg.policy, index), admission, metrics,
                                adapters=adapters,
                                max_resumes=cfg.streams.max_resumes if cfg.streams.resume else 0)
        drains = Drains(fleet, dispatcher)
        decoders = {r.served_model_name: TokenDecoder(r.tokenizer) for r in models.registry}
        tasks = [asyncio.create_task(fleet.watch(), name="fleet-watch")]
        discovery = None
        if cfg.discovery is not None and source is not None:
            discovery = Reconciler(fleet, drains, http_spec,
                                   drain_timeout=cfg.discovery.drain_timeout,
                                   max_engines=cfg.control.max_engines)
            tasks.append(asyncio.create_task(discovery.run(source), name="discovery"))
            metrics.watch_discovery(discovery.snapshot)
        st = RouterState(
            config=cfg, render=render, models=models, remote=remote, client=client, kv=kv,
            index=index, dispatcher=dispatcher, fleet=fleet, drains=drains, discovery=discovery,
            lifecycle=lifecycle,
            router_metrics=metrics, decoders=decoders,
            generate_decoder=msgspec.json.Decoder(GenerateRequest), adapters=adapters)
        # For in-process tools (demo, tests): the same object the handlers see.
        app.state.live = st
        lifecycle.cut = partial(cut_open_requests, st)
        # The startup heap (tokenizers, templates, the index) lives as long as the process, yet
        # each full collection re-scans it, a pause in the middle of streams that grows with the
        # heap. Freeze it.
        gc.collect()
        gc.freeze()
        if on_ready is not None:
            on_ready(st)
        try:
            yield {ROUTER_KEY: st, RENDER_KEY: render}
        finally:
            gc.unfreeze()  # in-process users (tests, the demo) get their garbage collected again
            lifecycle.draining = True
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await drains.close()
            await adapters.close()
            await kv.close()
            await client.close()
            if remote is not None:
                await remote.close()
            pool.shutdown(wait=False, cancel_futures=True)

    routes = [
        Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        Route("/v1/completions", handlers.completions, methods=["POST"]),
        Route("/inference/v1/generate", handlers.generate, methods=["POST"]),
        Route("/inference/v1/abort_requests", handlers.abort_requests, methods=["POST"]),
        Route("/v1/chat/completions/render", render_server.chat_render, methods=["POST"]),
        Route("/v1/completions/render", render_server.completion_render, methods=["POST"]),
        Route("/tokenize", render_server.tokenize_endpoint, methods=["POST"]),
        Route("/detokenize", render_server.detokenize_endpoint, methods=["POST"]),
        Route("/v1/models", lora.list_models, methods=["GET"]),
        Route("/admin/engines", control.add_engine, methods=["POST"]),
        Route("/admin/engines", control.list_engines, methods=["GET"]),
        Route("/admin/engines/{name}", control.remove_engine, methods=["DELETE"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    if cfg.allow_runtime_lora_updating:
        routes += [
            Route("/v1/load_lora_adapter", lora.load_lora_adapter, methods=["POST"]),
            Route("/v1/unload_lora_adapter", lora.unload_lora_adapter, methods=["POST"]),
        ]
    errors = router_errors()
    api_key = ApiKey(cfg.api_key)
    app = RouterApp(routes=routes, lifespan=lifespan, exception_handlers=dict(errors.handlers()))
    admin_key = ApiKey(cfg.control.admin_key) if cfg.control.admin_key else None
    app.add_middleware(Guard, api_key=api_key, admin_key=admin_key, lifecycle=lifecycle)
    app.fast = FastPath(api_key, lifecycle, errors)
    app.state.lifecycle = lifecycle
    return app

