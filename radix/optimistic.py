"""Optimistic entries: blocks an engine will hold once a routed request runs, until an expiry."""

from __future__ import annotations

import heapq


class Optimistic:
    """``(block key, engine bit index) -> expiry``; an entry counts while ``now < expiry``.

    Entries are few and short-lived (routing rate x ttl), so plain dicts suffice; a heap of
    expiries lets every call drop what has expired in amortised O(1).
    """

    __slots__ = ("_entries", "_heap", "_compact_at")

    def __init__(self) -> None:
        self._entries: dict[int, dict[int, float]] = {}
        self._heap: list[tuple[float, int, int]] = []
        # Compact when the heap doubles: amortised O(1) (len(self) is O(entries) per call).
        self._compact_at = 64

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether any engine has an entry (expired or not) for this block key."""
        return key in self._entries

    def __len__(self) -> int:
        return sum(len(d) for d in self._entries.values())

    def add(self, key: int, engine: int, expiry: float) -> bool:
        """Record or extend an entry; False if an entry already outlives ``expiry``."""
        per_key = self._entries.setdefault(key, {})
        if per_key.get(engine, float("-inf")) >= expiry:
            return False
        per_key[engine] = expiry
        heapq.heappush(self._heap, (expiry, key, engine))
        if len(self._heap) > self._compact_at:
            self._compact()
            self._compact_at = max(64, 2 * len(self._heap))
        return True

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
        heap = self._heap
        while heap and heap[0][0] <= now:
            expiry, key, engine = heapq.heappop(heap)
            per_key = self._entries.get(key)
            # A stale heap item (entry extended, confirmed or dropped since) is just skipped.
            if per_key is not None and per_key.get(engine) == expiry:
                del per_key[engine]
                if not per_key:
                    del self._entries[key]

    def drop_engine(self, engine: int) -> None:
        for key in [k for k, d in self._entries.items() if engine in d]:
            self.discard(key, engine)
        self._compact()

    def _compact(self) -> None:
        # Discarded and extended entries leave stale heap items behind; rebuild from the truth.
        self._heap = [(x, k, e) for k, d in self._entries.items() for e, x in d.items()]
        heapq.heapify(self._heap)
