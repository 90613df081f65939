"""The logprobs of one engine message, shared by its outputs: floats as JSON, made once for all.

Per output token, chat logprobs were the costliest part of the stream: k+1 candidates, each a
few Python operations. The numbers and token ids of every output of one message are kept here
side by side, so their JSON text (``texts``) and per-candidate JSON objects (built by
``router.logprobs`` with the model's tables, cached in ``entries``) come from a handful of C
calls over the whole message when the first output asks, and each output takes a slice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat
from operator import itemgetter

import msgspec

from router.detokenize import CONTEXT_HEAD, TokenDecoder

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


def chat_contents(frame: FrameLogprobs, td: TokenDecoder, limit: int
                  ) -> tuple[list[bytes], bool] | None:
    """Per output of the message (each one row of ``frame.width`` columns, column 0 the
    sampled token), its chat ``logprobs.content`` JSON with the first ``limit`` columns as
    top_logprobs; and whether any head is ``CONTEXT_HEAD`` (a token whose shown text depends
    on the preceding ones: the caller must check its output's JSON and fall back). None if
    an id is outside the vocabulary or the outputs are not one row each.

    The pieces of all outputs are interleaved by ``zip`` over column slices and joined per
    output by ``map``: a few C calls per message instead of Python work per candidate."""
    width = frame.width
    ids = frame.token_ids()
    if not width or not 0 < limit <= width or not ids:
        return None
    heads, tails = td.head_table, td.tail_table
    # Only the first ``limit`` columns are shown: ids, table entries and float texts are taken
    # per column, each a slice across all outputs.
    id_cols = [ids[col::width] for col in range(limit)]
    if min(map(min, id_cols)) < 0:
        return None
    lps = frame.logprobs()
    f_cols = [float_texts(lps[col::width]) for col in range(limit)]
    for attempt in (0, 1):
        h_cols, t_cols = [], []
        for col_ids in id_cols:
            pick = itemgetter(*col_ids) if len(col_ids) > 1 else _one(col_ids[0])
            try:
                h_cols.append(pick(heads))
                t_cols.append(pick(tails))
            except IndexError:  # an id outside the vocabulary (tokenizers' decode skips it)
                return None
        try:
            return _interleave(h_cols, f_cols, t_cols), any(CONTEXT_HEAD in h for h in h_cols)
        except TypeError:  # ids met for the first time: their fragments are made now
            if attempt:
                raise
            for i in set(chain.from_iterable(id_cols)):
                if heads[i] is None:
                    td.token_json(i)
    return None  # not reached


def _one(i: int) -> Callable[[Sequence[bytes | None]], tuple[bytes | None]]:
    return lambda table: (table[i],)


def _interleave(h: list[Sequence[bytes | None]], f: list[list[bytes]],
                t: list[Sequence[bytes | None]]) -> list[bytes]:
    seqs: list[Iterable[bytes | None]] = [repeat(b"["), h[0], f[0], t[0], repeat(TOP), h[0],
                                          f[0], t[0]]
    for col in range(1, len(h)):
        seqs += (repeat(b"},"), h[col], f[col], t[col])
    seqs.append(repeat(b"}]}]"))
    # The repeats are endless: the columns (one item per output) end the zip.
    return list(map(b"".join, zip(*seqs, strict=False)))
