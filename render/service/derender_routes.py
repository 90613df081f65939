"""``POST /v1/chat/completions/derender`` and ``/v1/completions/derender`` (vLLM 0.32's paths).

One path each for a whole generate response and for one chunk of a generate stream (by the
body's ``stream``); the work (render/service/derender.py) runs where renders run, under the
model's lock. vLLM's bounds come first, with its messages: choices per response and token ids,
logprobs and prompt ids within the model's limits.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from render.errors import BadRequestError
from render.protocol import decode_request
from render.service.derender import Derenderer
from render.service.derender_protocol import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderStreamResponse,
    GenerateResponse,
    stream_of,
)
from render.service.state import RenderState, render_state
from serving.body import JSON, read_body

_CHAT = msgspec.json.Decoder(DerenderChatRequest)
_CHAT_STREAM = msgspec.json.Decoder(DerenderChatStreamRequest)
_COMPLETION = msgspec.json.Decoder(DerenderCompletionRequest)
_COMPLETION_STREAM = msgspec.json.Decoder(DerenderCompletionStreamRequest)
_ENCODE = msgspec.json.Encoder()


def _bounds(st: RenderState, name: str | None, responses: list[GenerateResponse]) -> None:
    renderer = st.models.get(name)
    max_n, max_len = renderer.limits.max_n, renderer.max_model_len
    max_lp = renderer.limits.max_logprobs
    if len(responses) > max_n:
        raise BadRequestError(f"generate_responses count ({len(responses)}) exceeds server "
                              f"maximum ({max_n}).")
    for gen in responses:
        if len(gen.choices) > max_n:
            raise BadRequestError(f"choices count ({len(gen.choices)}) in response "
                                  f"'{gen.request_id}' exceeds server maximum ({max_n}).")
        for c in gen.choices:
            if c.token_ids and len(c.token_ids) > max_len:
                raise BadRequestError(f"token_ids length ({len(c.token_ids)}) in choice "
                                      f"{c.index} exceeds max_model_len ({max_len}).")
            content = c.logprobs.content if c.logprobs is not None else None
            for entry in content or ():
                if max_lp >= 0 and len(entry.top_logprobs) > max_lp:
                    raise BadRequestError(
                        f"top_logprobs count ({len(entry.top_logprobs)}) in choice {c.index} "
                        f"exceeds max_logprobs ({max_lp}).")
        _ids_in_vocab(st, name, [t for c in gen.choices for t in c.token_ids or ()])


def _ids_in_vocab(st: RenderState, name: str | None, ids: list[int]) -> None:
    renderer = st.models.get(name)
    limit = max(renderer.vocab_size, renderer.tokenizer.get_vocab_size(True))
    bad = next((t for t in ids if t >= limit), None)
    if bad is not None:
        raise BadRequestError(f"Token id {bad} is out of vocabulary (vocab size {limit}).")


def _prompt(st: RenderState, name: str | None, ids: list[int] | None) -> None:
    renderer = st.models.get(name)
    if ids is not None and len(ids) > renderer.max_model_len:
        raise BadRequestError(f"prompt_token_ids length ({len(ids)}) exceeds max_model_len "
                              f"({renderer.max_model_len}).")
    if ids:
        _ids_in_vocab(st, name, ids)


async def _run(st: RenderState, name: str | None, size: int, fn: Any, req: Any) -> Response:
    renderer = st.models.get(name)
    derenderer: Derenderer = st.models.derenderer(renderer.served_model_name)
    out = await st.run(renderer, size, getattr(derenderer, fn), req)
    if isinstance(out, tuple):
        out = DerenderStreamResponse(*out)
    return Response(_ENCODE.encode(out), media_type=JSON)


async def chat_derender(request: Request) -> Response:
    st = render_state(request.scope["state"])
    body = await read_body(request, st.limits.max_body_bytes)
    if stream_of(body):
        sreq: DerenderChatStreamRequest = decode_request(_CHAT_STREAM, body)
        _prompt(st, sreq.model, sreq.prompt_token_ids)
        _bounds(st, sreq.model, [GenerateResponse(request_id=sreq.generate_chunk.request_id,
                                                  choices=list(sreq.generate_chunk.choices))])
        state = sreq.stream_state
        prior = len(state.output_token_ids) if state is not None else 0
        delta = sum(len(c.token_ids or ()) for c in sreq.generate_chunk.choices)
        prompt = len(sreq.prompt_token_ids or ())
        max_len = st.models.get(sreq.model).max_model_len
        if prompt + prior + delta > max_len:
            raise BadRequestError(
                f"prompt_token_ids length ({prompt}) plus output_token_ids length ({prior}) "
                f"plus delta ({delta}) exceeds max_model_len ({max_len}).")
        return await _run(st, sreq.model, len(body), "chat_stream", sreq)
    req: DerenderChatRequest = decode_request(_CHAT, body)
    _bounds(st, req.model, [req.generate_response])
    _prompt(st, req.model, req.prompt_token_ids)
    return await _run(st, req.model, len(body), "chat", req)


async def completion_derender(request: Request) -> Response:
    st = render_state(request.scope["state"])
    body = await read_body(request, st.limits.max_body_bytes)
    if stream_of(body):
        sreq: DerenderCompletionStreamRequest = decode_request(_COMPLETION_STREAM, body)
        _prompt(st, sreq.model, sreq.prompt_token_ids)
        _bounds(st, sreq.model, [GenerateResponse(request_id=sreq.generate_chunk.request_id,
                                                  choices=list(sreq.generate_chunk.choices))])
        return await _run(st, sreq.model, len(body), "completion_stream", sreq)
    req: DerenderCompletionRequest = decode_request(_COMPLETION, body)
    _bounds(st, req.model, req.generate_responses)
    for ids in req.prompt_token_ids or ():
        _prompt(st, req.model, ids)
    return await _run(st, req.model, len(body), "completion", req)
