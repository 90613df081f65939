"""HTTP-facing render types: OpenAI/vLLM requests validated at decode time; GenerateRequest out.

Requests are plain (not array_like) msgspec Structs whose ``Meta`` constraints reject bad input
while decoding, with msgspec's ``... - at `$.field``` messages. Optional message keys default to
``UNSET`` so the template sees exactly the keys the client sent, as it does in vLLM.
``GenerateRequest`` keeps vLLM's field order
(``vllm/entrypoints/scale_out/token_in_token_out/protocol.py``).

Free-form JSON values (``chat_template_kwargs``, tool ``parameters``, ``vllm_xargs``, schemas, ...)
may nest at most ``MAX_JSON_DEPTH`` levels: the template, the engine's encoder and vLLM itself
recurse into them, and a value nested a thousand deep would end there as a RecursionError (a
500). Each struct holding one checks it in ``__post_init__``, which msgspec runs while decoding,
so the 400 names the field; a value too deep for msgspec's own recursion is refused by
``decode_request``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType

from render.errors import BadRequestError
from wire.sampling import RepetitionDetectionParams, SamplingParams, StructuredOutputsParams

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
TokenId = Annotated[int, Meta(ge=0, le=INT64_MAX)]
NonNegInt = Annotated[int, Meta(ge=0, le=INT64_MAX)]

# How deep a free-form JSON value may nest (a scalar is depth 0, ``[]`` and ``{}`` depth 1).
MAX_JSON_DEPTH = 64


def _too_deep(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (decoded JSON: dicts, lists, scalars) nests deeper than ``limit``."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list | tuple))
    return False


def _check_depth(owner: object, *names: str) -> None:
    """Refuse (ValueError, turned into a 400 by msgspec) a named field nested too deep."""
    for name in names:
        value = getattr(owner, name)
        if isinstance(value, dict | list) and _too_deep(value):
            raise ValueError(f"{name} nests deeper than {MAX_JSON_DEPTH} levels "
                             f"(the router's JSON depth limit)")


def decode_request(decoder: msgspec.json.Decoder[Any], body: bytes) -> Any:
    """``decoder.decode(body)``, with a body nested beyond msgspec's recursion refused as a 400."""
    try:
        return decoder.decode(body)
    except RecursionError:
        raise BadRequestError(f"The request body nests deeper than {MAX_JSON_DEPTH} levels "
                              "(the router's JSON depth limit).") from None


# The content part types vLLM parses as text, and those it would hand to a multimodal processor.
TextPartType = Literal["text", "input_text", "output_text", "refusal", "thinking", "tool_reference"]
MediaPartType = Literal[
    "image_url", "input_image", "image_embeds", "image_pil", "audio_url", "input_audio",
    "audio_embeds", "video_url", "video_embeds", "prompt_embeds",
]
PartType = Literal[TextPartType, MediaPartType]
MEDIA_PART_TYPES = frozenset(get_args(MediaPartType))


class ContentPart(msgspec.Struct, omit_defaults=True):
    """One OpenAI content part; media parts decode so render can refuse them with a clear 400."""

    type: PartType
    text: str | None | UnsetType = UNSET
    refusal: str | None | UnsetType = UNSET
    thinking: str | None | UnsetType = UNSET
    name: str | UnsetType = UNSET
    image_url: Any = UNSET
    input_audio: Any = UNSET
    audio_url: Any = UNSET
    video_url: Any = UNSET
    uuid: str | None | UnsetType = UNSET

    def __post_init__(self) -> None:
        _check_depth(self, "image_url", "input_audio", "audio_url", "video_url")


Content = str | list[str | ContentPart] | None


class FunctionCall(msgspec.Struct, omit_defaults=True):
    name: str
    # A JSON string per OpenAI; vLLM also accepts an object.
    arguments: str | dict[str, Any] | None | UnsetType = UNSET

    def __post_init__(self) -> None:
        _check_depth(self, "arguments")


class ToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    # OpenAI's key order: templates that `tojson` a call see the keys in this order.
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionCall


class ChatMessage(msgspec.Struct, omit_defaults=True):
    """A chat message of any role; which keys a role may carry is checked when rendering."""

    # Any role: vLLM takes custom roles (``CustomChatCompletionMessageParam``) to the template.
    role: str
    content: Content | UnsetType = UNSET
    name: str | UnsetType = UNSET
    tool_calls: list[ToolCall] | None | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET
    reasoning: str | None | UnsetType = UNSET
    reasoning_content: str | None | UnsetType = UNSET
    tools: list[dict[str, Any]] | None | UnsetType = UNSET

    def __post_init__(self) -> None:
        _check_depth(self, "tools")


class FunctionDefinition(msgspec.Struct, omit_defaults=True):
    name: Annotated[str, Meta(min_length=1)]
    description: str | UnsetType = UNSET
    parameters: dict[str, Any] | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET

    def __post_init__(self) -> None:
        _check_depth(self, "parameters")


class Tool(msgspec.Struct, omit_defaults=True):
    function: FunctionDefinition
    type: Literal["function"] = "function"


class NamedFunction(msgspec.Struct):
    name: Annotated[str, Meta(min_length=1)]


class NamedToolChoice(msgspec.Struct):
    function: NamedFunction
    type: Literal["function"] = "function"


class StreamOptions(msgspec.Struct, omit_defaults=True):
    # Unset unless sent: vLLM refuses stream options without a stream only when some are sent
    # (an empty object passes).
    include_usage: bool | None | UnsetType = UNSET
    continuous_usage_stats: bool | None | UnsetType = UNSET

    def given(self) -> bool:
        return self.include_usage is not UNSET or self.continuous_usage_stats is not UNSET


class JsonSchemaSpec(msgspec.Struct, omit_defaults=True):
    name: str = "response"
    description: str | UnsetType = UNSET
    # OpenAI calls it `schema`; vLLM's pydantic model reads the same key.
    schema: dict[str, Any] | None = None
    strict: bool | None = None

    def __post_init__(self) -> None:
        _check_depth(self, "schema")


class ResponseFormat(msgspec.Struct, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaSpec | None = None
    # structural_tag formats carry free-form fields; kept verbatim for the engine.
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None
    format: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _check_depth(self, "structures", "format")


Stop = str | list[str] | None
LogitBias = dict[str, float]


class _SamplingFields(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The sampling fields chat and completion requests share (vLLM's names and defaults)."""

    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: LogitBias | None = None
    n: int | None = 1  # checked as vLLM does (render/sampling_checks.py), not while decoding
    seed: Int64 | None = None
    stop: Stop = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    watermarking: bool | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[Int64] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: Int64 = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=INT64_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[Int64] | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[Int64] | None = None
    bad_words: list[str] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    priority: Int64 = 0
    request_id: Annotated[str, Meta(min_length=1, max_length=4096)] | None = None
    cache_salt: str | None = None  # vLLM's validate_cache_salt (render/request_checks.py)
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    stream_interval: Annotated[int, Meta(ge=1)] | None = None
    thinking_token_budget: int | None = None
    routed_experts_prompt_start: NonNegInt = 0
    return_token_ids: bool | None = None
    return_token_offsets: bool | None = False
    echo: bool | None = False
    session_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    # Render endpoints only (vLLM ignores them elsewhere): what multimodal features carry.
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None

    def __post_init__(self) -> None:
        _check_depth(self, "kv_transfer_params", "ec_transfer_params", "vllm_xargs")
        if self.structured_outputs is not None:
            _check_depth(self.structured_outputs, "json")


class ChatCompletionRequest(_SamplingFields, kw_only=True, omit_defaults=True):
    """``POST /v1/chat/completions`` (and its ``/render``), vLLM 0.32's fields."""

    messages: list[ChatMessage]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None | UnsetType = UNSET
    parallel_tool_calls: bool | None = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    include_reasoning: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_depth(self, "chat_template_kwargs", "documents", "media_io_kwargs",
                     "mm_processor_kwargs")


class CompletionRequest(_SamplingFields, kw_only=True, omit_defaults=True):
    """``POST /v1/completions`` (and ``/render``): a string, strings, token ids or lists of them."""

    # msgspec allows one array type per union: the list's element kinds are checked when rendering.
    prompt: str | list[str | TokenId | list[TokenId]] | None = None
    logprobs: int | None = None
    max_tokens: Int64 | None = 16
    suffix: str | None = None
    add_special_tokens: bool = True
    # Refused (vLLM without --enable-prompt-embeds): base64 tensors, one or a list.
    prompt_embeds: str | list[str] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_tokens is None:  # vLLM's normalize_null_max_tokens: null is the default
            self.max_tokens = 16


class TokenizeRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``POST /tokenize``: vLLM's completion form (``prompt``) or chat form (``messages``)."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Annotated[list[Tool], Meta(min_length=1)] | None = None

    def __post_init__(self) -> None:
        _check_depth(self, "chat_template_kwargs")


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(msgspec.Struct):
    prompt: str


class ReasoningParserKwargs(msgspec.Struct):
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_depth(self, "chat_template_kwargs")


class GenerateRequest(msgspec.Struct, kw_only=True):
    """What render returns and vLLM's ``/inference/v1/generate`` accepts, in vLLM's field order."""

    request_id: str
    token_ids: list[int]
    token_offsets: list[tuple[int, int]] | None = None
    features: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None
    sampling_params: SamplingParams
    model: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: ReasoningParserKwargs | None = None
    return_token_ids: bool | None = None
    output_mode: Literal["tokens", "text", "derender"] = "tokens"
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    priority: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _check_depth(self, "features", "content_parts", "kv_transfer_params",
                     "ec_transfer_params")
        _check_depth(self.sampling_params, "extra_args")
        if self.sampling_params.structured_outputs is not None:
            _check_depth(self.sampling_params.structured_outputs, "json")
