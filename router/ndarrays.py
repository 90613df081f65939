"""vLLM's msgpack encoding of numpy arrays inside engine outputs, decoded without pickle.

vLLM (``vllm/v1/serial_utils.py``) writes an ndarray as ``[dtype_str, shape, data]`` where ``data``
is either ``Ext(3, raw_bytes)`` (arrays under 256 bytes, inline) or an int indexing the extra ZMQ
frames that follow the msgpack payload. Logprobs travel this way as ``LogprobsLists``:
``(logprob_token_ids, logprobs, sampled_token_ranks, cu_num_generated_tokens)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

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
    import msgspec

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
