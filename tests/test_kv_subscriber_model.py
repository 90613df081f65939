"""Property: whatever batches a lossy link drops or duplicates, the subscriber's index ends equal
to the index built from every batch in order (replay served by a real ROUTER socket)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.kvfeed.kv_subscriber import END_SEQ, KVEndpoints, KVSubscriber
from tests.engines import NaiveIndex
from wire.engine import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch

BS = 2
ENC = msgspec.msgpack.Encoder()


class ReplayServer:
    """vLLM's replay ROUTER: answers [b"", start] with the published batches >= start + END."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, payloads: list[bytes]) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.bind(endpoint)
        self.payloads = payloads
        self.published = -1  # the engine has published seqs 0..published so far

    async def run(self) -> None:
        while True:
            ident, _, start = await self.sock.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq in range(first, self.published + 1):
                await self.sock.send_multipart(
                    (ident, b"", b"kv", seq.to_bytes(8, "big"), self.payloads[seq])
                )
            await self.sock.send_multipart((ident, b"", b"", END_SEQ, b""))


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[list[KVEvent]], list[int]]:
    """Batches of KV events over a small hash space, and how often each batch is delivered."""
    batches: list[list[KVEvent]] = []
    live: list[int] = []
    next_hash = 1
    for _ in range(draw(st.integers(1, 12))):
        events: list[KVEvent] = []
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["store", "store", "remove", "clear"]))
            if kind == "store":
                n = draw(st.integers(1, 2))
                parent = draw(st.sampled_from([None, *live])) if live else None
                hashes = list(range(next_hash, next_hash + n))
                next_hash += n
                tokens = draw(st.lists(st.integers(0, 3), min_size=n * BS, max_size=n * BS))
                events.append(BlockStored(hashes, parent, tokens, BS, None, "GPU", None))
                live += hashes
            elif kind == "remove" and live:
                gone = draw(st.lists(st.sampled_from(live), min_size=1, max_size=2, unique=True))
                events.append(BlockRemoved(gone, "GPU"))
                live = [h for h in live if h not in gone]
            elif kind == "clear":
                events.append(AllBlocksCleared())
                live = []
        batches.append(events)
    # 0 = dropped, 1 = delivered, 2 = duplicated; the last batch always arrives (it reveals gaps).
    copies = [draw(st.sampled_from([0, 1, 1, 2])) for _ in batches[:-1]] + [1]
    return batches, copies


async def scenario(tmp: Path, batches: list[list[KVEvent]], copies: list[int]) -> None:
    payloads = [ENC.encode(KVEventBatch(float(i), evs)) for i, evs in enumerate(batches)]
    reference = NaiveIndex()
    for evs in batches:
        for ev in evs:
            if isinstance(ev, BlockStored):
                reference.apply_stored("e", ev.block_hashes, ev.parent_block_hash, ev.token_ids,
                                       (None, None), 0.0)  # fmt: skip
            elif isinstance(ev, BlockRemoved):
                reference.apply_removed("e", ev.block_hashes)
            else:
                reference.apply_cleared("e")
    ctx = zmq.asyncio.Context()
    server = ReplayServer(ctx, f"ipc://{tmp}/replay", payloads)
    task = asyncio.create_task(server.run())
    index = NaiveIndex()
    try:
        async with KVSubscriber(index, replay_timeout=5.0) as sub:
            sub.add_engine(KVEndpoints("e", f"ipc://{tmp}/pub", f"ipc://{tmp}/replay"))
            for seq, n in enumerate(copies):
                server.published = seq
                for _ in range(n):
                    await sub.on_batch("e", seq, payloads[seq])
            c = sub.counters("e")
            assert c.last_seq == len(batches) - 1
            assert c.lost_batches == 0 and c.decode_errors == 0
            assert c.duplicates >= sum(1 for n in copies if n == 2)
            assert index.snapshot("e") == reference.snapshot("e")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server.sock.close(linger=0)
        ctx.term()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=histories())
def test_lossy_delivery_converges_to_the_full_history(
    tmp_path: Path, history: tuple[list[list[KVEvent]], list[int]]
) -> None:
    asyncio.run(scenario(tmp_path, *history))
