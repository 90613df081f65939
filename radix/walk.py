"""The match walk: one pass over a prompt's block keys for all engines of one block size."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import compress
from operator import is_not
from typing import NamedTuple

from radix.optimistic import Optimistic, mask_of
from radix.prompt import PromptKeys
from radix.stamps import SEQ_BITS

_ONE = ord("1")


class Walk(NamedTuple):
    # (depth in blocks, engine bitmask) per group of engines that left the walk together; the
    # engines of one group share one answer, so nothing below is per engine.
    confirmed: list[tuple[int, int]]  # leading blocks held
    optimistic: list[tuple[int, int]]  # leading blocks held or optimistic
    keys: list[int]  # the blocks some engine holds confirmed (renewed for the LRU)
    values: list[int | None]


def select(mask: int, by_bit: list[str | None]) -> Iterator[str | None]:
    """``by_bit[i]`` for each set bit i of ``mask``, by C-level passes (fleets of 64 engines)."""
    return compress(by_bit, map(_ONE.__eq__, bin(mask)[:1:-1].encode()))


def walk(
    nodes: dict[int, int], pending: Optimistic, prompt: PromptKeys, size: int,
    engines_mask: int, now: float
) -> Walk:
    """One pass over the prompt's blocks for every engine of this block size: each engine
    leaves the walk at the first block it lacks, so the cost is O(blocks + engines)."""
    get = nodes.get
    opt = pending if pending else None
    n = prompt.blocks(size)
    alive_c = alive_o = engines_mask
    confirmed: list[tuple[int, int]] = []
    optimistic: list[tuple[int, int]] = []
    values: list[int | None] = []
    depth, deepest, stopped = 0, None, False
    chunk = 8
    while depth < n and not stopped:
        # Keys in growing chunks: a miss hashes one small chunk, a long hit few C-level calls
        # (and a note_routed after this match reuses them).
        stop = min(n, depth + chunk)
        chunk_keys = prompt.keys(size, stop)[depth:stop]
        chunk_values = list(map(get, chunk_keys))
        values += chunk_values
        chunk, m = chunk * 4, len(chunk_keys)
        # Only blocks whose holders differ from the block before can change the answer (a run
        # stored by one event shares one value object, a run routed together one optimistic
        # holders dict); found by C-level passes.
        marks = set(compress(range(1, m), map(is_not, chunk_values[1:], chunk_values[:-1])))
        marks.add(0)
        if opt is not None:
            holders = list(map(opt.holders, chunk_keys))
            marks.update(compress(range(1, m), map(is_not, holders[1:], holders[:-1])))
        for i in sorted(marks):
            value = chunk_values[i]
            held = 0 if value is None else value >> SEQ_BITS
            still_c = alive_c & held
            if still_c != alive_c:
                confirmed.append((depth + i, alive_c ^ still_c))
                alive_c = still_c
                if not alive_c and deepest is None:
                    deepest = depth + i
            if opt is not None and (pending_here := holders[i]):
                held |= mask_of(pending_here, now)
            still_o = alive_o & held
            if still_o != alive_o:
                optimistic.append((depth + i, alive_o ^ still_o))
                alive_o = still_o
                if not alive_o:
                    stopped = True
                    break
        if not stopped:
            depth += m
    if alive_c:
        confirmed.append((depth, alive_c))
    if alive_o:
        optimistic.append((depth, alive_o))
    deepest = depth if deepest is None else deepest
    keys = prompt.keys(size, deepest)[:deepest]
    return Walk(confirmed, optimistic, keys, values[:deepest])
