"""The two render POSTs as raw ASGI in front of the Starlette app, for requests that succeed.

Starlette's route matching, Request object, exception and metrics middleware are a measurable share
of a short render request's CPU. This route answers a well-formed chat or completion render itself
(same JSON, same metrics) and hands everything else to the Starlette app untouched: other paths,
bodies without a Content-Length or over the limit. A render that raises is answered by the app's
own error path (serving/http_errors.py's ErrorPath, the app's exception_handlers), so every error
keeps its single mapping and a failing render is not run twice. Bodies over --inline-max-bytes
render in a helper process (render/service/offload.py) when one is ready, as in the app's own
handlers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec
from starlette.requests import Request

from render import Renderer
from render.protocol import ChatCompletionRequest, CompletionRequest, decode_request
from render.service.offload import CHAT, COMPLETIONS
from render.service.state import RenderState, render_state
from serving.http_errors import ErrorPath

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_HEADERS = [(b"content-type", b"application/json")]


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class FastRenderRoute:
    """The render service's ASGI app: the two render POSTs here, everything else to ``app``."""

    def __init__(self, app: ASGIApp, errors: ErrorPath) -> None:
        self.app = app
        self.errors = errors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in (CHAT, COMPLETIONS):
            await self.app(scope, receive, send)
            return
        st = render_state(scope["state"])
        size = _content_length(scope)
        if size is None or size > st.limits.max_body_bytes:
            await self.app(scope, receive, send)  # chunked or too big: the app reads / 413s it
            return
        t0 = time.perf_counter()
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            payload, tokens, model = await self._render(st, path, body)
        except Exception as exc:  # answered by the app's own error path (one mapping)
            response = self.errors.answer(Request(scope), exc)
            await response(scope, receive, send)
            st.metrics.request_done(path, response.status_code, time.perf_counter() - t0)
            if not self.errors.expected(exc):
                raise  # as Starlette's ServerErrorMiddleware: answered, and the server logs it
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_HEADERS, (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        metrics = st.metrics
        metrics.add_prompt_tokens(model, tokens)
        metrics.request_done(path, 200, time.perf_counter() - t0)

    @staticmethod
    async def _render(st: RenderState, path: str, body: bytes) -> tuple[bytes, int, str]:
        done = await st.offloaded(path, body)
        if done is not None:
            return done
        codecs = st.codecs
        decoder: msgspec.json.Decoder[ChatCompletionRequest] | msgspec.json.Decoder[
            CompletionRequest] = codecs.chat if path == CHAT else codecs.completion
        if len(body) > st.limits.inline_max_bytes:
            # No helper took it: a body this big renders on a thread; decoding it there too keeps
            # the loop free (JSON decoding costs in proportion to the body, up to the body limit).
            req = await asyncio.get_running_loop().run_in_executor(st.pool, decode_request,
                                                                     decoder, body)
        else:
            req = decode_request(decoder, body)
        renderer = st.models.get(req.model)
        job: Callable[..., tuple[bytes, int]] = _chat_job if path == CHAT else _completion_job
        payload, tokens = await st.run(renderer, len(body), job, renderer, codecs.encoder, req)
        return payload, tokens, renderer.served_model_name


# The JSON encoding is part of the job, so an offloaded render is also encoded on its thread:
# encoding a big prompt's ids holds the GIL throughout (msgspec never releases it, which is also
# why one Encoder may serve the loop and the threads).
def _chat_job(renderer: Renderer, encoder: msgspec.json.Encoder,
              req: ChatCompletionRequest) -> tuple[bytes, int]:
    out = renderer.render_chat(req, array=True)
    return encoder.encode(out), len(out.token_ids)


def _completion_job(renderer: Renderer, encoder: msgspec.json.Encoder,
                    req: CompletionRequest) -> tuple[bytes, int]:
    outs = renderer.render_completion(req)
    return encoder.encode(outs), sum(len(o.token_ids) for o in outs)
