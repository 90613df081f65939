"""Chained 60-bit block keys: one xxh3 per full block, seeded by the key of the block before it."""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from typing import Any

import xxhash

# Keys stay below 2**60 so CPython stores each as a two-digit int (32 bytes): the index holds
# millions of them. A 60-bit collision among a million blocks has odds of about 1e-6.
KEY_MASK = (1 << 60) - 1

_h = xxhash.xxh3_64_intdigest


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as little uint32s, the unit every block key is hashed over."""
    return array("I", tokens).tobytes()


def root_key(block_size: int, namespace: Hashable) -> int:
    """The seed of block 0's key, distinct per (block size, namespace) so neither matches across.

    ``namespace`` must have a stable ``repr``: str, int, bytes, None and tuples of them.
    """
    return _h(repr((block_size, namespace)).encode()) & KEY_MASK


def plain(value: Any) -> Any:
    """Lists to tuples, recursively: msgpack hands back lists where vLLM wrote tuples."""
    if isinstance(value, list | tuple):
        return tuple(plain(v) for v in value)
    return value


def extra_seed(extra: Any) -> int:
    """What a block's residual extra keys (multimodal identity, embeds digest) mix into its seed."""
    return _h(repr(plain(extra)).encode()) & KEY_MASK


def block_keys(buf: bytes, block_size: int, seed: int, first: int = 0, stop: int | None = None
               ) -> list[int]:
    """Keys of the full blocks ``first`` .. ``stop - 1`` of ``buf`` (from :func:`token_bytes`),
    chained from ``seed`` (a root key, the parent block's key, or the key of block first - 1)."""
    step = block_size * 4
    end = len(buf) // step if stop is None else stop
    key, mask, h = seed, KEY_MASK, _h
    out: list[int] = []
    append = out.append
    # The hot path of match and of ingest: a plain loop over locals (a comprehension's walrus
    # would make ``key`` a closure cell, measurably slower on 3.11).
    for o in range(first * step, end * step, step):
        key = h(buf[o : o + step], key) & mask
        append(key)
    return out


def block_keys_with_extras(
    buf: bytes, block_size: int, seed: int, extras: Sequence[Any | None]
) -> list[int]:
    """Like :func:`block_keys`, folding ``extras[i]`` (when not None) into block i's seed."""
    step = block_size * 4
    key = seed
    out = []
    for i, off in enumerate(range(0, len(buf) - step + 1, step)):
        extra = extras[i] if i < len(extras) else None
        chained = key if extra is None else key ^ extra_seed(extra)
        key = _h(buf[off : off + step], chained) & KEY_MASK
        out.append(key)
    return out
