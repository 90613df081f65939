"""Sim engine configuration, parsed once from the CLI (flags mirror `vllm serve --headless`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from render.models import EMBEDDED_MODEL
from sim.tokens import TokenTable

# What a text request costs the face (--render-work): kvroute's render alone, vLLM's render work
# on the CPU too (sim/http/vllm_render.py), or vLLM's render time waited (sim/http/render_time.py).
RENDER_WORK = ("kvroute", "vllm", "vllm-time")

# vLLM's HANDSHAKE_TIMEOUT_MINS.
HANDSHAKE_TIMEOUT_S = 5 * 60.0
SIM_VLLM_VERSION = "0.32.0"
# A frontend (router) disconnected this long is gone: the engine exits instead of waiting forever.
# Long enough for a router restart that re-adopts its engines (a model load).
FRONTEND_GONE_TIMEOUT_S = 120.0
DEFAULT_NUM_GPU_BLOCKS = 2048
# The library's (and `--vocab-size` mode's) context length; with a model the CLI takes its own.
DEFAULT_MAX_MODEL_LEN = 4096
OUTPUTS = ("echo", "random", "markov")


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
class HttpFaceConfig:
    """The engine's HTTP face, as `vllm serve --enable-scale-out` is started."""

    model_dir: Path  # tokenizer and chat template for /v1/* and detokenized output
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (printed once listening)
    # vLLM's --enable-prompt-tokens-details: usage reports the prompt's cached tokens.
    enable_prompt_tokens_details: bool = False
    # vLLM's --timeout-keep-alive (uvicorn's default there: 5 s).
    keep_alive_timeout: float = 5.0
    # "vllm": text requests also cost what vLLM's render spends (sim/http/vllm_render.py);
    # "vllm-time": they wait render_time's (base s, s per prompt token) (sim/http/render_time.py).
    render_work: str = "kvroute"
    render_time: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.render_work not in RENDER_WORK:
            raise ValueError(f"render_work must be one of {', '.join(RENDER_WORK)}, not "
                             f"{self.render_work!r}")
        if (self.render_work == "vllm-time") != (self.render_time is not None):
            raise ValueError("render_work 'vllm-time' takes render_time (base and per-token "
                             "seconds), and only it does")
        if self.render_time is not None and min(self.render_time) < 0:
            raise ValueError(f"render_time must not be negative, not {self.render_time}")


@dataclass(frozen=True)
class SimConfig:
    """Everything a SimEngine needs; ``tokens`` may be shared by engines in one process.

    ``handshake_address`` None: no ZMQ frontend (an engine behind its HTTP face only)."""

    handshake_address: str | None
    tokens: TokenTable
    data_parallel_rank: int = 0
    block_size: int = 16
    num_gpu_blocks: int = DEFAULT_NUM_GPU_BLOCKS
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
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
    # "echo": the prompt's last line after a "(simulated)" mark (needs a tokenizer, else random);
    # "random": words drawn by the request's key; "markov": each word a hash of the ones before
    # it, so a request continued from its own output goes on alike (tokens.py).
    output: str = "echo"
    # Seconds after the frontend disconnected before the engine exits on its own (0: never).
    frontend_gone_timeout: float = FRONTEND_GONE_TIMEOUT_S
    # LoRA, as vllm serve's --enable-lora, --max-loras (adapters in one batch), --max-lora-rank
    # and --max-cpu-loras (adapters kept loaded; None: max_loras).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # The HTTP face (sim/http/): `vllm serve`'s endpoints on this port (None: no face).
    http: HttpFaceConfig | None = None

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {self.output!r}")
        if self.frontend_gone_timeout < 0:
            raise ValueError("frontend_gone_timeout must be >= 0")
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
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError("max_loras and max_lora_rank must be >= 1")
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        elif self.max_cpu_loras < self.max_loras:
            # vLLM's LoRAConfig check, worded as vLLM words it.
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras}).")

    @property
    def identity(self) -> bytes:
        return self.data_parallel_rank.to_bytes(2, "little")


def model_max_len(model_dir: Path) -> int:
    """The context length vLLM (and the router's render) derive from the model's config.json."""
    from render.model_files import derive_max_model_len

    path = model_dir / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    return derive_max_model_len(config, {})


def blocks_for(max_model_len: int, block_size: int) -> int:
    """The default cache size: 2048 blocks, or more when one request of ``max_model_len`` needs
    them (block 0 is the null block), as vLLM requires a max-length request to fit."""
    return max(DEFAULT_NUM_GPU_BLOCKS, -(-max_model_len // block_size) + 1)


def _render_time(text: str) -> tuple[float, float]:
    """``BASE_MS,US_PER_TOKEN`` -> (base, per-token) seconds."""
    try:
        base_ms, us = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BASE_MS,US_PER_TOKEN, not {text!r}") from None
    if base_ms < 0 or us < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return base_ms / 1e3, us / 1e6


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute sim-engine",
        description="Simulated vLLM engine: the headless EngineCore protocol, a real prefix "
        "cache with KV events, and a configurable step time.",
    )
    fe = p.add_argument_group("frontend (the router's handshake, as vllm serve --headless)")
    fe.add_argument("--data-parallel-address", default="127.0.0.1")
    fe.add_argument("--data-parallel-rpc-port", type=int, default=None,
                    help="default 13345 (with --port alone: no ZMQ frontend)")
    fe.add_argument("--handshake-address", help="full zmq URL; overrides address and port")
    fe.add_argument("--data-parallel-rank", type=int, default=0)
    fe.add_argument("--handshake-timeout", type=float, default=HANDSHAKE_TIMEOUT_S)
    fe.add_argument("--frontend-gone-timeout", type=float, default=FRONTEND_GONE_TIMEOUT_S,
                    help="exit when the frontend has been disconnected this many seconds "
                         "(0: wait for it forever)")
    fe.add_argument("--headless", action="store_true", help="accepted for vllm serve parity")
    http = p.add_argument_group("HTTP face (as `vllm serve --enable-scale-out`: /inference/v1/"
                                "generate, /v1/completions, /v1/chat/completions, /metrics, ...)")
    http.add_argument("--port", type=int, default=None,
                      help="serve the HTTP face on this port (0: any free one; printed); "
                           "without --data-parallel-rpc-port or --handshake-address the engine "
                           "has no ZMQ frontend")
    http.add_argument("--host", default="127.0.0.1", help="the HTTP face's address")
    http.add_argument("--served-model-name", help="the model name the face answers to")
    http.add_argument("--enable-prompt-tokens-details", action="store_true",
                      help="usage reports the prompt's cached tokens (as vllm serve's flag)")
    http.add_argument("--timeout-keep-alive", type=float, default=5.0,
                      help="seconds an idle keep-alive connection stays open (vLLM's default 5)")
    http.add_argument("--render-work", choices=RENDER_WORK, default="kvroute",
                      help="kvroute (default): text requests are rendered by kvroute's renderer "
                           "alone; vllm: each also does vLLM's render work (the chat "
                           "template, then HF tokenizers' encode of the prompt), so it "
                           "costs the pod's CPU what a vllm serve pod spends; vllm-time: "
                           "each waits, one at a time per pod, the time --render-time says "
                           "vLLM's render takes, without spending it")
    http.add_argument("--render-time", type=_render_time, metavar="BASE_MS,US_PER_TOKEN",
                      help="with --render-work vllm-time: vLLM's render time for a text "
                           "request, BASE_MS plus US_PER_TOKEN per prompt token "
                           "(bench/compare_render_time.py measures them)")
    model = p.add_argument_group("model and output")
    model.add_argument(
        "--model",
        default=None,
        help="model dir with tokenizer.json, or a Hugging Face id ORG/NAME (its tokenizer and "
        "config fetched as the router does; default: the embedded Qwen3 tokenizer)",
    )
    model.add_argument("--revision", help="Hub branch, tag or commit of an ORG/NAME --model")
    model.add_argument("--vocab-size", type=int, default=None,
                       help="emit ids below this instead of reading a tokenizer")
    model.add_argument("--output", choices=OUTPUTS, default="echo",
                       help="echo (default): answers repeat the prompt's last line after a "
                            "'(simulated)' mark; random: words drawn per request (vLLM's seed "
                            "rules); markov: each word a hash of the words before it (a request "
                            "resumed from its own output continues alike)")
    model.add_argument("--eos-token-id", type=int, action="append", default=None)
    model.add_argument("--eos-prob", type=float, default=0.0,
                       help="chance per step (after min_tokens) of emitting the request's EOS id")
    model.add_argument("--seed", type=int, default=0)
    limits = p.add_argument_group("cache and scheduler limits")
    limits.add_argument("--block-size", type=int, default=16)
    limits.add_argument("--num-gpu-blocks", "--num-gpu-blocks-override", type=int, default=None,
                        help=f"KV cache blocks (default: {DEFAULT_NUM_GPU_BLOCKS}, or enough "
                             "for one request of --max-model-len)")
    limits.add_argument("--max-model-len", type=int, default=None,
                        help="context length (default: the model's, by vLLM's rule from "
                             "config.json, as the router derives it; 4096 with --vocab-size)")
    limits.add_argument("--max-num-seqs", type=int, default=256)
    limits.add_argument("--max-num-batched-tokens", type=int, default=8192)
    lora = p.add_argument_group("LoRA (as vllm serve)")
    lora.add_argument("--enable-lora", action="store_true",
                      help="serve LoRA adapters: add_lora/remove_lora/list_loras/pin_lora, and "
                           "requests naming one (loaded from its path on first use)")
    lora.add_argument("--max-loras", type=int, default=1,
                      help="most distinct adapters in one step's batch")
    lora.add_argument("--max-lora-rank", type=int, default=16,
                      help="adapters of a higher rank are refused")
    lora.add_argument("--max-cpu-loras", type=int, default=None,
                      help="adapters kept loaded, least recently used out (default --max-loras)")
    timing = p.add_argument_group("timing")
    timing.add_argument("--step-time", type=float, default=0.01, help="seconds per decode step")
    timing.add_argument("--prefill-time-per-token", type=float, default=2e-5,
                        help="extra seconds per uncached prompt token scheduled in a step")
    timing.add_argument("--decode-time-per-seq", type=float, default=0.0,
                        help="extra seconds per request in the step (batch-size-dependent "
                             "decode cost)")
    obs = p.add_argument_group("observability")
    obs.add_argument("--kv-events-config", default=None, help="JSON, as for vllm serve")
    obs.add_argument("--disable-log-stats", action="store_true")
    return p


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    max_model_len = ns.max_model_len
    http: HttpFaceConfig | None = None
    if ns.vocab_size is not None:
        eos = tuple(ns.eos_token_id or ())
        tokens = TokenTable.from_vocab_size(ns.vocab_size, eos)
        max_model_len = max_model_len or DEFAULT_MAX_MODEL_LEN
    else:
        from render.hub import resolve_model

        model = resolve_model(ns.model, ns.revision) if ns.model else EMBEDDED_MODEL
        if ns.port is not None:
            http = HttpFaceConfig(model, ns.served_model_name or ns.model or model.name,
                                  ns.host, ns.port, ns.enable_prompt_tokens_details,
                                  ns.timeout_keep_alive, ns.render_work, ns.render_time)
        tokens = TokenTable.from_model_dir(model)
        if ns.eos_token_id:
            tokens = dataclasses.replace(tokens, eos_token_ids=tuple(ns.eos_token_id))
        max_model_len = max_model_len or model_max_len(model)
    num_gpu_blocks = ns.num_gpu_blocks or blocks_for(max_model_len, ns.block_size)
    kv = (
        msgspec.json.decode(ns.kv_events_config, type=KVEventsConfig)
        if ns.kv_events_config
        else KVEventsConfig()
    )
    if ns.port is not None and ns.vocab_size is not None:
        raise ValueError("the HTTP face (--port) needs a tokenizer: give --model, not "
                         "--vocab-size")
    address: str | None = ns.handshake_address or None
    if address is None and (ns.port is None or ns.data_parallel_rpc_port is not None
                            or ns.headless):
        address = f"tcp://{ns.data_parallel_address}:{ns.data_parallel_rpc_port or 13345}"
    return SimConfig(
        handshake_address=address,
        tokens=tokens,
        data_parallel_rank=ns.data_parallel_rank,
        block_size=ns.block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
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
        output=ns.output,
        frontend_gone_timeout=ns.frontend_gone_timeout,
        enable_lora=ns.enable_lora,
        max_loras=ns.max_loras,
        max_lora_rank=ns.max_lora_rank,
        max_cpu_loras=ns.max_cpu_loras,
        http=http,
    )
