"""Optimistic entries: blocks an engine will hold once a routed request runs, until an expiry."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, count, repeat
from operator import is_, is_not
from typing import cast

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
        olds = list(map(self._entries.get, keys))
        fresh: Holders = {engine: expiry}
        new_of: dict[int, Holders | None] = {}  # id(old holders) -> its replacement
        for old in _distinct(olds):
            if old is None:
                new_of[id(old)] = fresh
            elif old.get(engine, float("-inf")) < expiry:
                new_of[id(old)] = {**old, engine: expiry}
        self._rewrite(keys, olds, new_of)
        heapq.heappush(self._heap, (expiry, next(self._order), engine, keys))

    def discard(self, key: int, engine: int) -> None:
        self.discard_many([key], engine)

    def discard_many(self, keys: Sequence[int], engine: int) -> None:
        """Drop ``engine``'s entries for ``keys`` (confirmed or removed blocks)."""
        olds = list(map(self._entries.get, keys))
        self._rewrite(keys, olds, {id(old): self._without(old, engine) for old in _distinct(olds)
                                   if old is not None and engine in old})

    def purge(self, now: float) -> None:
        heap, entries = self._heap, self._entries
        while heap and heap[0][0] <= now:
            expiry, _, engine, keys = heapq.heappop(heap)
            olds = list(map(entries.get, keys))
            # Entries extended, confirmed or dropped since are not this item's to remove.
            self._rewrite(keys, olds, {id(old): self._without(old, engine)
                                       for old in _distinct(olds)
                                       if old is not None and old.get(engine) == expiry})

    @staticmethod
    def _without(old: Holders, engine: int) -> Holders | None:
        return {e: x for e, x in old.items() if e != engine} if len(old) > 1 else None

    def _rewrite(self, keys: Sequence[int], olds: list[Holders | None],
                 new_of: dict[int, Holders | None]) -> None:
        """Replace each key's holders whose id is in ``new_of`` (None deletes the entry).

        A routed prompt's blocks share one holders object, so the decisions above are made once
        per distinct object and applied to thousands of keys by C-level map/compress passes.
        """
        if not new_of:
            return
        entries = self._entries
        if len(new_of) == 1 and olds.count(olds[0]) == len(olds):  # one routed prompt's run
            new = next(iter(new_of.values()))
            if new is None:
                deque(map(entries.pop, keys, repeat(None)), maxlen=0)
            else:
                entries.update(dict.fromkeys(keys, new))
            return
        ids = list(map(id, olds))  # ``olds`` keeps every object alive: the ids stay unique
        hit = list(map(new_of.__contains__, ids))
        changed = list(compress(keys, hit))
        news = list(map(new_of.__getitem__, compress(ids, hit)))
        if None in new_of.values():
            doomed = compress(changed, map(is_, news, repeat(None)))
            deque(map(entries.pop, doomed, repeat(None)), maxlen=0)
            keep = list(map(is_not, news, repeat(None)))
            changed, news = list(compress(changed, keep)), list(compress(news, keep))
        entries.update(zip(changed, cast(list[Holders], news), strict=True))

    def drop_engine(self, engine: int) -> None:
        keys = [k for k, d in self._entries.items() if engine in d]
        olds = list(map(self._entries.get, keys))
        self._rewrite(keys, olds, {id(old): self._without(old, engine) for old in _distinct(olds)
                                   if old is not None})
        # Its heap items go too: the bit index may be reused by a new engine.
        self._heap = [item for item in self._heap if item[2] != engine]
        heapq.heapify(self._heap)


def _distinct(olds: list[Holders | None]) -> Iterable[Holders | None]:
    """Each holders object once (they are shared by runs of keys, and unhashable)."""
    if olds and olds.count(olds[0]) == len(olds):  # one run: C-level, allocates no ids
        return olds[:1]
    return dict(zip(map(id, olds), olds, strict=True)).values()
