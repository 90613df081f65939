"""The match walk: one pass over a prompt's block keys for all engines of one block size."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import compress, groupby
from operator import itemgetter
from typing import NamedTuple, cast

from radix.optimistic import Optimistic, mask_of
from radix.prompt import PromptKeys
from radix.stamps import SEQ_BITS

_ONE = ord("1")


class Walk(NamedTuple):
    # (depth in blocks, engine bitmask) per group of engines that left the walk together; the
    # engines of one group share one answer, so nothing below is per engine.
    confirmed: list[tuple[int, int]]  # leading blocks held
    optimistic: list[tuple[int, int]]  # leading blocks held or optimistic
    # A value per run of equal values over the blocks some engine holds confirmed: their runs
    # are renewed for the LRU.
    held: list[int]


def select(mask: int, by_bit: list[str | None]) -> Iterator[str | None]:
    """``by_bit[i]`` for each set bit i of ``mask``, by C-level passes (fleets of 64 engines)."""
    return compress(by_bit, map(_ONE.__eq__, bin(mask)[:1:-1].encode()))


def _run_starts(items: Sequence[object]) -> list[int]:
    """Where each run of equal items starts: ``groupby`` compares neighbours in C (identity
    first), so a 2,048-block run stored by one event costs no Python-level step per block."""
    starts, at = [], 0
    for _, run in groupby(items):
        starts.append(at)
        at += len(list(run))
    return starts


def _values(nodes: dict[int, int], keys: list[int], need_all: bool) -> Sequence[int | None]:
    """``nodes.get`` of each key; without ``need_all``, up to the first key absent (its value
    None ends every engine's confirmed run, so nothing past it matters). With ``need_all`` the
    keys are looked up by one ``map``: itemgetter would raise (a KeyError built in C, caught
    here) on every prompt that is not fully held."""
    if len(keys) > 1 and not need_all:
        try:
            found: tuple[int, ...] = itemgetter(*keys)(nodes)  # C-level, cheaper than map(get)
            return found
        except KeyError as missing:
            return list(map(nodes.get, keys[: keys.index(missing.args[0]) + 1]))
    return list(map(nodes.get, keys))


def walk(
    nodes: dict[int, int], pending: Optimistic, prompt: PromptKeys, size: int,
    engines_mask: int, now: float
) -> Walk:
    """One pass over the prompt's blocks for every engine of this block size: each engine
    leaves the walk at the first block it lacks, so the cost is O(blocks + engines).

    A prompt whose first block nobody holds (a cold prompt) is answered from that block's key
    alone: the rest are hashed later, by the note_routed that follows the decision, off the
    request's way to its engine. Otherwise all the keys are hashed at once (vectorised; that
    note needs them all anyway), then looked up by C-level passes that stop at the first block
    nobody holds when no optimistic entries exist.
    """
    opt = pending if pending else None
    n = prompt.blocks(size)
    if n:
        first = prompt.keys(size, 1)[0]
        if first not in nodes and (opt is None or not opt.holders(first)):
            return Walk([(0, engines_mask)], [(0, engines_mask)], [])
    keys = prompt.keys(size, n)
    keys = keys if len(keys) == n else keys[:n]
    values = _values(nodes, keys, opt is not None)
    alive_c = alive_o = engines_mask
    confirmed: list[tuple[int, int]] = []
    optimistic: list[tuple[int, int]] = []
    deepest = None
    # Only blocks whose holders differ from the block before can change the answer (a run
    # stored by one event shares one value, a run routed together one optimistic holders).
    runs = _run_starts(values)
    marks = set(runs)
    if opt is not None:
        holders = list(map(opt.holders, keys))
        marks.update(_run_starts(holders))
    depth = len(values)
    for i in sorted(marks):
        value = values[i]
        held = 0 if value is None else value >> SEQ_BITS
        still_c = alive_c & held
        if still_c != alive_c:
            confirmed.append((i, alive_c ^ still_c))
            alive_c = still_c
            if not alive_c and deepest is None:
                deepest = i
        if opt is not None and (pending_here := holders[i]):
            held |= mask_of(pending_here, now)
        still_o = alive_o & held
        if still_o != alive_o:
            optimistic.append((i, alive_o ^ still_o))
            alive_o = still_o
            if not alive_o:
                depth = i
                break
    if alive_c:
        confirmed.append((depth, alive_c))
    if alive_o:
        optimistic.append((depth, alive_o))
    deepest = depth if deepest is None else deepest
    renewed = cast(list[int], [values[i] for i in runs if i < deepest])
    return Walk(confirmed, optimistic, renewed)
