"""vLLM's msgpack encoding of numpy arrays inside engine outputs, decoded without pickle.

vLLM (``vllm/v1/serial_utils.py``) writes an ndarray as ``[dtype_str, shape, data]`` where ``data``
is either ``Ext(3, raw_bytes)`` (arrays under 256 bytes, inline) or an int indexing the extra ZMQ
frames that follow the msgpack payload. Logprobs travel this way as ``LogprobsLists``:
``(logprob_token_ids, logprobs, sampled_token_ranks, cu_num_generated_tokens)``.

Two decodings: ``decode_logprobs`` gives numpy arrays (prompt logprobs, tools, tests); the
receive path turns the arrays straight into Python numbers (``LogprobRows``) with ``struct``: a
top-5 row is three arrays of a few bytes, for which numpy's per-call cost dominates.
``rows_from_wire`` reads the typed arrays (``WireLogprobs``), one unpack each;
``wire.logprob_layout`` reads a known byte layout with one unpack for all three.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from functools import lru_cache
from math import prod
from typing import Any, NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from wire.logprob_frame import FrameLogprobs

# vLLM's VLLM_MSGPACK_ZERO_COPY_THRESHOLD default: larger arrays go out of band.
INLINE_THRESHOLD = 256

Buffer = bytes | memoryview


class NdarrayError(ValueError):
    """An encoded array is malformed or references a missing aux frame."""


def decode_ndarray(encoded: Any, aux: Sequence[Buffer] = ()) -> npt.NDArray[Any]:
    """Decode ``[dtype, shape, ext3-bytes | aux-index]`` (ext 3 already mapped to bytes)."""
    try:
        dtype, shape, data = encoded
    except (TypeError, ValueError) as e:
        raise NdarrayError(f"not an encoded ndarray: {type(encoded).__name__}") from e
    if isinstance(data, int):
        # aux[0] is the msgpack payload itself; vLLM's indices count it.
        if not 0 < data < len(aux):
            raise NdarrayError(f"aux frame {data} missing ({len(aux)} frames)")
        data = aux[data]
    if not isinstance(data, bytes | memoryview):
        raise NdarrayError(f"ndarray data has type {type(data).__name__}")
    try:
        # A vLLM dtype string like "<i4" or "<f4"; object dtypes never travel this way.
        dt = np.dtype(dtype)
        if dt.kind in "OV":
            raise NdarrayError(f"refusing ndarray dtype {dtype!r}")
        return np.frombuffer(data, dtype=dt).reshape(tuple(shape))
    except (TypeError, ValueError) as e:
        if isinstance(e, NdarrayError):
            raise
        raise NdarrayError(f"bad ndarray {dtype!r} {shape!r}: {e}") from e


def encode_ndarray(arr: npt.NDArray[Any], aux: list[Buffer]) -> tuple[Any, ...]:
    """Encode as vLLM does; ``aux`` starts with a placeholder for the payload frame."""
    arr = np.ascontiguousarray(arr)
    if not arr.shape or arr.nbytes < INLINE_THRESHOLD:
        return (arr.dtype.str, arr.shape, msgspec.msgpack.Ext(3, arr.tobytes()))
    aux.append(arr.data.cast("B"))
    return (arr.dtype.str, arr.shape, len(aux) - 1)


class Logprobs(NamedTuple):
    """Per-token top-k logprobs of one output: rows are generated tokens, columns the ranks."""

    token_ids: npt.NDArray[Any]  # [num_tokens, k+1] int32 (column 0 is the sampled token)
    logprobs: npt.NDArray[Any]  # [num_tokens, k+1] float32
    sampled_ranks: npt.NDArray[Any]  # [num_tokens] int
    cu_num_generated_tokens: list[int] | None


def decode_logprobs(encoded: Any, aux: Sequence[Buffer] = ()) -> Logprobs:
    """Decode a ``LogprobsLists`` tuple of ndarrays (``EngineCoreOutput.new_logprobs``)."""
    if not isinstance(encoded, list | tuple) or len(encoded) < 3:
        raise NdarrayError("new_logprobs is not a LogprobsLists tuple")
    cu = encoded[3] if len(encoded) > 3 else None
    return Logprobs(
        decode_ndarray(encoded[0], aux),
        decode_ndarray(encoded[1], aux),
        decode_ndarray(encoded[2], aux),
        None if cu is None else list(cu),
    )


# ---- the receive path: logprob arrays straight to Python numbers, no numpy ----


class WireArray(msgspec.Struct, array_like=True, gc=False):
    """One encoded ndarray as the output decoder reads it (typed, so no ext_hook call)."""

    dtype: str
    shape: tuple[int, ...]
    data: msgspec.msgpack.Ext | int


class WireLogprobs(msgspec.Struct, array_like=True, gc=False):
    """vLLM's ``LogprobsLists`` NamedTuple on the wire."""

    token_ids: WireArray
    logprobs: WireArray
    sampled_ranks: WireArray
    cu_num_generated_tokens: list[int] | None = None


class LogprobRows(msgspec.Struct, gc=False):
    """An output's logprobs as Python numbers; row ``i`` (generated token i) is
    ``token_ids[i * width : (i + 1) * width]``, column 0 the sampled token, then the top-k.
    ``frame`` (if set) holds these numbers again, with those of the other outputs of the same
    engine message, from ``offset`` on: formatting works on the whole message at once. A
    Struct, not a NamedTuple: one is made per output and a NamedTuple's ``__new__`` is a
    Python call."""

    token_ids: Sequence[int]
    logprobs: Sequence[float]
    sampled_ranks: Sequence[int]
    width: int
    frame: FrameLogprobs | None = None
    offset: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) // self.width if self.width else len(self.sampled_ranks)


# numpy dtype strings (byte order + kind + size) -> struct byte order and codes; struct reads
# either byte order on any host (vLLM runs on big-endian s390x too).
STRUCT_ORDER = {"<": "<", "|": "<", ">": ">"}
STRUCT_CODES = {"i4": "i", "f4": "f", "i8": "q", "f8": "d", "i2": "h", "f2": "e", "u4": "I",
                 "u8": "Q", "i1": "b", "u1": "B"}


@lru_cache(maxsize=256)
def _unpacker(dtype: str, count: int) -> Callable[[Buffer], tuple[Any, ...]]:
    # One compiled struct per (dtype, length): a per-step logprob row is 1 x (k+1) of a few
    # dtypes, so the cache stays tiny; unpack is one C call (numpy pays a per-call cost per array).
    # KeyError for any other dtype.
    return struct.Struct(f"{STRUCT_ORDER[dtype[:1]]}{count}{STRUCT_CODES[dtype[1:]]}").unpack


def _buffer(data: msgspec.msgpack.Ext | int, aux: Sequence[Buffer]) -> Any:
    if isinstance(data, int):
        # aux[0] is the msgpack payload itself; vLLM's indices count it.
        if not 0 < data < len(aux):
            raise NdarrayError(f"aux frame {data} missing ({len(aux)} frames)")
        return aux[data]
    if data.code != 3:
        raise NdarrayError(f"refusing msgpack ext type {data.code} (pickle-based in vLLM)")
    return data.data


def rows_from_wire(w: WireLogprobs, aux: Sequence[Buffer] = ()) -> LogprobRows:
    """``EngineCoreOutput.new_logprobs`` as decoded from the wire -> ``LogprobRows``."""
    ids, lps, ranks = w.token_ids, w.logprobs, w.sampled_ranks
    shape = ids.shape
    try:
        n, width = shape
        if lps.shape != shape or prod(ranks.shape) != n:
            raise ValueError("mismatched shapes")
        count = n * width
        return LogprobRows(_unpacker(ids.dtype, count)(_buffer(ids.data, aux)),
                           _unpacker(lps.dtype, count)(_buffer(lps.data, aux)),
                           _unpacker(ranks.dtype, n)(_buffer(ranks.data, aux)), width)
    except (ValueError, KeyError, struct.error) as e:
        if isinstance(e, NdarrayError):
            raise
        raise NdarrayError(f"bad logprobs arrays {ids.dtype!r} {shape!r}, {lps.dtype!r} "
                           f"{lps.shape!r}, {ranks.dtype!r} {ranks.shape!r}: {e}") from e


def rows_from_numpy(lp: Logprobs) -> LogprobRows:
    ids = lp.token_ids
    if ids.ndim != 2 or lp.logprobs.shape != ids.shape:
        raise NdarrayError(f"logprobs arrays of shapes {ids.shape}, {lp.logprobs.shape}")
    return LogprobRows(ids.reshape(-1).tolist(), lp.logprobs.reshape(-1).tolist(),
                       lp.sampled_ranks.reshape(-1).tolist(), ids.shape[1])


def rows_of(raw: Any, aux: Sequence[Buffer] = ()) -> LogprobRows:
    """``EngineCoreOutput.new_logprobs`` in any form it reaches the pipeline -> ``LogprobRows``:
    already converted by the engine client (the hot path), typed wire arrays, the untyped
    ``[dtype, shape, data]`` lists of a plain decoder, or numpy ``Logprobs``."""
    if isinstance(raw, LogprobRows):
        return raw
    if isinstance(raw, WireLogprobs):
        return rows_from_wire(raw, aux)
    return rows_from_numpy(raw if isinstance(raw, Logprobs) else decode_logprobs(raw, aux))
