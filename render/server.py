"""`kvroute render`: the render service over HTTP (Starlette + Hypercorn, uvloop), vLLM's shapes.

    POST /v1/chat/completions/render   ChatCompletionRequest  -> GenerateRequest
    POST /v1/completions/render        CompletionRequest      -> [GenerateRequest, ...]
    POST /tokenize                     prompt or messages     -> {count, max_model_len, tokens, ...}
    POST /detokenize                   {tokens}               -> {prompt}
    GET  /v1/models, /health, /ping, /metrics

Bodies are decoded straight into msgspec Structs (bad input fails at decode time, see
render/http_errors.py for how every error becomes OpenAI's error JSON). Renders of big bodies run on
a small thread pool: tokenizers releases the GIL, so the loop keeps answering /health meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from render import ModelRegistry, Renderer
from render.errors import ModelNotFoundError, RenderError
from render.http_config import ServerConfig, parse_args
from render.http_errors import EXCEPTION_HANDLERS, BodyTooLarge
from render.http_metrics import MetricsMiddleware, RenderMetrics
from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
)

T = TypeVar("T")
JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"

ROUTE_PATHS = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/tokenize",
    "/detokenize",
    "/v1/models",
    "/health",
    "/ping",
    "/metrics",
)


class Codecs:
    """One typed decoder per request type and one encoder, built once per app."""

    def __init__(self) -> None:
        self.chat = msgspec.json.Decoder(ChatCompletionRequest)
        self.completion = msgspec.json.Decoder(CompletionRequest)
        self.tokenize = msgspec.json.Decoder(TokenizeRequest)
        self.detokenize = msgspec.json.Decoder(DetokenizeRequest)
        self.encoder = msgspec.json.Encoder()


class Models:
    """The loaded renderers, each with the lock that serialises its renders in this worker.

    A Renderer is not thread-safe (its caches mutate), and big renders run on a thread while small
    ones run on the loop, so every render of a model takes its asyncio lock first: waiting for it
    never blocks the loop, and the lock is uncontended on the common path.
    """

    def __init__(self, registry: ModelRegistry, created: int) -> None:
        self.registry = registry
        self.locks = {name: asyncio.Lock() for name in registry.names()}
        self.created = created

    def get(self, name: str | None) -> Renderer:
        try:
            return self.registry.get(name)
        except ModelNotFoundError:
            # vLLM's own wording (serve/engine/serving.py), so clients matching on it keep working.
            raise RenderError(
                404,
                f"The model `{name}` does not exist. "
                f"Valid aliases: {', '.join(self.registry.names())}.",
                "NotFoundError",
                "model",
            ) from None


def load_models(cfg: ServerConfig) -> ModelRegistry:
    return ModelRegistry([
        Renderer.load(
            spec.model,
            tokenizer=spec.tokenizer,
            chat_template=str(spec.chat_template) if spec.chat_template else None,
            served_model_name=spec.served_model_name,
            max_model_len=spec.max_model_len,
            allow_request_chat_template=cfg.allow_request_chat_template,
        )
        for spec in cfg.models
    ])


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def run_render(request: Request, renderer: Renderer, size: int,
                     fn: Callable[..., T], *args: Any) -> T:
    """Runs ``fn`` under the model's lock: inline for small bodies, on the render pool for big."""
    st = request.state
    async with st.models.locks[renderer.served_model_name]:
        if size <= st.config.offload_bytes:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(st.pool, fn, *args)


def json_response(request: Request, obj: object) -> Response:
    return Response(request.state.codecs.encoder.encode(obj), media_type=JSON)


async def chat_render(request: Request) -> Response:
    st = request.state
    body = await read_body(request, st.config.max_body_bytes)
    req = st.codecs.chat.decode(body)
    renderer = st.models.get(req.model)
    out: GenerateRequest = await run_render(
        request, renderer, len(body), renderer.render_chat, req
    )
    st.metrics.add_prompt_tokens(renderer.served_model_name, len(out.token_ids))
    return json_response(request, out)


async def completion_render(request: Request) -> Response:
    st = request.state
    body = await read_body(request, st.config.max_body_bytes)
    req = st.codecs.completion.decode(body)
    renderer = st.models.get(req.model)
    outs: list[GenerateRequest] = await run_render(
        request, renderer, len(body), renderer.render_completion, req
    )
    st.metrics.add_prompt_tokens(renderer.served_model_name, sum(len(o.token_ids) for o in outs))
    return json_response(request, outs)


async def tokenize_endpoint(request: Request) -> Response:
    st = request.state
    body = await read_body(request, st.config.max_body_bytes)
    req = st.codecs.tokenize.decode(body)
    renderer = st.models.get(req.model)
    out = await run_render(request, renderer, len(body), renderer.tokenize, req)
    return json_response(request, out)


async def detokenize_endpoint(request: Request) -> Response:
    st = request.state
    body = await read_body(request, st.config.max_body_bytes)
    req = st.codecs.detokenize.decode(body)
    renderer = st.models.get(req.model)
    out = await run_render(request, renderer, len(body), renderer.detokenize, req)
    return json_response(request, out)


async def list_models(request: Request) -> Response:
    models: Models = request.state.models
    data = [
        {
            "id": r.served_model_name,
            "object": "model",
            "created": models.created,
            "owned_by": "kvroute",
            "root": str(spec.model),
            "parent": None,
            "max_model_len": r.max_model_len,
        }
        for r, spec in zip(models.registry, request.state.config.models, strict=True)
    ]
    return json_response(request, {"object": "list", "data": data})


async def health(request: Request) -> Response:
    return Response(b"", status_code=200)


async def metrics_endpoint(request: Request) -> Response:
    return Response(request.state.metrics.exposition(), media_type=PROMETHEUS)


def create_app(cfg: ServerConfig, *, on_ready: Callable[[], None] | None = None) -> Starlette:
    """The ASGI app; its lifespan loads the models and owns the render thread pool."""
    metrics = RenderMetrics(ROUTE_PATHS)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        models = Models(await asyncio.to_thread(load_models, cfg), int(time.time()))
        pool = ThreadPoolExecutor(cfg.render_threads, thread_name_prefix="render")
        if on_ready is not None:
            on_ready()
        try:
            yield {"config": cfg, "models": models, "pool": pool, "metrics": metrics,
                   "codecs": Codecs()}
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    routes = [
        Route("/v1/chat/completions/render", chat_render, methods=["POST"]),
        Route("/v1/completions/render", completion_render, methods=["POST"]),
        Route("/tokenize", tokenize_endpoint, methods=["POST"]),
        Route("/detokenize", detokenize_endpoint, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers=dict(EXCEPTION_HANDLERS),
        middleware=[Middleware(MetricsMiddleware, metrics=metrics)],
    )


# --- serving ---------------------------------------------------------------------------------


def _hypercorn_config(cfg: ServerConfig) -> Any:
    from hypercorn.config import Config

    hc = Config()
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    hc.bind = [f"{host}:{cfg.port}"]
    hc.worker_class = "uvloop"
    hc.workers = cfg.workers
    hc.accesslog = "-" if cfg.access_log else None
    hc.errorlog = "-"
    hc.backlog = 1024
    # Hypercorn closes a keep-alive connection after 1000 requests by default; a gateway's pooled
    # connection (or a benchmark's) would see a reset mid-stream. vLLM's servers do not cap it.
    hc.keep_alive_max_requests = 2**31
    # Loading several big tokenizers (gpt-oss, Gemma: ~30 MB of JSON each) takes well over
    # Hypercorn's default 60 s on a busy 2-core machine.
    hc.startup_timeout = 900
    return hc


def _worker(cfg: ServerConfig, sockets: Any, shutdown_event: Any) -> None:
    """One serving process (or the only one): builds the app and runs Hypercorn on uvloop."""
    import uvloop
    from hypercorn.asyncio.run import worker_serve
    from hypercorn.utils import check_multiprocess_shutdown_event, wrap_app

    hc = _hypercorn_config(cfg)
    url = f"http://{cfg.host}:{cfg.port}"
    # A render thread running Python (template, cache lookups) holds the GIL for up to the switch
    # interval (5 ms by default) each time the loop wants it back; 0.5 ms keeps /health fast.
    sys.setswitchinterval(cfg.switch_interval)

    def ready() -> None:
        print(f"kvroute render: ready on {url} (pid {os.getpid()})", flush=True)

    asgi: Any = create_app(cfg, on_ready=ready)  # Starlette is an ASGI app; hypercorn types differ
    app = wrap_app(asgi, hc.wsgi_max_body_size, "asgi")
    trigger = None
    if shutdown_event is not None:
        trigger = lambda: check_multiprocess_shutdown_event(shutdown_event, asyncio.sleep)  # noqa: E731
    uvloop.run(worker_serve(app, hc, sockets=sockets, shutdown_trigger=trigger))


def serve(cfg: ServerConfig) -> int:
    """Binds once, then serves here or in ``cfg.workers`` processes sharing the socket."""
    import multiprocessing as mp

    hc = _hypercorn_config(cfg)
    sockets = hc.create_sockets()
    port = sockets.insecure_sockets[0].getsockname()[1]
    cfg = replace(cfg, port=port)  # port 0 resolved, so workers report the real address
    names = ", ".join(m.served_model_name for m in cfg.models)
    print(f"kvroute render: serving {names} on http://{cfg.host}:{port} "
          f"({cfg.workers} worker{'s' if cfg.workers > 1 else ''})", flush=True)
    if cfg.workers == 1:
        _worker(cfg, sockets, None)
        return 0
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    # Workers inherit SIG_IGN for SIGINT so a Ctrl-C reaches only this supervisor, which stops them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    procs = [ctx.Process(target=_worker, args=(cfg, sockets, stop), daemon=True)
             for _ in range(cfg.workers)]
    for p in procs:
        p.start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    from multiprocessing.connection import wait

    # Any worker exiting (crash or shutdown) ends the service: a half-served port is worse.
    wait([p.sentinel for p in procs])
    stop.set()
    code = 0
    for p in procs:
        p.join(timeout=10)
        if p.exitcode not in (0, None):
            code = 1
        if p.is_alive():
            p.terminate()
    return code


def cli(argv: list[str]) -> int:
    cfg = parse_args(argv)
    try:
        return serve(cfg)
    except OSError as e:
        print(f"kvroute render: cannot listen on {cfg.host}:{cfg.port}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a model that fails to load: say which, without a 3-level traceback
        print(f"kvroute render: startup failed: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
