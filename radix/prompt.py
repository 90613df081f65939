"""PromptKeys: a prompt's chained block keys, computed once and shared by match and note_routed."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from radix.keys import block_keys, root_key, token_bytes


class PromptKeys:
    """One prompt in one namespace, as the index sees it: its uint32 bytes and, per block size,
    the chained keys of its leading blocks.

    Hashing (one xxh3 per block) and the list -> bytes conversion are the whole cost of routing a
    prompt, so they are done lazily and once: a match that misses early hashes a few blocks, and
    the ``note_routed`` after it reuses every key the match computed.  Build it with
    :meth:`radix.PrefixIndex.prepare`; it holds no reference to the index, and the tokens must not
    change while it is in use.
    """

    __slots__ = ("tokens", "namespace", "_buf", "_keys")

    def __init__(self, tokens: Sequence[int], namespace: Hashable) -> None:
        self.tokens = tokens
        self.namespace = namespace
        self._buf: bytes | None = None
        self._keys: dict[int, list[int]] = {}

    @property
    def buf(self) -> bytes:
        if self._buf is None:
            self._buf = token_bytes(self.tokens)
        return self._buf

    def blocks(self, block_size: int) -> int:
        """Full blocks of the prompt at this block size."""
        return len(self.tokens) // block_size

    def keys(self, block_size: int, stop: int) -> list[int]:
        """Keys of blocks 0 .. ``stop - 1``; the list may run longer (slice it, never mutate it)."""
        have = self._keys.get(block_size)
        if have is None:
            have = self._keys[block_size] = []
        if len(have) < stop:
            seed = have[-1] if have else root_key(block_size, self.namespace)
            have += block_keys(self.buf, block_size, seed, len(have), stop)
        return have
