"""PrefixIndex: which engine holds which token-block prefix, fed by the engines' own KV events.

Layout (memory is the constraint: millions of blocks, <= 200 bytes each):
- ``_nodes``: one dict, chained block key -> ``engine_mask << SEQ_BITS | run``.  A block is one
  key whatever engines hold it; the engines are bits, so a prompt is matched against every engine
  in one walk over its blocks: O(len / block_size + engines), not O(engines x len).
- per engine, ``hashes``: its opaque block hash -> our key (the same int object as the node key),
  which is how removals and parent hashes are resolved.  vLLM's hash functions are never
  reproduced: keys are our own keyed chain over the token ids the events carry (radix/keys.py),
  secret to this index.
- ``seq`` is a logical clock: each store or match takes the next value.  A store's blocks take it
  as their run id; blocks with the same mask and run share one int object, so the value costs
  nothing per block.  A match stamps the runs it reaches (``_last``, radix/stamps.py).  When the
  index outgrows ``max_blocks``, the runs with the oldest stamps go first (least recently
  matched), whole stamps at a time, down to a low-water mark.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from typing import Any, NamedTuple

from radix.keys import KEY_MASK, KeySpace, token_array
from radix.optimistic import Optimistic
from radix.prompt import PromptKeys
from radix.stamps import (
    SEQ_BITS,
    SEQ_MASK,
    Last,
    evict_oldest,
    forget_absent,
    present_runs,
    renew,
    renumber,
)
from radix.walk import select, walk

# Groups whose cached prefix can be resumed from any block boundary.  Sliding-window, chunked-local
# and mamba groups keep only a tail, so their blocks must not extend a prefix match.
FULL_ATTENTION_KINDS = frozenset({None, "full_attention", "mla_attention", "sink_full_attention"})
# The engine's own KV cache; offload tiers (CPU, STORAGE) are not indexed.
DEVICE_MEDIA = frozenset({None, "GPU"})

BlockHash = bytes | int
# Removed blocks remembered per engine (by key, with the time), for ``cut_short``: an engine of
# 2048 blocks under bench/compare.py's cache pressure removes ~300 a second, so these cover the
# policy's 5 s window there, for ~150 KB an engine (the key objects are the ones dropped).
REMOVED_MEMORY = 2048


class Match(NamedTuple):
    """Leading prompt tokens one engine holds: confirmed by events, and with optimistic blocks."""

    confirmed_tokens: int
    optimistic_tokens: int


NO_MATCH = Match(0, 0)


@dataclass(slots=True)
class IndexStats:
    stored_blocks: int = 0
    removed_blocks: int = 0
    evicted_blocks: int = 0
    unknown_parent_events: int = 0
    skipped_events: int = 0  # other attention kinds, groups or media, or malformed


class _Engine:
    __slots__ = ("name", "index", "bit", "block_size", "group", "group_known", "hashes",
                 "removed")

    def __init__(self, name: str, index: int, block_size: int | None) -> None:
        self.name = name
        self.index = index
        self.bit = 1 << index
        self.block_size = block_size
        # The one full-attention KV-cache group indexed (vLLM reuses block hashes across groups).
        self.group: int | None = None
        self.group_known = False
        self.hashes: dict[BlockHash, int] = {}
        # Keys of the blocks it last removed -> when (``apply_removed``'s ``now``), oldest first,
        # at most REMOVED_MEMORY: what :meth:`PrefixIndex.cut_short` asks.
        self.removed: dict[int, float] = {}


def _norm(block_hash: BlockHash) -> BlockHash:
    # 60 bits keep the int small (see keys.KEY_MASK); a clash inside one engine is ~1e-8.
    return block_hash & KEY_MASK if isinstance(block_hash, int) else block_hash


class PrefixIndex:
    """Per-engine cached token blocks.  Time is always passed in as ``now`` (non-decreasing)."""

    def __init__(self, max_blocks: int) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        # Evicting to a low-water mark amortises the sort over max_blocks / 8 insertions.
        self.low_water = max_blocks - max(1, max_blocks // 8)
        self.stats = IndexStats()
        self._nodes: dict[int, int] = {}
        self._last: Last = {}  # run -> latest match (radix/stamps.py)
        self._seq = 0
        self._engines: dict[str, _Engine] = {}
        self._by_index: dict[int, _Engine] = {}
        self._by_bit: list[str | None] = []  # engine name by bit index (None: free)
        self._free: list[int] = []
        self._size_masks: dict[int, int] = {}
        self._optimistic = Optimistic()
        self._space = KeySpace()

    def __len__(self) -> int:
        """Unique cached blocks (held confirmed by at least one engine)."""
        return len(self._nodes)

    # ---- engines ----

    def add_engine(self, engine: str, block_size: int | None = None) -> None:
        """Register an engine; ``block_size=None`` learns it from the first BlockStored."""
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        known = self._engines.get(engine)
        if known is not None:
            if block_size is not None and known.block_size not in (None, block_size):
                raise ValueError(
                    f"engine {engine!r} has block size {known.block_size}, not {block_size}; "
                    "remove_engine() it first"
                )
            if known.block_size is None and block_size is not None:
                self._set_block_size(known, block_size)
            return
        index = heapq.heappop(self._free) if self._free else len(self._by_index)
        eng = _Engine(engine, index, None)
        self._engines[engine] = self._by_index[index] = eng
        if index == len(self._by_bit):
            self._by_bit.append(engine)
        else:
            self._by_bit[index] = engine
        if block_size is not None:
            self._set_block_size(eng, block_size)

    def remove_engine(self, engine: str) -> None:
        eng = self._engines.pop(engine, None)
        if eng is None:
            return
        self._clear(eng)
        del self._by_index[eng.index]
        self._by_bit[eng.index] = None
        heapq.heappush(self._free, eng.index)
        if eng.block_size is not None:
            mask = self._size_masks[eng.block_size] & ~eng.bit
            if mask:
                self._size_masks[eng.block_size] = mask
            else:
                del self._size_masks[eng.block_size]

    def engines(self) -> dict[str, int | None]:
        """Engine name -> block size (None until learned)."""
        return {name: eng.block_size for name, eng in self._engines.items()}

    def engine_blocks(self, engine: str) -> int:
        """Block hashes this engine has announced and not removed."""
        return len(self._engines[engine].hashes)

    def cut_short(self, engine: str, prompt: PromptKeys, tokens: int, since: float) -> bool:
        """Whether ``engine`` removed, at or after ``since``, the block that follows the first
        ``tokens`` tokens of the prompt: its match there ends where the engine is evicting.

        vLLM frees a finished request's blocks tail first, so a cached prefix is evicted from
        its end and what is left of it is the next to go. A match that ends short of the
        prompt because the prompt goes on differently is not cut short."""
        eng = self._engines.get(engine)
        if eng is None or not eng.removed or eng.block_size is None:
            return False
        size = eng.block_size
        n, rest = divmod(tokens, size)
        if rest or n >= self._own(prompt).blocks(size):
            return False
        at = eng.removed.get(prompt.keys(size, n + 1)[n])
        return at is not None and at >= since

    def _set_block_size(self, eng: _Engine, block_size: int) -> None:
        eng.block_size = block_size
        self._size_masks[block_size] = self._size_masks.get(block_size, 0) | eng.bit

    # ---- KV events ----

    def apply_stored(
        self,
        engine: str,
        block_hashes: Sequence[BlockHash],
        parent_block_hash: BlockHash | None,
        token_ids: Sequence[int],
        namespace: Hashable,
        now: float,
        *,
        block_size: int | None = None,
        extra_keys: Sequence[Any | None] | None = None,
        group_idx: int | None = None,
        kind: str | None = None,
        medium: str | None = None,
    ) -> int:
        """Apply one BlockStored; returns the number of blocks indexed.

        ``namespace`` only seeds chains that start at block 0 (no parent): a child continues its
        parent's chain, which already carries the namespace.  ``extra_keys`` are the residual
        per-block keys (see :func:`radix.namespace.split_event_extra_keys`).  A parent hash this
        engine never announced (the router joined late) indexes nothing: no false match.
        """
        eng = self._engines[engine]
        n = len(block_hashes)
        if n == 0:
            return 0
        size = self._stored_size(eng, n, len(token_ids), block_size, group_idx, kind, medium)
        if size is None:
            self.stats.skipped_events += 1
            return 0
        if parent_block_hash is None:
            seed = self._space.root(size, namespace)
        else:
            parent_key = eng.hashes.get(_norm(parent_block_hash))
            if parent_key is None:
                self.stats.unknown_parent_events += 1
                return 0
            seed = parent_key
        try:
            tokens = token_array(token_ids)
        except (OverflowError, TypeError):
            self.stats.skipped_events += 1
            return 0
        keys = (
            self._space.chain(tokens, size, seed)
            if not extra_keys
            else self._space.chain_with_extras(tokens, size, seed, extra_keys)
        )
        # int hashes cut by a C-level pass; bytes (older vLLM) give NotImplemented there.
        hs: list[BlockHash] = list(map(KEY_MASK.__and__, block_hashes))  # type: ignore[arg-type]
        if NotImplemented in hs:
            hs = [_norm(h) for h in block_hashes]
        self._optimistic.purge(now)
        nodes, hashes, bit = self._nodes, eng.hashes, eng.bit
        # The per-block work below is C-level map/update calls: ingest is the router's hot path.
        olds = list(map(hashes.get, hs))
        if olds.count(None) != n:
            for old, key in zip(olds, keys, strict=True):
                # A reused hash no longer names its old block (released before this event's
                # blocks are held, so an old block the event names again stays held).
                if old is not None and old != key:
                    self._clear_bit(old, eng)
        hashes.update(zip(hs, keys, strict=True))
        seq = self._tick()
        fresh = (bit << SEQ_BITS) | seq
        values = list(map(nodes.get, keys))
        if values.count(None) == n:
            nodes.update(dict.fromkeys(keys, fresh))
        else:
            shared = {v: (((v >> SEQ_BITS) | bit) << SEQ_BITS) | seq for v in set(values) if v}
            nodes.update(zip(keys, [fresh if v is None else shared[v] for v in values],
                             strict=True))
        if self._optimistic:
            self._optimistic.discard_many(keys, eng.index)
        self.stats.stored_blocks += n
        if len(nodes) > self.max_blocks:
            self._evict()
        return n

    def _stored_size(self, eng: _Engine, n: int, n_tokens: int, block_size: int | None,
                     group_idx: int | None, kind: str | None, medium: str | None) -> int | None:
        """A BlockStored's block size; None for one the index skips: not full attention on the
        device, tokens that do not fill its blocks, another size or group than the engine's."""
        if kind not in FULL_ATTENTION_KINDS or medium not in DEVICE_MEDIA:
            return None
        size = block_size if block_size is not None else n_tokens // n
        if n_tokens != n * size or size < 1 or eng.block_size not in (None, size):
            return None
        if not self._accept_group(eng, group_idx):
            return None
        if eng.block_size is None:
            self._set_block_size(eng, size)
        return size

    def apply_removed(
        self,
        engine: str,
        block_hashes: Sequence[BlockHash],
        *,
        group_idx: int | None = None,
        medium: str | None = None,
        now: float | None = None,
    ) -> int:
        """Apply one BlockRemoved; returns the number of known blocks dropped. With ``now``, the
        dropped blocks are remembered as removed then (:meth:`cut_short`)."""
        eng = self._engines[engine]
        if medium not in DEVICE_MEDIA or (
            group_idx is not None and eng.group_known and group_idx != eng.group
        ):
            self.stats.skipped_events += 1
            return 0
        dropped = 0
        memo: dict[int, int] = {}
        removed = eng.removed
        for block_hash in block_hashes:
            key = eng.hashes.pop(_norm(block_hash), None)
            if key is None:
                continue
            self._clear_bit(key, eng, memo)
            self._optimistic.discard(key, eng.index)
            dropped += 1
            if now is not None:
                removed.pop(key, None)  # to the end: the dict stays oldest first
                removed[key] = now
        self.stats.removed_blocks += dropped
        if len(removed) > REMOVED_MEMORY:
            for key in list(islice(removed, len(removed) - REMOVED_MEMORY)):
                del removed[key]
        return dropped

    def apply_cleared(self, engine: str) -> None:
        """Apply AllBlocksCleared: the engine holds none of the blocks it announced.

        Its optimistic entries stay, to expire or be confirmed as usual: they stand for requests
        routed there that will store their blocks when they run, and a clear does not undo a
        route. An engine resets its cache only with no block in use (vLLM's
        ``reset_prefix_cache``), and publishes the clear with its NEXT step's events, so the
        clear arrives after the requests routed since were noted: dropping their entries made
        each of them look cold to the next request of the same prefix."""
        self._clear(self._engines[engine], routed=False)

    def _accept_group(self, eng: _Engine, group_idx: int | None) -> bool:
        if group_idx is None:
            return True
        if not eng.group_known:
            eng.group, eng.group_known = group_idx, True
        return group_idx == eng.group

    def _clear(self, eng: _Engine, *, routed: bool = True) -> None:
        """Drop what ``eng`` announced, and with ``routed`` its optimistic entries too."""
        memo: dict[int, int] = {}
        for key in eng.hashes.values():
            self._clear_bit(key, eng, memo)
        eng.hashes.clear()
        eng.removed.clear()  # nothing left to evict
        if routed:
            self._optimistic.drop_engine(eng.index)

    def _clear_bit(self, key: int, eng: _Engine, memo: dict[int, int] | None = None) -> None:
        """Drop one engine from a block; ``memo`` keeps blocks that shared a value sharing one."""
        value = self._nodes.get(key)
        if value is None:
            return
        new = memo.get(value) if memo is not None else None
        if new is None:
            mask = (value >> SEQ_BITS) & ~eng.bit
            new = (mask << SEQ_BITS) | (value & SEQ_MASK) if mask else 0
            if memo is not None:
                memo[value] = new
        if new:
            self._nodes[key] = new
        else:
            del self._nodes[key]

    # ---- routing ----

    def prepare(self, tokens: Sequence[int], namespace: Hashable) -> PromptKeys:
        """The prompt's block keys, computed lazily and once: pass the result to
        :meth:`match_keys` and :meth:`note_routed_keys` so a routing decision hashes once."""
        return PromptKeys(tokens, namespace, self._space)

    def _own(self, prompt: PromptKeys) -> PromptKeys:
        if prompt.space is not self._space:
            raise ValueError("PromptKeys from another index: use this index's prepare()")
        return prompt

    def note_routed(
        self, engine: str, tokens: Sequence[int], namespace: Hashable, now: float, ttl: float
    ) -> int:
        """Mark the full blocks of a prompt just routed to ``engine`` as optimistic until
        ``now + ttl``; returns how many blocks were marked (confirmed ones need no mark)."""
        return self.note_routed_keys(engine, self.prepare(tokens, namespace), now, ttl)

    def note_routed_keys(self, engine: str, prompt: PromptKeys, now: float, ttl: float) -> int:
        """:meth:`note_routed` for a prompt from :meth:`prepare`."""
        eng = self._engines[engine]
        self._own(prompt)
        size = eng.block_size
        if size is None:
            return 0
        self._optimistic.purge(now)
        n = prompt.blocks(size)
        keys = prompt.keys(size, n)[:n]
        bit = eng.bit
        values = list(map(self._nodes.get, keys))
        # Decided once per distinct node value (a stored run shares one), applied by C-level passes.
        distinct = set(values)
        lacking = {v for v in distinct if v is None or not (v >> SEQ_BITS) & bit}
        unheld = keys if len(lacking) == len(distinct) else list(
            compress(keys, map(lacking.__contains__, values)))
        self._optimistic.add(unheld, eng.index, now + ttl)
        return len(unheld)

    def forget_routed(self, engine: str, tokens: Sequence[int], namespace: Hashable) -> None:
        """Drop ``engine``'s optimistic blocks for a prompt routed there that will not run (the
        engine refused it, or it failed before the prefill): nothing will confirm them. Blocks
        the engine announced stay; an unknown engine is ignored (it left meanwhile)."""
        eng = self._engines.get(engine)
        if eng is None or eng.block_size is None:
            return
        prompt = self.prepare(tokens, namespace)
        n = prompt.blocks(eng.block_size)
        self._optimistic.discard_many(prompt.keys(eng.block_size, n)[:n], eng.index)

    def match(self, tokens: Sequence[int], namespace: Hashable, now: float) -> dict[str, Match]:
        """Per engine, the leading prompt tokens cached: confirmed, and confirmed plus unexpired
        optimistic.  Renews, for the LRU, the stored runs of the blocks matched (confirmed)."""
        return self.match_keys(self.prepare(tokens, namespace), now)

    def match_keys(self, prompt: PromptKeys, now: float) -> dict[str, Match]:
        """:meth:`match` for a prompt from :meth:`prepare`."""
        self._own(prompt)
        self._optimistic.purge(now)
        out = dict.fromkeys(self._engines, NO_MATCH)
        if not self._size_masks:
            return out
        for size, engines_mask in sorted(self._size_masks.items()):
            w = walk(self._nodes, self._optimistic, prompt, size, engines_mask, now)
            # Engines that left the walk together share one Match: no per-engine Python work.
            for blocks_o, mask_o in w.optimistic:
                if not blocks_o:
                    continue  # optimistic 0 implies confirmed 0: NO_MATCH already
                for blocks_c, mask_c in w.confirmed:
                    if both := mask_o & mask_c:
                        out.update(dict.fromkeys(select(both, self._by_bit),  # type: ignore[arg-type]
                                                 Match(blocks_c * size, blocks_o * size)))
            if w.held:
                renew(self._last, w.held, self._tick())
        if len(self._last) > 1024 + len(self._nodes) // 4:
            # Stamps of runs since removed: a pass over the index per len / 4 new stamps.
            forget_absent(self._last, present_runs(self._nodes))
        return out

    # ---- LRU ----

    def _tick(self) -> int:
        if self._seq >= SEQ_MASK:
            self._seq = renumber(self._nodes, self._last)
        self._seq += 1
        return self._seq

    def _evict(self) -> None:
        self.stats.evicted_blocks += evict_oldest(self._nodes, self.low_water, self._last)
