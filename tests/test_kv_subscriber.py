"""KV-event subscriber: sequence logic, vLLM's endpoint rule, and replay over a lossy link."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from router.kvfeed.kv_subscriber import (
    KVEndpoints,
    KVSubscriber,
    dial_address,
    engine_binds,
    kv_namespace,
    offset_endpoint,
)
from router.link.engine_client import EngineClient
from sim.config import KVEventsConfig
from sim.kv_publisher import KVEventPublisher
from tests.engines import NaiveIndex, make_engine
from tests.test_engine_client import make_request
from wire.engine import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

ENC = msgspec.msgpack.Encoder()
BS = 4


def stored(
    hashes: list[int], parent: int | None, tokens: list[int], salt: str | None = None
) -> Any:
    extra = [[salt]] + [None] * (len(hashes) - 1) if salt else None
    return BlockStored(hashes, parent, tokens, BS, None, "GPU", None, extra_keys=extra)


def batch(*events: object, ts: float | None = None) -> bytes:
    return ENC.encode(KVEventBatch(time.time() if ts is None else ts, list(events)))  # type: ignore[arg-type]


@pytest.fixture
async def sub_no_replay() -> AsyncIterator[tuple[KVSubscriber, NaiveIndex]]:
    index = NaiveIndex()
    async with KVSubscriber(index) as sub:
        # Nobody publishes here: the tests drive on_batch() directly.
        sub.add_engine(KVEndpoints("e", "ipc:///nonexistent/kv"))
        yield sub, index


async def test_sequence_gap_without_replay_counts_loss(sub_no_replay: Any) -> None:
    sub, index = sub_no_replay
    await sub.on_batch("e", 0, batch(stored([1], None, [1, 2, 3, 4])))
    await sub.on_batch("e", 3, batch(stored([2], 1, [5, 6, 7, 8])))
    c = sub.counters("e")
    assert (c.gaps, c.lost_batches, c.batches, c.last_seq) == (1, 2, 2, 3)
    assert index.match("e", [1, 2, 3, 4, 5, 6, 7, 8], BS) == 8


async def test_duplicate_is_skipped_and_rewind_cannot_wipe(sub_no_replay: Any) -> None:
    sub, index = sub_no_replay
    b0 = batch(stored([1, 2], None, list(range(8))), ts=1.0)
    await sub.on_batch("e", 0, b0)
    await sub.on_batch("e", 1, batch(BlockRemoved([2], "GPU")))
    await sub.on_batch("e", 0, b0)  # the same batch again
    c = sub.counters("e")
    assert c.duplicates == 1 and c.resets == 0
    assert set(index.snapshot("e")) == {1}
    # Seq 0 again with new content, without a new handshake: a forger's (or stale) batch.
    # It is dropped: it neither wipes the index nor adds its blocks.
    await sub.on_batch("e", 0, batch(AllBlocksCleared(), stored([9], None, [7, 7, 7, 7]), ts=2.0))
    assert (c.rewinds, c.resets) == (1, 0)
    assert set(index.snapshot("e")) == {1}
    assert index.cleared.get("e", 0) == 0
    # The feed goes on in sequence; a restart is signalled by the engine client's handshake.
    await sub.on_batch("e", 2, batch(stored([3], 1, [8, 9, 10, 11])))
    assert set(index.snapshot("e")) == {1, 3}
    await sub.engine_restarted("e")
    assert c.resets == 1 and index.cleared["e"] == 1 and set(index.snapshot("e")) == set()
    await sub.on_batch("e", 0, batch(stored([9], None, [7, 7, 7, 7]), ts=3.0))
    assert set(index.snapshot("e")) == {9}


async def test_undecodable_batch_is_counted_and_skipped(sub_no_replay: Any) -> None:
    sub, index = sub_no_replay
    await sub.on_batch("e", 0, b"\xc1not msgpack")
    await sub.on_batch("e", 1, ENC.encode([1.0, [{"type": "NoSuchEvent"}]]))
    await sub.on_batch("e", 2, batch(stored([5], None, [1, 1, 1, 1]), AllBlocksCleared()))
    await sub.on_batch("e", 3, batch(stored([6], None, [2, 2, 2, 2])))
    c = sub.counters("e")
    assert (c.decode_errors, c.batches, c.gaps) == (2, 2, 0)
    assert set(index.snapshot("e")) == {6}


async def test_salted_chain_namespace(sub_no_replay: Any) -> None:
    sub, index = sub_no_replay
    await sub.on_batch("e", 0, batch(stored([1, 2], None, list(range(8)), salt="tenant")))
    await sub.on_batch("e", 1, batch(stored([3], 2, [8, 9, 10, 11])))
    prompt = list(range(12))
    assert index.match("e", prompt, BS) == 0
    assert index.match("e", prompt, BS, kv_namespace(None, "tenant")) == 12


def test_endpoint_rule_mirrors_vllm() -> None:
    assert engine_binds("tcp://*:5557") and engine_binds("ipc:///tmp/x")
    assert engine_binds("tcp://[::]:5557") and engine_binds("inproc://kv")
    assert not engine_binds("tcp://10.0.0.5:5557")
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("tcp://*:0", 2) == "tcp://*:0"
    assert offset_endpoint("inproc://kv", 1) == "inproc://kv_dp1"
    assert dial_address("tcp://*:5557", "10.1.2.3") == "tcp://10.1.2.3:5557"
    assert dial_address("ipc:///tmp/x", "10.1.2.3") == "ipc:///tmp/x"


async def test_subscriber_binds_when_engine_connects() -> None:
    """A non-wildcard TCP endpoint: vLLM's PUB connects, so the subscriber must bind."""
    index = NaiveIndex()
    ctx = zmq.asyncio.Context()
    # An XPUB is a PUB that also hands over the subscriptions it receives: once the subscriber's
    # has arrived, a batch sent is delivered (a PUB drops what it sends before that).
    pub = ctx.socket(zmq.XPUB)
    try:
        async with KVSubscriber(index) as sub:
            address = sub.add_engine(KVEndpoints("e", "tcp://127.0.0.1:0", topic="kv"))
            assert address.startswith("tcp://127.0.0.1:") and not address.endswith(":0")
            pub.connect(address)
            assert await asyncio.wait_for(pub.recv(), 30) == b"\x01kv"
            await pub.send_multipart((b"kv", (0).to_bytes(8, "big"),
                                      batch(stored([1], None, [1, 2, 3, 4]))))
            while index.match("e", [1, 2, 3, 4], BS) < 4:  # checked, then waited: no lost wake-up
                await sub.wait_applied("e", 30)
    finally:
        pub.close(linger=0)
        ctx.term()


class LossyProxy:
    """Between the engine's PUB and the subscriber: drops and duplicates batches while lossy."""

    def __init__(self, ctx: zmq.asyncio.Context, upstream: str, downstream: str) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(upstream)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind(downstream)
        self.lossy = True
        self.dropped = self.duplicated = 0

    async def run(self) -> None:
        while True:
            frames = await self.sub.recv_multipart()
            seq = int.from_bytes(frames[1], "big")
            if self.lossy and seq % 4 == 1:
                self.dropped += 1
                continue
            await self.pub.send_multipart(frames)
            if self.lossy and seq % 5 == 2:
                self.duplicated += 1
                await self.pub.send_multipart(frames)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.pub.close(linger=0)


async def test_replay_restores_exact_index_over_lossy_link(tmp_path: Path) -> None:
    # Few blocks, so evictions (BlockRemoved) happen too.
    engine = make_engine("sim", "kv", tmp_path, block_size="16", num_gpu_blocks="48")
    ctx = zmq.asyncio.Context()
    proxy = LossyProxy(ctx, engine.kv.endpoint, f"ipc://{tmp_path}/proxy")
    proxy_task = asyncio.create_task(proxy.run())
    lossy_index, ref_index = NaiveIndex(), NaiveIndex()
    via_proxy = KVEndpoints("kv", f"ipc://{tmp_path}/proxy", engine.kv.replay_endpoint, "kv")
    try:
        async with EngineClient([engine.spec]) as client, KVSubscriber(lossy_index) as lossy:
            lossy.add_engine(via_proxy)
            engine.spawn()
            await client.wait_ready(60.0)
            rng = random.Random(7)
            stems = [[rng.randrange(1000, 50_000) for _ in range(64)] for _ in range(4)]
            for i in range(40):
                prompt = stems[i % 4][: 16 * rng.randrange(1, 5)] + [rng.randrange(1000, 50_000)]
                prompt += [rng.randrange(1000, 50_000) for _ in range(rng.randrange(0, 40))]
                await (await client.submit("kv", make_request(prompt, 3))).collect()
            proxy.lossy = False
            await (await client.submit("kv", make_request(stems[0], 20))).collect()

            async with KVSubscriber(ref_index) as ref:
                ref.add_engine(KVEndpoints("kv", engine.kv.endpoint, engine.kv.replay_endpoint))
                await ref.resync("kv")  # everything, straight from the engine's buffer
                last = ref.counters("kv").last_seq
            assert last is not None and last > 20
            deadline = time.monotonic() + 20
            while lossy.counters("kv").last_seq != last:
                await lossy.wait_applied("kv", max(0.1, deadline - time.monotonic()))
            c = lossy.counters("kv")
            assert proxy.dropped > 0 and proxy.duplicated > 0
            assert c.gaps > 0 and c.replays > 0 and c.duplicates > 0
            assert c.lost_batches == 0 and c.decode_errors == 0
            assert lossy_index.snapshot("kv") == ref_index.snapshot("kv")
            assert len(ref_index.snapshot("kv")) > 0
    finally:
        proxy_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await proxy_task
        proxy.close()
        ctx.term()
        engine.kill()


async def test_engine_restart_clears_its_index(tmp_path: Path) -> None:
    engine = make_engine("sim", "rs", tmp_path, block_size="16")
    index = NaiveIndex()
    old, new = random_tokens(48, 1), random_tokens(48, 2)
    try:
        async with EngineClient([engine.spec]) as client, KVSubscriber(index) as sub:
            sub.add_engine(engine.kv)
            engine.spawn()
            await client.wait_ready(60.0)
            await (await client.submit("rs", make_request(old, 2))).collect()
            await sub.resync("rs")
            assert index.match("rs", old, 16) == 48
            engine.kill()
            engine.spawn()  # a new process: its KV sequence starts at 0 again
            await client.wait_connects("rs", 2, 60.0)
            # What the fleet does on a new handshake: the old process's blocks are gone.
            await sub.engine_restarted("rs")
            assert index.match("rs", old, 16) == 0
            await (await client.submit("rs", make_request(new, 2))).collect()
            await sub.resync("rs")
            assert index.match("rs", new, 16) == 48
            assert index.match("rs", old, 16) == 0
            c = sub.counters("rs")
            assert c.resets == 1 and c.lost_batches == 0
    finally:
        engine.kill()


def random_tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 50_000) for _ in range(n)]


async def test_events_keep_routes_noted_on_other_engines() -> None:
    """A route noted optimistically (on the dispatcher's monotonic clock) lives out its ttl
    while KV events of other engines arrive: the subscriber applies them on the same clock."""
    from radix import PrefixIndex

    index = PrefixIndex(10_000)
    for name in ("e", "f"):
        index.add_engine(name, BS)
    async with KVSubscriber(index) as sub:
        sub.add_engine(KVEndpoints("e", "ipc:///nonexistent/kv-e"))
        ns = kv_namespace(None, None)
        prompt = list(range(100, 140))
        index.note_routed("f", prompt, ns, time.monotonic(), ttl=60.0)
        assert index.match(prompt, ns, time.monotonic())["f"].optimistic_tokens == 40
        await sub.on_batch("e", 0, batch(stored([1], None, [1, 2, 3, 4])))
        assert index.match([1, 2, 3, 4, 5], ns, time.monotonic())["e"].confirmed_tokens == 4
        assert index.match(prompt, ns, time.monotonic())["f"].optimistic_tokens == 40


class _ReplayServer:
    """An engine's replay ROUTER holding ``history`` (seq, payload); ``stall_after`` N batches
    it stops answering for good (no END, no answer to a later request), as a wedged peer would."""

    def __init__(self, ctx: zmq.asyncio.Context, address: str,
                 history: list[tuple[int, bytes]], stall_after: int | None = None,
                 lose_first: frozenset[int] = frozenset(), end_first: bool = True) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.bind(address)
        self.history = history
        self.stall_after = stall_after
        # The first answer lacks these seqs (and its end marker unless end_first): what a
        # ROUTER drops when its peer's queue is full.
        self.lose_first = lose_first
        self.end_first = end_first
        self.requests = 0

    async def serve(self) -> None:
        sent = 0
        while True:
            client, _, start = await self.sock.recv_multipart()
            self.requests += 1
            first = self.requests == 1
            for seq, payload in self.history:
                if seq < int.from_bytes(start, "big") or (first and seq in self.lose_first):
                    continue
                if self.stall_after is not None and sent >= self.stall_after:
                    break
                await self.sock.send_multipart((client, b"", b"", seq.to_bytes(8, "big"),
                                                payload))
                sent += 1
            else:
                if not first or self.end_first:
                    await self.sock.send_multipart((client, b"", b"", b"\xff" * 8, b""))


class _CountingIndex(NaiveIndex):
    def __init__(self) -> None:
        super().__init__()
        self.stored_calls = 0

    def apply_stored(self, *args: Any, **kwargs: Any) -> None:
        self.stored_calls += 1
        super().apply_stored(*args, **kwargs)


OLD = [random_tokens(8, seed) for seed in range(40)]
NEW = random_tokens(8, 99)


def _history() -> list[tuple[int, bytes]]:
    """40 batches of blocks since gone, a clear, then the cache as it is now."""
    old = [batch(stored([1000 + i, 2000 + i], None, t)) for i, t in enumerate(OLD)]
    now = [batch(AllBlocksCleared()), batch(stored([7, 8], None, NEW))]
    return list(enumerate(old + now))


async def _subscribed(ctx_dir: Path, index: NaiveIndex, timeout: float
                      ) -> tuple[KVSubscriber, str]:
    sub = KVSubscriber(index, replay_timeout=timeout)  # type: ignore[arg-type]
    await sub.start()
    replay = f"ipc://{ctx_dir}/replay"
    sub.add_engine(KVEndpoints("e", f"ipc://{ctx_dir}/kv", replay))
    return sub, replay


async def test_a_replay_skips_what_a_later_clear_undoes(tmp_path: Path) -> None:
    """A late joiner's replay of a long-running engine: the batches before its last
    AllBlocksCleared are not applied (they would be wrong in the index until the clear came),
    and the index ends as the engine's cache is."""
    index = _CountingIndex()
    ctx = zmq.asyncio.Context()
    sub, address = await _subscribed(tmp_path, index, 5.0)
    server = _ReplayServer(ctx, address, _history())
    serving = asyncio.create_task(server.serve())
    try:
        await sub.resync("e")
        c = sub.counters("e")
        assert index.snapshot("e") == {7: (None, tuple(NEW[:4])), 8: (7, tuple(NEW[4:]))}
        assert index.stored_calls == 1  # only the blocks stored since the clear
        assert c.superseded_batches == 40 and c.replayed_batches == 2
        assert c.lost_batches == 0 and c.last_seq == 41
    finally:
        serving.cancel()
        await sub.close()
        server.sock.close(linger=0)
        ctx.term()


async def test_a_replay_cut_short_applies_nothing(tmp_path: Path) -> None:
    """A replay whose engine stops answering halfway is dropped whole: half a history would
    leave blocks in the index that its missing rest removed."""
    index = _CountingIndex()
    ctx = zmq.asyncio.Context()
    sub, address = await _subscribed(tmp_path, index, 0.5)
    server = _ReplayServer(ctx, address, _history(), stall_after=20)
    serving = asyncio.create_task(server.serve())
    try:
        await sub.resync("e")
        assert index.stored_calls == 0 and index.snapshot("e") == {}
        assert sub.counters("e").replayed_batches == 0
    finally:
        serving.cancel()
        await sub.close()
        server.sock.close(linger=0)
        ctx.term()


class _EngineThread:
    """The sim's KV publisher (vLLM's ZmqEventPublisher: PUB + replay ROUTER, vLLM's socket
    options) on its own thread, as an engine runs it, with ``batches`` already published."""

    def __init__(self, batches: list[list[Any]]) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        config = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://*:0",
                                replay_endpoint="tcp://*:0", buffer_steps=len(batches))
        self.pub = KVEventPublisher(self.ctx, config, 0)
        for events in batches:
            self.pub.publish(events)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        assert self.pub.replay is not None
        while not self.stop.is_set():
            if self.pub.replay.poll(50):
                self.pub.service_replay()  # sends the whole answer at once, as vLLM does

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.pub.close()
        self.ctx.term()


async def test_a_full_replay_buffer_arrives_whole() -> None:
    """A late joiner asks a long-running engine for its whole buffer (vLLM keeps 10,000
    batches), which the engine sends in one go through a ROUTER that DROPS what does not fit its
    peer's queue. The subscriber must take it all in as fast as it comes: an answer cut short
    is dropped whole, after replay_timeout, and the index stays empty until live events fill it
    (seen in bench/compare.py: seconds of requests routed cold at the start of a run)."""
    tokens = random_tokens(256 * BS, 5)  # a 1k-token prompt's blocks per batch, ~5 KB each
    history = [[stored([1_000_000 * i + b for b in range(256)], None, tokens)]
               for i in range(10_000)]
    engine = _EngineThread(history)
    index = _CountingIndex()
    sub = KVSubscriber(index, replay_timeout=5.0)  # type: ignore[arg-type]
    await sub.start()
    try:
        cfg = engine.pub.config
        assert cfg.replay_endpoint is not None
        # The engine bound both: a wildcard endpoint is dialled (vLLM's rule).
        sub.add_engine(KVEndpoints("e", cfg.endpoint.replace("127.0.0.1", "*"),
                                   cfg.replay_endpoint.replace("127.0.0.1", "*")))
        async def busy_router() -> None:
            # The router's loop is busy (requests, other engines' replays) while the engine
            # sends: nothing reads the replay socket for a second.
            await asyncio.sleep(0)
            time.sleep(1.0)

        busy = asyncio.create_task(busy_router())
        await sub.resync("e")
        await busy
        c = sub.counters("e")
        assert c.replayed_batches == 10_000 and c.lost_batches == 0 and c.last_seq == 9_999
        assert index.stored_calls == 10_000
    finally:
        await sub.close()
        engine.close()


def _stored_history(n: int) -> list[tuple[int, bytes]]:
    return [(i, batch(stored([500 + i], None, random_tokens(BS, i)))) for i in range(n)]


@pytest.mark.parametrize("end_first", [True, False], ids=["holes", "holes-and-no-end"])
async def test_a_replay_asks_again_for_what_its_answer_lacked(tmp_path: Path,
                                                              end_first: bool) -> None:
    """The engine's ROUTER dropped frames of its answer (a queue full while it sent): the
    subscriber asks again from the first missing seq, and the index ends whole."""
    index = _CountingIndex()
    ctx = zmq.asyncio.Context()
    sub, address = await _subscribed(tmp_path, index, 0.5)
    lost = frozenset({3, 4, 17, 29})
    server = _ReplayServer(ctx, address, _stored_history(30), lose_first=lost,
                           end_first=end_first)
    serving = asyncio.create_task(server.serve())
    try:
        await sub.resync("e")
        c = sub.counters("e")
        assert c.replayed_batches == 30 and c.lost_batches == 0 and c.last_seq == 29
        assert index.stored_calls == 30 and len(index.snapshot("e")) == 30
        assert server.requests >= 2
    finally:
        serving.cancel()
        await sub.close()
        server.sock.close(linger=0)
        ctx.term()


async def test_a_removal_is_dated_on_the_index_s_clock() -> None:
    """The policy discounts a prefix its engine is evicting (``PrefixIndex.cut_short``): the
    subscriber dates each BlockRemoved on the router's monotonic clock, not the batch's stamp."""
    from radix import PrefixIndex

    index = PrefixIndex(10_000)
    index.add_engine("e", BS)
    ns = kv_namespace(None, None)
    async with KVSubscriber(index) as sub:
        sub.add_engine(KVEndpoints("e", "ipc:///nonexistent/kv-e"))
        await sub.on_batch("e", 0, batch(stored([1, 2], None, list(range(8)))))
        prompt = index.prepare(list(range(9)), ns)
        before = time.monotonic()
        await sub.on_batch("e", 1, batch(BlockRemoved([2], "GPU"), ts=1.0))  # an old wall stamp
        assert index.cut_short("e", prompt, BS, before)
        assert not index.cut_short("e", prompt, BS, time.monotonic() + 1.0)
