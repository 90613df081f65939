"""The face's endpoints: what `vllm serve --enable-scale-out` answers, in front of the sim engine.

    POST /inference/v1/generate        token ids in, token ids out (SSE with stream: true)
    POST /inference/v1/abort_requests  {"request_ids": [...]} (the engine's ids)
    POST /v1/completions, /v1/chat/completions   rendered here, answered in OpenAI's shapes
    GET  /kv_event_sources, /health, /metrics (vLLM's metric names), /v1/models
    POST /v1/chat/completions/render, /v1/completions/render, /tokenize, /reset_prefix_cache,
         /sim/prefix_cache/match, GET /sim/render_work   (sim/http/extra_routes.py)

Requests are rendered by ``render`` (the tokens vLLM computes) and answered through the same
output pipeline the router runs (``output``: vLLM's chunk shapes, SSE framing, usage); the
engine requests go through ``sim.http.link`` to the engine's own busy loop, so the face shares
its scheduler, prefix cache and KV events with a ZMQ frontend. Engine request ids are vLLM's:
``generate-tokens-{id}`` for generate, the response id for chat and completions. A client that
disconnects aborts its requests on the engine, as vLLM's ``with_cancellation`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from output.collect import collect
from output.detokenize import TokenDecoder
from output.pipeline import CHAT, COMPLETION, GENERATE, Pipeline, PipelineSpec
from output.sse import SSEResponse, sse_stream
from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    TokenizeRequest,
    TokenizeResponse,
    decode_request,
)
from render.renderer import Renderer
from render.sampling_checks import check_sampling
from serving.body import JSON, read_body
from serving.errors import (
    APIError,
    BadRequestError,
    EngineOutputError,
    InvalidJSONError,
    ModelNotFoundError,
)
from serving.http_errors import ErrorPath
from sim.config import SimConfig
from sim.engine import SimEngine
from sim.http.extra_routes import extra_routes
from sim.http.link import FaceLink, Outputs, merged
from sim.http.metrics import metrics_text
from sim.http.render_time import RenderClock
from sim.http.vllm_render import VllmRenderWork
from wire.engine import EngineCoreOutput, EngineCoreRequest
from wire.sampling import SamplingParams

MAX_BODY = 64 * 1024 * 1024
PROMPT_TAIL = 6
POD_PREFIX = "generate-tokens-"
_ENCODER = msgspec.json.Encoder()


class FaceGenerateRequest(GenerateRequest, kw_only=True):
    """vLLM's GenerateRequest: without a request_id the server draws one."""

    request_id: str = ""


class _Keys(msgspec.Struct):
    """Which sampling keys the client sent (vLLM fills max_tokens only when absent)."""

    sampling_params: dict[str, msgspec.Raw] = {}


class AbortRequests(msgspec.Struct):
    request_ids: list[str]


_GENERATE = msgspec.json.Decoder(FaceGenerateRequest)
_CHAT = msgspec.json.Decoder(ChatCompletionRequest)
_COMPLETION = msgspec.json.Decoder(CompletionRequest)


@dataclass
class FaceState:
    engine: SimEngine
    config: SimConfig
    link: FaceLink
    renderer: Renderer
    decoder: TokenDecoder
    created: int
    # --render-work vllm: what vLLM's frontend spends rendering a text request, spent here too;
    # --render-work vllm-time: the time it takes, waited here (one render at a time)
    vllm_work: VllmRenderWork | None = None
    clock: RenderClock | None = None
    vllm_renders: int = 0  # requests that did or waited it (GET /sim/render_work)

    async def _vllm_render(self, tokens: int) -> None:
        if self.vllm_work is not None or self.clock is not None:
            self.vllm_renders += 1
        if self.clock is not None:
            await self.clock.wait(tokens)

    async def render_chat(self, chat: ChatCompletionRequest) -> GenerateRequest:
        gen = self.renderer.render_chat(chat)  # its verdicts and ids; then vLLM's cost
        if self.vllm_work is not None:
            self.vllm_work.chat(chat, gen)
        await self._vllm_render(len(gen.token_ids))
        return gen

    async def render_completion(self, req: CompletionRequest) -> list[GenerateRequest]:
        gens = self.renderer.render_completion(req)
        if self.vllm_work is not None:
            self.vllm_work.completion(req)
        # vLLM encodes text prompts only; token-id prompts cost its render nothing
        prompts = req.prompt if isinstance(req.prompt, list) else [req.prompt]
        text = [len(g.token_ids) for p, g in zip(prompts, gens, strict=False) if isinstance(p, str)]
        await self._vllm_render(sum(text))
        return gens

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        out = self.renderer.tokenize(req)
        if self.vllm_work is not None:
            self.vllm_work.tokenize(req, out.tokens)
        await self._vllm_render(len(out.tokens))
        return out


def _state(request: Request) -> FaceState:
    st = request.scope["state"]["sim.face"]
    assert isinstance(st, FaceState)
    return st


def create_app(engine: SimEngine, on_ready: Callable[[], None] | None = None,
               renderer: Renderer | None = None) -> Starlette:
    """The face's app; ``renderer``: one already loaded for this model (else loaded here)."""
    config = engine.config
    face = config.http
    assert face is not None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, object]]:
        nonlocal renderer
        if renderer is None:
            renderer = await asyncio.to_thread(
                Renderer.load, face.model_dir, served_model_name=face.served_model_name,
                max_model_len=config.max_model_len)
        work = VllmRenderWork(renderer, face.model_dir) if face.render_work == "vllm" else None
        clock = RenderClock(*face.render_time) if face.render_time is not None else None
        link = FaceLink(engine)
        link.start()
        st = FaceState(engine, config, link, renderer, TokenDecoder(renderer.tokenizer),
                       int(time.time()), work, clock)
        if on_ready is not None:
            on_ready()
        try:
            yield {"sim.face": st}
        finally:
            await link.close()

    routes = [
        Route("/inference/v1/generate", generate, methods=["POST"]),
        Route("/inference/v1/abort_requests", abort_requests, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/kv_event_sources", kv_event_sources, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *extra_routes(_state, _check_model),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers=dict(ErrorPath().handlers()))


# ---- the model endpoints ----


async def generate(request: Request) -> Response:
    st = _state(request)
    body = await read_body(request, MAX_BODY)
    gen = decode_request(_GENERATE, body)
    _check_model(st, gen.model)
    # vLLM's request validation (pydantic): its 400 says "Bad Request".
    if not gen.token_ids:
        raise InvalidJSONError("token_ids must hold at least one token id.", "body.token_ids")
    if min(gen.token_ids) < 0:
        raise InvalidJSONError("token_ids must not contain negative values", "body.token_ids")
    if gen.output_mode != "tokens":
        raise BadRequestError("the simulated engine answers output_mode 'tokens' only",
                              "output_mode")
    params = gen.sampling_params
    check_sampling(params, "sampling_params.")
    if "max_tokens" not in msgspec.json.decode(body, type=_Keys).sampling_params:
        params.max_tokens = max(st.config.max_model_len - len(gen.token_ids), 1)
    request_id = POD_PREFIX + (gen.request_id or uuid.uuid4().hex[:16])
    opts = gen.stream_options
    spec = PipelineSpec(
        kind=GENERATE, request_id=request_id, model=st.renderer.served_model_name,
        created=int(time.time()), prompt_tokens=len(gen.token_ids), n=params.n,
        include_usage=bool(opts and opts.include_usage),
        continuous_usage=bool(opts and opts.continuous_usage_stats),
        return_token_ids=bool(gen.return_token_ids), detokenize=False,
        logprobs=params.logprobs, prompt_token_ids=gen.token_ids if gen.return_token_ids else None,
        usage_details=_details(st))
    return await _answer(st, request, spec, gen.token_ids, params, request_id,
                         bool(gen.stream), gen.cache_salt, gen.priority)


async def chat_completions(request: Request) -> Response:
    st = _state(request)
    body = await read_body(request, MAX_BODY)
    chat = decode_request(_CHAT, body)
    _check_model(st, chat.model)
    gen = await st.render_chat(chat)
    spec = _spec(CHAT, st, gen, return_token_ids=bool(chat.return_token_ids))
    return await _answer(st, request, spec, gen.token_ids, gen.sampling_params,
                         gen.request_id, bool(chat.stream), gen.cache_salt, gen.priority)


async def completions(request: Request) -> Response:
    st = _state(request)
    body = await read_body(request, MAX_BODY)
    req = decode_request(_COMPLETION, body)
    _check_model(st, req.model)
    gens = await st.render_completion(req)
    if len(gens) != 1:
        raise BadRequestError("the simulated engine answers one prompt per completions "
                              "request", "prompt")
    gen = gens[0]
    echo = (st.renderer.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
            if req.echo else None)
    spec = _spec(COMPLETION, st, gen, echo=echo, return_token_ids=bool(req.return_token_ids))
    return await _answer(st, request, spec, gen.token_ids, gen.sampling_params,
                         gen.request_id, bool(req.stream), gen.cache_salt, gen.priority)


def _spec(kind: str, st: FaceState, gen: GenerateRequest, **kw: Any) -> PipelineSpec:
    sp = gen.sampling_params
    opts = gen.stream_options
    stop = () if sp.stop is None else (sp.stop,) if isinstance(sp.stop, str) else tuple(sp.stop)
    return PipelineSpec(
        kind=kind, request_id=gen.request_id, model=st.renderer.served_model_name,
        created=int(time.time()), prompt_tokens=len(gen.token_ids), n=sp.n, stop=stop,
        include_stop_str_in_output=sp.include_stop_str_in_output,
        skip_special_tokens=sp.skip_special_tokens, min_tokens=sp.min_tokens,
        logprobs=sp.logprobs, detokenize=sp.detokenize,
        include_usage=bool(opts and opts.include_usage),
        continuous_usage=bool(opts and opts.continuous_usage_stats),
        prompt_tail=tuple(gen.token_ids[-PROMPT_TAIL:]), usage_details=_details(st), **kw)


def _details(st: FaceState) -> bool:
    """vLLM's --enable-prompt-tokens-details on this pod."""
    return st.config.http is not None and st.config.http.enable_prompt_tokens_details


def _check_model(st: FaceState, model: str | None) -> None:
    name = st.renderer.served_model_name
    if model is not None and model != name:
        raise ModelNotFoundError(model, name)


async def _answer(st: FaceState, request: Request, spec: PipelineSpec, tokens: list[int],
                  params: SamplingParams, request_id: str, stream: bool,
                  cache_salt: str | None, priority: int) -> Response:
    """Submit the request (n choices as vLLM's ParentRequest fans them out) and answer."""
    children = _children(request_id, tokens, params, cache_salt, priority)
    link = st.link
    streams = [await link.submit(child) for child in children]
    ids = [s.request_id for s in streams]
    pipeline = Pipeline(spec, st.decoder)
    outputs = _checked(st, streams)

    async def abort_choice(index: int) -> None:
        await link.abort([ids[index]])

    async def abort_all() -> None:
        await link.abort(ids)

    if stream:
        return _Streamed(SSEResponse(sse_stream(pipeline, outputs, abort_choice),
                                     on_disconnect=abort_all))
    body = await _unless_gone(request, collect(pipeline, outputs, abort_choice), abort_all)
    return Response(_ENCODER.encode(body), media_type=JSON)


def _children(request_id: str, tokens: list[int], params: SamplingParams,
              cache_salt: str | None, priority: int) -> list[EngineCoreRequest]:
    now = time.time()
    if params.n == 1:
        return [EngineCoreRequest(request_id, list(tokens), None, params, None, now, None,
                                  cache_salt, None, priority=priority)]
    out = []
    for i in range(params.n):
        seed = None if params.seed is None else params.seed + i
        child = msgspec.structs.replace(params, n=1, seed=seed)
        out.append(EngineCoreRequest(f"{i}_{request_id}", list(tokens), None, child, None,
                                     now, None, cache_salt, None, priority=priority))
    return out


async def _checked(st: FaceState, streams: list[Outputs]
                   ) -> AsyncIterator[tuple[int, EngineCoreOutput]]:
    """The choices' outputs; an engine-reported error raises with its code (vLLM's status),
    and prompt cached tokens are dropped unless --enable-prompt-tokens-details."""
    details = _details(st)
    async for index, out in merged(streams):
        if out.error is not None:
            code = out.error.code
            if 400 <= code < 500:  # the engine refused the input: vLLM's 400, not a 500
                raise APIError(code, out.error.message, "BadRequestError")
            raise EngineOutputError(out.error.message, code)
        if out.prefill_stats is not None and not details:
            out.prefill_stats = None
        yield index, out


async def _unless_gone(request: Request, work: Awaitable[Any],
                       on_gone: Callable[[], Awaitable[None]]) -> Any:
    """``work``'s result, unless the client disconnects first (then ``on_gone`` aborts)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        await on_gone()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return Response(b"", status_code=499)
    return task.result()


class _Streamed(Response):
    """An SSEResponse in Starlette's endpoint: its ASGI call replaces Response's."""

    def __init__(self, sse: SSEResponse) -> None:
        super().__init__()
        self.sse = sse

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.sse(scope, receive, send)


# ---- control endpoints ----


async def abort_requests(request: Request) -> Response:
    st = _state(request)
    body = await read_body(request, MAX_BODY)
    req = msgspec.json.decode(body, type=AbortRequests)
    # A parent id aborts its n children too, as vLLM's output processor maps them.
    ids = [rid for rid in st.link.requests
           if rid in req.request_ids or rid.split("_", 1)[-1] in req.request_ids]
    await st.link.abort(ids)
    return Response(b"", status_code=200)


async def kv_event_sources(request: Request) -> Response:
    st = _state(request)
    kv = st.engine.kv_publisher
    sources = {} if kv is None else {str(st.config.data_parallel_rank): kv.config}
    return Response(_ENCODER.encode(sources), media_type=JSON)


async def models(request: Request) -> Response:
    st = _state(request)
    name = st.renderer.served_model_name
    card = {"id": name, "object": "model", "created": st.created, "owned_by": "vllm",
            "root": str(st.config.http.model_dir) if st.config.http else name, "parent": None,
            "max_model_len": st.config.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex[:16]}",
                            "object": "model_permission", "created": st.created,
                            "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False,
                            "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}
    return Response(_ENCODER.encode({"object": "list", "data": [card]}), media_type=JSON)


async def health(request: Request) -> Response:
    st = _state(request)
    if st.engine.error is not None or not st.engine.ready.is_set():
        return Response(b"", status_code=503)
    return Response(b"", status_code=200)


async def metrics(request: Request) -> Response:
    st = _state(request)
    return Response(metrics_text(st.engine, st.renderer.served_model_name),
                    media_type="text/plain; version=0.0.4; charset=utf-8")
