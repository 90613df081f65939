"""vLLM EngineCore wire types (msgpack via msgspec), mirrored field by field from vLLM 0.33.

The field order IS the protocol: these are ``array_like`` structs, so append only. Peers with
fewer trailing fields (vLLM 0.32) or more (newer vLLM) interoperate: msgspec fills missing
trailing fields with defaults and ignores extra ones (``forbid_unknown_fields`` stays off).
msgpack ext types 1/2 carry pickles in vLLM and are refused here; ext 3 is a raw ndarray buffer.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from wire.sampling import SamplingParams

# Request-type byte, the frame after the engine identity (vLLM EngineCoreRequestType).
REQ_ADD = b"\x00"
REQ_ABORT = b"\x01"
REQ_START_DP_WAVE = b"\x02"
REQ_UTILITY = b"\x03"
REQ_EXECUTOR_FAILED = b"\x04"
REQ_WAKEUP = b"\x05"

ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"

EXT_PICKLE = 1
EXT_CLOUDPICKLE = 2
EXT_RAW_VIEW = 3


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4


FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[Any] | None
    sampling_params: SamplingParams | None
    pooling_params: dict[str, Any] | None
    arrival_time: float
    lora_request: LoRARequest | None
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: Any | None = None
    prompt_is_token_ids: list[bool] | None = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None
    kv_hints: Any | None = None


class EngineCoreEvent(msgspec.Struct, gc=False):
    """A request lifecycle event; a MAP on the wire (not array_like)."""

    type: int
    timestamp: float


class EngineError(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vLLM 0.33 request-level error attached to an output."""

    code: int
    message: str
    retryable: bool = False


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    new_token_ids: list[int]
    # LogprobsLists: (token_ids, logprobs, sampled_ranks, cu_num_generated_tokens), each array
    # either inline [dtype, shape, ext3-bytes] or [dtype, shape, aux-frame-index]; see ndarrays.py.
    new_logprobs: Any | None = None
    new_prompt_logprobs_tensors: Any | None = None
    pooling_output: Any | None = None
    finish_reason: int | None = None
    stop_reason: int | str | None = None
    events: list[EngineCoreEvent] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    trace_headers: dict[str, str] | None = None
    prefill_stats: dict[str, Any] | None = None
    routed_experts: Any | None = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: list[str] | None = None
    new_sampling_mask: Any | None = None
    spec_decode_metrics: Any | None = None
    prompt_token_id_logprobs: Any | None = None
    error: EngineError | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    call_id: int
    failure_message: str | None = None
    # [type_info, value]: the value is plain msgpack for simple results.
    result: Any | None = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    engine_index: int = 0
    outputs: list[EngineCoreOutput] = []
    scheduler_stats: dict[str, Any] | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None


def ext_hook(code: int, data: memoryview) -> Any:
    """Accept only raw ndarray buffers; vLLM's pickle ext types are never decoded here."""
    if code == EXT_RAW_VIEW:
        return bytes(data)
    raise ValueError(f"refusing msgpack ext type {code} (pickle-based in vLLM)")


def enc_hook(obj: Any) -> Any:
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


# ---- KV-cache events (vllm/distributed/kv_events.py): tagged MAPS inside an array_like batch ----

ExternalBlockHash = bytes | int


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged KV events; the tag is the class name under the key ``type``."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[list[Any] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


# ---- headless-engine handshake (vllm/v1/engine/utils.py, core.py): plain msgpack MAPS ----


class HandshakeStatus(msgspec.Struct, omit_defaults=True, gc=False):
    """Engine -> frontend on the handshake socket: ``HELLO`` first, ``READY`` once serving."""

    status: str
    local: bool = False
    headless: bool = True
    parallel_config_hash: str | None = None


class EngineZmqAddresses(msgspec.Struct, gc=False):
    """Frontend sockets an engine connects to; a frontend's client_index is its list position."""

    inputs: list[str]
    outputs: list[str]
    coordinator_input: str | None = None
    coordinator_output: str | None = None
    frontend_stats_publish_address: str | None = None


class EngineHandshakeMetadata(msgspec.Struct, gc=False):
    """Frontend -> engine answer to HELLO."""

    addresses: EngineZmqAddresses
    parallel_config: dict[str, Any] = {}


class EngineReadyResponse(msgspec.Struct, gc=False):
    """The engine's first message on the input socket (vLLM ``EngineCoreReadyResponse``, a map).

    Everything has a default so that older or newer engines with other fields still decode.
    """

    max_model_len: int = 0
    num_gpu_blocks: int = 0
    block_size: int = 0
    dp_stats_address: str | None = None
    dtype: str = ""
    vllm_version: str = ""
    world_size: int = 1
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    data_parallel_rank: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    instance_id: str = ""
    supports_lora: bool = False
    max_loras: int = 0
    mamba_block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: dict[str, Any] | None = None
    weight_transfer_backend: str | None = None
    enable_sleep_mode: bool = False
    supports_draft_weight_updates: bool = False
    effective_attention_block_size: int | None = None

