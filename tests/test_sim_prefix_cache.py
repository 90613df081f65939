"""Invariants of the sim engine's block pool and scheduler, checked by hypothesis state machines.

After every step: refcounts equal the holdings of live requests, capacity is never exceeded, a
referenced block never loses its hash, the hash map agrees with the blocks, lookups agree with a
naive scan, eviction takes the least recently freed block, and replaying every KV event emitted so
far rebuilds exactly the multiset of cached hashes.
"""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from sim.config import KVEventsConfig, SimConfig
from sim.prefix_cache import BlockPool, chain_hashes, namespace_root
from sim.request import SimRequest
from sim.scheduler import Scheduler
from sim.tokens import TokenTable
from wire import engine as wire
from wire.sampling import SamplingParams

BS = 2
# A tiny alphabet and short prompts, so prefixes are shared and the pool churns.
prompts = st.lists(st.integers(1, 3), min_size=1, max_size=12)


def replay_events(events: list[wire.KVEvent]) -> Counter[int]:
    held: Counter[int] = Counter()
    for e in events:
        if isinstance(e, wire.BlockStored):
            assert len(e.token_ids) == len(e.block_hashes) * e.block_size
            held.update(int(h) for h in e.block_hashes)
        elif isinstance(e, wire.BlockRemoved):
            held.subtract(int(h) for h in e.block_hashes)
            assert all(v >= 0 for v in held.values()), "removed a hash never stored"
        else:
            held.clear()
    return +held


def check_pool(pool: BlockPool, holdings: list[list[int]], event_log: list[wire.KVEvent]) -> None:
    refs = Counter(b for blocks in holdings for b in blocks)
    assert pool.ref_cnt[0] == 0 and 0 not in pool.free
    for b in range(1, pool.num_gpu_blocks):
        assert pool.ref_cnt[b] == refs[b], f"block {b}"
        assert (b in pool.free) == (refs[b] == 0)
    assert len(pool.free) + sum(1 for b in refs if refs[b]) == pool.num_usable
    for h, holders in pool.cached.items():
        assert holders and all(pool.block_hash[b] == h for b in holders)
    hashed = Counter(h for h in pool.block_hash if h is not None)
    assert hashed == Counter({h: len(v) for h, v in pool.cached.items()})
    event_log.extend(pool.take_events())
    assert replay_events(event_log) == hashed


class BlockPoolMachine(RuleBasedStateMachine):
    reqs = Bundle("reqs")

    @initialize(num_blocks=st.integers(3, 12))
    def setup(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks, BS, enable_events=True)
        self.live: dict[
            int, tuple[list[int], list[int | None]]
        ] = {}  # id -> (blocks, hashes they hold)
        self.log: list[wire.KVEvent] = []
        self.clock = 0
        self.freed_at: dict[int, int] = {}
        self.next_id = 0

    @rule(target=reqs, tokens=prompts, salt=st.sampled_from([None, "s"]))
    def start(self, tokens: list[int], salt: str | None) -> int:
        pool = self.pool
        hashes = chain_hashes(tokens, BS, namespace_root(None, None, salt), [])
        assert len(hashes) == len(tokens) // BS
        hit = pool.longest_hit(hashes, (len(tokens) - 1) // BS)
        present = {h for h in pool.block_hash if h is not None}
        naive = 0
        while naive < (len(tokens) - 1) // BS and hashes[naive] in present:
            naive += 1
        assert len(hit) == naive and [pool.block_hash[b] for b in hit] == hashes[: len(hit)]
        need = -(-len(tokens) // BS) - len(hit)
        if need > pool.num_allocatable(hit):
            return -1
        hashed_free = [b for b in pool.free if pool.block_hash[b] is not None and b not in hit]
        unhashed_free = [b for b in pool.free if pool.block_hash[b] is None]
        pool.touch(hit)
        new = pool.allocate(need)
        evicted = [b for b in new if b in hashed_free]
        if evicted:
            # Unhashed blocks go first; hashed ones in the order they were freed (LRU).
            assert len(unhashed_free) < need
            oldest = sorted(hashed_free, key=lambda b: self.freed_at[b])[: len(evicted)]
            assert sorted(evicted) == sorted(oldest)
        blocks = hit + new
        full = len(tokens) // BS
        start = len(hit)
        pool.cache_full_blocks(
            blocks[start:full],
            hashes[start:full],
            hashes[start - 1] if start else None,
            tokens[start * BS : full * BS],
            lora_id=None,
            lora_name=None,
            extra_keys=[None] * (full - start),
        )
        rid = self.next_id
        self.next_id += 1
        self.live[rid] = (blocks, [pool.block_hash[b] for b in blocks])
        return rid

    @rule(rid=consumes(reqs))
    def finish(self, rid: int) -> None:
        if rid not in self.live:
            return
        blocks, _ = self.live.pop(rid)
        self.pool.free_blocks(blocks[::-1])
        for b in blocks[::-1]:
            if self.pool.ref_cnt[b] == 0:
                self.clock += 1
                self.freed_at[b] = self.clock

    @rule()
    def reset(self) -> None:
        assert self.pool.reset() == (not self.live)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "pool"):
            return
        check_pool(self.pool, [b for b, _ in self.live.values()], self.log)
        for blocks, hashes in self.live.values():
            # A referenced block is never evicted: the hash it had when cached is still there.
            for b, h in zip(blocks, hashes, strict=True):
                if h is not None:
                    assert self.pool.block_hash[b] == h


TestBlockPool = BlockPoolMachine.TestCase
TestBlockPool.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


class SchedulerMachine(RuleBasedStateMachine):
    """The scheduler over a tiny pool: preemption, chunking, aborts and resets all happen."""

    @initialize(
        num_blocks=st.integers(6, 14),
        max_seqs=st.integers(1, 4),
        budget=st.integers(2, 16),
    )
    def setup(self, num_blocks: int, max_seqs: int, budget: int) -> None:
        config = SimConfig(
            handshake_address="inproc://unused",
            tokens=TokenTable.from_vocab_size(50, (49,)),
            block_size=BS,
            num_gpu_blocks=num_blocks,
            max_model_len=12,
            max_num_seqs=max_seqs,
            max_num_batched_tokens=budget,
            kv_events=KVEventsConfig(enable_kv_cache_events=True),
        )
        self.sched = Scheduler(config)
        self.log: list[wire.KVEvent] = []
        self.emitted: Counter[str] = Counter()
        self.max_tokens: dict[str, int] = {}
        self.finished: set[str] = set()
        self.aborted: set[str] = set()
        self.n = 0

    @rule(tokens=st.lists(st.integers(1, 3), min_size=1, max_size=8), max_tokens=st.integers(1, 5))
    def add(self, tokens: list[int], max_tokens: int) -> None:
        rid = f"r{self.n}"
        self.n += 1
        req = wire.EngineCoreRequest(
            rid, tokens, None, SamplingParams(max_tokens=max_tokens), None, 0.0, None, None, None
        )
        if len(tokens) >= self.sched.config.max_model_len:
            return  # the engine rejects what leaves no room for an output token
        self.sched.add(SimRequest(req, self.n, self.sched.config.max_model_len), 0.0)
        self.max_tokens[rid] = max_tokens

    @precondition(lambda self: hasattr(self, "sched") and self.sched.has_work())
    @rule()
    def step(self) -> None:
        plan = self.sched.schedule(0.0)
        assert sum(n for _, n, _ in plan.scheduled) <= self.sched.config.max_num_batched_tokens
        assert len(self.sched.running) <= self.sched.config.max_num_seqs
        for outs in self.sched.finish(plan).values():
            for o in outs.outputs:
                assert o.request_id not in self.finished
                self.emitted[o.request_id] += len(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)

    @precondition(lambda self: hasattr(self, "sched") and bool(self.sched.requests))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.sched.requests)))
        self.sched.abort([rid])
        self.finished.add(rid)
        self.aborted.add(rid)

    @rule(running=st.booleans())
    def reset(self, running: bool) -> None:
        if not hasattr(self, "sched"):
            return
        ok = self.sched.reset_prefix_cache(running)
        assert ok == (running or not any(r.blocks for r in self.sched.requests.values()))

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "sched"):
            return
        s = self.sched
        live = list(s.requests.values())
        assert {r.request_id for r in live} == {r.request_id for r in [*s.waiting, *s.running]}
        check_pool(s.pool, [r.blocks for r in live], self.log)
        for r in s.running:
            assert len(r.blocks) * BS >= r.num_computed
            assert r.num_cached_blocks <= len(r.blocks)
        for r in s.waiting:
            assert r.blocks == [] and r.num_computed == 0
        for rid, n in self.emitted.items():
            assert n <= self.max_tokens[rid]

    def teardown(self) -> None:
        """Liveness: with no new input, every request finishes (no self-preemption loop)."""
        if not hasattr(self, "sched"):
            return
        for _ in range(500):
            if not self.sched.has_work():
                break
            self.step()
        assert not self.sched.has_work() and not self.sched.requests
        assert self.sched.pool.usage == 0.0
        assert set(self.max_tokens) == self.finished
        for rid, n in self.max_tokens.items():
            if rid not in self.aborted:
                # max_tokens, or cut short by max_model_len (the ids never hit a stop id here)
                assert 1 <= self.emitted[rid] <= n


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
