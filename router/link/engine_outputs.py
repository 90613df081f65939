"""Decoding EngineCoreOutputs off the output socket: payload, aux frames, logprob arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, overload

import msgspec

from wire.engine import EngineCoreOutput, EngineCoreOutputs, ext_hook
from wire.logprob_frame import FrameLogprobs
from wire.logprob_layout import RowLayouts, rows_from_raw
from wire.ndarrays import LogprobRows, decode_logprobs, rows_of

_O = TypeVar("_O", bound=EngineCoreOutputs)

NIL = msgspec.Raw(b"\xc0")  # msgpack nil: no stats in this message


class ReceivedOutput(EngineCoreOutput, array_like=True, omit_defaults=True, gc=False):
    """EngineCoreOutput with its logprob arrays kept as their msgpack bytes, read by
    ``RowLayouts`` (one struct unpack) instead of three array Structs (``decode_engine_outputs``
    replaces the bytes by ``LogprobRows``, or None)."""

    new_logprobs: msgspec.Raw = msgspec.Raw()


class ReceivedOutputs(EngineCoreOutputs, array_like=True, omit_defaults=True, gc=False):
    """EngineCoreOutputs as the listener decodes them: scheduler_stats left as raw msgpack.

    vLLM attaches a ~550-byte stats map to every message; parsing it per message would cost more
    than the tokens. It is parsed only when someone reads ``EngineState.scheduler_stats``.
    """

    outputs: list[ReceivedOutput] = []  # type: ignore[assignment]
    scheduler_stats: msgspec.Raw = msgspec.Raw()  # type: ignore[assignment]


class OutputDecoder:
    """The receive path's decoder: ``ReceivedOutputs`` plus the logprob layouts seen so far.
    One per listener (the layouts are its state)."""

    __slots__ = ("decoder", "layouts")

    def __init__(self) -> None:
        self.decoder = msgspec.msgpack.Decoder(ReceivedOutputs, ext_hook=ext_hook)
        self.layouts = RowLayouts()


@overload
def decode_engine_outputs(decoder: OutputDecoder, bufs: Sequence[Any]) -> ReceivedOutputs: ...


@overload
def decode_engine_outputs(decoder: msgspec.msgpack.Decoder[_O], bufs: Sequence[Any]) -> _O: ...


def decode_engine_outputs(decoder: Any, bufs: Sequence[Any]) -> Any:
    """Decode ``[payload, *aux_frames]``, resolving the logprob arrays against the aux frames.

    ``new_logprobs`` becomes ``ndarrays.LogprobRows`` (Python numbers, what the pipeline
    formats; all outputs' logprobs share one ``FrameLogprobs``), prompt logprobs
    ``ndarrays.Logprobs`` (numpy). Raises ``msgspec.DecodeError`` or ``ValueError`` (incl.
    ``NdarrayError``) on bad input.
    """
    layouts: RowLayouts | None = None
    if isinstance(decoder, OutputDecoder):
        layouts = decoder.layouts
        decoder = decoder.decoder
    outs = decoder.decode(bufs[0])
    frame: FrameLogprobs | None = None
    id_parts: list[Sequence[int]] = []
    lp_parts: list[Sequence[float]] = []
    size = width = 0
    for out in outs.outputs:
        lp = out.new_logprobs
        if lp is not None:
            rows: LogprobRows | None = None
            if type(lp) is not msgspec.Raw:
                rows = rows_of(lp, bufs)
            elif lp and lp != NIL:  # an absent field keeps the empty default
                rows = layouts.rows(lp, bufs) if layouts is not None else rows_from_raw(lp, bufs)
            if rows is not None:
                ids, lps = rows.token_ids, rows.logprobs
                if len(ids) == len(lps):
                    if frame is None:
                        frame = FrameLogprobs()
                        id_parts, lp_parts = frame.id_parts, frame.lp_parts
                        width = rows.width
                    if len(ids) != width or rows.width != width:
                        width = -1  # not every output one row of one width
                    rows.frame = frame
                    rows.offset = size
                    id_parts.append(ids)
                    lp_parts.append(lps)
                    size += len(lps)
            out.new_logprobs = rows
        if out.new_prompt_logprobs_tensors is not None:
            out.new_prompt_logprobs_tensors = decode_logprobs(out.new_prompt_logprobs_tensors, bufs)
    if frame is not None and width > 0:
        frame.width = width
    return outs
