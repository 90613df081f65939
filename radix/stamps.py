"""Node values: an engine bitmask and an LRU stamp packed in one int, renewed and evicted."""

from __future__ import annotations

from typing import cast

# value = engine_mask << SEQ_BITS | stamp.  With up to 16 engines the value stays under 2**60, a
# 32-byte int; blocks written by one store or match share one value object.
SEQ_BITS = 44
SEQ_MASK = (1 << SEQ_BITS) - 1


def renew(nodes: dict[int, int], keys: list[int], values: list[int | None], stamp: int) -> None:
    """Give the blocks ``keys`` (whose current values are ``values``) the stamp ``stamp``."""
    renewed = {v: (v >> SEQ_BITS << SEQ_BITS) | stamp for v in set(values) if v is not None}
    held = cast(list[int], values)  # every renewed block exists
    nodes.update(zip(keys, map(renewed.__getitem__, held), strict=True))


def evict_oldest(nodes: dict[int, int], keep: int) -> int:
    """Drop the oldest stamps until at most ``keep`` blocks remain; returns blocks dropped.

    Whole stamps go together (a stamp is one store or match), so slightly more than needed may go.
    """
    excess = len(nodes) - keep
    if excess <= 0:
        return 0
    cut = sorted([value & SEQ_MASK for value in nodes.values()])[excess - 1]
    doomed = [key for key, value in nodes.items() if value & SEQ_MASK <= cut]
    for key in doomed:
        del nodes[key]
    return len(doomed)


def renumber(nodes: dict[int, int]) -> int:
    """Compact the stamps to 1..n keeping their order; returns the newest.  Only needed after
    2**44 stores and matches."""
    stamps = sorted({value & SEQ_MASK for value in nodes.values()})
    rank = {stamp: i for i, stamp in enumerate(stamps, start=1)}
    renewed: dict[int, int] = {}
    for key, value in nodes.items():
        new = renewed.get(value)
        if new is None:
            new = renewed[value] = (value >> SEQ_BITS << SEQ_BITS) | rank[value & SEQ_MASK]
        nodes[key] = new
    return len(stamps)
