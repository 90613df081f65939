"""Sim engine block pool: refcounted KV blocks, chained-hash prefix cache, LRU eviction, KV events.

Mirrors vLLM's ``v1/core/block_pool.py`` semantics that a router can observe:
- block 0 is vLLM's null block, so ``num_gpu_blocks - 1`` blocks are usable;
- only FULL blocks are hashed and announced (``BlockStored``), once per caching call, with the
  concatenated tokens; a recomputed block whose hash is already cached is stored again under the
  same hash (vLLM keeps several blocks per hash and announces each);
- freed blocks stay cached; eviction is lazy, when a free block is reused, and emits one
  ``BlockRemoved`` per evicted block; unhashed free blocks are reused first (LIFO), hashed ones
  in LRU order (a request frees its blocks tail first, so tails go before shared heads);
- ``reset`` succeeds only when no block is referenced and then emits ``AllBlocksCleared``.
Block hashes are the sim's own (xxh3 over parent, tokens and namespace), unsigned 64-bit.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

import xxhash

from wire.engine import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

MEDIUM = "GPU"


def namespace_root(lora_name: str | None, lora_path: str | None, cache_salt: str | None) -> int:
    """The parent of block 0: vLLM folds LoRA and cache_salt into the extra keys of the hash."""
    if lora_name is None and cache_salt is None:
        return 0
    key = f"{lora_name!r}\x00{lora_path!r}\x00{cache_salt!r}".encode()
    return xxhash.xxh3_64_intdigest(key)


def chain_hashes(tokens: Sequence[int], block_size: int, root: int, hashes: list[int]) -> list[int]:
    """Extend ``hashes`` (the chain so far) with every further full block of ``tokens``."""
    parent = hashes[-1] if hashes else root
    for start in range(len(hashes) * block_size, len(tokens) - block_size + 1, block_size):
        body = array("q", tokens[start : start + block_size]).tobytes()
        parent = xxhash.xxh3_64_intdigest(body, seed=parent)
        hashes.append(parent)
    return hashes


class BlockPool:
    """Fixed pool of KV blocks with refcounts, a hash -> blocks map and a pending-event queue."""

    def __init__(self, num_gpu_blocks: int, block_size: int, *, enable_events: bool) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be >= 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.enable_events = enable_events
        self.ref_cnt = [0] * num_gpu_blocks
        self.block_hash: list[int | None] = [None] * num_gpu_blocks
        # hash -> block ids holding it (insertion ordered); a lookup takes the first.
        self.cached: dict[int, dict[int, None]] = {}
        # Free blocks, front evicted/reused first. Block 0 (null) is never free.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_gpu_blocks))
        self.events: list[KVEvent] = []
        # Prefix-cache stats since the last take_stats(): requests, queried tokens, hit tokens.
        self.stat_requests = 0
        self.stat_queries = 0
        self.stat_hits = 0
        self.stat_reset = False

    @property
    def num_usable(self) -> int:
        return self.num_gpu_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_usable

    def longest_hit(self, block_hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of ``block_hashes`` (at most ``max_blocks``)."""
        hit: list[int] = []
        cached = self.cached
        for h in block_hashes[:max_blocks]:
            holders = cached.get(h)
            if not holders:
                break
            hit.append(next(iter(holders)))
        return hit

    def record_query(self, num_tokens: int, num_hits: int) -> None:
        self.stat_requests += 1
        self.stat_queries += num_tokens
        self.stat_hits += num_hits

    def take_stats(self) -> dict[str, object]:
        """vLLM ``PrefixCacheStats`` as a map, reset after each read (one per scheduler step)."""
        stats: dict[str, object] = {
            "reset": self.stat_reset,
            "requests": self.stat_requests,
            "queries": self.stat_queries,
            "hits": self.stat_hits,
            "preempted_requests": 0,
            "preempted_queries": 0,
            "preempted_hits": 0,
            "hits_by_source": {},
        }
        self.stat_requests = self.stat_queries = self.stat_hits = 0
        self.stat_reset = False
        return stats

    def num_allocatable(self, hit_blocks: Sequence[int]) -> int:
        """Free blocks left for new allocations once ``hit_blocks`` are touched."""
        evictable_hits = sum(1 for b in hit_blocks if self.ref_cnt[b] == 0)
        return len(self.free) - evictable_hits

    def touch(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if self.ref_cnt[b] == 0:
                del self.free[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the front of the free queue, evicting their cached hashes."""
        if n > len(self.free):
            raise ValueError(f"cannot allocate {n} blocks, {len(self.free)} free")
        out: list[int] = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                self._uncache(b, h)
                if self.enable_events:
                    self.events.append(BlockRemoved(block_hashes=[h], medium=MEDIUM, group_idx=0))
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def _uncache(self, block: int, h: int) -> None:
        holders = self.cached[h]
        del holders[block]
        if not holders:
            del self.cached[h]
        self.block_hash[block] = None

    def cache_full_blocks(
        self,
        blocks: Sequence[int],
        hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: list[int],
        *,
        lora_id: int | None,
        lora_name: str | None,
        extra_keys: list[list[object] | None],
    ) -> None:
        """Register newly full blocks under their hashes and queue one ``BlockStored``."""
        for b, h in zip(blocks, hashes, strict=True):
            assert self.block_hash[b] is None, "a full block is cached once"
            self.block_hash[b] = h
            self.cached.setdefault(h, {})[b] = None
        if self.enable_events and blocks:
            self.events.append(
                BlockStored(
                    block_hashes=list(hashes),
                    parent_block_hash=parent_hash,
                    token_ids=token_ids,
                    block_size=self.block_size,
                    lora_id=lora_id,
                    medium=MEDIUM,
                    lora_name=lora_name,
                    extra_keys=extra_keys,
                    group_idx=0,
                    # vLLM's KVCacheManager annotates stored blocks with their group's spec.
                    kv_cache_spec_kind="full_attention",
                )
            )

    def free_blocks(self, ordered: Sequence[int]) -> None:
        """Drop one reference each; ``ordered`` runs from evict-first to evict-last."""
        for b in ordered:
            self.ref_cnt[b] -= 1
            assert self.ref_cnt[b] >= 0
            if self.ref_cnt[b] == 0:
                self.free[b] = None
                if self.block_hash[b] is None:
                    # Never-cached blocks can serve no hit: reuse them before cached ones.
                    self.free.move_to_end(b, last=False)

    def reset(self) -> bool:
        if len(self.free) != self.num_usable:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_gpu_blocks
        self.stat_reset = True
        if self.enable_events:
            self.events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events
