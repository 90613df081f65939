"""KV events recorded from vLLM's own block pool and publisher (tests/data/kv_golden.*) applied to
the index: its matches equal what vLLM itself holds, step by step."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest

from radix import PrefixIndex, namespace_for, split_event_extra_keys
from wire.engine import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

DATA = Path(__file__).resolve().parent / "data"
META = json.loads((DATA / "kv_golden.json").read_text())
BLOCK = META["block_size"]
META_CHECKPOINTS = {e["engine"]: e["checkpoints"] for e in META["engines"]}


def _records() -> list[tuple[str, list[bytes]]]:
    blob, off, out = (DATA / "kv_golden.bin").read_bytes(), 0, []

    def take() -> bytes:
        nonlocal off
        (n,) = struct.unpack_from("<I", blob, off)
        off += 4 + n
        return blob[off - n : off]

    while off < len(blob):
        name = take().decode()
        (count,) = struct.unpack_from("<I", blob, off)
        off += 4
        out.append((name, [take() for _ in range(count)]))
    return out


RECORDS = _records()
DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def _apply(index: PrefixIndex, engine: str, batch: KVEventBatch) -> None:
    """What a KV subscriber does with one batch (router/kvfeed/kv_subscriber.py's job, inlined)."""
    for ev in batch.events:
        if isinstance(ev, BlockStored):
            salt, residual = split_event_extra_keys(ev.lora_name, ev.extra_keys)
            index.apply_stored(
                engine, ev.block_hashes, ev.parent_block_hash, ev.token_ids,
                namespace_for(ev.lora_name, salt), batch.ts, block_size=ev.block_size,
                extra_keys=residual, group_idx=ev.group_idx, kind=ev.kv_cache_spec_kind,
                medium=ev.medium,
            )
        elif isinstance(ev, BlockRemoved):
            index.apply_removed(engine, ev.block_hashes, group_idx=ev.group_idx, medium=ev.medium)
        else:
            assert isinstance(ev, AllBlocksCleared)
            index.apply_cleared(engine)


def _streams() -> dict[str, list[KVEventBatch]]:
    streams: dict[str, list[KVEventBatch]] = {}
    for name, (topic, seq, payload) in RECORDS:
        assert topic == f"kv@{name}".encode() and len(seq) == 8
        streams.setdefault(name, []).append(DECODER.decode(payload))
    return streams


def _check(index: PrefixIndex, engine: str, checkpoint: dict[str, Any], probes: list[Any],
           now: float, exact: bool = True) -> None:
    for probe, (vllm_hit, group0_held) in zip(probes, checkpoint["cached"], strict=True):
        tokens = probe["tokens"]
        got = index.match(tokens, namespace_for(probe["lora"], probe["salt"]), now)[engine]
        where = f"{engine} {checkpoint['label']} probe of {len(tokens)} tokens"
        if not exact:  # events were lost: never claim more than vLLM holds
            assert got.confirmed_tokens <= group0_held, where
            continue
        assert got.confirmed_tokens == group0_held, where
        assert got.optimistic_tokens == got.confirmed_tokens, where
        # vLLM recomputes the last prompt token, so its reuse stops one block-aligned step short.
        assert vllm_hit <= min(got.confirmed_tokens, (len(tokens) - 1) // BLOCK * BLOCK), where
        if engine == "full":
            assert vllm_hit == min(got.confirmed_tokens, (len(tokens) - 1) // BLOCK * BLOCK), where


def test_golden_frames_are_vllm_events() -> None:
    streams = _streams()
    assert set(streams) == {"full", "hybrid"}
    kinds = {type(ev).__name__ for batches in streams.values() for b in batches for ev in b.events}
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    stored = [ev for b in streams["hybrid"] for ev in b.events if isinstance(ev, BlockStored)]
    assert {(ev.group_idx, ev.kv_cache_spec_kind) for ev in stored} == {
        (0, "full_attention"), (1, "sliding_window")}


def test_events_from_vllm_reproduce_its_cache_in_one_shared_index() -> None:
    streams = _streams()
    index = PrefixIndex(max_blocks=100_000)
    for engine in streams:
        index.add_engine(engine, BLOCK)
    probes = {e["engine"]: e["probes"] for e in META["engines"]}
    applied = dict.fromkeys(streams, 0)
    checked = 0
    # Interleave the two engines' streams and, after every batch, check BOTH engines against
    # their latest vLLM checkpoint: one engine's events must never move the other's view.
    for step in range(max(len(b) for b in streams.values())):
        for engine, batches in streams.items():
            if step >= len(batches):
                continue
            _apply(index, engine, batches[step])
            applied[engine] += 1
            for other in streams:
                done = [c for c in META_CHECKPOINTS[other] if c["after_frames"] <= applied[other]]
                if done:
                    _check(index, other, done[-1], probes[other], batches[step].ts)
                    checked += 1
    assert checked >= sum(len(c) for c in META_CHECKPOINTS.values())
    assert index.stats.removed_blocks > 0 and index.stats.skipped_events > 0
    assert len(index) == 0  # both engines ended with a reset


@pytest.mark.parametrize("engine", ["full", "hybrid"])
def test_duplicated_batches_are_idempotent(engine: str) -> None:
    index = PrefixIndex(max_blocks=100_000)
    index.add_engine(engine, BLOCK)
    probes = next(e["probes"] for e in META["engines"] if e["engine"] == engine)
    checkpoints = list(META_CHECKPOINTS[engine])
    for n, batch in enumerate(_streams()[engine], start=1):
        _apply(index, engine, batch)
        _apply(index, engine, batch)  # at-least-once delivery: a replayed batch changes nothing
        while checkpoints and checkpoints[0]["after_frames"] <= n:
            _check(index, engine, checkpoints.pop(0), probes, batch.ts)


@pytest.mark.parametrize("skip", [1, 2, 3])
def test_joining_late_never_claims_blocks_vllm_lacks(skip: int) -> None:
    index = PrefixIndex(max_blocks=100_000)
    index.add_engine("full", BLOCK)
    probes = next(e["probes"] for e in META["engines"] if e["engine"] == "full")
    for n, batch in enumerate(_streams()["full"], start=1):
        if n > skip:
            _apply(index, "full", batch)
        for checkpoint in META_CHECKPOINTS["full"]:
            if checkpoint["after_frames"] == n:
                _check(index, "full", checkpoint, probes, batch.ts, exact=False)
    assert index.stats.unknown_parent_events > 0


def test_block_size_learned_from_events() -> None:
    index = PrefixIndex(max_blocks=100_000)
    index.add_engine("full")
    batch = _streams()["full"][0]
    _apply(index, "full", batch)
    assert index.engines() == {"full": BLOCK}
    probe = next(e["probes"] for e in META["engines"] if e["engine"] == "full")[0]
    first = META_CHECKPOINTS["full"][0]
    assert index.match(probe["tokens"], (None, None), batch.ts)["full"].confirmed_tokens == (
        first["cached"][0][1])


def test_a_match_is_cut_short_where_its_engine_removed_the_next_block() -> None:
    index = PrefixIndex(1000)
    index.add_engine("e", 4)
    index.add_engine("f", 4)
    ns = namespace_for(None, None)
    index.apply_stored("e", [1, 2, 3], None, list(range(12)), ns, 1.0, block_size=4)
    prompt = index.prepare(list(range(14)), ns)  # 3 full blocks and 2 tokens
    assert not index.cut_short("e", prompt, 8, 0.0)
    assert index.apply_removed("e", [7], now=2.0) == 0  # never announced: nothing removed
    assert index.apply_removed("e", [3], now=3.0) == 1  # the tail first, as vLLM frees
    assert index.match_keys(prompt, 3.0)["e"].confirmed_tokens == 8
    assert index.cut_short("e", prompt, 8, 3.0)
    assert not index.cut_short("e", prompt, 8, 3.5)  # removed before ``since``
    assert not index.cut_short("f", prompt, 8, 0.0)  # another engine's
    assert not index.cut_short("e", prompt, 4, 0.0)  # block 1 is held
    assert not index.cut_short("e", prompt, 12, 0.0)  # no full block follows
    assert not index.cut_short("gone", prompt, 8, 0.0)
    other = index.prepare([*range(8), 99, 99, 99, 99], ns)  # goes on differently after 8
    assert not index.cut_short("e", other, 8, 0.0)
    index.apply_removed("e", [2])  # undated: not remembered
    assert not index.cut_short("e", prompt, 4, 0.0)
    index.apply_cleared("e")  # nothing cached: nothing being evicted
    assert not index.cut_short("e", prompt, 8, 0.0)
