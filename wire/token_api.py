"""vLLM's token-in HTTP API as a client speaks it: the request body and the SSE chunks read back.

Mirrors ``vllm/entrypoints/scale_out/token_in_token_out/protocol.py`` (vllm 0.32), field by
field, append only: ``GenerateRequest`` as sent to ``POST /inference/v1/generate`` with
``stream: true``, and ``GenerateTokensStreamResponse`` chunks (``data: {json}\\n\\n`` events
ending with ``data: [DONE]``). An error after the response started arrives as one event
``{"error": {"message", "type", "param", "code"}}`` (vLLM's ``ErrorResponse``), which the chunk
type below reads too. ``GET /kv_event_sources`` answers ``{rank: KVEventsConfig map}``.
The render's own ``render.protocol.GenerateRequest`` is the HTTP input type (validated on
decode); these are the engine-facing mirrors.
"""

from __future__ import annotations

from typing import Any

import msgspec

from wire.sampling import SamplingParams

GENERATE_PATH = "/inference/v1/generate"
ABORT_PATH = "/inference/v1/abort_requests"
KV_SOURCES_PATH = "/kv_event_sources"
# vLLM names the engine request of a generate call "generate-tokens-{request_id}" (or of the
# X-Request-Id header): the id /inference/v1/abort_requests takes.
POD_REQUEST_PREFIX = "generate-tokens-"


class GenerateStreamOptions(msgspec.Struct, omit_defaults=True, gc=False):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class TokenGenerateRequest(msgspec.Struct, omit_defaults=True, gc=False):
    """vLLM ``GenerateRequest`` (the fields a router sends), in vLLM's field order."""

    request_id: str
    token_ids: list[int]
    sampling_params: SamplingParams
    model: str | None = None
    output_mode: str = "tokens"
    stream: bool | None = False
    stream_options: GenerateStreamOptions | None = None
    cache_salt: str | None = None
    priority: int = 0
    kv_transfer_params: dict[str, Any] | None = None


class GenerateLogprob(msgspec.Struct, gc=False):
    """One candidate: ``rank`` None where vLLM's is 0 (a NaN logprob's)."""

    token_id: int
    logprob: float
    rank: int | None = None


class GenerateLogprobsContent(msgspec.Struct, gc=False):
    """One generated token: its own logprob, then the first ``max(k, 1)`` candidates of vLLM's
    per-position map (the sampled token first, then the top-k without it)."""

    token_id: int
    logprob: float
    rank: int | None = None
    top_logprobs: list[GenerateLogprob] = []


class GenerateLogprobs(msgspec.Struct, gc=False):
    content: list[GenerateLogprobsContent] | None = None


class StreamChoice(msgspec.Struct, gc=False):
    """``GenerateTokensStreamChoice``: the delta token ids of one choice."""

    index: int
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    logprobs: GenerateLogprobs | None = None


class PromptTokensDetails(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class UsageInfo(msgspec.Struct, gc=False):
    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class ErrorInfo(msgspec.Struct, gc=False):
    message: str = ""
    type: str = ""
    param: str | None = None
    code: int = 500


class StreamChunk(msgspec.Struct, gc=False):
    """One SSE event of a generate stream: a ``GenerateTokensStreamResponse``, or vLLM's
    in-band ``ErrorResponse`` (``error`` set, nothing else)."""

    request_id: str | None = None
    choices: list[StreamChoice] = []
    usage: UsageInfo | None = None
    error: ErrorInfo | None = None


class ErrorResponse(msgspec.Struct, gc=False):
    """vLLM's error body of a refused request (any non-2xx answer)."""

    error: ErrorInfo | None = None
    # FastAPI's own validation and HTTPException answers: {"detail": ...}
    detail: Any = None


class ModelCard(msgspec.Struct, gc=False):
    id: str
    max_model_len: int | None = None


class ModelList(msgspec.Struct, gc=False):
    data: list[ModelCard] = []
