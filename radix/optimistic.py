"""Optimistic entries: blocks an engine will hold once a routed request runs, until an expiry."""

from __future__ import annotations

import heapq
from itertools import count


class Optimistic:
    """``(block key, engine bit index) -> expiry``; an entry counts while ``now < expiry``.

    Entries are short-lived (routing rate x ttl).  Each ``add`` pushes ONE heap item holding its
    keys, so routing a 32k-token prompt costs one push, and every call with a later ``now`` drops
    what has expired in amortised O(1) per entry.
    """

    __slots__ = ("_entries", "_heap", "_order")

    def __init__(self) -> None:
        self._entries: dict[int, dict[int, float]] = {}
        self._heap: list[tuple[float, int, int, list[int]]] = []
        self._order = count()  # ties on expiry never compare the key lists

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether any engine has an entry (expired or not) for this block key."""
        return key in self._entries

    def __len__(self) -> int:
        return sum(len(d) for d in self._entries.values())

    def add(self, keys: list[int], engine: int, expiry: float) -> None:
        """Record entries for ``keys``, or extend them to ``expiry``."""
        if not keys:
            return
        entries = self._entries
        for key in keys:
            per_key = entries.get(key)
            if per_key is None:
                entries[key] = {engine: expiry}
            elif per_key.get(engine, float("-inf")) < expiry:
                per_key[engine] = expiry
        heapq.heappush(self._heap, (expiry, next(self._order), engine, keys))

    def discard(self, key: int, engine: int) -> None:
        per_key = self._entries.get(key)
        if per_key is not None and per_key.pop(engine, None) is not None and not per_key:
            del self._entries[key]

    def mask(self, key: int, now: float) -> int:
        """Bitmask of the engines holding an unexpired entry for ``key``."""
        per_key = self._entries.get(key)
        if not per_key:
            return 0
        bits = 0
        for engine, expiry in per_key.items():
            if expiry > now:
                bits |= 1 << engine
        return bits

    def purge(self, now: float) -> None:
        heap, entries = self._heap, self._entries
        while heap and heap[0][0] <= now:
            expiry, _, engine, keys = heapq.heappop(heap)
            for key in keys:
                per_key = entries.get(key)
                # Entries extended, confirmed or dropped since are not this item's to remove.
                if per_key is not None and per_key.get(engine) == expiry:
                    del per_key[engine]
                    if not per_key:
                        del entries[key]

    def drop_engine(self, engine: int) -> None:
        for key in [k for k, d in self._entries.items() if engine in d]:
            self.discard(key, engine)
        # Its heap items go too: the bit index may be reused by a new engine.
        self._heap = [item for item in self._heap if item[2] != engine]
        heapq.heapify(self._heap)
