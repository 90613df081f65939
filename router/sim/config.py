"""Sim engine configuration, parsed once from the CLI (flags mirror `vllm serve --headless`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from render.models import EMBEDDED_MODEL
from router.sim.tokens import TokenTable

# vLLM's HANDSHAKE_TIMEOUT_MINS.
HANDSHAKE_TIMEOUT_S = 5 * 60.0
SIM_VLLM_VERSION = "0.32.0"


class KVEventsConfig(msgspec.Struct, omit_defaults=False, gc=False):
    """vLLM ``KVEventsConfig`` (a map in ``--kv-events-config`` and in the ready response)."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = msgspec.field(default=10_000)
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        if self.buffer_steps < 1:
            raise ValueError("buffer_steps must be >= 1")


@dataclass(frozen=True)
class SimConfig:
    """Everything a SimEngine needs; ``tokens`` may be shared by engines in one process."""

    handshake_address: str
    tokens: TokenTable
    data_parallel_rank: int = 0
    block_size: int = 16
    num_gpu_blocks: int = 2048
    max_model_len: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    step_time: float = 0.01
    prefill_time_per_token: float = 2e-5
    decode_time_per_seq: float = 0.0
    eos_prob: float = 0.0
    seed: int = 0
    log_stats: bool = True
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    handshake_timeout: float = HANDSHAKE_TIMEOUT_S
    vllm_version: str = SIM_VLLM_VERSION
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("block_size", "num_gpu_blocks", "max_model_len", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be >= 2 (block 0 is the null block)")
        # One request of max_model_len must fit in the cache, or it would preempt itself forever;
        # vLLM auto-fits max_model_len to the KV cache the same way (and reports the result).
        capacity = (self.num_gpu_blocks - 1) * self.block_size
        if self.max_model_len > capacity:
            object.__setattr__(self, "max_model_len", capacity)
        if min(self.step_time, self.prefill_time_per_token, self.decode_time_per_seq) < 0:
            raise ValueError("step times must be >= 0")
        if not 0.0 <= self.eos_prob <= 1.0:
            raise ValueError("eos_prob must be in [0, 1]")

    @property
    def identity(self) -> bytes:
        return self.data_parallel_rank.to_bytes(2, "little")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute sim-engine",
        description="Simulated vLLM engine: the headless EngineCore protocol, a real prefix "
        "cache with KV events, and a configurable step time.",
    )
    p.add_argument("--data-parallel-address", default="127.0.0.1")
    p.add_argument("--data-parallel-rpc-port", type=int, default=13345)
    p.add_argument("--handshake-address", help="full zmq URL; overrides address and port")
    p.add_argument("--data-parallel-rank", type=int, default=0)
    p.add_argument("--kv-events-config", default=None, help="JSON, as for vllm serve")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--step-time", type=float, default=0.01, help="seconds per decode step")
    p.add_argument(
        "--prefill-time-per-token",
        type=float,
        default=2e-5,
        help="extra seconds per uncached prompt token scheduled in a step",
    )
    p.add_argument(
        "--decode-time-per-seq",
        type=float,
        default=0.0,
        help="extra seconds per request in the step (batch-size-dependent decode cost)",
    )
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model dir with tokenizer.json (default: the embedded Qwen3 tokenizer)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="emit ids below this instead of reading a tokenizer",
    )
    p.add_argument("--eos-token-id", type=int, action="append", default=None)
    p.add_argument(
        "--eos-prob",
        type=float,
        default=0.0,
        help="chance per step (after min_tokens) of emitting the request's EOS id",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--handshake-timeout", type=float, default=HANDSHAKE_TIMEOUT_S)
    p.add_argument("--headless", action="store_true", help="accepted for vllm serve parity")
    return p


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    if ns.vocab_size is not None:
        eos = tuple(ns.eos_token_id or ())
        tokens = TokenTable.from_vocab_size(ns.vocab_size, eos)
    else:
        tokens = TokenTable.from_model_dir(ns.model or EMBEDDED_MODEL)
        if ns.eos_token_id:
            tokens = TokenTable(tokens.ids, tokens.vocab_size, tuple(ns.eos_token_id))
    kv = (
        msgspec.json.decode(ns.kv_events_config, type=KVEventsConfig)
        if ns.kv_events_config
        else KVEventsConfig()
    )
    address = (
        ns.handshake_address or f"tcp://{ns.data_parallel_address}:{ns.data_parallel_rpc_port}"
    )
    return SimConfig(
        handshake_address=address,
        tokens=tokens,
        data_parallel_rank=ns.data_parallel_rank,
        block_size=ns.block_size,
        num_gpu_blocks=ns.num_gpu_blocks,
        max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        step_time=ns.step_time,
        prefill_time_per_token=ns.prefill_time_per_token,
        decode_time_per_seq=ns.decode_time_per_seq,
        eos_prob=ns.eos_prob,
        seed=ns.seed,
        log_stats=not ns.disable_log_stats,
        kv_events=kv,
        handshake_timeout=ns.handshake_timeout,
    )
