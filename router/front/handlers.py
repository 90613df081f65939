"""HTTP handlers of the router: render, open on an engine, then stream (or collect) the answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from output.detokenize import TokenDecoder
from output.parsers.registry import RequestParsers, options_of
from output.pipeline import CHAT, COMPLETION, GENERATE, Pipeline, PipelineSpec
from output.sse import RefusedStream
from render.errors import BadRequestError, InputProcessorError
from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    decode_request,
)
from render.renderer import Renderer
from render.request_checks import check_chat, check_completion
from render.sampling_checks import check_engine_input, check_sampling
from router.front.answer_spec import (
    Headers,
    chat_options,
    check_json,
    completion_options,
    completion_prompts,
    header_priority,
    header_request_id,
    session_id,
    usage_options,
)
from router.front.beam_search import (
    BeamAnswer,
    BeamDecision,
    beam_search,
    check_beam,
    check_beam_steps,
)
from router.front.multi_prompt import PipelineGroup, RoutedGroup
from router.front.respond import EngineResponse, client_disconnected
from router.front.state import RouterState, router_state
from router.routing.dispatch import Routed
from serving.body import read_body
from serving.errors import ClientGoneError
from wire.engine import LoRARequest

T = TypeVar("T")
Receive = Callable[[], Awaitable[Any]]
# What an opener returns: the ASGI app that writes the answer.
Answer = EngineResponse | RefusedStream

# How long an opening may wait on its engine before a watcher for the client's disconnect starts.
WATCH_AFTER = 0.005

# vLLM's detokenizer seeds non-byte-level decoding with the last few prompt tokens.
PROMPT_TAIL = 6


class AbortRequests(msgspec.Struct):
    request_ids: list[str]


def _stop(value: str | list[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _spec(kind: str, gen: GenerateRequest, model: str, **kw: Any) -> PipelineSpec:
    sp = gen.sampling_params
    kw.setdefault("logprobs", sp.logprobs)
    kw.setdefault("skip_special_tokens", sp.skip_special_tokens)
    return PipelineSpec(
        kind=kind, request_id=gen.request_id, model=model, created=int(time.time()),
        prompt_tokens=len(gen.token_ids), n=sp.n, stop=_stop(sp.stop),
        include_stop_str_in_output=sp.include_stop_str_in_output,
        min_tokens=sp.min_tokens, detokenize=sp.detokenize,
        prompt_tail=tuple(gen.token_ids[-PROMPT_TAIL:]), **kw,
    )


def _admit(st: RouterState, renderer: Renderer, gen: GenerateRequest, where: str = "",
           prompt_ids: Sequence[int] = ()) -> None:
    """vLLM's input-processor checks as the request goes to an engine, against what the
    engines take: render made them against its own view (a remote render service's may differ),
    and leaves the reasoning ones to the router."""
    check_engine_input(gen.sampling_params, len(gen.token_ids), vocab_size=renderer.vocab_size,
                       max_model_len=renderer.max_model_len, prompt_ids=prompt_ids, where=where,
                       limits=st.config.limits.request, reasoning=False)


def _target(st: RouterState, model: str | None) -> tuple[Renderer, LoRARequest | None]:
    """The renderer a request's ``model`` names and its LoRA adapter, if it names one (then
    the renderer is the adapter's base model's, as vLLM renders adapter requests)."""
    return st.models.get(model), st.adapters.get(model)


def _served(renderer: Renderer, lora: LoRARequest | None) -> str:
    """The ``model`` of the answer: the adapter's name for an adapter request, as vLLM."""
    return renderer.served_model_name if lora is None else lora.lora_name


def _for_remote(body: bytes, renderer: Renderer, lora: LoRARequest | None) -> bytes:
    """The body for the render service: an adapter's model name becomes its base model's
    (the service knows the base models, not the adapters loaded here at run time)."""
    if lora is None:
        return body
    data = msgspec.json.decode(body)
    data["model"] = renderer.served_model_name
    return msgspec.json.encode(data)


async def _open(st: RouterState, receive: Receive, gen: GenerateRequest, spec: PipelineSpec,
                stream: bool, decoder: TokenDecoder, lora: LoRARequest | None = None,
                session: str | None = None,
                parsers: RequestParsers | None = None) -> EngineResponse:
    if gen.request_id in st.active:
        raise BadRequestError(f"request_id {gen.request_id!r} is already in flight.",
                              "request_id")
    routed = await _unless_client_leaves(st, receive, st.dispatcher.open(
        gen.request_id, gen.token_ids, gen.sampling_params, lora=lora,
        cache_salt=gen.cache_salt, priority=gen.priority, session_id=session))
    st.router_metrics.prompt_tokens_tally.inc((), len(gen.token_ids))
    return EngineResponse(st, routed, spec, decoder, stream, parsers=parsers)


async def _unless_client_leaves(st: RouterState, receive: Receive, opening: Awaitable[T]) -> T:
    """Await the engine's first output, unless the client disconnects first: a request queued
    in the router or prefilling on an engine is then cancelled, which aborts it on the engine
    (Dispatcher.open) instead of spending the prefill on nobody.

    ``opening`` runs inline in the request's task (a task of its own plus ``asyncio.wait`` cost
    two loop passes between the engine's first output and the answer); the watcher cancels
    this task when the client leaves, and the cancellation becomes ``ClientLeft``. Most
    openings finish well within ``WATCH_AFTER``, so the watcher (a task) only starts when the
    opening is still waiting after ``WATCH_AFTER``: a client that leaves is noticed that much
    later, and the common request pays for a timer instead of a task and its two steps.
    A client gone before the first token is ``ClientGoneError`` (499)."""
    task = asyncio.current_task()
    assert task is not None
    gone = False
    left: asyncio.Future[None] | None = None

    def on_left(watch: asyncio.Future[None]) -> None:
        nonlocal gone
        if not watch.cancelled() and watch.exception() is None:
            gone = True
            task.cancel()

    def watch() -> None:
        nonlocal left
        left = asyncio.ensure_future(client_disconnected(receive))
        left.add_done_callback(on_left)

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER, watch)
    try:
        result = await opening
    except asyncio.CancelledError:
        if not gone or task.uncancel() > 0:
            raise  # cancelled from outside (shutdown), not by the watcher
        if isinstance(opening, asyncio.Future) and opening.done() and not opening.cancelled():
            await _give_back(st, opening.result())  # it completed as the client left
        raise ClientGoneError from None
    finally:
        timer.cancel()
        if left is not None:
            left.remove_done_callback(on_left)
            left.cancel()
    if gone:  # the cancellation was absorbed by ``opening``: the client is gone all the same
        task.uncancel()
        await _give_back(st, result)
        raise ClientGoneError
    return result


async def _give_back(st: RouterState, result: object) -> None:
    """Release what an opening placed on engines for a client that has left."""
    placed = [r for r in (result if isinstance(result, list) else [result])
              if isinstance(r, Routed)]
    for routed in placed:
        await st.dispatcher.abort(routed, "client_disconnect")
        st.dispatcher.done(routed)


async def open_chat(st: RouterState, receive: Receive, body: bytes, arrival: float,
                    headers: Headers) -> Answer:
    """A read chat completions body: render, route, open; its answer is the returned app."""
    check_json(headers)
    req = decode_request(st.render.codecs.chat, body)
    renderer, lora = _target(st, req.model)
    width = None
    if req.use_beam_search:  # rendered as one plain choice, grown into beams here
        check_chat(req)
        width = req.n if req.n is not None else 1
        check_beam(bool(req.logprobs), width)
        req = msgspec.structs.replace(req, use_beam_search=False, n=1)
        body = msgspec.json.encode(req)
    try:
        if st.remote is not None:
            gen = await st.remote.render_chat(_for_remote(body, renderer, lora))
        else:
            gen = await st.render.run(renderer, len(body), renderer.render_chat, req)
        _admit(st, renderer, gen)
        if width is not None:
            check_beam_steps(width, st.config.limits.request)
    except InputProcessorError as exc:
        if req.stream:
            return RefusedStream(exc)
        raise
    session = _identify([gen], "chatcmpl", req, headers)
    # What the client sees follows its own skip_special_tokens: a parser's markers reach the
    # parser whatever it is (the rendered params clear it for vLLM's parsers, as vLLM does).
    spec = _spec(CHAT, gen, _served(renderer, lora),
                 **chat_options(req, gen, renderer, st.config.frontend),
                 skip_special_tokens=req.skip_special_tokens)
    if width is not None:
        return await _answer_beams(st, receive, [gen], [spec], width, req.length_penalty,
                                   bool(req.stream), renderer, arrival, lora, session)
    parsers = st.models.parsers.get(renderer.served_model_name)
    per_request = (parsers.for_request(options_of(req), gen.token_ids)
                   if parsers is not None else None)
    return await _answer(st, receive, gen, spec, bool(req.stream), renderer, arrival, lora,
                         session, per_request)


def _identify(gens: list[GenerateRequest], prefix: str,
              req: ChatCompletionRequest | CompletionRequest, headers: Headers) -> str | None:
    """What vLLM reads from a request's headers: ``x-request-id`` names the answer (and its
    engine requests), ``x-vllm-priority`` wins over the body's priority. Returns the session id
    the engine requests carry."""
    if (rid := header_request_id(headers)) is not None:
        for i, gen in enumerate(gens):
            gen.request_id = f"{prefix}-{rid}" if len(gens) == 1 else f"{prefix}-{rid}-{i}"
    if (priority := header_priority(headers)) is not None:
        for gen in gens:
            gen.priority = priority
    return session_id(req, headers)


async def _answer(st: RouterState, receive: Receive, gen: GenerateRequest, spec: PipelineSpec,
                  stream: bool, renderer: Renderer, arrival: float,
                  lora: LoRARequest | None = None, session: str | None = None,
                  parsers: RequestParsers | None = None) -> EngineResponse:
    """Open the engine request and its response, timed from the request's arrival."""
    decoder = st.decoders[renderer.served_model_name]
    resp = await _open(st, receive, gen, spec, stream, decoder, lora, session, parsers)
    resp.arrival = arrival
    return resp


async def open_completion(st: RouterState, receive: Receive, body: bytes, arrival: float,
                          headers: Headers) -> Answer:
    """A read completions body: render (one or several prompts), route, open."""
    check_json(headers)
    req = decode_request(st.render.codecs.completion, body)
    renderer, lora = _target(st, req.model)
    width = None
    if req.use_beam_search:  # rendered as one plain choice per prompt, grown into beams here
        check_completion(req)
        width = req.n if req.n is not None else 1
        check_beam(req.logprobs is not None, width)
        req = msgspec.structs.replace(req, use_beam_search=False, n=1)
        body = msgspec.json.encode(req)
    try:
        if st.remote is not None:
            gens = await st.remote.render_completion(_for_remote(body, renderer, lora))
        else:
            gens = await st.render.run(renderer, len(body), renderer.render_completion, req)
        for gen in gens:
            _admit(st, renderer, gen)
        if width is not None:
            check_beam_steps(width, st.config.limits.request)
    except InputProcessorError as exc:
        if req.stream:
            return RefusedStream(exc)
        raise
    session = _identify(gens, "cmpl", req, headers)
    prompts = completion_prompts(req, gens, renderer) if req.echo else [None] * len(gens)
    specs = [
        _spec(COMPLETION, gen, _served(renderer, lora),
              **completion_options(req, gen, prompt, st.config.frontend))
        for gen, prompt in zip(gens, prompts, strict=True)
    ]
    if width is not None:
        return await _answer_beams(st, receive, gens, specs, width, req.length_penalty,
                                   bool(req.stream), renderer, arrival, lora, session)
    if len(gens) == 1:
        return await _answer(st, receive, gens[0], specs[0], bool(req.stream), renderer,
                             arrival, lora, session)
    return await _answer_prompts(st, receive, gens, specs, bool(req.stream), renderer, arrival,
                                 lora, session)


async def _answer_prompts(st: RouterState, receive: Receive, gens: list[GenerateRequest],
                          specs: list[PipelineSpec], stream: bool, renderer: Renderer,
                          arrival: float, lora: LoRARequest | None,
                          session: str | None) -> EngineResponse:
    """Several prompts: each routed on its own, concurrently; answered as one response."""
    # vLLM names the prompts' requests "{id}-{i}"; the response carries the id itself.
    response_id = gens[0].request_id.rsplit("-", 1)[0]
    if response_id in st.active or any(g.request_id in st.active for g in gens):
        raise BadRequestError(f"request_id {response_id!r} is already in flight.", "request_id")
    opened = await _unless_client_leaves(st, receive, asyncio.gather(*(
        st.dispatcher.open(g.request_id, g.token_ids, g.sampling_params, lora=lora,
                           cache_salt=g.cache_salt, priority=g.priority, session_id=session)
        for g in gens), return_exceptions=True))
    parts = [r for r in opened if isinstance(r, Routed)]
    failed = [r for r in opened if isinstance(r, BaseException)]
    if failed:
        for part in parts:  # the prompts that did open must not run on unheard
            await st.dispatcher.abort(part, "sibling_failed")
            st.dispatcher.done(part)
        raise failed[0]
    st.router_metrics.prompt_tokens_tally.inc((), sum(len(g.token_ids) for g in gens))
    decoder = st.decoders[renderer.served_model_name]
    first = specs[0]
    spec = msgspec.structs.replace(
        first, request_id=response_id, n=sum(s.n for s in specs),
        prompt_tokens=sum(s.prompt_tokens for s in specs), echo=None, prompt_tail=())
    group = PipelineGroup(spec, [Pipeline(s, decoder) for s in specs])
    resp = EngineResponse(st, RoutedGroup(parts), spec, decoder, stream, pipeline=group)
    resp.arrival = arrival
    return resp


async def _answer_beams(st: RouterState, receive: Receive, gens: list[GenerateRequest],
                        specs: list[PipelineSpec], width: int, length_penalty: float,
                        stream: bool, renderer: Renderer, arrival: float,
                        lora: LoRARequest | None, session: str | None) -> EngineResponse:
    """Beam search on each prompt (router/front/beam_search.py), answered as its ``width``
    best beams per prompt. The beams are the answer's choices and keep their EOS token's text
    out as vLLM's do, so the pipeline is told not to cut one more."""
    outputs = await _unless_client_leaves(st, receive, asyncio.gather(*(
        beam_search(st, gen, width, renderer.eos_token_id, length_penalty,
                    gen.sampling_params.ignore_eos, gen.sampling_params.include_stop_str_in_output,
                    renderer.generation_config, lora, session)
        for gen in gens)))
    specs = [msgspec.structs.replace(s, n=width, include_stop_str_in_output=True)
             for s in specs]
    decoder = st.decoders[renderer.served_model_name]
    answer = BeamAnswer(BeamDecision(max(g.sampling_params.max_tokens or 0 for g in gens)),
                        [out for outs in outputs for out in outs])
    spec = specs[0]
    group = None
    if len(specs) > 1:
        spec = msgspec.structs.replace(
            spec, request_id=gens[0].request_id.rsplit("-", 1)[0], n=width * len(specs),
            prompt_tokens=sum(s.prompt_tokens for s in specs), echo=None, prompt_tail=())
        group = PipelineGroup(spec, [Pipeline(s, decoder) for s in specs])
    resp = EngineResponse(st, answer, spec, decoder, stream, pipeline=group)
    resp.arrival = arrival
    return resp


async def open_generate(st: RouterState, receive: Receive, body: bytes, arrival: float,
                        headers: Headers) -> Answer:
    """vLLM's token-in endpoint: a GenerateRequest as render produced it, tokens (or text)
    out. The read body: decode and check it, route, open."""
    check_json(headers)
    gen = decode_request(st.generate_decoder, body)
    renderer, lora = _target(st, gen.model)
    if not gen.token_ids:
        raise BadRequestError("token_ids must hold at least one token id.", "token_ids")
    check_sampling(gen.sampling_params, "sampling_params.", st.config.limits.request)
    try:
        _admit(st, renderer, gen, where="sampling_params.", prompt_ids=gen.token_ids)
        renderer.engine_params(gen.sampling_params)
    except InputProcessorError as exc:
        if gen.stream:
            return RefusedStream(exc)
        raise
    spec = _spec(GENERATE, gen, _served(renderer, lora), output_mode=gen.output_mode,
                 return_token_ids=bool(gen.return_token_ids),
                 prompt_token_ids=gen.token_ids if gen.return_token_ids else None,
                 **usage_options(gen, st.config.frontend))
    resp = await _open(st, receive, gen, spec, bool(gen.stream),
                       st.decoders[renderer.served_model_name], lora)
    resp.arrival = arrival
    return resp


Opener = Callable[[RouterState, Receive, bytes, float, Headers], Awaitable[Answer]]


def _endpoint(open_body: Opener) -> Callable[[Request], Awaitable[Answer]]:
    """The Starlette endpoint of an opener: timed from arrival, the body read first."""
    async def endpoint(request: Request) -> Answer:
        arrival = time.perf_counter()
        st = router_state(request.scope["state"])
        body = await read_body(request, st.render.limits.max_body_bytes)
        return await open_body(st, request.receive, body, arrival, request.scope["headers"])

    endpoint.__doc__ = open_body.__doc__
    return endpoint


chat_completions = _endpoint(open_chat)
completions = _endpoint(open_completion)
generate = _endpoint(open_generate)


async def abort_requests(request: Request) -> Response:
    st = router_state(request.scope["state"])
    body = await read_body(request, st.render.limits.max_body_bytes)
    req = msgspec.json.decode(body, type=AbortRequests)
    for rid in req.request_ids:
        routed = st.active.get(rid)
        if routed is not None:
            await st.dispatcher.abort(routed, "abort_requests")
    return Response(b"", status_code=200)
