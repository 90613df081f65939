"""Hold-back over streamed text: how much of the tail could still grow into one of some markers.

A streamed consumer (stop strings, a tool-call parser watching for its start tag) may release text
only once no marker can begin in it: the held-back part is the longest suffix of the text so far
that is a proper prefix of some marker (``Cutter`` applies that rule for the output parsers: it
cuts a buffer at the earliest complete marker, or releases what no marker can start in). Each
marker carries its Knuth-Morris-Pratt failure table, built once in O(len(marker)); the matched
length per marker is carried from call to call, so every character is stepped at most once per
marker (amortised O(1)), and a call never looks further back than ``len(marker) - 1`` characters.
The work is linear in the text and in the markers' length: no table of prefixes, whose size would
be quadratic in a marker's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache


@lru_cache(maxsize=4096)
def _failure(marker: str) -> list[int]:
    """KMP failure table: ``fail[k]`` is the longest proper border of ``marker[:k]``."""
    fail = [0] * (len(marker) + 1)
    k = 0
    for i in range(1, len(marker)):
        while k and marker[i] != marker[k]:
            k = fail[k]
        if marker[i] == marker[k]:
            k += 1
        fail[i + 1] = k
    return fail


class HoldBack:
    """Incremental hold-back for one stream against fixed markers (empty markers are ignored)."""

    __slots__ = ("_markers", "_fails", "_state", "_zeros", "extend_chars")

    def __init__(self, markers: Sequence[str]):
        self._markers = tuple(m for m in markers if m)
        self._fails = tuple(_failure(m) for m in self._markers)
        self._zeros = (0,) * len(self._markers)
        # Per marker: the longest suffix of the text so far that is a proper prefix of it.
        self._state = self._zeros
        # A text whose last character is not here holds nothing back: the one-lookup fast path.
        self.extend_chars = frozenset(c for m in self._markers for c in m[:-1])

    def hold(self, text: str, new: int) -> int:
        """The held-back length of the stream whose unreleased tail is ``text``.

        The last ``new`` characters of ``text`` are new since the previous call; the characters
        before them are a suffix of the previous call's text (normally what it held back; if the
        caller released more, matches simply cannot reach back into the released text). Returns
        the length of the longest suffix of ``text`` that is a proper prefix of a marker.
        """
        if not text or text[-1] not in self.extend_chars:
            self._state = self._zeros
            return 0
        end = len(text)
        states = []
        for marker, fail, k in zip(self._markers, self._fails, self._state, strict=True):
            start = end - new
            # The answer is shorter than the marker, so older characters cannot matter.
            window = end - len(marker) + 1
            if window > start:
                start, k = window, 0
            while k > start:  # the caller kept less than was pending: next shorter border
                k = fail[k]
            last = len(marker) - 1
            for i in range(start, end):
                c = text[i]
                while k and (k == last + 1 or marker[k] != c):
                    k = fail[k]
                if marker[k] == c:
                    k += 1
            if k > last:  # a whole marker ends here: hold back its longest proper border
                k = fail[k]
            states.append(k)
        self._state = tuple(states)
        return max(states, default=0)


def held_back(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``.

    O(len(text) + total marker length); for a stream, keep one ``HoldBack`` instead.
    """
    return HoldBack(markers).hold(text, len(text))


class Cutter:
    """The markers one parser state watches for, over a buffer of text not yet released.

    ``cut(buf)`` returns ``(n, marker)``: with a complete marker in ``buf``, ``n`` is where the
    earliest one starts (ties: the longer marker, so ``</a>`` beats ``</``); without one, ``n`` is
    how much of ``buf`` is text no marker can begin in (the rest is held back) and ``marker`` is
    None. The hold-back is ``HoldBack``'s, recomputed from ``buf`` on each call, so one Cutter
    serves any number of streams. A buffer holding none of the markers' first characters is
    released whole after one scan per first character.
    """

    __slots__ = ("markers", "_hold", "_firsts")

    def __init__(self, markers: Sequence[str]):
        self.markers = tuple(sorted({m for m in markers if m}, key=len, reverse=True))
        self._hold = HoldBack(self.markers)
        self._firsts = tuple({m[0] for m in self.markers})

    def cut(self, buf: str) -> tuple[int, str | None]:
        start = len(buf)
        for c in self._firsts:
            i = buf.find(c)
            if i != -1 and i < start:
                start = i
        if start == len(buf):
            return start, None
        best, best_at = None, len(buf)
        for m in self.markers:
            i = buf.find(m, start)
            if i != -1 and i < best_at:
                best, best_at = m, i
        if best is not None:
            return best_at, best
        return len(buf) - self._hold.hold(buf, len(buf)), None
