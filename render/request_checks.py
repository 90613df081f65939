"""vLLM's request validators: what its Chat/CompletionRequest refuse as they load.

vLLM 0.32 runs these as pydantic ``model_validator``s (and ``validate_request_mm_kwargs``)
before it renders anything; render runs them first thing, with vLLM's messages and parameters,
so a request refused by both gets the same 400. Type and range errors that vLLM leaves to
pydantic stay msgspec's decode errors (render/protocol.py), typed "Bad Request" as vLLM types
pydantic's.
"""

from __future__ import annotations

from render.errors import BadRequestError, vllm_message
from render.protocol import ChatCompletionRequest, CompletionRequest

# vLLM's cache-salt bounds (entrypoints/generate/base/protocol.py).
MAX_CACHE_SALT_LENGTH = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")


def refuse(message: str, parameter: str | None = None, value: object = None) -> BadRequestError:
    """A 400 worded as vLLM's ``VLLMValidationError``."""
    return BadRequestError(vllm_message(message, parameter, value), parameter)


def check_chat(req: ChatCompletionRequest) -> None:
    """``ChatCompletionRequest``'s validators, then the online renderer's first checks."""
    _check_salt(req.cache_salt)
    if req.tools is not None and not req.tools:
        raise refuse("`tools` must not be an empty array. Either provide at least one tool or "
                     "omit the field entirely.", "tools")
    if req.continue_final_message and req.add_generation_prompt:
        raise refuse("Cannot set both `continue_final_message` and `add_generation_prompt` to "
                      "True.")
    _check_stream_options(req)
    if req.logprob_token_ids and req.use_beam_search:
        raise refuse("`logprob_token_ids` is not supported with beam search.",
                      "logprob_token_ids")
    if req.logprob_token_ids and not req.logprobs:
        raise refuse("when using `logprob_token_ids`, `logprobs` must be set to true.",
                     "logprob_token_ids")
    _check_prompt_logprobs(req)
    top = req.top_logprobs
    if top is not None:
        if top < 0 and top != -1:
            raise refuse("`top_logprobs` must be a positive value or -1.", "top_logprobs", top)
        if (top == -1 or top > 0) and not req.logprobs:
            raise refuse("when using `top_logprobs`, `logprobs` must be set to true.",
                         "top_logprobs")
    if req.mm_processor_kwargs:
        raise refuse("Per-request mm_processor_kwargs are disabled by default because they can "
                      "change multimodal preprocessing resource usage. Start the server with "
                      "--trust-request-mm-kwargs only when clients are trusted.",
                      "mm_processor_kwargs")
    if req.media_io_kwargs:
        raise refuse("Per-request media_io_kwargs are disabled by default because they can "
                      "change multimodal media loading resource usage. Start the server with "
                      "--trust-request-mm-kwargs only when clients are trusted.",
                      "media_io_kwargs")
    if not req.messages:
        raise refuse("Cannot apply chat template to an empty conversation. Provide at least one "
                      "message.")


def check_completion(req: CompletionRequest) -> None:
    """``CompletionRequest``'s validators, then the completion renderer's first checks."""
    _check_salt(req.cache_salt)
    if req.logprob_token_ids and req.use_beam_search:
        raise refuse("`logprob_token_ids` is not supported with beam search.",
                     "logprob_token_ids")
    if req.use_beam_search and req.echo and req.logprobs is not None:
        raise refuse("`echo` with `logprobs` is not supported with beam search because beam "
                      "search does not compute prompt logprobs.", "echo")
    if req.logprob_token_ids and req.echo and req.max_tokens == 0:
        raise refuse("`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` "
                      "because no output tokens are generated.", "logprob_token_ids")
    if req.logprob_token_ids and req.logprobs is None:
        raise refuse("when using `logprob_token_ids`, `logprobs` must be set.",
                     "logprob_token_ids")
    _check_prompt_logprobs(req)
    if req.logprobs is not None and req.logprobs < 0 and req.logprobs != -1:
        raise refuse("`logprobs` must be a positive value or -1.", "logprobs", req.logprobs)
    _check_stream_options(req)
    embeds = req.prompt_embeds
    if (req.prompt is None or req.prompt == "") and (embeds is None or embeds == []):
        raise refuse("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if req.stream and req.use_beam_search:
        raise refuse("Streaming is not currently supported with beam search")
    if embeds is not None:
        raise refuse("You must set `--enable-prompt-embeds` to input `prompt_embeds`.",
                     "prompt_embeds")
    if req.suffix is not None:  # vLLM's message names no parameter here, its error does
        raise BadRequestError("suffix is only supported for models with FIM completion "
                              "rendering", "suffix")


def _check_salt(salt: str | None) -> None:
    if salt is None:
        return
    if not salt:
        raise refuse("Parameter 'cache_salt' must be a non-empty string if provided.",
                     "cache_salt")
    if len(salt) > MAX_CACHE_SALT_LENGTH or not _SALT_FORBIDDEN.isdisjoint(salt):
        raise refuse("Parameter 'cache_salt' must be at most 128 characters and must not "
                     "contain '@', '/', '\\\\', or NUL.", "cache_salt")


def _check_stream_options(req: ChatCompletionRequest | CompletionRequest) -> None:
    if req.stream_options is not None and req.stream_options.given() and not req.stream:
        raise refuse("Stream options can only be defined when `stream=True`.", "stream_options")


def _check_prompt_logprobs(req: ChatCompletionRequest | CompletionRequest) -> None:
    n = req.prompt_logprobs
    if n is None:
        return
    if req.stream and (n > 0 or n == -1):
        raise refuse("`prompt_logprobs` are not available when `stream=True`.",
                     "prompt_logprobs")
    if n < 0 and n != -1:
        raise refuse("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", n)
