"""Per-engine KV-event subscriber: SUB + replay DEALER, sequence tracking, feeding the prefix index.

vLLM publishes ``[topic, seq (8-byte big-endian), msgpack(KVEventBatch)]`` on a PUB socket and keeps
the last batches for replay on a ROUTER (``vllm/distributed/kv_events.py``). The subscriber:

- follows vLLM's endpoint rule from the other side (``router.kvfeed.kv_endpoints``);
- on a sequence gap (seq > expected) replays from the first missing seq, then goes on;
- on a duplicate (a seq already applied, same payload) skips the batch;
- on a rewind (seq goes backwards with a different payload) drops the batch and counts it: a
  SUB cannot tell a restarted engine from a forger, so only the engine client's new handshake
  (``engine_restarted``) clears an engine's index; a wipe otherwise comes only from a decoded
  ``AllBlocksCleared`` in this engine's feed;
- counts and skips batches that fail to decode or that the index refuses; never dies on bad
  input (``MAXMSGSIZE`` bounds a frame);
- a SUB it binds (an engine configured to connect to the router) admits only ``allowed_peers``
  when given (a ZAP handler, pyzmq's authenticator, as on the engine client's sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import msgspec
import xxhash
import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from radix import PrefixIndex
from radix.namespace import namespace_for, split_event_extra_keys
from router.kvfeed.kv_endpoints import KVEndpoints, dial_address, engine_binds, offset_endpoint
from wire.engine import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, ext_hook

log = logging.getLogger("kvroute.kvfeed")

END_SEQ = b"\xff" * 8
# The tag of an AllBlocksCleared event in a batch's msgpack: batches without it are not decoded
# to look for one.
_CLEARED = b"AllBlocksCleared"
# Largest KV-event frame accepted: a batch announces at most a scheduler step's new blocks
# (token ids + hashes, a few bytes per token); 64 MiB is ~8M tokens of events in one step.
DEFAULT_MAX_MSG_SIZE = 64 * 1024 * 1024
# Batches remembered per engine (seq -> payload digest) to tell duplicates from restarts.
DUP_WINDOW = 4096
# A replay asks again for what its answer lacked (dropped by the engine's ROUTER) this often.
REPLAY_ROUNDS = 8


def kv_namespace(lora_name: str | None, cache_salt: str | None) -> Hashable:
    """The prefix-index namespace of a request; the same function names event chains."""
    return namespace_for(lora_name, cache_salt)


class KVCounters(msgspec.Struct):
    batches: int = 0
    events: int = 0
    gaps: int = 0
    replays: int = 0
    replayed_batches: int = 0
    lost_batches: int = 0  # a gap replay could not fill (buffer overrun or no replay socket)
    superseded_batches: int = 0  # replayed, but skipped: a later AllBlocksCleared undoes them
    duplicates: int = 0
    resets: int = 0
    rewinds: int = 0  # seq went backwards with new content and no new handshake: dropped
    decode_errors: int = 0
    refused_events: int = 0  # events the index refused (inconsistent fields)
    last_seq: int | None = None
    # Seconds between the engine stamping the last batch and us applying it.
    lag: float = 0.0


class _EngineFeed:
    def __init__(self, spec: KVEndpoints, sub: zmq.asyncio.Socket, sub_address: str) -> None:
        self.spec = spec
        self.sub = sub
        self.sub_address = sub_address
        self.replay: zmq.asyncio.Socket | None = None
        self.expected: int | None = None  # next seq; None until the first batch
        self.recent: OrderedDict[int, int] = OrderedDict()
        self.counters = KVCounters()
        self.applied = asyncio.Event()  # set after every applied batch (tests wait on it)
        # Live batches and explicit resyncs share the replay socket and the sequence state.
        self.lock = asyncio.Lock()


class KVSubscriber:
    """Subscribes to many engines' KV events and applies them to ``sink``: the router's
    ``radix.PrefixIndex`` (its ``apply_stored`` / ``apply_removed`` / ``apply_cleared``; tests
    pass stand-ins with the same three methods). ``namespace`` seeds chains that start at block
    0 (no parent); a child block continues its parent's chain (vLLM puts the cache_salt in the
    first block's extra keys only)."""

    def __init__(
        self,
        sink: PrefixIndex,
        *,
        replay_timeout: float = 2.0,
        max_msg_size: int = DEFAULT_MAX_MSG_SIZE,
        allowed_peers: Sequence[str] | None = None,
    ) -> None:
        self.sink = sink
        self.replay_timeout = replay_timeout
        self.max_msg_size = max_msg_size
        # IP addresses admitted on the SUB sockets this subscriber binds; None: any peer that
        # reaches the bound interface.
        self.allowed_peers = tuple(allowed_peers) if allowed_peers is not None else None
        self._auth: AsyncioAuthenticator | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._feeds: dict[str, _EngineFeed] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch, ext_hook=ext_hook)

    async def __aenter__(self) -> KVSubscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        if self.allowed_peers is not None:
            self._auth = AsyncioAuthenticator(self._ctx, log=log)
            self._auth.start()
            self._auth.allow(*self.allowed_peers)

    async def close(self) -> None:
        for name in list(self._feeds):
            await self.remove_engine(name)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def counters(self, engine: str) -> KVCounters:
        return self._feeds[engine].counters

    def add_engine(self, spec: KVEndpoints) -> str:
        """Open the engine's SUB (and replay DEALER); returns the SUB's bound/dialled address."""
        if self._ctx is None:
            raise RuntimeError("KVSubscriber.start() first")
        if spec.engine in self._feeds:
            raise ValueError(f"engine {spec.engine!r} already subscribed")
        endpoint = offset_endpoint(spec.endpoint, spec.dp_rank)
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.MAXMSGSIZE, self.max_msg_size)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, spec.topic.encode())
        if engine_binds(endpoint):
            address = dial_address(endpoint, spec.host)
            sub.connect(address)
        else:
            if self._auth is not None:
                # A NULL-mechanism socket consults the ZAP handler only with a domain set.
                sub.zap_domain = b"kvroute-engines"
            sub.bind(endpoint)
            address = sub.getsockopt_string(zmq.LAST_ENDPOINT)
        feed = _EngineFeed(spec, sub, address)
        if spec.replay_endpoint:
            feed.replay = self._replay_socket(spec)
        self._feeds[spec.engine] = feed
        self._tasks[spec.engine] = asyncio.create_task(self._run(feed), name=f"kv-{spec.engine}")
        return address

    async def remove_engine(self, engine: str) -> None:
        task = self._tasks.pop(engine, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        feed = self._feeds.pop(engine, None)
        if feed is not None:
            feed.sub.close(linger=0)
            if feed.replay is not None:
                feed.replay.close(linger=0)

    async def wait_applied(self, engine: str, timeout: float) -> None:
        """Wait for the next applied batch of ``engine`` (for tests and tools)."""
        feed = self._feeds[engine]
        feed.applied.clear()
        async with asyncio.timeout(timeout):
            await feed.applied.wait()

    async def resync(self, engine: str) -> None:
        """Catch up now from the engine's replay buffer (after the last applied seq)."""
        feed = self._feeds[engine]
        async with feed.lock:
            await self._replay(feed, 0 if feed.expected is None else feed.expected)

    async def engine_restarted(self, engine: str) -> None:
        """A new process serves this engine (the client saw a new handshake): forget the old
        one's blocks and rebuild from the new process's replay buffer.

        Seq detection alone misses a restart when the new process has already published past
        the old sequence by the time we hear from it.
        """
        feed = self._feeds[engine]
        async with feed.lock:
            feed.counters.resets += 1
            self._clear(feed)
            feed.expected = 0
            await self._replay(feed, 0)

    def _replay_socket(self, spec: KVEndpoints) -> zmq.asyncio.Socket:
        assert self._ctx is not None and spec.replay_endpoint
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_msg_size)
        # An engine sends its whole answer at once through a ROUTER, which DROPS what does not
        # fit our queue (vLLM keeps 10,000 batches): the I/O thread must take it all in while
        # the loop is busy, or the answer loses its end and is dropped whole. Its size is bounded
        # by the engine's buffer.
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(dial_address(offset_endpoint(spec.replay_endpoint, spec.dp_rank), spec.host))
        return sock

    async def _run(self, feed: _EngineFeed) -> None:
        while True:
            frames = await feed.sub.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                feed.counters.decode_errors += 1
                continue
            try:
                await self.on_batch(feed.spec.engine, int.from_bytes(frames[1], "big"), frames[2])
            except Exception:
                # One bad batch must not end the feed: count it, log it, read the next.
                feed.counters.decode_errors += 1
                log.exception("engine %s: a KV-event batch failed", feed.spec.engine)

    async def on_batch(self, engine: str, seq: int, payload: bytes) -> None:
        """Sequence bookkeeping for one live batch, then apply it (public for tests)."""
        feed = self._feeds[engine]
        async with feed.lock:
            await self._on_batch(feed, seq, payload)

    async def _on_batch(self, feed: _EngineFeed, seq: int, payload: bytes) -> None:
        c = feed.counters
        if feed.expected is None:
            # A late joiner (router restart) rebuilds from the engine's replay buffer.
            feed.expected = 0
        if seq < feed.expected:
            digest = feed.recent.get(seq)
            if digest is not None and digest == xxhash.xxh3_64_intdigest(payload):
                c.duplicates += 1
                return
            # Backwards with new content: a new engine process announces itself with a new
            # handshake (engine_restarted), so this batch is a stranger's or stale: dropped.
            c.rewinds += 1
            return
        if seq > feed.expected:
            c.gaps += 1
            await self._replay(feed, feed.expected)
            if seq < feed.expected:
                return  # the replay covered this batch
            if seq > feed.expected:
                c.lost_batches += seq - feed.expected
        self._apply(feed, seq, payload)

    async def _replay(self, feed: _EngineFeed, start: int) -> None:
        """Catch up from the engine's replay buffer, from ``start`` on.

        The whole answer is read before any of it is applied, and what an AllBlocksCleared in
        it supersedes is skipped: an engine that has run a while answers with thousands of
        batches of blocks long gone, and applying them one by one would keep the index wrong
        (and the feed's lock held) for seconds. The engine sends its answer at once through a
        ROUTER that drops what its queue cannot hold (vLLM's), so an answer may come with holes
        or without its end: the holes after the last clear are asked for again, from the first,
        for up to REPLAY_ROUNDS rounds while each brings something new. A replay that stops
        answering is dropped whole (``replay_timeout`` without a frame and nothing new):
        applying part of a history leaves blocks in the index that the missing rest removed."""
        if feed.replay is None:
            return
        c = feed.counters
        got: dict[int, bytes] = {}  # what is kept: since the last AllBlocksCleared received
        cleared = -1  # the seq of that clear
        superseded: set[int] = set()  # what came before it
        fresh = 0

        def take(seq: int, payload: bytes) -> None:
            nonlocal got, cleared, fresh
            if seq in got or seq in superseded:
                return
            fresh += 1
            if seq < cleared:  # a hole filled again, before the clear that undoes it
                superseded.add(seq)
                return
            got[seq] = payload
            if _CLEARED in payload and self._clears(payload):
                # What came before it goes now: a long history is not held whole.
                cleared = seq
                superseded.update(s for s in got if s < seq)
                got = {s: p for s, p in got.items() if s >= seq}

        ask = start
        for _ in range(REPLAY_ROUNDS):
            fresh = 0
            complete = await self._replay_round(feed, ask, take)
            if not fresh and not complete:
                return  # the engine stopped answering: nothing applied
            kept = sorted(got)
            hole = next((a + 1 for a, b in zip(kept, kept[1:], strict=False) if b != a + 1),
                        None)
            if hole is None and not complete and kept:
                hole = kept[-1] + 1  # the end was lost: ask for what follows the last
            if hole is None or not fresh:
                break
            ask = hole
        c.superseded_batches += len(superseded)
        skipped = bool(superseded)
        for seq in sorted(got):
            expected = feed.expected if feed.expected is not None else 0
            if seq < expected:
                continue
            if seq > expected and not skipped:
                # The engine's buffer no longer holds what we missed (or it never came).
                c.lost_batches += seq - expected
            skipped = False  # what an applied clear superseded is not lost
            c.replayed_batches += 1
            self._apply(feed, seq, got[seq])

    async def _replay_round(self, feed: _EngineFeed, start: int,
                            take: Callable[[int, bytes], None]) -> bool:
        """Ask for the batches from ``start`` on, each handed to ``take`` as it comes; whether
        the end marker came."""
        assert feed.replay is not None
        feed.counters.replays += 1
        await feed.replay.send_multipart((b"", start.to_bytes(8, "big")))
        while True:
            if not await feed.replay.poll(int(self.replay_timeout * 1000)):
                # The replay socket may be wedged mid-answer: start afresh next time.
                self._reset_replay_socket(feed)
                return False
            frames = await feed.replay.recv_multipart()
            if len(frames) != 4:
                feed.counters.decode_errors += 1
                continue
            _, _topic, seq_bytes, payload = frames
            if seq_bytes == END_SEQ:
                return True
            take(int.from_bytes(seq_bytes, "big"), payload)

    def _clears(self, payload: bytes) -> bool:
        """Does this batch hold an AllBlocksCleared (not just the word, say in a LoRA name)?"""
        try:
            return any(isinstance(ev, AllBlocksCleared)
                       for ev in self._decoder.decode(payload).events)
        except (msgspec.DecodeError, ValueError):
            return False

    def _reset_replay_socket(self, feed: _EngineFeed) -> None:
        if feed.replay is None or self._ctx is None or not feed.spec.replay_endpoint:
            return
        feed.replay.close(linger=0)
        feed.replay = self._replay_socket(feed.spec)

    def _clear(self, feed: _EngineFeed) -> None:
        feed.recent.clear()
        self.sink.apply_cleared(feed.spec.engine)

    def _apply(self, feed: _EngineFeed, seq: int, payload: bytes) -> None:
        c = feed.counters
        feed.expected = seq + 1
        c.last_seq = seq
        feed.recent[seq] = xxhash.xxh3_64_intdigest(payload)
        if len(feed.recent) > DUP_WINDOW:
            feed.recent.popitem(last=False)
        try:
            batch = self._decoder.decode(payload)
        except (msgspec.DecodeError, ValueError):
            c.decode_errors += 1
            return
        c.batches += 1
        # vLLM stamps batches with time.time(): lag is only meaningful on one host.
        c.lag = max(0.0, time.time() - batch.ts)
        # The index's clock is the router's monotonic one: the routes noted optimistically
        # expire on it, and a wall-clock "now" would expire every one at each event.
        now = time.monotonic()
        engine = feed.spec.engine
        for ev in batch.events:
            c.events += 1
            try:
                self._apply_event(engine, ev, now)
            except (ValueError, TypeError, KeyError, IndexError):
                c.refused_events += 1
        feed.applied.set()

    def _apply_event(self, engine: str, ev: object, now: float) -> None:
        sink = self.sink
        if isinstance(ev, BlockStored):
            salt, residual = split_event_extra_keys(ev.lora_name, ev.extra_keys)
            sink.apply_stored(
                engine,
                ev.block_hashes,
                ev.parent_block_hash,
                ev.token_ids,
                namespace_for(ev.lora_name, salt),
                now,
                block_size=ev.block_size,
                extra_keys=residual,
                group_idx=ev.group_idx,
                kind=ev.kv_cache_spec_kind,
                medium=ev.medium,
            )
        elif isinstance(ev, BlockRemoved):
            sink.apply_removed(
                engine, ev.block_hashes, group_idx=ev.group_idx, medium=ev.medium, now=now
            )
        elif isinstance(ev, AllBlocksCleared):
            sink.apply_cleared(engine)


__all__ = [
    "KVCounters",
    "KVEndpoints",
    "KVSubscriber",
    "dial_address",
    "engine_binds",
    "kv_namespace",
    "offset_endpoint",
]
