"""OpenAI (and vLLM generate) response shapes as msgspec Structs: stream chunks and full bodies.

Field names follow vLLM 0.33's pydantic models so clients see the same JSON; ``object`` is the
msgspec tag, so it is always written (first) even under ``omit_defaults``. Optional
fields that OpenAI always sends (``finish_reason``, chat ``logprobs``) have no default and so are
always encoded, as ``null`` when absent; vLLM extensions (``stop_reason``, ``token_ids``) are
omitted when unset.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class PromptTokensDetails(msgspec.Struct, omit_defaults=True, gc=False):
    cached_tokens: int | None = None


class CompletionTokensDetails(msgspec.Struct, gc=False):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct, omit_defaults=True, gc=False):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    # Sent when a reasoning parser runs (vLLM's completion_tokens_details).
    completion_tokens_details: CompletionTokensDetails | None = None


# ---- logprobs ----


class ChatTopLogprob(msgspec.Struct, gc=False):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatLogprobsContent(msgspec.Struct, gc=False):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(msgspec.Struct, gc=False):
    # The pipeline writes the list as JSON (output/logprobs.py); the Struct types above are
    # its schema, e.g. for decoding it back.
    content: msgspec.Raw | list[ChatLogprobsContent] | None


class CompletionLogprobs(msgspec.Struct, gc=False):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class GenerateLogprob(msgspec.Struct, omit_defaults=True, gc=False):
    """One candidate with its integer token id (vLLM ``GenerateLogProb``)."""

    token_id: int
    logprob: float
    rank: int | None = None


class GenerateLogprobsContent(msgspec.Struct, omit_defaults=True, gc=False):
    token_id: int
    logprob: float
    rank: int | None = None
    top_logprobs: list[GenerateLogprob] = []


class GenerateLogprobs(msgspec.Struct, gc=False):
    content: list[GenerateLogprobsContent] | None


# ---- chat ----


class ToolCallFunction(msgspec.Struct, omit_defaults=True, gc=False):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, omit_defaults=True, gc=False):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunction | None = None


class ChatDelta(msgspec.Struct, omit_defaults=True, gc=False):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    reasoning: str | None = None  # vLLM 0.32's name for reasoning_content (both are sent)


class ChatChunkChoice(msgspec.Struct, omit_defaults=True, gc=False):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(
    msgspec.Struct,
    omit_defaults=True,
    gc=False,
    tag_field="object",
    tag="chat.completion.chunk",
):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    # The first chunk of each choice: the prompt (return_token_ids) and its text
    # (return_prompt_text).
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None


class ChatMessage(msgspec.Struct, omit_defaults=True, gc=False):
    role: str
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] = []
    reasoning: str | None = None  # vLLM 0.32's name for reasoning_content (both are sent)


class ChatChoice(msgspec.Struct, omit_defaults=True, gc=False):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletion(
    msgspec.Struct,
    omit_defaults=True,
    gc=False,
    tag_field="object",
    tag="chat.completion",
):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    # vLLM's extensions: [None, {token id: {logprob, rank, decoded_token}}, ...]
    prompt_logprobs: list[dict[str, dict[str, object]] | None] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    kv_transfer_params: dict[str, object] | None = None


# ---- completions ----


class CompletionChoice(msgspec.Struct, omit_defaults=True, gc=False):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    # Its prompt: the first chunk of an echoed or return_token_ids stream, a body's with
    # return_token_ids; a body's prompt logprobs.
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[dict[str, dict[str, object]] | None] | None = None


class Completion(
    msgspec.Struct,
    omit_defaults=True,
    gc=False,
    tag_field="object",
    tag="text_completion",
):
    """Both the ``text_completion`` stream chunk and the collected body (same shape in OpenAI)."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    kv_transfer_params: dict[str, object] | None = None


# ---- /inference/v1/generate (vLLM's token-in / token-out shapes) ----


class GenerateChoice(msgspec.Struct, omit_defaults=True, gc=False):
    """A stream choice (delta token ids) or a final one (all token ids); text in text mode."""

    index: int
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    text: str | None = None
    logprobs: GenerateLogprobs | ChatLogprobs | None = None


class GenerateResponse(msgspec.Struct, omit_defaults=True, gc=False, kw_only=True):
    """vLLM ``GenerateTokensResponse`` / ``GenerateTextResponse`` and their stream chunks."""

    request_id: str
    model: str | None = None
    created: int | None = None
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    # Always sent (omit_defaults would drop it): vLLM's discriminator defaults to "tokens" anyway.
    output_mode: str
    choices: list[GenerateChoice]


Chunk = ChatCompletionChunk | Completion | GenerateResponse
