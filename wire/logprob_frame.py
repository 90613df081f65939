"""The logprobs of one engine message, shared by its outputs: floats as JSON, made once for all.

Per output token, chat logprobs are the costliest part of the stream: k+1 candidates, each a
few Python operations. The numbers and token ids of every output of one message are kept here
side by side, so their JSON text (``texts``) and per-candidate JSON objects (built by
``output.logprobs`` with the model's tables, cached in ``entries``) come from a handful of C
calls over the whole message when the first output asks, and each output takes a slice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain

import msgspec

FLOOR = -9999.0
_encode = msgspec.json.encode


def clamp(lp: float) -> float:
    return FLOOR if math.isnan(lp) else max(lp, FLOOR)


def float_texts(lps: Sequence[float]) -> list[bytes]:
    """msgspec's JSON text of each logprob, clamped as vLLM does (NaN too).

    One encode of all the numbers and a split: msgspec's float format (e.g. ``-1e-7``) is not
    ``repr``'s, and one call per number would cost more than the split. msgspec writes NaN and
    the infinities as ``null``, so a clamp pass is needed only when ``null`` shows or a finite
    value is under the floor (rare: a sampled token the model gave ~0 probability)."""
    js = _encode(lps)
    if b"n" in js or (lps and min(lps) < FLOOR):
        # NaN compares false, so the comprehension clamps it too.
        js = _encode([x if x > FLOOR else FLOOR for x in lps])
    return js[1:-1].split(b",")


TOP = b',"top_logprobs":['


class FrameLogprobs:
    """The token ids and logprobs of all outputs of one engine message.

    The decoder appends each output's (equally long) ``token_ids`` and ``logprobs`` and records
    where they start (``LogprobRows.offset``): that output's numbers are
    ``texts()[offset : offset + len(logprobs)]``. ``entries`` caches ``chat_contents`` per
    (``TokenDecoder``, top_logprobs)."""

    __slots__ = ("id_parts", "lp_parts", "width", "entries", "_texts")

    def __init__(self) -> None:
        self.id_parts: list[Sequence[int]] = []
        self.lp_parts: list[Sequence[float]] = []
        self.width = 0  # every output one row of this width (0: not so)
        self.entries: dict[object, tuple[list[bytes], bool] | None] = {}
        self._texts: list[bytes] | None = None

    def token_ids(self) -> Sequence[int]:
        parts = self.id_parts
        return parts[0] if len(parts) == 1 else tuple(chain.from_iterable(parts))

    def logprobs(self) -> Sequence[float]:
        parts = self.lp_parts
        return parts[0] if len(parts) == 1 else tuple(chain.from_iterable(parts))

    def texts(self) -> list[bytes]:
        texts = self._texts
        if texts is None:
            parts = self.lp_parts
            flat = parts[0] if len(parts) == 1 else list(chain.from_iterable(parts))
            texts = self._texts = float_texts(flat) if flat else []
        return texts
