"""`kvroute render`: the render service over HTTP (Starlette on the configured server, uvloop).

    POST /v1/chat/completions/render   ChatCompletionRequest  -> GenerateRequest
    POST /v1/completions/render        CompletionRequest      -> [GenerateRequest, ...]
    POST /tokenize                     prompt or messages     -> {count, max_model_len, tokens, ...}
    POST /detokenize                   {tokens}               -> {prompt}
    GET  /v1/models, /health, /ping, /metrics

Bodies are decoded straight into msgspec Structs (bad input fails at decode time, see
serving/errors.py for how every error becomes OpenAI's error JSON). Small bodies render on the
loop, bigger ones on a small thread pool, and bodies over --inline-max-bytes in a helper process
(render/service/offload.py): a thread's tokenizer encode and JSON encoding hold the GIL
for milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from render.protocol import decode_request
from render.renderer import Renderer
from render.service.config import ServerConfig, parse_args
from render.service.derender_routes import chat_derender, completion_derender
from render.service.fast_route import FastRenderRoute
from render.service.loading import Codecs, load_served
from render.service.offload import CHAT, COMPLETIONS, DETOKENIZE, TOKENIZE, RenderHelper
from render.service.sandbox import TemplateSandbox
from render.service.state import STATE_KEY, Models, RenderState, render_pool, render_state
from serving.body import JSON, json_response, read_body
from serving.errors import APIError
from serving.http_errors import ErrorPath
from serving.metrics import MetricsMiddleware, RenderMetrics
from serving.server import bind_socket

ROUTE_PATHS = (
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/chat/completions/derender",
    "/v1/completions/derender",
    "/tokenize",
    "/detokenize",
    "/v1/models",
    "/health",
    "/ping",
    "/metrics",
)
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
T = TypeVar("T")


async def offloaded(st: RenderState, path: str, body: bytes) -> Response | None:
    """The answer of a helper process (a template helper for a request's own chat template, a
    render helper for a big body); None: none answered, render it here."""
    done = await st.offloaded(path, body)
    if done is None:
        return None
    if path in (CHAT, COMPLETIONS):
        st.metrics.add_prompt_tokens(done.model, done.tokens)
    return Response(done.payload, media_type=JSON)


async def _render_endpoint(request: Request, path: str,
                           decoder: Callable[[Codecs], msgspec.json.Decoder[Any]],
                           method: Callable[[Renderer], Callable[[Any], T]],
                           prompt_tokens: Callable[[T], int] | None = None) -> Response:
    """Read the body, let a helper process answer it if it is big, else decode it and run
    ``method`` of the model it names; ``prompt_tokens`` counts what a render produced."""
    st = render_state(request.scope["state"])
    body = await read_body(request, st.limits.max_body_bytes)
    if (answer := await offloaded(st, path, body)) is not None:
        return answer
    req = decode_request(decoder(st.codecs), body)
    renderer = st.models.get(req.model)
    out = await st.run(renderer, len(body), method(renderer), req)
    if prompt_tokens is not None:
        st.metrics.add_prompt_tokens(renderer.served_model_name, prompt_tokens(out))
    return json_response(st.codecs.encoder, out)


async def chat_render(request: Request) -> Response:
    return await _render_endpoint(request, CHAT, lambda c: c.chat,
                                  lambda r: partial(r.render_chat, array=True),
                                  lambda out: len(out.token_ids))


async def completion_render(request: Request) -> Response:
    return await _render_endpoint(request, COMPLETIONS, lambda c: c.completion,
                                  lambda r: r.render_completion,
                                  lambda outs: sum(len(o.token_ids) for o in outs))


async def tokenize_endpoint(request: Request) -> Response:
    return await _render_endpoint(request, TOKENIZE, lambda c: c.tokenize, lambda r: r.tokenize)


async def detokenize_endpoint(request: Request) -> Response:
    return await _render_endpoint(request, DETOKENIZE, lambda c: c.detokenize,
                                  lambda r: r.detokenize)


def model_card(model_id: str, created: int, root: str, parent: str | None,
               max_model_len: int | None) -> dict[str, object]:
    """One entry of ``GET /v1/models`` (vLLM's ModelCard); an adapter's has its base model as
    ``parent``, its directory as ``root`` and no ``max_model_len``."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": "vllm",
            "root": root, "parent": parent, "max_model_len": max_model_len,
            "permission": [_permission(created)]}


def model_cards(st: RenderState) -> list[dict[str, object]]:
    """The served models' cards, then the static LoRA modules' (--lora-modules)."""
    created = st.models.created
    cards = [model_card(r.served_model_name, created, str(root), None, r.max_model_len)
             for r, root in zip(st.models.registry, st.roots, strict=True)]
    parents = st.models.registry.aliases()
    cards += [model_card(m.name, created, m.path, parents[m.name], None)
              for m in st.lora_modules]
    return cards


def models_body(cards: list[dict[str, object]]) -> dict[str, object]:
    return {"object": "list", "data": cards}


async def list_models(request: Request) -> Response:
    """vLLM's model list, field for field, so clients that read it see what `vllm serve`
    shows."""
    st = render_state(request.scope["state"])
    return json_response(st.codecs.encoder, models_body(model_cards(st)))


def _permission(created: int) -> dict[str, object]:
    """vLLM's ``ModelPermission`` with its defaults."""
    return {"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission",
            "created": created, "allow_create_engine": False, "allow_sampling": True,
            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
            "allow_fine_tuning": False, "organization": "*", "group": None,
            "is_blocking": False}


async def health(request: Request) -> Response:
    return Response(b"", status_code=200)


def render_errors(metrics: RenderMetrics) -> ErrorPath:
    """The render service's error path: every error answered is counted by its OpenAI type."""

    def observe(request: Request, err: APIError) -> None:
        metrics.add_error(request.url.path, err.type)

    return ErrorPath(observe)


def create_app(cfg: ServerConfig, *,
               on_ready: Callable[[], None] | None = None) -> FastRenderRoute:
    """The ASGI app; its lifespan loads the models and owns the render thread pool and helper
    processes."""
    metrics = RenderMetrics(ROUTE_PATHS)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=PROMETHEUS)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, RenderState]]:
        registry, parsers = await asyncio.to_thread(
            load_served, cfg.models, allow_request_chat_template=cfg.allow_request_chat_template,
            limits=cfg.request_limits, lora_modules=cfg.lora_modules,
            structured_outputs=cfg.structured_outputs)
        pool = await asyncio.to_thread(render_pool, cfg.render_threads, registry)
        # Ready without waiting for the helpers' own model load: big bodies render on the
        # thread pool until they are up.
        helper = RenderHelper(cfg, metrics.helpers)
        helper.start()
        sandbox = TemplateSandbox(cfg, metrics) if cfg.allow_request_chat_template else None
        if sandbox is not None:
            sandbox.start()
        st = RenderState(Models(registry, int(time.time()), parsers),
                         tuple(m.model for m in cfg.models),
                         cfg.limits, pool, Codecs(), metrics, helper, cfg.lora_modules,
                         sandbox)
        if on_ready is not None:
            on_ready()
        try:
            yield {STATE_KEY: st}
        finally:
            if sandbox is not None:
                await sandbox.close()
            await helper.close()
            pool.shutdown(wait=False, cancel_futures=True)

    routes = [
        Route("/v1/chat/completions/render", chat_render, methods=["POST"]),
        Route("/v1/completions/render", completion_render, methods=["POST"]),
        Route("/v1/chat/completions/derender", chat_derender, methods=["POST"]),
        Route("/v1/completions/derender", completion_derender, methods=["POST"]),
        Route("/tokenize", tokenize_endpoint, methods=["POST"]),
        Route("/detokenize", detokenize_endpoint, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    errors = render_errors(metrics)
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers=dict(errors.handlers()),
        middleware=[Middleware(MetricsMiddleware, metrics=metrics)],
    )
    return FastRenderRoute(app, errors)


# --- serving ---------------------------------------------------------------------------------


def _worker(cfg: ServerConfig, sock: socket.socket, shutdown_event: Any) -> None:
    """One serving process (or the only one): builds the app and serves it on uvloop."""
    import uvloop

    from serving.server import ServeOptions, serve_asgi

    url = f"http://{cfg.host}:{cfg.port}"
    # A render thread running Python (template, cache lookups) holds the GIL for up to the switch
    # interval (5 ms by default) each time the loop wants it back; 0.5 ms keeps /health fast.
    sys.setswitchinterval(cfg.switch_interval)

    names = ", ".join(f"{m.served_model_name} ({m.model})" for m in cfg.models)

    def ready() -> None:
        print(f"kvroute render: ready on {url} (pid {os.getpid()}), serving {names}", flush=True)

    app = create_app(cfg, on_ready=ready)
    opts = ServeOptions(server=cfg.http_server, backlog=1024, access_log=cfg.access_log)
    shutdown = None
    if shutdown_event is not None:
        async def shutdown() -> None:
            # A cross-process Event has no awaitable form: poll it (0.2 s stop latency).
            while not shutdown_event.is_set():
                await asyncio.sleep(0.2)

    uvloop.run(serve_asgi(app, sock, opts, shutdown))


def serve(cfg: ServerConfig) -> int:
    """Binds once, then serves here or in ``cfg.workers`` processes sharing the socket."""
    import multiprocessing as mp

    # Listening now, not when the HTTP server starts: "ready" is printed from the lifespan,
    # before the server accepts, and a client connecting in between must queue.
    sock = bind_socket(cfg.host, cfg.port, backlog=1024)
    port = sock.getsockname()[1]
    cfg = replace(cfg, port=port)  # port 0 resolved, so workers report the real address
    names = ", ".join(m.served_model_name for m in cfg.models)
    print(f"kvroute render: serving {names} on http://{cfg.host}:{port} "
          f"({cfg.workers} worker{'s' if cfg.workers > 1 else ''})", flush=True)
    if cfg.workers == 1:
        _worker(cfg, sock, None)
        return 0
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    # Workers inherit SIG_IGN for SIGINT so a Ctrl-C reaches only this supervisor, which stops them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Not daemonic: a daemonic process may not start children (its render helpers). The stop
    # event, the joins below and the helpers' own parent watch leave no process behind.
    procs = [ctx.Process(target=_worker, args=(cfg, sock, stop)) for _ in range(cfg.workers)]
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
    from render.hub import ModelUnavailable
    from render.service.config import resolve_spec

    cfg = parse_args(argv)
    try:
        cfg = replace(cfg, models=tuple(resolve_spec(m) for m in cfg.models))
    except ModelUnavailable as e:
        print(f"kvroute render: {e}", file=sys.stderr)
        return 2
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
