"""Decoding EngineCoreOutputs messages off the output socket: payload, aux frames, ndarrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from router.ndarrays import decode_logprobs
from router.wire import EngineCoreOutputs

_O = TypeVar("_O", bound=EngineCoreOutputs)

NIL = msgspec.Raw(b"\xc0")  # msgpack nil: no stats in this message


def decode_engine_outputs(decoder: msgspec.msgpack.Decoder[_O], bufs: Sequence[Any]) -> _O:
    """Decode ``[payload, *aux_frames]``; logprob arrays become ``ndarrays.Logprobs``.

    Raises ``msgspec.DecodeError`` or ``ValueError`` (incl. ``NdarrayError``) on bad input.
    """
    outs = decoder.decode(bufs[0])
    for out in outs.outputs:
        if out.new_logprobs is not None:
            out.new_logprobs = decode_logprobs(out.new_logprobs, bufs)
        if out.new_prompt_logprobs_tensors is not None:
            out.new_prompt_logprobs_tensors = decode_logprobs(out.new_prompt_logprobs_tensors, bufs)
    return outs


class ReceivedOutputs(EngineCoreOutputs, array_like=True, omit_defaults=True, gc=False):
    """EngineCoreOutputs as the listener decodes them: scheduler_stats left as raw msgpack.

    vLLM attaches a ~550-byte stats map to every message; parsing it per message would cost more
    than the tokens. It is parsed only when someone reads ``EngineState.scheduler_stats``.
    """

    scheduler_stats: msgspec.Raw = msgspec.Raw()  # type: ignore[assignment]
