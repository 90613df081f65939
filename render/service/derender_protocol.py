"""The derender endpoints' JSON: vLLM 0.32's ``Derender*`` requests and the generate responses
they carry (``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``), checked at decode time.

A body is one shape or the other by its ``stream`` field (``stream_of``): a whole generate
response (``generate_response`` / ``generate_responses``), or one chunk of a generate stream
(``generate_chunk``) with the ``stream_state`` the previous call returned.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from render.protocol import ChatCompletionRequest, CompletionRequest

TokenId = Annotated[int, Meta(ge=0)]


class GenerateLogprob(msgspec.Struct, omit_defaults=True):
    token_id: TokenId
    logprob: float
    rank: int | None = None


class GenerateLogprobsEntry(msgspec.Struct, omit_defaults=True):
    token_id: TokenId
    logprob: float
    rank: int | None = None
    # The engine's order: the sampled token first, then the other candidates by rank.
    top_logprobs: list[GenerateLogprob] = []


class GenerateLogprobs(msgspec.Struct, omit_defaults=True):
    content: list[GenerateLogprobsEntry] | None = None


class GenerateChoice(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: Annotated[int, Meta(ge=0)]
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[TokenId] | None = None
    logprobs: GenerateLogprobs | None = None


class GenerateStreamChoice(GenerateChoice, kw_only=True, omit_defaults=True):
    finish_reason: str | None = None


def _request_id() -> str:
    return f"{uuid.uuid4().int & (2**64 - 1):016x}"  # vLLM's default: random_uuid()


class GenerateResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    """vLLM's ``GenerateTokensResponse`` (``output_mode`` "tokens" only, as vLLM takes)."""

    request_id: str = msgspec.field(default_factory=_request_id)
    model: str | None = None
    created: int | None = None
    usage: dict[str, Any] | None = None
    prompt_logprobs: Any = None
    prompt_token_ids: list[TokenId] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    output_mode: Literal["tokens"] = "tokens"
    choices: list[GenerateChoice]


class GenerateStreamResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    request_id: str = msgspec.field(default_factory=_request_id)
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[TokenId] | None = None
    metrics: dict[str, Any] | None = None
    output_mode: Literal["tokens"] = "tokens"
    choices: list[GenerateStreamChoice]


class DerenderStreamState(msgspec.Struct, kw_only=True):
    """vLLM's client-carried stream state (plain JSON, the client sends back what it got).

    kvroute reads ``output_token_ids`` / ``output_chunk_lens`` (replayed through a fresh
    pipeline, as vLLM replays its parser) and ``logprob_context_token_ids`` (the last sampled
    ids: they also seed the next chunk's detokenization); ``prev_tokens`` and the offsets are
    vLLM's detokenizer window, carried unread.
    """

    prev_tokens: Annotated[list[str], Meta(max_length=1024)] = []
    prefix_offset: Annotated[int, Meta(ge=0)] = 0
    read_offset: Annotated[int, Meta(ge=0)] = 0
    role_sent: bool = False
    logprob_context_token_ids: Annotated[list[TokenId], Meta(max_length=4)] = []
    logprob_text_offset: Annotated[int, Meta(ge=0)] = 0
    output_token_ids: list[TokenId] = []
    output_chunk_lens: list[Annotated[int, Meta(gt=0)]] = []
    tools_streamed: bool = False
    last_tool_call_ids: list[str] = []

    def __post_init__(self) -> None:
        total = sum(self.output_chunk_lens)
        if total != len(self.output_token_ids):
            raise ValueError(
                f"output_chunk_lens must sum to len(output_token_ids) (got sum={total}, "
                f"len(output_token_ids)={len(self.output_token_ids)})")


class Streamed(msgspec.Struct):
    stream: bool = False


class DerenderChatRequest(msgspec.Struct, kw_only=True):
    stream: Literal[False] = False
    model: str | None = None
    generate_response: GenerateResponse
    prompt_tokens: int | None = None
    prompt_token_ids: list[TokenId] | None = None
    chat_request: ChatCompletionRequest | None = None


class DerenderChatStreamRequest(msgspec.Struct, kw_only=True):
    stream: Literal[True]
    model: str | None = None
    generate_chunk: GenerateStreamResponse
    stream_state: DerenderStreamState | None = None
    prompt_tokens: int | None = None
    prompt_token_ids: list[TokenId] | None = None
    chat_request: ChatCompletionRequest | None = None


class DerenderCompletionRequest(msgspec.Struct, kw_only=True):
    stream: Literal[False] = False
    model: str | None = None
    generate_responses: list[GenerateResponse]
    prompt_tokens: list[int] | None = None
    prompt_token_ids: list[list[TokenId] | None] | None = None
    completion_request: CompletionRequest | None = None

    def __post_init__(self) -> None:
        n = len(self.generate_responses)
        if self.prompt_tokens is not None and len(self.prompt_tokens) != n:
            raise ValueError(f"prompt_tokens length ({len(self.prompt_tokens)}) must equal "
                             f"generate_responses length ({n})")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != n:
            raise ValueError(f"prompt_token_ids length ({len(self.prompt_token_ids)}) must "
                             f"equal generate_responses length ({n})")


class DerenderCompletionStreamRequest(msgspec.Struct, kw_only=True):
    stream: Literal[True]
    model: str | None = None
    generate_chunk: GenerateStreamResponse
    stream_state: DerenderStreamState | None = None
    prompt_tokens: int | None = None
    prompt_token_ids: list[TokenId] | None = None
    completion_request: CompletionRequest | None = None


class DerenderStreamResponse(msgspec.Struct):
    chunk: Any
    stream_state: DerenderStreamState


def stream_of(body: bytes) -> bool:
    """Whether a derender body is one chunk of a stream (``"stream": true``)."""
    return msgspec.json.decode(body, type=Streamed).stream
