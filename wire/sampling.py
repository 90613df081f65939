"""vLLM's SamplingParams, mirrored field by field: the render output and the engine wire map.

vLLM encodes SamplingParams as a msgpack/JSON MAP of its non-default fields (not array_like), so one
msgspec Struct with ``omit_defaults=True`` serves both render's JSON GenerateRequest and the msgpack
EngineCoreRequest. Field names and order mirror vLLM 0.33 ``vllm/sampling_params.py``; append only.
"""

from __future__ import annotations

from typing import Any

import msgspec

# RequestOutputKind
OUTPUT_CUMULATIVE = 0
OUTPUT_DELTA = 1
OUTPUT_FINAL_ONLY = 2


class StructuredOutputsParams(msgspec.Struct, gc=False):
    """vLLM ``StructuredOutputsParams``: one of json, regex, choice, grammar, json_object, tag.

    vLLM's is a dataclass, which msgspec encodes with EVERY field (its private ``_backend`` pair
    included), so this one keeps defaults on the wire too: byte-equal to vLLM's encoding.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None
    _backend: str | None = None
    _backend_was_auto: bool = False


class RepetitionDetectionParams(msgspec.Struct, omit_defaults=True, gc=False):
    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


class SamplingParams(msgspec.Struct, omit_defaults=True, gc=False):
    """vLLM ``SamplingParams``; encodes as a map of the non-default fields, in vLLM's names."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    watermarking: bool | None = None
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    prompt_logprob_token_ids: list[int] | None = None
    prompt_logprob_start: int | None = None
    logprob_token_ids: list[int] | None = None
    flat_logprobs: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: int = OUTPUT_CUMULATIVE
    stream_interval: int | None = None
    skip_clone: bool = False
    output_text_buffer_length: int = 0
    _eos_token_id: int | None = None
    _all_stop_token_ids: list[int] = msgspec.field(default_factory=list)
    _watermarking_skipped: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None
    _bad_words_token_ids: list[list[int]] | None = None
    skip_reading_prefix_cache: bool | None = None
    thinking_token_budget: int | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    routed_experts_prompt_start: int = 0
    trace_decode_token_ids: list[int] | None = None
