"""Decoding EngineCoreOutputs off the output socket: payload, aux frames, logprob arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from router.ndarrays import WireLogprobs, decode_logprobs, rows_of
from router.wire import EngineCoreOutput, EngineCoreOutputs

_O = TypeVar("_O", bound=EngineCoreOutputs)

NIL = msgspec.Raw(b"\xc0")  # msgpack nil: no stats in this message


def decode_engine_outputs(decoder: msgspec.msgpack.Decoder[_O], bufs: Sequence[Any]) -> _O:
    """Decode ``[payload, *aux_frames]``, resolving the logprob arrays against the aux frames.

    ``new_logprobs`` becomes ``ndarrays.LogprobRows`` (Python numbers, what the pipeline
    formats), prompt logprobs ``ndarrays.Logprobs`` (numpy). Raises ``msgspec.DecodeError`` or
    ``ValueError`` (incl. ``NdarrayError``) on bad input.
    """
    outs = decoder.decode(bufs[0])
    for out in outs.outputs:
        if out.new_logprobs is not None:
            out.new_logprobs = rows_of(out.new_logprobs, bufs)
        if out.new_prompt_logprobs_tensors is not None:
            out.new_prompt_logprobs_tensors = decode_logprobs(out.new_prompt_logprobs_tensors, bufs)
    return outs


class ReceivedOutput(EngineCoreOutput, array_like=True, omit_defaults=True, gc=False):
    """EngineCoreOutput with its logprob arrays typed: msgspec reads the ext-3 buffers itself
    (an untyped field calls ``ext_hook`` in Python and copies, per array)."""

    new_logprobs: WireLogprobs | None = None


class ReceivedOutputs(EngineCoreOutputs, array_like=True, omit_defaults=True, gc=False):
    """EngineCoreOutputs as the listener decodes them: scheduler_stats left as raw msgpack.

    vLLM attaches a ~550-byte stats map to every message; parsing it per message would cost more
    than the tokens. It is parsed only when someone reads ``EngineState.scheduler_stats``.
    """

    outputs: list[ReceivedOutput] = []  # type: ignore[assignment]
    scheduler_stats: msgspec.Raw = msgspec.Raw()  # type: ignore[assignment]
