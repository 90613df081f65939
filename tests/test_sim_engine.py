"""The simulated engine over raw ZMQ: a minimal vLLM frontend written here drives it."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from render.models import EMBEDDED_MODEL
from sim.config import KVEventsConfig, SimConfig
from sim.kv_publisher import offset_endpoint_port
from sim.launch import SimEngineThread, sim_engines, spawn_sim_engine, start_sim_engine
from sim.request import SimRequest
from sim.scheduler import Scheduler
from sim.tokens import TokenTable
from wire import engine as wire
from wire.ndarrays import decode_logprobs
from wire.sampling import SamplingParams

TIMEOUT_MS = 20_000
EOS = 999
TOKENS = TokenTable.from_vocab_size(1000, (EOS,))
BS = 4


class Frontend:
    """The frontend half of the headless protocol: handshake ROUTER, input ROUTER, output PULL."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], base: Path) -> None:
        self.ctx = ctx
        self.hs_addr = f"ipc://{base}/hs"
        self.in_addr = f"ipc://{base}/in"
        self.out_addr = f"ipc://{base}/out"
        self.hs = ctx.socket(zmq.ROUTER)
        self.hs.bind(self.hs_addr)
        self.bind_io()
        self.enc = msgspec.msgpack.Encoder(enc_hook=wire.enc_hook)
        self.dec = msgspec.msgpack.Decoder(wire.EngineCoreOutputs, ext_hook=wire.ext_hook)
        self.identity = b""
        self.ready: dict[str, Any] = {}
        self.aux: dict[str, list[list[bytes]]] = {}

    def bind_io(self) -> None:
        self.inp = self.ctx.socket(zmq.ROUTER)
        self.inp.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.inp.bind(self.in_addr)
        self.out = self.ctx.socket(zmq.PULL)
        self.out.bind(self.out_addr)

    def close_io(self) -> None:
        self.inp.close(linger=0)
        self.out.close(linger=0)

    def close(self) -> None:
        self.close_io()
        self.hs.close(linger=0)

    def handshake(self, timeout_ms: int = TIMEOUT_MS) -> dict[str, Any]:
        ident = self.answer_hello(timeout_ms)
        # A real engine says HELLO first and loads its model before the ready response.
        assert self.inp.poll(timeout_ms), "no ready response"
        self.identity, payload = self.inp.recv_multipart()
        assert self.identity == ident
        self.ready = msgspec.msgpack.decode(payload)
        assert self.hs.poll(TIMEOUT_MS), "no READY"
        _, status = self.hs.recv_multipart()
        assert msgspec.msgpack.decode(status)["status"] == "READY"
        return self.ready

    def answer_hello(self, timeout_ms: int = TIMEOUT_MS) -> bytes:
        """The handshake's first half: HELLO in, the addresses out; the engine's identity."""
        assert self.hs.poll(timeout_ms), "no HELLO"
        ident, hello = self.hs.recv_multipart()
        assert msgspec.msgpack.decode(hello) == {
            "status": "HELLO",
            "local": False,
            "headless": True,
        }
        addresses = {
            "inputs": [self.in_addr],
            "outputs": [self.out_addr],
            "coordinator_input": None,
            "coordinator_output": None,
            "frontend_stats_publish_address": None,
        }
        self.hs.send_multipart(
            [ident, msgspec.msgpack.encode({"addresses": addresses, "parallel_config": {}})]
        )
        ident_bytes: bytes = ident
        return ident_bytes

    def add(
        self,
        rid: str,
        prompt: list[int],
        cache_salt: str | None = None,
        lora: wire.LoRARequest | None = None,
        **params: Any,
    ) -> None:
        req = wire.EngineCoreRequest(
            rid, prompt, None, SamplingParams(**params), None, time.time(), lora, cache_salt, None
        )
        self.inp.send_multipart([self.identity, wire.REQ_ADD, self.enc.encode(req)])

    def abort(self, *rids: str) -> None:
        self.inp.send_multipart([self.identity, wire.REQ_ABORT, self.enc.encode(list(rids))])

    def utility(self, call_id: int, method: str, *args: Any) -> wire.UtilityOutput:
        payload = self.enc.encode([0, call_id, method, list(args)])
        self.inp.send_multipart([self.identity, wire.REQ_UTILITY, payload])
        while True:
            outs = self.recv()
            if outs.utility_output is not None:
                assert outs.utility_output.call_id == call_id
                return outs.utility_output

    def recv(self) -> wire.EngineCoreOutputs:
        assert self.out.poll(TIMEOUT_MS), "no output from the engine"
        frames = self.out.recv_multipart()
        outs = self.dec.decode(frames[0])
        for o in outs.outputs:
            self.aux.setdefault(o.request_id, []).append(frames)
        return outs

    def run(
        self, *rids: str
    ) -> tuple[dict[str, list[wire.EngineCoreOutput]], list[dict[str, Any]]]:
        """Collect outputs until every request in ``rids`` has finished; also the stats seen."""
        got: dict[str, list[wire.EngineCoreOutput]] = {r: [] for r in rids}
        stats: list[dict[str, Any]] = []
        pending = set(rids)
        while pending:
            outs = self.recv()
            if outs.scheduler_stats is not None:
                stats.append(outs.scheduler_stats)
            for o in outs.outputs:
                got.setdefault(o.request_id, []).append(o)
                if o.finish_reason is not None:
                    pending.discard(o.request_id)
        return got, stats

    def tokens(self, outs: list[wire.EngineCoreOutput]) -> list[int]:
        return [t for o in outs for t in o.new_token_ids]


def replay(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, start: int = 0
) -> list[tuple[int, bytes]]:
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    batches: list[tuple[int, bytes]] = []
    try:
        while True:
            assert sock.poll(TIMEOUT_MS), "replay did not answer"
            empty, topic, seq, payload = sock.recv_multipart()
            assert empty == b""
            if seq == b"\xff" * 8:
                assert topic == b"" and payload == b""
                return batches
            batches.append((int.from_bytes(seq, "big"), payload))
    finally:
        sock.close(linger=0)


BATCH = msgspec.msgpack.Decoder(wire.KVEventBatch)


def events_of(batches: list[tuple[int, bytes]]) -> list[wire.KVEvent]:
    return [e for _, p in batches for e in BATCH.decode(p).events]


def cached_multiset(events: list[wire.KVEvent]) -> Counter[int]:
    held: Counter[int] = Counter()
    for e in events:
        if isinstance(e, wire.BlockStored):
            held.update(int(h) for h in e.block_hashes)
        elif isinstance(e, wire.BlockRemoved):
            held.subtract(int(h) for h in e.block_hashes)
        else:
            held.clear()
    return +held


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    c: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield c
    c.destroy(linger=0)


class Harness:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], base: Path) -> None:
        self.ctx = ctx
        self.base = base
        self.fe = Frontend(ctx, base)
        self.engine: SimEngineThread | None = None
        self.kv = KVEventsConfig(
            enable_kv_cache_events=True,
            endpoint=f"ipc://{base}/kv",
            replay_endpoint=f"ipc://{base}/replay",
        )

    def start(self, tokens: TokenTable = TOKENS, **overrides: Any) -> Frontend:
        cfg: dict[str, Any] = {
            "block_size": BS,
            "num_gpu_blocks": 64,
            "step_time": 0.0005,
            "prefill_time_per_token": 0.0,
            "kv_events": self.kv,
        }
        cfg.update(overrides)
        self.engine = start_sim_engine(self.fe.hs_addr, tokens, **cfg)
        self.fe.handshake()
        assert self.engine.wait_ready(10)
        return self.fe

    def replay(self, start: int = 0) -> list[tuple[int, bytes]]:
        return replay(self.ctx, self.kv.replay_endpoint or "", start)

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
        self.fe.close()


@pytest.fixture
def sim(ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path) -> Iterator[Harness]:
    h = Harness(ctx, tmp_path)
    yield h
    h.stop()


# ---------------------------------------------------------------- handshake and streaming


def test_handshake_ready_response(sim: Harness) -> None:
    sim.start(max_model_len=200, max_num_seqs=7, max_num_batched_tokens=99)
    fe = sim.fe
    assert fe.identity == b"\x00\x00"
    ready = msgspec.convert(fe.ready, wire.EngineReadyResponse)
    assert (ready.block_size, ready.num_gpu_blocks, ready.max_model_len) == (BS, 64, 200)
    assert (ready.max_num_seqs, ready.max_num_batched_tokens) == (7, 99)
    assert ready.kv_cache_size_tokens == 64 * BS and ready.data_parallel_rank == 0
    assert ready.kv_events_config is not None
    assert ready.kv_events_config["endpoint"] == sim.kv.endpoint
    assert ready.kv_events_config["replay_endpoint"] == sim.kv.replay_endpoint
    assert ready.kv_events_config["publisher"] == "zmq"


def test_add_streams_one_token_per_step_until_max_tokens(sim: Harness) -> None:
    fe = sim.start()
    fe.add("a", list(range(1, 11)), max_tokens=6)
    got, stats = fe.run("a")
    outs = got["a"]
    assert [len(o.new_token_ids) for o in outs] == [1] * 6
    assert [o.finish_reason for o in outs] == [None] * 5 + [wire.FinishReason.LENGTH]
    assert all(t in set(TOKENS.ids) for t in fe.tokens(outs))
    first = outs[0]
    assert first.prefill_stats is not None and first.prefill_stats["num_prompt_tokens"] == 10
    assert first.prefill_stats["num_cached_tokens"] == 0
    assert first.events is not None
    assert [e.type for e in first.events] == [
        wire.EngineCoreEventType.QUEUED,
        wire.EngineCoreEventType.SCHEDULED,
    ]
    assert all(o.prefill_stats is None and o.events is None for o in outs[1:])
    assert stats[0]["num_running_reqs"] == 1 and stats[-1]["num_running_reqs"] == 0
    assert stats[0]["kv_cache_usage"] > 0 and stats[-1]["kv_cache_usage"] == 0.0


def test_outputs_are_deterministic_for_greedy_and_seeded_requests(sim: Harness) -> None:
    fe = sim.start()
    prompt = list(range(100, 120))
    fe.add("g1", prompt, max_tokens=8, temperature=0.0)
    fe.add("g2", prompt, max_tokens=8, temperature=0.0)
    fe.add("s1", prompt, max_tokens=8, seed=5)
    fe.add("r1", prompt, max_tokens=8)
    got, _ = fe.run("g1", "g2", "s1", "r1")
    assert fe.tokens(got["g1"]) == fe.tokens(got["g2"])
    assert fe.tokens(got["s1"]) != fe.tokens(got["g1"])
    assert fe.tokens(got["r1"]) != fe.tokens(got["g1"])


def test_default_token_table_emits_decodable_words() -> None:
    from tokenizers import Tokenizer

    model = EMBEDDED_MODEL
    table = TokenTable.from_model_dir(model)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert set(table.eos_token_ids) == {151645, 151643}
    assert not set(table.ids) & set(table.eos_token_ids)
    text = tok.decode(list(table.ids[:: max(1, len(table.ids) // 50)]))
    assert text.replace(" ", "").isalpha() and text.isascii()


# ---------------------------------------------------------------- prefix cache and KV events


def test_prefix_hits_are_reported_and_namespaced(sim: Harness) -> None:
    fe = sim.start()
    shared = list(range(1, 15))  # 3 full blocks of 4 + 2 tokens
    fe.add("a", shared + [500, 501], max_tokens=1)
    fe.run("a")
    fe.add("b", shared + [600, 601, 602], max_tokens=1)
    fe.add("salted", shared + [600], max_tokens=1, cache_salt="tenant")
    lora = wire.LoRARequest("adapter", 1, "/x")
    fe.add("lora", shared + [600], max_tokens=1, lora=lora)
    got, stats = fe.run("b", "salted", "lora")
    assert got["b"][0].prefill_stats is not None
    assert got["b"][0].prefill_stats["num_cached_tokens"] == 12
    assert got["b"][0].prefill_stats["num_computed_tokens"] == 17 - 12
    for rid in ("salted", "lora"):
        first = got[rid][0].prefill_stats
        assert first is not None and first["num_cached_tokens"] == 0
    assert sum(s["prefix_cache_stats"]["hits"] for s in stats) == 12
    stored = [e for e in events_of(sim.replay()) if isinstance(e, wire.BlockStored)]
    by_first_token = {tuple(e.token_ids[:1]): e for e in stored if e.parent_block_hash is None}
    plain, salted_or_lora = stored[0], [e for e in stored if e.extra_keys and e.extra_keys[0]]
    assert plain.extra_keys == [None] * len(plain.block_hashes) and plain.medium == "GPU"
    assert (plain.group_idx, plain.kv_cache_spec_kind) == (0, "full_attention")
    assert {tuple((e.extra_keys or [None])[0] or ()) for e in salted_or_lora} == {
        ("tenant",),
        ("adapter",),
    }
    lora_event = next(e for e in salted_or_lora if e.lora_name == "adapter")
    assert lora_event.lora_id == 1 and lora_event.extra_keys == [["adapter"]] * 3
    assert len(by_first_token) == 1  # the three namespaces share tokens, not hashes
    assert len({e.block_hashes[0] for e in stored if e.parent_block_hash is None}) == 3


def test_block_stored_chains_and_covers_generated_tokens(sim: Harness) -> None:
    fe = sim.start()
    fe.add("a", list(range(1, 7)), max_tokens=7)  # 6 prompt + 6 computed outputs = 3 blocks
    got, _ = fe.run("a")
    stored = [e for e in events_of(sim.replay()) if isinstance(e, wire.BlockStored)]
    seq = [t for e in stored for t in e.token_ids]
    assert seq == (list(range(1, 7)) + fe.tokens(got["a"]))[:12]
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) == 3 and len(set(hashes)) == 3
    for prev, e in zip(stored, stored[1:], strict=False):
        assert e.parent_block_hash == prev.block_hashes[-1]
    assert all(len(e.token_ids) == BS * len(e.block_hashes) for e in stored)


def test_eviction_emits_block_removed_lru(sim: Harness) -> None:
    fe = sim.start(num_gpu_blocks=9)  # 8 usable blocks of 4 tokens
    fe.add("a", list(range(1, 17)), max_tokens=1)  # 4 blocks, all cached
    fe.run("a")
    fe.add("b", list(range(101, 117)), max_tokens=1)  # 4 more: the pool is now full of hashes
    fe.run("b")
    fe.add("c", list(range(201, 209)), max_tokens=1)  # needs 2 blocks: evicts 2
    fe.run("c")
    events = events_of(sim.replay())
    stored_a = next(e for e in events if isinstance(e, wire.BlockStored) and e.token_ids[0] == 1)
    removed = [h for e in events if isinstance(e, wire.BlockRemoved) for h in e.block_hashes]
    assert all(len(e.block_hashes) == 1 for e in events if isinstance(e, wire.BlockRemoved))
    # a's blocks were freed first (least recently used), its tail before its head
    assert removed == stored_a.block_hashes[::-1][:2]
    held = cached_multiset(events)
    assert sum(held.values()) <= 8
    fe.add("a2", list(range(1, 17)), max_tokens=1)
    got, _ = fe.run("a2")
    assert got["a2"][0].prefill_stats is not None
    assert got["a2"][0].prefill_stats["num_cached_tokens"] == 8  # the head survived


def test_reset_prefix_cache_clears_on_next_step(sim: Harness) -> None:
    fe = sim.start(step_time=0.002)
    prompt = list(range(1, 21))
    fe.add("a", prompt, max_tokens=200, ignore_eos=True)
    fe.recv()
    assert fe.utility(1, "reset_prefix_cache").result == [None, False]  # blocks in use
    fe.abort("a")
    assert fe.utility(2, "reset_prefix_cache").result == [None, True]
    fe.add("b", prompt, max_tokens=1)
    got, _ = fe.run("b")
    assert got["b"][0].prefill_stats is not None
    assert got["b"][0].prefill_stats["num_cached_tokens"] == 0
    events = events_of(sim.replay())
    cleared = [i for i, e in enumerate(events) if isinstance(e, wire.AllBlocksCleared)]
    assert len(cleared) == 1
    (stored_b,) = events[cleared[0] + 1 :]
    assert isinstance(stored_b, wire.BlockStored) and stored_b.token_ids == prompt
    assert cached_multiset(events) == Counter(stored_b.block_hashes)


def test_pub_frames_match_replay_and_sequence_is_gapless(
    sim: Harness, ctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    fe = sim.start()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(sim.kv.endpoint)
    live: list[tuple[int, bytes]] = []
    # The subscription reaches the PUB asynchronously: prime until a batch arrives.
    i = 0
    while not live:
        fe.add(f"p{i}", [i + 1] * 9, max_tokens=1)
        fe.run(f"p{i}")
        i += 1
        while sub.poll(50):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b""
            live.append((int.from_bytes(seq, "big"), payload))
    for k in range(3):
        fe.add(f"q{k}", [7 + k] * 12, max_tokens=2)
        fe.run(f"q{k}")
    # The replay buffer holds every batch published so far: receive live up to its last.
    last = sim.replay()[-1][0]
    while live[-1][0] < last:
        assert sub.poll(TIMEOUT_MS), f"batch {live[-1][0] + 1} of {last} never arrived live"
        topic, seq, payload = sub.recv_multipart()
        live.append((int.from_bytes(seq, "big"), payload))
    seqs = [s for s, _ in live]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert sim.replay(seqs[0]) == live
    assert [s for s, _ in sim.replay()] == list(range(seqs[-1] + 1))
    assert all(BATCH.decode(p).data_parallel_rank == 0 for _, p in live)
    sub.close(linger=0)


def test_replay_buffer_is_bounded(sim: Harness) -> None:
    kv = msgspec.structs.replace(sim.kv, buffer_steps=3)
    sim.kv = kv
    fe = sim.start()
    for k in range(6):
        fe.add(f"r{k}", [k + 1] * 8, max_tokens=1)
        fe.run(f"r{k}")
    assert [s for s, _ in sim.replay()] == [3, 4, 5]
    assert sim.replay(10) == []


def test_kv_publisher_connects_to_a_non_wildcard_tcp_endpoint(
    ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path
) -> None:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    h = Harness(ctx, tmp_path)
    h.kv = KVEventsConfig(
        enable_kv_cache_events=True, endpoint=f"tcp://127.0.0.1:{port}", topic="kv"
    )
    try:
        fe = h.start()
        assert fe.ready["kv_events_config"]["endpoint"] == f"tcp://127.0.0.1:{port}"
        i = 0
        while not sub.poll(50):
            fe.add(f"p{i}", [i + 1] * 9, max_tokens=1)
            fe.run(f"p{i}")
            i += 1
        topic, _, payload = sub.recv_multipart()
        assert topic == b"kv" and BATCH.decode(payload).events
    finally:
        h.stop()
        sub.close(linger=0)


# ---------------------------------------------------------------- stops, aborts, limits


def test_stop_token_ids_eos_ignore_eos_and_min_tokens(sim: Harness) -> None:
    fe = sim.start()
    script = {"kvroute_sim_token_ids": [11, 12, 13, EOS, 14, 15, 16, 17]}
    fe.add("stop", [1, 2, 3], max_tokens=20, stop_token_ids=[13], extra_args=script)
    fe.add("eos", [1, 2, 3], max_tokens=20, _eos_token_id=EOS, extra_args=script)
    fe.add("ignore", [1, 2, 3], max_tokens=6, ignore_eos=True, _eos_token_id=EOS, extra_args=script)
    fe.add(
        "min",
        [1, 2, 3],
        max_tokens=20,
        min_tokens=5,
        _eos_token_id=EOS,
        stop_token_ids=[13, 16],
        extra_args=script,
    )
    fe.add("noeos", [1, 2, 3], max_tokens=5, extra_args=script)  # no _eos_token_id sent
    got, _ = fe.run("stop", "eos", "ignore", "min", "noeos")
    last = {r: o[-1] for r, o in got.items()}
    assert fe.tokens(got["stop"]) == [11, 12, 13]
    assert (last["stop"].finish_reason, last["stop"].stop_reason) == (wire.FinishReason.STOP, 13)
    assert fe.tokens(got["eos"]) == [11, 12, 13, EOS]
    assert (last["eos"].finish_reason, last["eos"].stop_reason) == (wire.FinishReason.STOP, None)
    assert fe.tokens(got["ignore"]) == [11, 12, 13, EOS, 14, 15]
    assert last["ignore"].finish_reason == wire.FinishReason.LENGTH
    min_tokens = fe.tokens(got["min"])
    # positions 2 and 3 (13 and EOS) are masked before min_tokens and replaced
    assert min_tokens[:2] == [11, 12] and min_tokens[4:] == [14, 15, 16]
    assert not {13, 16, EOS} & set(min_tokens[2:4])
    assert (last["min"].finish_reason, last["min"].stop_reason) == (wire.FinishReason.STOP, 16)
    assert fe.tokens(got["noeos"]) == [11, 12, 13, EOS, 14]


def test_eos_prob_ends_requests_with_the_request_eos(sim: Harness) -> None:
    fe = sim.start(eos_prob=0.5)
    for k in range(8):
        fe.add(f"e{k}", [k + 1] * 5, max_tokens=100, _eos_token_id=EOS, min_tokens=2)
    got, _ = fe.run(*(f"e{k}" for k in range(8)))
    for outs in got.values():
        toks = fe.tokens(outs)
        assert toks[-1] == EOS and EOS not in toks[:-1] and len(toks) >= 3


def test_max_model_len_is_fitted_to_the_cache(sim: Harness) -> None:
    fe = sim.start(num_gpu_blocks=9, max_model_len=4096)  # 8 usable blocks of 4 tokens
    assert fe.ready["max_model_len"] == 32
    fe.add("a", list(range(1, 20)), max_tokens=100)
    got, _ = fe.run("a")
    assert len(fe.tokens(got["a"])) == 32 - 19
    assert got["a"][-1].finish_reason == wire.FinishReason.LENGTH


def test_max_model_len_finishes_with_length(sim: Harness) -> None:
    fe = sim.start(max_model_len=16)
    fe.add("a", list(range(1, 13)), max_tokens=100)
    got, _ = fe.run("a")
    assert len(fe.tokens(got["a"])) == 4
    assert got["a"][-1].finish_reason == wire.FinishReason.LENGTH


def test_abort_sends_nothing_more_and_frees_blocks(sim: Harness) -> None:
    fe = sim.start(step_time=0.002)
    fe.add("long", list(range(1, 30)), max_tokens=10_000, ignore_eos=True)
    fe.recv()
    fe.abort("long", "unknown-id")
    fe.add("after", [5] * 5, max_tokens=3)
    got, stats = fe.run("after")
    late = [o for o in got.get("long", []) if o.finish_reason is not None]
    assert late == []
    assert stats[-1]["num_running_reqs"] == 0 and stats[-1]["kv_cache_usage"] == 0.0


def test_continuous_batching_respects_max_num_seqs(sim: Harness) -> None:
    fe = sim.start(max_num_seqs=2, step_time=0.01)  # all ADDs land within the first step
    rids = [f"r{k}" for k in range(5)]
    for k, r in enumerate(rids):
        fe.add(r, [k + 1] * 6, max_tokens=4)
    got, stats = fe.run(*rids)
    assert max(s["num_running_reqs"] for s in stats) == 2
    # 3 wait behind the first two; 4 if stats were taken before the second was admitted
    assert 3 <= max(s["num_waiting_reqs"] for s in stats) <= 4
    assert all(len(fe.tokens(got[r])) == 4 for r in rids)


def test_preemption_when_blocks_run_out(sim: Harness) -> None:
    fe = sim.start(num_gpu_blocks=9, max_num_seqs=8)  # 8 usable blocks, 32 tokens
    rids = [f"r{k}" for k in range(3)]
    for k, r in enumerate(rids):
        fe.add(r, [k + 1] * 6, max_tokens=12, ignore_eos=True)
    got, _ = fe.run(*rids)
    assert all(len(fe.tokens(got[r])) == 12 for r in rids)
    kinds = [e.type for r in rids for o in got[r] for e in (o.events or [])]
    assert wire.EngineCoreEventType.PREEMPTED in kinds


def _planned_steps(sched: Scheduler, prompts: dict[str, list[int]], max_tokens: int,
                   **params: Any) -> list[float]:
    """Adds the requests to the scheduler and runs them to the end: each step's planned
    (simulated) duration. The engine loop sleeps exactly that per step (bench/sim_timing.py
    measures it end to end)."""
    for rid, prompt in prompts.items():
        sp = SamplingParams(max_tokens=max_tokens, **params)
        req = wire.EngineCoreRequest(rid, prompt, None, sp, None, 0.0, None, None, None)
        sched.add(SimRequest(req, 0, sched.config.max_model_len), 0.0)
    steps = []
    while sched.has_work():
        plan = sched.schedule(0.0)
        steps.append(plan.duration)
        sched.finish(plan)
    return steps


def _scheduler(**overrides: Any) -> Scheduler:
    return Scheduler(SimConfig(handshake_address="inproc://unused", tokens=TOKENS, **overrides))


def test_prefill_time_scales_with_uncached_tokens(sim: Harness) -> None:
    timing = {"step_time": 0.0, "prefill_time_per_token": 0.002, "block_size": 16,
              "num_gpu_blocks": 64}
    prompt = list(range(1, 129))  # 128 tokens
    sched = _scheduler(**timing)
    assert _planned_steps(sched, {"cold": prompt}, 1) == [pytest.approx(128 * 0.002)]
    # 112 tokens cached (7 blocks: one token must be computed), 16 computed.
    assert _planned_steps(sched, {"warm": prompt}, 1) == [pytest.approx(16 * 0.002)]
    fe = sim.start(**timing)  # the engine: the same cache hit
    fe.add("cold", prompt, max_tokens=1)
    (cold,) = fe.run("cold")[0]["cold"]
    fe.add("warm", prompt, max_tokens=1)
    (warm,) = fe.run("warm")[0]["warm"]
    assert cold.prefill_stats is not None and warm.prefill_stats is not None
    assert (cold.prefill_stats["num_cached_tokens"], cold.prefill_stats["num_computed_tokens"]) \
        == (0, 128)
    assert (warm.prefill_stats["num_cached_tokens"], warm.prefill_stats["num_computed_tokens"]) \
        == (112, 16)


def test_rejects_requests_it_cannot_serve(sim: Harness) -> None:
    fe = sim.start(max_model_len=32)
    fe.add("long", list(range(1, 33)), max_tokens=1)  # == max_model_len: no room to generate
    fe.add("vocab", [1, 2, 5000], max_tokens=1)
    got, _ = fe.run("long", "vocab")
    for r in ("long", "vocab"):
        (out,) = got[r]
        assert out.finish_reason == wire.FinishReason.ERROR and out.new_token_ids == []
        assert out.error is not None and out.error.message


# ---------------------------------------------------------------- logprobs, utilities, death


def test_logprobs_inline_and_aux_frames(sim: Harness) -> None:
    fe = sim.start()
    fe.add("small", [1, 2, 3], max_tokens=2, logprobs=3)
    got, _ = fe.run("small")
    fe.add("big", [1, 2, 3], max_tokens=2, logprobs=80)  # 81 * 4 bytes > 256: out of band
    got.update(fe.run("big")[0])
    for rid, k, n_frames in (("small", 3, 1), ("big", 80, 1 + 2)):
        for out, frames in zip(got[rid], fe.aux[rid], strict=True):
            lp = decode_logprobs(out.new_logprobs, frames)
            assert lp.token_ids.shape == (1, k + 1) and lp.token_ids.dtype.str == "<i4"
            assert lp.logprobs.shape == (1, k + 1) and lp.logprobs.dtype.str == "<f4"
            assert lp.sampled_ranks.dtype.str == "<i8" and lp.sampled_ranks.tolist() == [1]
            assert int(lp.token_ids[0, 0]) == out.new_token_ids[0]
            assert len(frames) == n_frames


def test_utilities_is_sleeping_and_unknown(sim: Harness) -> None:
    fe = sim.start()
    assert fe.utility(5, "is_sleeping").result == [None, False]
    bad = fe.utility(6, "no_such_method", 1)
    assert bad.result is None and bad.failure_message is not None
    assert bad.failure_message.startswith("Call to no_such_method method failed:")


def test_executor_failure_sends_engine_core_dead(sim: Harness) -> None:
    fe = sim.start()
    fe.add("a", [1, 2, 3], max_tokens=1)
    fe.run("a")
    fe.inp.send_multipart([fe.identity, wire.REQ_EXECUTOR_FAILED, b""])
    assert fe.out.poll(TIMEOUT_MS)
    assert fe.out.recv_multipart() == [wire.ENGINE_CORE_DEAD]
    assert sim.engine is not None
    sim.engine.thread.join(10)
    assert isinstance(sim.engine.engine.error, RuntimeError)


def test_frontend_restart_is_readopted_without_handshake(sim: Harness) -> None:
    fe = sim.start()  # within frontend_gone_timeout (default 120 s) the engine waits for it
    fe.add("a", [1, 2, 3], max_tokens=2)
    fe.run("a")
    fe.close_io()
    fe.bind_io()
    monitor = fe.inp.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    assert monitor.poll(TIMEOUT_MS), "the engine did not reconnect"
    assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
    fe.inp.disable_monitor()
    monitor.close(linger=0)
    fe.add("b", [1, 2, 3, 4, 5], max_tokens=2)
    got, _ = fe.run("b")
    assert len(fe.tokens(got["b"])) == 2
    assert got["b"][0].prefill_stats is not None


def test_data_parallel_rank_sets_identity_and_offsets_kv_ports(
    ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path
) -> None:
    h = Harness(ctx, tmp_path)
    # A non-wildcard endpoint: the engine's PUB connects, to the port + rank, where this SUB is
    # bound (a port the test holds throughout). The wildcard (bind) form takes the same offset
    # (offset_endpoint_port, below).
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    h.kv = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://127.0.0.1:{port - 2}",
                          replay_endpoint=f"ipc://{tmp_path}/replay")
    try:
        fe = h.start(data_parallel_rank=2)
        assert fe.identity == (2).to_bytes(2, "little")
        assert fe.ready["data_parallel_rank"] == 2
        assert fe.ready["kv_events_config"]["endpoint"] == f"tcp://127.0.0.1:{port}"
        assert fe.ready["kv_events_config"]["replay_endpoint"] == f"ipc://{tmp_path}/replay_dp2"
        i = 0
        while not sub.poll(50):  # the subscription reaches the PUB asynchronously: prime
            fe.add(f"a{i}", [i + 1] * 5, max_tokens=1)
            (out,) = fe.run(f"a{i}")[0][f"a{i}"]
            assert out.finish_reason == wire.FinishReason.LENGTH
            i += 1
        assert BATCH.decode(sub.recv_multipart()[2]).data_parallel_rank == 2
    finally:
        h.stop()
        sub.close(linger=0)
    assert offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint_port("tcp://*:0", 2) == "tcp://*:0"


def test_cli_subprocess_handshakes_serves_and_stops_cleanly(
    ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path
) -> None:
    fe = Frontend(ctx, tmp_path)
    hs_tcp = ctx.socket(zmq.ROUTER)
    port = hs_tcp.bind_to_random_port("tcp://127.0.0.1")
    fe.hs.close(linger=0)
    fe.hs = hs_tcp
    root = Path(__file__).resolve().parent.parent
    proc = spawn_sim_engine(
        "",
        [
            "--data-parallel-address",
            "127.0.0.1",
            "--data-parallel-rpc-port",
            str(port),
            "--vocab-size",
            "1000",
            "--step-time",
            "0.001",
            "--headless",
        ],
        cwd=root,
        stderr=subprocess.PIPE,
    )
    try:
        fe.handshake()
        fe.add("a", [1, 2, 3], max_tokens=3)
        got, _ = fe.run("a")
        assert len(fe.tokens(got["a"])) == 3
        proc.terminate()
        assert proc.wait(10) == 0
        assert not fe.out.poll(100)  # a clean stop sends no ENGINE_CORE_DEAD
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
        fe.close()


def test_malformed_messages_are_dropped_not_fatal(sim: Harness) -> None:
    fe = sim.start()
    fe.inp.send_multipart([fe.identity, wire.REQ_ADD, b"\xc1garbage"])
    fe.inp.send_multipart([fe.identity, wire.REQ_ABORT, fe.enc.encode(5)])
    fe.inp.send_multipart([fe.identity, wire.REQ_UTILITY, fe.enc.encode([0, 1])])
    fe.inp.send_multipart([fe.identity, b"\x09", b""])
    fe.add("ok", [1, 2, 3], max_tokens=2)
    got, _ = fe.run("ok")
    assert len(fe.tokens(got["ok"])) == 2


# ---------------------------------------------------------------- the referee: real vLLM


def _summarize_event(e: wire.KVEvent, known: set[int]) -> tuple[Any, ...]:
    """An event without its opaque hashes, but with how it chains to what came before."""
    if isinstance(e, wire.BlockStored):
        parent = None if e.parent_block_hash is None else int(e.parent_block_hash) in known
        known.update(int(h) for h in e.block_hashes)
        return (
            "stored",
            len(e.block_hashes),
            parent,
            # Generated tokens differ between models: the length and the first (prompt) token.
            (len(e.token_ids), e.token_ids[0]),
            e.block_size,
            e.lora_id,
            e.medium,
            e.lora_name,
            e.extra_keys,
            e.group_idx,
            e.kv_cache_spec_kind,
        )
    if isinstance(e, wire.BlockRemoved):
        return ("removed", [int(h) in known for h in e.block_hashes], e.medium, e.group_idx)
    return ("cleared",)


def _scenario(ctx: zmq.Context[zmq.Socket[bytes]], engine: Any) -> dict[str, Any]:
    """Drive an engine started by tests/engines.py (its frontend gone) as a re-adopting frontend."""
    spec = engine.spec
    fe = Frontend.__new__(Frontend)
    fe.ctx, fe.in_addr, fe.out_addr = ctx, spec.input_address, spec.output_address
    fe.enc = msgspec.msgpack.Encoder(enc_hook=wire.enc_hook)
    fe.dec = msgspec.msgpack.Decoder(wire.EngineCoreOutputs, ext_hook=wire.ext_hook)
    fe.aux, fe.identity = {}, b"\x00\x00"
    fe.hs = ctx.socket(zmq.ROUTER)  # unused: these engines handshook already
    fe.bind_io()
    monitor = fe.inp.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    assert monitor.poll(60_000), "the engine did not reconnect"
    fe.inp.disable_monitor()
    monitor.close(linger=0)
    seen: list[int] = [len(replay(ctx, engine.kv.replay_endpoint))]
    known: set[int] = set()
    hashes_of = seen  # replay position, advanced per scenario

    def run(rid: str, prompt: list[int], **params: Any) -> dict[str, Any]:
        fe.add(rid, prompt, temperature=0.0, **params)
        got, _ = fe.run(rid)
        outs = []
        for o, frames in zip(got[rid], fe.aux[rid], strict=True):
            lp = None
            if o.new_logprobs is not None:
                d = decode_logprobs(o.new_logprobs, frames)
                lp = (
                    d.token_ids.dtype.str,
                    d.token_ids.shape,
                    d.logprobs.dtype.str,
                    d.sampled_ranks.dtype.str,
                    d.sampled_ranks.shape,
                    len(frames),
                )
            outs.append(
                (
                    len(o.new_token_ids),
                    o.finish_reason,
                    o.stop_reason,
                    o.prefill_stats,
                    [e.type for e in o.events or []],
                    lp,
                )
            )
        # KV batches of the step that finished rid are published before its output is sent.
        batches = replay(ctx, engine.kv.replay_endpoint, hashes_of[0])
        hashes_of[0] += len(batches)
        return {"outs": outs, "events": [_summarize_event(e, known) for e in events_of(batches)]}

    try:
        result: dict[str, Any] = {"reset": fe.utility(1, "reset_prefix_cache").result}
        prompt = list(range(1000, 1300))
        result["cold"] = run("cold", prompt, max_tokens=4)
        result["warm"] = run("warm", prompt, max_tokens=4)
        result["exact_blocks"] = run("exact", prompt[:256], max_tokens=2)
        result["reset_again"] = fe.utility(2, "reset_prefix_cache").result
        result["after_reset"] = run("after", prompt, max_tokens=2)
        result["cross_block"] = run(
            "cross", list(range(2000, 2120)), max_tokens=20, ignore_eos=True
        )
        result["logprobs"] = run("lp", list(range(3000, 3010)), max_tokens=2, logprobs=2)
        result["logprobs_aux"] = run("lpa", list(range(3000, 3010)), max_tokens=2, logprobs=80)
        result["min_tokens"] = run("min", list(range(4000, 4010)), max_tokens=3, min_tokens=2)
        bad = fe.utility(3, "no_such_method")
        result["bad_utility"] = (bad.failure_message, bad.result)
        result["is_sleeping"] = fe.utility(4, "is_sleeping").result
        return result
    finally:
        fe.close()


@pytest.mark.vllm
def test_sim_matches_real_vllm_on_the_wire(
    ctx: zmq.Context[zmq.Socket[bytes]], sim_engine: Any, vllm_engine: Any
) -> None:
    """One scenario against both: token counts, finish/stop reasons, prefill_stats, request
    events, logprobs array layout, utility answers and the KV events (hashes aside) must agree."""
    sim = _scenario(ctx, sim_engine)
    real = _scenario(ctx, vllm_engine)
    assert {k: (sim[k], v) for k, v in real.items() if sim[k] != v} == {}


def test_sim_engines_helper_runs_a_fleet(
    ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path
) -> None:
    fronts = []
    for k in range(3):
        (tmp_path / str(k)).mkdir()
        fronts.append(Frontend(ctx, tmp_path / str(k)))
    try:
        with sim_engines([f.hs_addr for f in fronts], TOKENS, step_time=0.001) as engines:
            for f in fronts:
                f.handshake()
            assert all(e.wait_ready(10) for e in engines)
            for k, f in enumerate(fronts):
                f.add(f"r{k}", [k + 1] * 5, max_tokens=3)
            for k, f in enumerate(fronts):
                got, _ = f.run(f"r{k}")
                assert len(f.tokens(got[f"r{k}"])) == 3
        assert not any(e.thread.is_alive() for e in engines)
    finally:
        for f in fronts:
            f.close()


def test_decode_time_grows_with_the_batch(sim: Harness) -> None:
    timing = {"step_time": 0.0, "prefill_time_per_token": 0.0, "decode_time_per_seq": 0.004,
              "max_num_seqs": 8}
    solo = _planned_steps(_scheduler(**timing), {"solo": [1, 2, 3]}, 5, ignore_eos=True)
    batch = _planned_steps(_scheduler(**timing), {f"b{k}": [k + 1] * 3 for k in range(8)}, 5,
                           ignore_eos=True)
    assert solo == [pytest.approx(0.004)] * 5  # a step per token, one request in each
    assert batch == [pytest.approx(8 * 0.004)] * 5  # the eight share every step
    fe = sim.start(**timing)  # the engine runs such plans: each request gets its five tokens
    for k in range(8):
        fe.add(f"b{k}", [k + 1] * 3, max_tokens=5, ignore_eos=True)
    got, _ = fe.run(*(f"b{k}" for k in range(8)))
    assert all(len(fe.tokens(got[f"b{k}"])) == 5 for k in range(8))


def _eviction_run(ctx: zmq.Context[zmq.Socket[bytes]], kind: str, workdir: Path) -> dict[str, Any]:
    """A 9-block cache (8 usable x 128 tokens): fill it, force one eviction, re-query."""
    from tests.engines import VLLM_START_TIMEOUT, make_engine

    flags = {"block_size": "128"} if kind == "sim" else {}
    eng = make_engine(kind, f"{kind}-evict", workdir, **flags)
    eng.argv += ["--num-gpu-blocks-override", "9"]
    fe = Frontend.__new__(Frontend)
    fe.ctx, fe.in_addr, fe.out_addr = ctx, eng.spec.input_address, eng.spec.output_address
    fe.enc = msgspec.msgpack.Encoder(enc_hook=wire.enc_hook)
    fe.dec = msgspec.msgpack.Decoder(wire.EngineCoreOutputs, ext_hook=wire.ext_hook)
    fe.aux, fe.identity, fe.ready = {}, b"", {}
    fe.hs = ctx.socket(zmq.ROUTER)
    fe.hs.bind(eng.spec.handshake)  # vLLM's: TCP port 0, the engine gets the bound one
    fe.hs_addr = fe.hs.getsockopt_string(zmq.LAST_ENDPOINT)
    fe.bind_io()
    try:
        eng.spawn(int(fe.hs_addr.rsplit(":", 1)[1]) if kind == "vllm" else None)
        fe.handshake(int(VLLM_START_TIMEOUT * 1000))
        prompts = {
            "A": list(range(1000, 1400)),
            "B": list(range(5000, 5400)),
            "C": list(range(9000, 9256)),
        }
        result: dict[str, Any] = {"num_gpu_blocks": fe.ready["num_gpu_blocks"]}
        for rid, name in (("A", "A"), ("B", "B"), ("C", "C"), ("A2", "A")):
            fe.add(rid, prompts[name], max_tokens=1, temperature=0.0)
            result[rid] = fe.run(rid)[0][rid][0].prefill_stats
        names: dict[int, str] = {}
        events: list[tuple[str, list[str]]] = []
        for e in events_of(replay(ctx, eng.kv.replay_endpoint or "")):
            if isinstance(e, wire.BlockStored):
                who = next(n for n, p in prompts.items() if e.token_ids[0] in p)
                first = prompts[who].index(e.token_ids[0]) // 128
                for i, h in enumerate(e.block_hashes):
                    names.setdefault(int(h), f"{who}{first + i}")
                events.append(("stored", [names[int(h)] for h in e.block_hashes]))
            elif isinstance(e, wire.BlockRemoved):
                events.append(("removed", [names.get(int(h), "?") for h in e.block_hashes]))
        result["events"] = events
        return result
    finally:
        eng.stop()
        fe.close()


@pytest.mark.vllm
@pytest.mark.slow
def test_eviction_matches_real_vllm(ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path) -> None:
    """LRU eviction on a tiny cache: the same blocks are evicted, in the same order, with the
    same prefix hits afterwards (checked once by hand: B's tail block goes, A keeps 384 tokens)."""
    sim = _eviction_run(ctx, "sim", tmp_path / "sim")
    real = _eviction_run(ctx, "vllm", tmp_path / "vllm")
    assert sim == real
    assert real["events"][-1] == ("removed", ["B2"])


# ---------------------------------------------------------------- output modes and lifetime


QWEN = TokenTable.from_model_dir(EMBEDDED_MODEL)


def _chat_prompt(user: str) -> list[int]:
    assert QWEN.tokenizer is not None
    text = (f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")
    ids: list[int] = QWEN.tokenizer.encode(text, add_special_tokens=False).ids
    return ids


def test_echo_output_repeats_the_prompts_last_line_after_a_mark(sim: Harness) -> None:
    """The default with a tokenizer: readable, marked as simulated, the prompt's own words."""
    assert QWEN.tokenizer is not None
    fe = sim.start(tokens=QWEN, num_gpu_blocks=256)
    prompt = _chat_prompt("Where is my cache?")
    fe.add("e", prompt, max_tokens=16, temperature=0.0)
    fe.add("c", QWEN.tokenizer.encode("The quick brown fox").ids, max_tokens=12, temperature=0.0)
    for rid, seed in (("s1", 5), ("s2", 5), ("s3", 6), ("u1", None), ("u2", None)):
        fe.add(rid, prompt, max_tokens=16, seed=seed)
    got, _ = fe.run("e", "c", "s1", "s2", "s3", "u1", "u2")
    chat = QWEN.tokenizer.decode(fe.tokens(got["e"]))
    assert chat.startswith("(simulated) Where is my cache? (simulated) Where is")
    assert len(fe.tokens(got["e"])) == 16 and got["e"][-1].finish_reason == wire.FinishReason.LENGTH
    assert QWEN.tokenizer.decode(fe.tokens(got["c"])).startswith(
        "(simulated) The quick brown fox (simulated)")
    # Sampled requests: a tag of the request's key, so vLLM's seed rules still hold.
    text = {r: QWEN.tokenizer.decode(fe.tokens(got[r])) for r in ("s1", "s2", "s3", "u1", "u2")}
    tagged = re.compile(r"\(simulated #[0-9a-f]{4}\) Where is my cache\?")
    assert all(tagged.match(t) for t in text.values()), text
    assert text["s1"] == text["s2"] and text["s1"] != text["s3"] and text["u1"] != text["u2"]


def test_random_output_stays_available(sim: Harness) -> None:
    assert QWEN.tokenizer is not None
    fe = sim.start(tokens=QWEN, num_gpu_blocks=256, output="random")
    fe.add("r", _chat_prompt("Where is my cache?"), max_tokens=16, seed=3)
    got, _ = fe.run("r")
    text = QWEN.tokenizer.decode(fe.tokens(got["r"]))
    assert "(simulated)" not in text and "cache" not in text
    assert set(fe.tokens(got["r"])) <= set(QWEN.ids)


def test_engine_exits_by_itself_when_its_frontend_is_gone(sim: Harness) -> None:
    fe = sim.start(frontend_gone_timeout=0.5)
    fe.add("a", [1, 2, 3], max_tokens=2)
    fe.run("a")
    assert sim.engine is not None and sim.engine.thread.is_alive()
    fe.close_io()  # the frontend went away (its sockets closed)
    sim.engine.thread.join(60)
    assert not sim.engine.thread.is_alive()
    assert sim.engine.engine.error is None


def test_cli_defaults_follow_the_model_like_the_router() -> None:
    from render import Renderer
    from sim.config import build_parser, config_from_args

    cfg = config_from_args(build_parser().parse_args([]))
    renderer = Renderer.load(EMBEDDED_MODEL)
    assert cfg.max_model_len == renderer.max_model_len  # what the router admits prompts to
    assert (cfg.num_gpu_blocks - 1) * cfg.block_size >= cfg.max_model_len
    assert cfg.output == "echo"
    vocab = config_from_args(build_parser().parse_args(["--vocab-size", "100"]))
    assert vocab.max_model_len == 4096 and vocab.num_gpu_blocks == 2048


def test_cli_engine_whose_kv_endpoint_is_taken_exits(
    ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: Path
) -> None:
    """A start that fails after some sockets opened exits (it used to hang in ctx.term())."""
    taken = ctx.socket(zmq.ROUTER)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    fe = Frontend(ctx, tmp_path)
    kv = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                     "endpoint": f"ipc://{tmp_path}/kv",
                     "replay_endpoint": f"tcp://127.0.0.1:{port}"})
    proc = spawn_sim_engine(fe.hs_addr, ["--vocab-size", "100", "--kv-events-config", kv],
                            stderr=subprocess.PIPE)
    try:
        fe.answer_hello()
        assert proc.wait(60) == 1
        assert proc.stderr is not None
        assert b"Address already in use" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        taken.close(linger=0)
        fe.close()
