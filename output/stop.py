"""Stop strings over streamed text: hold back what could still become a stop, cut where one ends.

Semantics follow vLLM's ``check_stop_strings`` (v1/engine/detokenizer.py): among the stop strings
found in the new text, the one that COMPLETES earliest wins (ties by list order); the output is
cut before it, or after it with ``include_stop_str_in_output``; tokens generated after the token
that completed it are dropped; with ``min_tokens`` a match must end beyond the first
``min_tokens`` tokens' text. Unlike vLLM, which always withholds ``max(len(stop)) - 1``
characters, only the longest suffix that is a prefix of some stop string is withheld, so text
reaches the client as early as it safely can. Every match lies inside the withheld buffer: text
is released only once no stop string can start in it.

Work is linear: the hold-back is ``output.holdback.HoldBack`` (KMP, no prefix tables), and a push
searches only where a match could end in its new text, so the buffer searched is shorter than the
longest stop string plus the new text.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from output.holdback import HoldBack


class StopMatch:
    """The result of a stop-string hit: what to release, which tokens survive, which string."""

    __slots__ = ("text", "num_tokens_kept", "stop")

    def __init__(self, text: str, num_tokens_kept: int, stop: str):
        self.text = text
        self.num_tokens_kept = num_tokens_kept
        self.stop = stop


class StopChecker:
    """One per output sequence. ``push`` per engine batch, ``finish`` when the engine ends it."""

    __slots__ = (
        "_stops",
        "_include",
        "_hold",
        "_extend",
        "_pending",
        "_released",
        "_num_tokens",
        "_min_tokens",
        "_protected_end",
    )

    def __init__(self, stops: Sequence[str], *, include_in_output: bool, min_tokens: int = 0):
        self._stops = tuple(s for s in stops if s)
        self._include = include_in_output
        self._hold = HoldBack(self._stops)
        # Most tokens end in a character no stop prefix ends in: released after one set lookup.
        self._extend = self._hold.extend_chars
        self._pending = ""
        self._released = 0  # characters released before _pending starts
        self._num_tokens = 0
        # With min_tokens, offsets are tracked so a match must end past the protected text.
        self._min_tokens = max(min_tokens, 0)
        # Absolute text offset a match must end beyond (the text of the first min_tokens tokens).
        self._protected_end = 0 if min_tokens <= 0 else None

    @property
    def active(self) -> bool:
        return bool(self._stops)

    def push(self, pieces: Sequence[str]) -> tuple[str, StopMatch | None]:
        """Feed the text of each new token; return (text to release now, match or None)."""
        if not self._stops:
            self._num_tokens += len(pieces)
            return "".join(pieces), None
        start = len(self._pending)
        offsets = [start]
        buf = self._pending
        for p in pieces:
            buf += p
            offsets.append(len(buf))
            self._num_tokens += 1
            if self._protected_end is None and self._num_tokens >= self._min_tokens:
                self._protected_end = self._released + len(buf)
        self._pending = buf
        if self._protected_end is not None:
            match = self._find(buf, start)
            if match is not None:
                idx, stop = match
                end = idx + len(stop)
                kept = bisect_left(offsets, end, lo=1)
                text = buf[:end] if self._include else buf[:idx]
                self._pending = ""
                return text, StopMatch(text, kept, stop)
        hold = self._hold.hold(buf, len(buf) - start)
        if hold == len(buf):
            return "", None
        out = buf[: len(buf) - hold]
        self._pending = buf[len(buf) - hold :]
        self._released += len(out)
        return out, None

    def push_one(self, piece: str) -> tuple[str, StopMatch | None]:
        """``push`` for one token, the per-token fast path (no min_tokens left to protect)."""
        if self._min_tokens:
            return self.push((piece,))
        pending = self._pending
        if pending:
            buf = pending + piece
            for stop in self._stops:
                # A new match ends in the new piece: the held-back text alone holds none.
                if buf.find(stop, max(len(pending) - len(stop) + 1, 0)) != -1:
                    return self.push((piece,))
        else:
            buf = piece
            for stop in self._stops:
                if stop in buf:
                    return self.push((piece,))
        if buf and buf[-1] in self._extend:
            hold = self._hold.hold(buf, len(piece))
            self._pending = buf[len(buf) - hold :]
            return buf[: len(buf) - hold], None
        # Nothing withheld; the hold-back restarts from the next piece (see HoldBack.hold).
        # _released only matters with min_tokens, which this path never has.
        self._pending = ""
        return buf, None

    def finish(self) -> str:
        """The engine ended the sequence without a stop string: release everything withheld."""
        out, self._pending = self._pending, ""
        self._released += len(out)
        return out

    def _find(self, buf: str, start: int) -> tuple[int, str] | None:
        """The earliest-completing stop that ends past ``start`` (the text seen before this push)
        and past the protected text, ties by list order."""
        assert self._protected_end is not None
        floor = self._protected_end - self._released
        best: tuple[int, str] | None = None
        best_end = len(buf) + 1
        for stop in self._stops:
            # A match ending at or before ``start`` was found by an earlier push or is protected.
            idx = buf.find(stop, max(max(start, floor) - len(stop) + 1, 0))
            if idx != -1 and idx + len(stop) < best_end:
                best, best_end = (idx, stop), idx + len(stop)
        return best
