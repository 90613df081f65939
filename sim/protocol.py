"""Engine side of vLLM's headless handshake (``EngineCoreProc._perform_handshake``), for the sim.

1. DEALER (identity = dp rank, 2 bytes little-endian) connects to the frontend's handshake ROUTER
   and sends ``{"status": "HELLO", "local": false, "headless": true}``;
2. the frontend answers with the input/output addresses (``EngineHandshakeMetadata``);
3. the engine connects one DEALER per input address and one PUSH per output address, and sends its
   ready response (``EngineCoreReadyResponse``, a map) on every input socket;
4. finally ``{"status": "READY", ...}`` goes out on the handshake socket, which is then closed.
"""

from __future__ import annotations

import socket
import time
import uuid
from dataclasses import dataclass

import msgspec
import zmq

from sim.config import KVEventsConfig, SimConfig
from wire.engine import EngineHandshakeMetadata, EngineReadyResponse, EngineZmqAddresses


class HandshakeTimeout(RuntimeError):
    """The frontend did not answer HELLO in time."""


@dataclass
class EngineSockets:
    inputs: list[zmq.Socket[bytes]]
    outputs: list[zmq.Socket[bytes]]


def _hello_payload() -> bytes:
    return msgspec.msgpack.encode({"status": "HELLO", "local": False, "headless": True})


def _ready_status_payload() -> bytes:
    return msgspec.msgpack.encode({"status": "READY", "local": False, "headless": True})


def drain_signal_fd(sock: socket.socket) -> None:
    """Empty a non-blocking signal wakeup socket (its bytes are signal numbers, not needed)."""
    try:
        while sock.recv(512):
            pass
    except BlockingIOError:
        pass


def connect_handshake(ctx: zmq.Context[zmq.Socket[bytes]], config: SimConfig) -> zmq.Socket[bytes]:
    if config.handshake_address is None:
        raise ValueError("the engine has no frontend handshake address")
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, config.identity)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(config.handshake_address)
    return sock


def receive_addresses(
    sock: zmq.Socket[bytes], timeout_s: float, stop: zmq.Socket[bytes] | None = None,
    signal_fd: socket.socket | None = None,
) -> EngineZmqAddresses | None:
    """Send HELLO and wait for the addresses; None if ``stop`` became readable first.

    ``signal_fd`` is the process's signal wakeup socket (``signal.set_wakeup_fd``): a signal
    delivered to another thread does not interrupt this poll, but it makes that socket
    readable, so the wait returns to Python, whose handler then makes ``stop`` readable."""
    sock.send(_hello_payload())
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if stop is not None:
        poller.register(stop, zmq.POLLIN)
    if signal_fd is not None:
        poller.register(signal_fd, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while True:
        left_ms = max(0, int((deadline - time.monotonic()) * 1000))
        ready = dict(poller.poll(timeout=left_ms))
        if stop is not None and stop in ready:
            return None
        if sock in ready:
            break
        if signal_fd is not None and signal_fd.fileno() in ready:
            drain_signal_fd(signal_fd)
            continue
        raise HandshakeTimeout(
            f"no answer from the frontend at {sock.getsockopt_string(zmq.LAST_ENDPOINT)} "
            f"within {timeout_s:.0f} s: is it bound there?"
        )
    meta = msgspec.msgpack.decode(sock.recv(), type=EngineHandshakeMetadata)
    return meta.addresses


def ready_response(config: SimConfig, kv_events: KVEventsConfig | None) -> bytes:
    size_tokens = config.num_gpu_blocks * config.block_size
    resp = EngineReadyResponse(
        max_model_len=config.max_model_len,
        num_gpu_blocks=config.num_gpu_blocks,
        block_size=config.block_size,
        dp_stats_address=None,
        dtype=config.dtype,
        vllm_version=config.vllm_version,
        world_size=1,
        data_parallel_size=1,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        decode_context_parallel_size=1,
        data_parallel_rank=config.data_parallel_rank,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        instance_id=uuid.uuid4().hex,
        supports_lora=config.enable_lora,
        max_loras=config.max_loras if config.enable_lora else 0,
        mamba_block_size=None,
        kv_cache_size_tokens=size_tokens,
        kv_cache_max_concurrency=size_tokens / config.max_model_len,
        kv_events_config=msgspec.to_builtins(kv_events) if kv_events is not None else None,
        effective_attention_block_size=config.block_size,
    )
    return msgspec.msgpack.encode(resp)


def connect_io(
    ctx: zmq.Context[zmq.Socket[bytes]], config: SimConfig, addresses: EngineZmqAddresses
) -> EngineSockets:
    inputs = []
    for address in addresses.inputs:
        s = ctx.socket(zmq.DEALER)
        # Unbounded queues, as vLLM's make_zmq_socket: a slow or absent frontend never makes
        # the engine drop or block on a message.
        s.setsockopt(zmq.RCVHWM, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.IDENTITY, config.identity)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(address)
        inputs.append(s)
    outputs = []
    for address in addresses.outputs:
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.SNDHWM, 0)
        # vLLM lingers so ENGINE_CORE_DEAD still leaves when the engine goes down.
        s.setsockopt(zmq.LINGER, 4000)
        s.connect(address)
        outputs.append(s)
    return EngineSockets(inputs, outputs)


def complete_handshake(
    sock: zmq.Socket[bytes], io: EngineSockets, config: SimConfig, kv: KVEventsConfig | None
) -> None:
    payload = ready_response(config, kv)
    for s in io.inputs:
        # Lets the frontend's ROUTER learn our identity before it routes requests to us.
        s.send(payload)
    sock.send(_ready_status_payload())
    sock.close()
