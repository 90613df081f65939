"""More of `vllm serve`'s routes on the face: render, tokenize, reset the prefix cache; and the
sim's own read of its true prefix cache.

    POST /v1/chat/completions/render, /v1/completions/render, /tokenize   (as vllm serve: what
         routers such as vllm-router call on every pod to key their cache-aware choice)
    POST /reset_prefix_cache     vLLM's dev route: {"success": bool} (fails while blocks are held)
    POST /sim/prefix_cache/match {"prompt_token_ids": [...], "cache_salt": null}
                                 -> {"cached_tokens": N}: the longest prefix of full blocks the
                                 engine holds now (sim only: a benchmark's oracle router reads it)
    GET  /sim/render_work        {"render_work": "kvroute"|"vllm"|"vllm-time", "vllm_renders":
                                 N, "render_seconds": S}: what a text request costs here, how
                                 many paid vLLM's render, and the render time they waited

The match reads the engine's block pool from the face's thread without a lock: each lookup is
one dict read, so an answer is at worst one engine step stale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    TokenizeRequest,
    decode_request,
)
from render.token_json import json_encoder
from serving.body import JSON, read_body
from sim.http.link import UtilityFailed
from sim.prefix_cache import chain_hashes, namespace_root

if TYPE_CHECKING:
    from sim.http.app import FaceState

MAX_BODY = 64 * 1024 * 1024


class PrefixMatchRequest(msgspec.Struct, forbid_unknown_fields=True):
    prompt_token_ids: list[int]
    cache_salt: str | None = None


_CHAT = msgspec.json.Decoder(ChatCompletionRequest)
_COMPLETION = msgspec.json.Decoder(CompletionRequest)
_TOKENIZE = msgspec.json.Decoder(TokenizeRequest)
_MATCH = msgspec.json.Decoder(PrefixMatchRequest)
_ENCODER = json_encoder()


def extra_routes(state_of: Callable[[Request], FaceState],
                 check_model: Callable[[FaceState, str | None], None]) -> list[Route]:
    """The routes, reading the face's state with ``state_of``."""

    async def chat_render(request: Request) -> Response:
        st = state_of(request)
        chat = decode_request(_CHAT, await read_body(request, MAX_BODY))
        check_model(st, chat.model)
        return Response(_ENCODER.encode(await st.render_chat(chat)), media_type=JSON)

    async def completion_render(request: Request) -> Response:
        st = state_of(request)
        req = decode_request(_COMPLETION, await read_body(request, MAX_BODY))
        check_model(st, req.model)
        return Response(_ENCODER.encode(await st.render_completion(req)), media_type=JSON)

    async def tokenize(request: Request) -> Response:
        st = state_of(request)
        req = decode_request(_TOKENIZE, await read_body(request, MAX_BODY))
        check_model(st, req.model)
        return Response(_ENCODER.encode(await st.tokenize(req)), media_type=JSON)

    async def reset_prefix_cache(request: Request) -> Response:
        st = state_of(request)
        running = request.query_params.get("reset_running_requests", "false").lower() == "true"
        try:
            success = bool(await st.link.call_utility("reset_prefix_cache", running))
        except UtilityFailed:
            success = False
        return Response(_ENCODER.encode({"success": success}), media_type=JSON)

    async def prefix_match(request: Request) -> Response:
        st = state_of(request)
        req = decode_request(_MATCH, await read_body(request, MAX_BODY))
        return Response(_ENCODER.encode({"cached_tokens": cached_tokens(st, req)}),
                        media_type=JSON)

    async def render_work(request: Request) -> Response:
        st = state_of(request)
        assert st.config.http is not None
        return Response(_ENCODER.encode({
            "render_work": st.config.http.render_work, "vllm_renders": st.vllm_renders,
            "render_seconds": st.clock.seconds if st.clock is not None else 0.0}),
            media_type=JSON)

    return [
        Route("/v1/chat/completions/render", chat_render, methods=["POST"]),
        Route("/v1/completions/render", completion_render, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
        Route("/sim/prefix_cache/match", prefix_match, methods=["POST"]),
        Route("/sim/render_work", render_work, methods=["GET"]),
    ]


def cached_tokens(st: FaceState, req: PrefixMatchRequest) -> int:
    """What the engine's scheduler would find cached for this prompt now (vLLM recomputes at
    least the last prompt token, so at most len - 1)."""
    pool = st.engine.scheduler.pool
    tokens = req.prompt_token_ids
    hashes = chain_hashes(tokens, pool.block_size, namespace_root(None, None, req.cache_salt), [])
    max_blocks = max(len(tokens) - 1, 0) // pool.block_size
    return len(pool.longest_hit(hashes, max_blocks)) * pool.block_size
