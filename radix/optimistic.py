"""Optimistic entries: blocks an engine will hold once a routed request runs, until an expiry."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import count

Holders = dict[int, float]  # engine bit index -> expiry


def mask_of(holders: Holders, now: float) -> int:
    """Bitmask of the engines whose entry is unexpired at ``now``."""
    bits = 0
    for engine, expiry in holders.items():
        if expiry > now:
            bits |= 1 << engine
    return bits


class Optimistic:
    """``block key -> {engine bit index: expiry}``; an entry counts while ``now < expiry``.

    The blocks of one routed prompt share ONE holders dict (copied on write), so a match walk
    sees a run of equal holders as one step, and each ``add`` pushes one heap item holding its
    keys: routing a 32k-token prompt is one push, and a later ``now`` drops what has expired.
    """

    __slots__ = ("_entries", "_heap", "_order")

    def __init__(self) -> None:
        self._entries: dict[int, Holders] = {}
        self._heap: list[tuple[float, int, int, list[int]]] = []
        self._order = count()  # ties on expiry never compare the key lists

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return sum(len(d) for d in self._entries.values())

    @property
    def holders(self) -> Callable[[int], Holders | None]:
        """``key -> holders dict or None``; equal runs are the same object."""
        return self._entries.get

    def add(self, keys: list[int], engine: int, expiry: float) -> None:
        """Record entries for ``keys``, or extend them to ``expiry``."""
        if not keys:
            return
        entries = self._entries
        fresh: Holders = {engine: expiry}
        extended: dict[int, Holders] = {}  # id(old holders) -> its extension, shared likewise
        for key in keys:
            old = entries.get(key)
            if old is None:
                entries[key] = fresh
            elif old.get(engine, float("-inf")) < expiry:
                new = extended.get(id(old))
                if new is None:
                    new = extended[id(old)] = {**old, engine: expiry}
                entries[key] = new
        heapq.heappush(self._heap, (expiry, next(self._order), engine, keys))

    def discard(self, key: int, engine: int) -> None:
        old = self._entries.get(key)
        if old is not None and engine in old:
            self._drop(key, old, engine, {})

    def _drop(self, key: int, old: Holders, engine: int, memo: dict[int, Holders]) -> None:
        if len(old) == 1:
            del self._entries[key]
            return
        new = memo.get(id(old))
        if new is None:
            new = memo[id(old)] = {e: x for e, x in old.items() if e != engine}
        self._entries[key] = new

    def purge(self, now: float) -> None:
        heap, entries = self._heap, self._entries
        while heap and heap[0][0] <= now:
            expiry, _, engine, keys = heapq.heappop(heap)
            memo: dict[int, Holders] = {}
            for key in keys:
                old = entries.get(key)
                # Entries extended, confirmed or dropped since are not this item's to remove.
                if old is not None and old.get(engine) == expiry:
                    self._drop(key, old, engine, memo)

    def drop_engine(self, engine: int) -> None:
        memo: dict[int, Holders] = {}
        for key, old in [(k, d) for k, d in self._entries.items() if engine in d]:
            self._drop(key, old, engine, memo)
        # Its heap items go too: the bit index may be reused by a new engine.
        self._heap = [item for item in self._heap if item[2] != engine]
        heapq.heapify(self._heap)
