"""An output's logprob arrays read straight from their msgpack bytes by one struct unpack.

vLLM writes ``new_logprobs`` (``LogprobsLists``) as three ``[dtype, shape, Ext(3, data)]`` arrays
and ``cu_num_generated_tokens``. For one top-k, token count and dtypes every byte of that but the
array data is the same from message to message, so the receive path keeps the bytes as
``msgspec.Raw`` and reads them with one ``struct.Struct`` made for their layout: the fixed bytes
come out as ``s`` fields and must equal the layout's (so the match is exact, not a guess by
length), the numbers come out as Python ints and floats, in one C call where decoding the three
arrays as Structs and unpacking each takes several. Anything else (aux-frame arrays, mixed
byte orders, a layout not seen yet) takes the general decode (``rows_from_wire``), and a
layout seen there is kept for the next output of that length.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from math import prod
from typing import Any, NamedTuple

import msgspec

from wire.ndarrays import (
    STRUCT_CODES,
    STRUCT_ORDER,
    Buffer,
    LogprobRows,
    WireLogprobs,
    rows_from_wire,
)


class RowLayout(NamedTuple):
    """One byte layout of an encoded ``LogprobsLists``: the unpacked tuple is
    ``(fixed0, *token_ids, fixed1, *logprobs, fixed2, *ranks, fixed3)``."""

    unpack: Callable[[Buffer], tuple[Any, ...]]
    fixed: tuple[bytes, bytes, bytes, bytes]
    at1: int  # tuple index of fixed1
    at2: int  # tuple index of fixed2
    width: int


_WIRE = msgspec.msgpack.Decoder(WireLogprobs)  # stateless; msgspec decoders are thread-safe


def rows_from_raw(raw: Buffer | msgspec.Raw, aux: Sequence[Buffer] = ()) -> LogprobRows:
    """The general decode of ``new_logprobs`` bytes (any layout, aux frames included)."""
    try:
        wire = _WIRE.decode(raw)
    except msgspec.ValidationError as e:
        raise ValueError(f"new_logprobs is not a LogprobsLists: {e}") from e
    return rows_from_wire(wire, aux)


def layout_of(raw: bytes, wire: WireLogprobs) -> RowLayout | None:
    """The layout of ``raw`` (which decodes to ``wire``), or None if it has none to reuse."""
    arrays = (wire.token_ids, wire.logprobs, wire.sampled_ranks)
    datas = [a.data for a in arrays]
    if not all(isinstance(d, msgspec.msgpack.Ext) and d.code == 3 for d in datas):
        return None  # aux-frame arrays: their numbers are not in these bytes
    try:
        orders = {STRUCT_ORDER[a.dtype[:1]] for a in arrays}
        codes = [STRUCT_CODES[a.dtype[1:]] for a in arrays]
    except KeyError:
        return None
    if len(orders) != 1 or len(wire.token_ids.shape) != 2:
        return None
    # Where each array's data sits: re-encode and demand the very same bytes (a writer that
    # encodes differently from msgspec/vLLM just keeps the general decode).
    enc = msgspec.msgpack.Encoder()
    if enc.encode(wire) != raw:
        return None
    blobs = [enc.encode(a) for a in arrays]
    pos = len(raw) - sum(map(len, blobs)) - len(enc.encode(wire.cu_num_generated_tokens))
    fmt = orders.pop()
    fixed: list[bytes] = []
    start = 0
    for blob, data, code, arr in zip(blobs, datas, codes, arrays, strict=True):
        assert isinstance(data, msgspec.msgpack.Ext)
        payload = bytes(data.data)
        end = pos + len(blob)
        data_start = end - len(payload)
        count = prod(arr.shape)
        if raw[data_start:end] != payload or struct.calcsize(f"<{count}{code}") != len(payload):
            return None
        fixed.append(raw[start:data_start])
        fmt += f"{data_start - start}s{count}{code}"
        start = pos = end
    fixed.append(raw[start:])
    fmt += f"{len(raw) - start}s"
    n_ids, n_lps = prod(arrays[0].shape), prod(arrays[1].shape)
    return RowLayout(struct.Struct(fmt).unpack, (fixed[0], fixed[1], fixed[2], fixed[3]),
                     1 + n_ids, 2 + n_ids + n_lps, wire.token_ids.shape[1])


class RowLayouts:
    """The layouts seen on one receive path, by byte length (bounded: a router sees a few
    top-k values and token counts, rarely more than a handful of layouts)."""

    __slots__ = ("_by_len", "_limit")

    def __init__(self, limit: int = 64) -> None:
        self._by_len: dict[int, RowLayout | None] = {}
        self._limit = limit

    def rows(self, raw: msgspec.Raw, aux: Sequence[Buffer]) -> LogprobRows:
        """``raw`` (a ``new_logprobs``' bytes) -> ``LogprobRows``."""
        size = len(raw)
        lay = self._by_len.get(size)
        if lay is not None:
            r = lay.unpack(raw)  # the same length: cannot fail
            at1, at2 = lay.at1, lay.at2
            if (r[0], r[at1], r[at2], r[-1]) == lay.fixed:
                return LogprobRows(r[1:at1], r[at1 + 1:at2], r[at2 + 1:-1], lay.width)
        rows = rows_from_raw(raw, aux)
        if lay is not None or size not in self._by_len:
            # Unseen, or another layout of the same length: (re)learn from these bytes.
            if len(self._by_len) >= self._limit:
                self._by_len.clear()
            data = bytes(raw)
            self._by_len[size] = layout_of(data, _WIRE.decode(data))
        return rows
