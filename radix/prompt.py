"""PromptKeys: a prompt's chained block keys, computed once and shared by match and note_routed."""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence

from radix.keys import KeySpace, token_array


class PromptKeys:
    """One prompt in one namespace, as one index sees it: per block size, the chained keys of its
    leading blocks (see :mod:`radix.keys`).

    Hashing and the list -> uint32 conversion are the whole cost of routing a prompt, so they are
    done lazily and once: per block size as far as asked, and the ``note_routed`` after a match
    reuses every key the match computed.  Build it with
    :meth:`radix.PrefixIndex.prepare` (the keys are secret to that index); the tokens must not
    change while it is in use.
    """

    __slots__ = ("tokens", "namespace", "space", "_arr", "_keys")

    def __init__(self, tokens: Sequence[int], namespace: Hashable, space: KeySpace) -> None:
        self.tokens = tokens
        self.namespace = namespace
        self.space = space
        self._arr: array[int] | None = None
        self._keys: dict[int, list[int]] = {}

    def blocks(self, block_size: int) -> int:
        """Full blocks of the prompt at this block size."""
        return len(self.tokens) // block_size

    def keys(self, block_size: int, stop: int) -> list[int]:
        """Keys of blocks 0 .. ``stop - 1``; the list may run longer (slice it, never mutate it)."""
        have = self._keys.get(block_size)
        if have is None:
            have = self._keys[block_size] = []
        done = len(have)
        if done < stop:
            seed = have[-1] if have else self.space.root(block_size, self.namespace)
            if self._arr is None:
                self._arr = token_array(self.tokens)
            have += self.space.chain(self._arr, block_size, seed, done, stop)
        return have
