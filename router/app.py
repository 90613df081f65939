"""The router's ASGI app: OpenAI + token-in endpoints, render endpoints, probes; lifespan owns all.

    POST /v1/chat/completions, /v1/completions      render -> route -> engine -> pipeline (SSE/JSON)
    POST /inference/v1/generate                     token-in GenerateRequest -> token-out
    POST /inference/v1/abort_requests               {"request_ids": [...]}
    POST /v1/chat/completions/render, /v1/completions/render, /tokenize, /detokenize  (render's)
    GET  /v1/models, /metrics; /health (liveness), /ready (readiness) — never behind the API key
    POST /admin/engines                             an engine joins at run time (handshake address)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radix import PrefixIndex
from render import server as render_server
from render.http_config import ModelSpec, ServerConfig
from render.http_errors import EXCEPTION_HANDLERS, error_response
from render.http_metrics import RenderMetrics
from render.loading import Codecs, load_models
from render.models import served_name
from render.protocol import GenerateRequest
from router import handlers
from router.admission import Admission, Overloaded
from router.config import RouterConfig
from router.detokenize import TokenDecoder
from router.dispatch import Dispatcher
from router.engine_client import EngineClient, EngineLinkError, EngineStatus
from router.fast_path import FastPath
from router.fleet import Fleet
from router.kv_subscriber import KVSubscriber
from router.metrics import RouterMetrics
from router.policy import Policy
from router.render_client import RenderClient
from router.sse import RAW_SEND

PROBES = frozenset({"/health", "/ready", "/metrics", "/ping"})
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Lifecycle:
    """Readiness and the streams in progress, for probes and graceful drain (one per app)."""

    draining: bool = False
    active: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def enter(self) -> None:
        self.active += 1
        self.idle.clear()

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()

    async def drain(self, timeout: float) -> bool:
        """Flip readiness, then wait for streams to finish; True if all did in time."""
        self.draining = True
        if self.active == 0:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), timeout)
        return self.active == 0


class Guard:
    """Pure ASGI: x-request-id in/out, bearer API key on public paths, draining refusals."""

    def __init__(self, app: ASGIApp, api_key: str | None, lifecycle: Lifecycle) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        rid = headers.get(b"x-request-id") or f"req-{time.monotonic_ns():x}".encode()
        scope.setdefault("state", {})["request_id"] = rid.decode("latin-1")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid)]
            await send(message)

        path = scope["path"]
        if path not in PROBES and self.api_key is not None:
            auth = headers.get(b"authorization", b"")
            if not (auth[:7].lower() == b"bearer " and hmac.compare_digest(auth[7:], self.api_key)):
                resp = error_response(401, "Invalid or missing API key.", "AuthenticationError",
                                      None)
                resp.headers["www-authenticate"] = "Bearer"
                # Answered before its body was read, so the server will close the connection
                # (h11 cannot find the next request's start): said up front, a keep-alive
                # client opens a new one instead of writing into a closing socket.
                resp.headers["connection"] = "close"
                await resp(scope, receive, send_with_id)
                return
        if self.lifecycle.draining and path not in PROBES and scope["method"] == "POST":
            resp = error_response(503, "The router is shutting down.", "ServiceUnavailable", None)
            resp.headers["retry-after"] = "1"
            resp.headers["connection"] = "close"
            await resp(scope, receive, send_with_id)
            return
        await self.app(scope, receive, send_with_id)


class RouterApp(Starlette):
    """Starlette, plus the server's own ``send`` in the scope for SSE body chunks, and the model
    POSTs served by router/fast_path.py ahead of the middleware stack when it takes them.

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
            # scope: left in, the pair is a reference cycle, and the request's stream, channel,
            # scope and headers (~20 objects) wait for the cyclic collector instead of going at
            # once (a young-generation pass every ~40 requests, ~1 ms each, here).
            del scope[RAW_SEND]


async def on_overloaded(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Overloaded)
    request.state.router_metrics.rejected.labels(str(exc.status)).inc()
    kind = "RateLimitError" if exc.status == 429 else "ServiceUnavailable"
    resp = error_response(exc.status, exc.message, kind, None)
    resp.headers["retry-after"] = str(exc.retry_after)
    return resp


async def on_client_left(request: Request, exc: Exception) -> Response:
    # Nobody reads this answer; the status only marks the request in logs and metrics.
    request.state.router_metrics.requests.labels(request.url.path, "499").inc()
    return Response(b"", status_code=499)


async def on_engine_error(request: Request, exc: Exception) -> Response:
    resp = error_response(503, f"Engine unavailable: {exc}", "ServiceUnavailable", None)
    resp.headers["retry-after"] = "1"
    return resp


async def health(request: Request) -> Response:
    return Response(b"", status_code=200)


async def ready(request: Request) -> Response:
    st = request.state
    if st.lifecycle.draining:
        return Response(b"draining", status_code=503)
    if not st.dispatcher.healthy():
        return Response(b"no engine ready", status_code=503)
    return Response(b"ready", status_code=200)


async def metrics_endpoint(request: Request) -> Response:
    st = request.state
    body = st.router_metrics.exposition() + st.metrics.exposition()
    return Response(body, media_type=PROMETHEUS)


def _engine_snapshot(client: EngineClient) -> Callable[[], dict[str, dict[str, float]]]:
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


def render_config(cfg: RouterConfig) -> ServerConfig:
    """The in-process render's config, with `kvroute render`'s served-name rule."""
    model = Path(cfg.model)
    name = cfg.served_model_name or served_name(model)
    spec = ModelSpec(
        model=model,
        served_model_name=name,
        tokenizer=Path(cfg.tokenizer) if cfg.tokenizer else None,
        chat_template=Path(cfg.chat_template) if cfg.chat_template else None,
        max_model_len=cfg.max_model_len,
    )
    return ServerConfig(models=(spec,), max_body_bytes=cfg.limits.max_body_bytes)


def create_app(cfg: RouterConfig) -> Starlette:
    """The router app; its lifespan builds every socket, task and index and tears them down."""
    lifecycle = Lifecycle()
    rcfg = render_config(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        lifecycle.idle = asyncio.Event()
        lifecycle.idle.set()
        models = render_server.Models(
            await asyncio.to_thread(load_models, rcfg), int(time.time()))
        pool = ThreadPoolExecutor(rcfg.render_threads, thread_name_prefix="render")
        remote = RenderClient(cfg.render_url) if cfg.render_url else None
        metrics = RouterMetrics()
        index = PrefixIndex(max_blocks=cfg.limits.max_index_blocks)
        client = EngineClient(cfg.engines, dead_after=cfg.limits.engine_dead_after)
        await client.start()
        kv = KVSubscriber(index)
        await kv.start()
        admission = Admission(cfg.limits.max_in_flight_per_engine, cfg.limits.max_queue,
                              cfg.limits.queue_timeout, cfg.limits.retry_after)
        fleet = Fleet(client, kv, index, admission, cfg.engines)
        metrics.queue_depth.set_function(lambda: admission.queued)
        metrics.watch_engines(_engine_snapshot(client))
        metrics.watch_kv_events(fleet.kv_snapshot)
        dispatcher = Dispatcher(client, Policy(cfg.policy, index), admission, metrics)
        decoders = {r.served_model_name: TokenDecoder(r.tokenizer) for r in models.registry}
        tasks = [asyncio.create_task(fleet.watch(), name="fleet-watch")]
        state = {
            "config": rcfg, "router_config": cfg, "models": models, "pool": pool,
            "metrics": RenderMetrics(render_server.ROUTE_PATHS),
            "codecs": Codecs(),
            "router_metrics": metrics, "remote": remote, "client": client, "kv": kv,
            "index": index, "dispatcher": dispatcher, "lifecycle": lifecycle,
            "fleet": fleet, "active": {}, "decoders": decoders,
            "generate_decoder": msgspec.json.Decoder(GenerateRequest),
        }
        # For in-process tools (demo, tests): the same objects the handlers see.
        app.state.live = SimpleNamespace(**state)
        # The startup heap (tokenizers, templates, the index) lives as long as the process, yet
        # each full collection re-scans it: ~70 ms pauses in the middle of streams. Freeze it.
        gc.collect()
        gc.freeze()
        try:
            yield state
        finally:
            gc.unfreeze()  # in-process users (tests, the demo) get their garbage collected again
            lifecycle.draining = True
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
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
        Route("/v1/models", render_server.list_models, methods=["GET"]),
        Route("/admin/engines", handlers.add_engine, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    exception_handlers = {
        Overloaded: on_overloaded,
        EngineLinkError: on_engine_error,
        handlers.ClientLeft: on_client_left,
        **EXCEPTION_HANDLERS,
    }
    app = RouterApp(routes=routes, lifespan=lifespan, exception_handlers=exception_handlers)
    app.add_middleware(Guard, api_key=cfg.api_key, lifecycle=lifecycle)
    app.fast = FastPath(cfg.api_key, lifecycle, exception_handlers)
    app.state.lifecycle = lifecycle
    return app

