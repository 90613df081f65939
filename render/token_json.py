"""Token ids to JSON without a Python int per token: the render service's response path.

A render answers with the prompt's token ids, thousands per request. As a list they cost twice
per token: the tokenizer builds one Python int each, then msgspec formats each. Here they stay in
one little-endian uint32 buffer from fastokens (``encode_batch_flat``), viewed by numpy, and
orjson writes the array straight to JSON text. msgspec still writes the response: it calls the
``enc_hook`` of ``json_encoder`` for the array and splices the returned ``Raw`` bytes in as they
are, so the body is byte for byte the one a list gives (``tests/test_render_token_json.py``).

Only the HTTP answer takes arrays (``Renderer.render_chat(req, array=True)``); the router's
in-process renders keep lists, which the engine link and the prefix index read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec
import numpy as np
import orjson

if TYPE_CHECKING:
    import numpy.typing as npt

    TokenArray: TypeAlias = npt.NDArray[np.uint32]
else:
    TokenArray = np.ndarray

TokenIds: TypeAlias = "list[int] | TokenArray"

_EMPTY = np.zeros(0, dtype=np.uint32)
_EMPTY.flags.writeable = False  # shared: read-only like the buffer views


def from_buffer(buf: bytes) -> TokenArray:
    """A read-only uint32 view of little-endian token ids (no copy)."""
    if not buf:
        return _EMPTY
    return np.frombuffer(buf, dtype="<u4")


def join(before: list[int], ids: TokenArray, after: list[int]) -> TokenArray:
    """``before + ids + after`` as one array (special tokens the post-processor adds)."""
    if not before and not after:
        return ids
    return np.concatenate((np.asarray(before, dtype=np.uint32), ids,
                           np.asarray(after, dtype=np.uint32)))


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray) and obj.ndim == 1 and obj.dtype.kind in "iu":
        # orjson serializes C-contiguous arrays only; a truncated view is one already.
        return msgspec.Raw(orjson.dumps(np.ascontiguousarray(obj),
                                        option=orjson.OPT_SERIALIZE_NUMPY))
    raise NotImplementedError(f"Objects of type {type(obj).__name__} are not supported")


def json_encoder() -> msgspec.json.Encoder:
    """msgspec's JSON encoder that also writes 1-d integer numpy arrays as JSON arrays."""
    return msgspec.json.Encoder(enc_hook=_enc_hook)
