"""`kvroute render`: the render service over HTTP (Starlette on uvicorn or Hypercorn, uvloop).

    POST /v1/chat/completions/render   ChatCompletionRequest  -> GenerateRequest
    POST /v1/completions/render        CompletionRequest      -> [GenerateRequest, ...]
    POST /tokenize                     prompt or messages     -> {count, max_model_len, tokens, ...}
    POST /detokenize                   {tokens}               -> {prompt}
    GET  /v1/models, /health, /ping, /metrics

Bodies are decoded straight into msgspec Structs (bad input fails at decode time, see
render/http_errors.py for how every error becomes OpenAI's error JSON). Small bodies render on the
loop, bigger ones on a small thread pool, and bodies over --inline-max-bytes in a helper process
(render/offload.py): a thread's tokenizer encode and JSON encoding hold the GIL for milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from render import ModelRegistry, Renderer
from render.asgi_server import bind_socket
from render.http_config import ServerConfig, parse_args
from render.http_errors import EXCEPTION_HANDLERS, BodyTooLarge
from render.http_metrics import MetricsMiddleware, RenderMetrics
from render.loading import Codecs, find_model, load_models
from render.offload import CHAT, COMPLETIONS, DETOKENIZE, TOKENIZE, RenderHelper

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


class Models:
    """The loaded renderers, each with the lock that serialises its renders in this worker.

    A Renderer is not thread-safe (its caches mutate), and big renders run on a thread while small
    ones run on the loop, so every render of a model takes its asyncio lock first: waiting for it
    never blocks the loop, and the lock is uncontended on the common path.
    """

    def __init__(self, registry: ModelRegistry, created: int) -> None:
        self.registry = registry
        self.locks = {name: asyncio.Lock() for name in registry.names()}
        self.costs = {name: RenderCost() for name in registry.names()}
        self.created = created

    def get(self, name: str | None) -> Renderer:
        return find_model(self.registry, name)


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


class RenderCost:
    """One model's CPU seconds per body byte, to predict a render's cost.

    Small requests carry a fixed overhead, so their per-byte cost over-predicts big ones: the
    estimate errs towards the thread, the side that never blocks the loop. It rises to a dearer
    sample at once and falls back slowly: renders served from the segment cache cost a fraction
    of a fresh text's, and a run of them must not send the next fresh 400 KB body to the loop.
    """

    def __init__(self) -> None:
        self.per_byte: float | None = None

    def predict(self, size: int) -> float | None:
        return None if self.per_byte is None else size * self.per_byte

    def observe(self, size: int, seconds: float) -> None:
        sample = seconds / max(size, 1)
        if self.per_byte is None or sample > self.per_byte:
            self.per_byte = sample
        else:
            self.per_byte = 0.9 * self.per_byte + 0.1 * sample


def _timed(cost: RenderCost, size: int, fn: Callable[..., T], *args: Any) -> T:
    t0 = time.thread_time()  # this thread's CPU: a render waiting for the GIL costs nothing
    try:
        return fn(*args)
    finally:
        cost.observe(size, time.thread_time() - t0)


async def run_render(request: Request, renderer: Renderer, size: int,
                     fn: Callable[..., T], *args: Any) -> T:
    """Runs ``fn`` under the model's lock: on the loop when small or predicted cheap (a thread
    handoff costs more than a fast render), else on the render pool."""
    st = request.state
    return await render_in(st.models, st.config, st.pool, renderer, size, fn, *args)


async def render_in(models: Models, config: ServerConfig, pool: ThreadPoolExecutor,
                    renderer: Renderer, size: int, fn: Callable[..., T], *args: Any) -> T:
    """``run_render`` on explicit app state (the raw ASGI route has no Request)."""
    name = renderer.served_model_name
    cost = models.costs[name]
    async with models.locks[name]:
        predicted = cost.predict(size)
        if size <= config.offload_bytes or (
            size <= config.inline_max_bytes
            and predicted is not None
            and predicted * 1e3 <= config.inline_budget_ms
        ):
            return _timed(cost, size, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(
            pool, _timed, cost, size, fn, *args
        )


def json_response(request: Request, obj: object) -> Response:
    return Response(request.state.codecs.encoder.encode(obj), media_type=JSON)


async def offloaded(request: Request, path: str, body: bytes) -> Response | None:
    """The answer of a render helper process for a big body (render/offload.py); None: none
    answered, render it here."""
    # The router serves these handlers too, rendering in process: its state has no helper.
    helper: RenderHelper | None = getattr(request.state, "helper", None)
    done = None if helper is None else await helper.render(path, body)
    if done is None:
        return None
    if path in (CHAT, COMPLETIONS):
        request.state.metrics.add_prompt_tokens(done.model, done.tokens)
    return Response(done.payload, media_type=JSON)


async def _render_endpoint(request: Request, path: str, decoder: Callable[[Any], Any],
                           method: Callable[[Renderer], Callable[[Any], T]],
                           prompt_tokens: Callable[[T], int] | None = None) -> Response:
    """Read the body, let a helper process answer it if it is big, else decode it and run
    ``method`` of the model it names; ``prompt_tokens`` counts what a render produced."""
    st = request.state
    body = await read_body(request, st.config.max_body_bytes)
    if (answer := await offloaded(request, path, body)) is not None:
        return answer
    req = decoder(st.codecs).decode(body)
    renderer = st.models.get(req.model)
    out = await run_render(request, renderer, len(body), method(renderer), req)
    if prompt_tokens is not None:
        st.metrics.add_prompt_tokens(renderer.served_model_name, prompt_tokens(out))
    return json_response(request, out)


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
    """The ASGI app; its lifespan loads the models and owns the render thread pool and helper
    processes."""
    metrics = RenderMetrics(ROUTE_PATHS)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        models = Models(await asyncio.to_thread(load_models, cfg), int(time.time()))
        pool = ThreadPoolExecutor(cfg.render_threads, thread_name_prefix="render")
        # Ready without waiting for the helpers' own model load: big bodies render on the
        # thread pool until they are up.
        helper = RenderHelper(cfg, metrics)
        helper.start()
        if on_ready is not None:
            on_ready()
        try:
            yield {"config": cfg, "models": models, "pool": pool, "metrics": metrics,
                   "codecs": Codecs(), "helper": helper}
        finally:
            await helper.close()
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


def _worker(cfg: ServerConfig, sock: socket.socket, shutdown_event: Any) -> None:
    """One serving process (or the only one): builds the app and serves it on uvloop."""
    import uvloop

    from render.asgi_server import ServeOptions, serve_asgi
    from render.fast_route import FastRenderRoute  # it imports this module

    url = f"http://{cfg.host}:{cfg.port}"
    # A render thread running Python (template, cache lookups) holds the GIL for up to the switch
    # interval (5 ms by default) each time the loop wants it back; 0.5 ms keeps /health fast.
    sys.setswitchinterval(cfg.switch_interval)

    def ready() -> None:
        print(f"kvroute render: ready on {url} (pid {os.getpid()})", flush=True)

    app = FastRenderRoute(create_app(cfg, on_ready=ready))
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
