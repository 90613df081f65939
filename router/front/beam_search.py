"""Beam search in the router, as vLLM's frontend runs it (``BeamSearchOnlineMixin.beam_search``).

vLLM's engines know no beams: its OpenAI server grows them itself, one engine request per beam
per token (``max_tokens=1``, the ``2 x beam_width`` most likely next tokens as logprobs), keeps
the ``beam_width`` best by cumulative logprob, sets aside a beam that reaches EOS, and at the end
answers the ``beam_width`` best by ``cumulative_logprob / length ** length_penalty``. The router
does the same through its dispatcher, so each step's requests are routed (and their prefixes
cached) like any other. The answer is the finished beams as one engine output each, written by
the ordinary output pipeline: ``BeamAnswer`` stands for the routed request.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from render.errors import InputProcessorError, vllm_message
from render.protocol import GenerateRequest
from render.request_checks import refuse
from render.sampling_checks import RequestLimits
from router.front.state import RouterState
from router.link.request_stream import ChoiceStream
from serving.errors import EngineOutputError
from wire.engine import EngineCoreOutput, FinishReason, LoRARequest
from wire.ndarrays import rows_of
from wire.sampling import OUTPUT_FINAL_ONLY, SamplingParams


@dataclass(frozen=True, slots=True)
class BeamDecision:
    steps: int

    def header(self) -> str:
        return f"beam_search; steps={self.steps}"


@dataclass(slots=True)
class BeamAnswer:
    """A finished beam search as the response writer sees a routed request: no engine stream
    left open, every choice's one output already here."""

    decision: BeamDecision
    first: list[EngineCoreOutput]
    streams: list[ChoiceStream] = field(default_factory=list)

    @property
    def request_ids(self) -> list[str]:
        return []


@dataclass(slots=True)
class _Beam:
    tokens: list[int]
    cum_logprob: float = 0.0
    finish: FinishReason = FinishReason.LENGTH
    stop_reason: int | None = None


def check_beam(logprobs: bool, width: int) -> None:
    """What vLLM refuses of a beam search as it builds it, and what the router's does not
    give: logprobs (vLLM's are the beams' step candidates, an answer shape of its own)."""
    if width < 1:
        raise refuse(f"beam_width must be at least 1, got {width}.")
    if logprobs:
        raise refuse("logprobs are not supported with beam search by kvroute.", "logprobs")


def check_beam_steps(width: int, limits: RequestLimits) -> None:
    """vLLM's input processor on a step request: its ``2 x width`` logprobs within
    ``--max-logprobs`` (a stream's in-band error, as from vLLM)."""
    wanted, cap = 2 * width, limits.max_logprobs
    if cap != -1 and wanted > cap:
        raise InputProcessorError(vllm_message(
            f"Requested sample logprobs of {wanted}, which is greater than max allowed: {cap}",
            "logprobs", wanted), "logprobs")


async def beam_search(st: RouterState, gen: GenerateRequest, width: int, eos: int | None,
                      length_penalty: float, ignore_eos: bool, include_stop: bool,
                      generation_config: dict[str, object], lora: LoRARequest | None = None,
                      session: str | None = None) -> list[EngineCoreOutput]:
    """The ``width`` best continuations of ``gen``'s prompt, at most its ``max_tokens`` long,
    each as one finished engine output (finish STOP at EOS, else LENGTH)."""
    sp = gen.sampling_params
    step_params = _step_params(sp, width, eos, generation_config)
    prompt = list(gen.token_ids)
    beams = [_Beam(prompt)]
    completed: list[_Beam] = []
    for _ in range(sp.max_tokens or 0):
        batch = f"{gen.request_id}-{uuid.uuid4().hex}"
        rows = await asyncio.gather(*(
            _next_tokens(st, f"{batch}-beam-{i}", beam.tokens, step_params, gen, lora, session)
            for i, beam in enumerate(beams)))
        candidates: list[tuple[float, int, _Beam]] = []
        for beam, row in zip(beams, rows, strict=True):
            for token, logprob in row.items():
                score = beam.cum_logprob + logprob
                if token == eos and not ignore_eos:
                    tokens = beam.tokens + [token] if include_stop else beam.tokens
                    completed.append(_Beam(tokens, score, FinishReason.STOP, token))
                else:
                    candidates.append((score, token, beam))
        candidates.sort(key=lambda c: -c[0])
        beams = [_Beam(beam.tokens + [token], score) for score, token, beam in
                 candidates[:width]]
        if not beams:
            break
    best = sorted([*completed, *beams], key=lambda b: _score(b, eos, length_penalty),
                  reverse=True)[:width]
    return [EngineCoreOutput(f"{gen.request_id}-{i}", b.tokens[len(prompt):],
                             finish_reason=b.finish, stop_reason=b.stop_reason)
            for i, b in enumerate(best)]


def _score(beam: _Beam, eos: int | None, length_penalty: float) -> float:
    """vLLM's ``get_beam_search_score`` (its length counts the prompt's tokens too)."""
    length = len(beam.tokens) - (1 if beam.tokens and beam.tokens[-1] == eos else 0)
    scale: float = math.pow(max(length, 1), length_penalty)
    return beam.cum_logprob / scale


def _step_params(sp: SamplingParams, width: int, eos: int | None,
                 generation_config: dict[str, object]) -> SamplingParams:
    """vLLM's step request (``SamplingParams(logprobs=2 * width, max_tokens=1, temperature,
    detokenize=False)``) with the stop ids its engine client adds."""
    ids = generation_config.get("eos_token_id")
    extra = [ids] if isinstance(ids, int) else list(ids) if isinstance(ids, list) else []
    stop_ids = [i for i in dict.fromkeys(extra) if isinstance(i, int) and i != eos]
    stop_all = sorted({*stop_ids, *([] if eos is None else [eos])})
    return SamplingParams(logprobs=2 * width, max_tokens=1, temperature=sp.temperature,
                          detokenize=False, watermarking=False, output_kind=OUTPUT_FINAL_ONLY,
                          stop_token_ids=stop_ids, _eos_token_id=eos,
                          _all_stop_token_ids=stop_all, skip_clone=True)


async def _next_tokens(st: RouterState, request_id: str, tokens: Sequence[int],
                       params: SamplingParams, gen: GenerateRequest, lora: LoRARequest | None,
                       session: str | None) -> dict[int, float]:
    """One beam's step on an engine: its candidates' logprobs, the sampled token first (as
    vLLM's dict: a candidate met again keeps its place)."""
    routed = await st.dispatcher.open(request_id, tokens, msgspec.structs.replace(params),
                                      lora=lora, cache_salt=gen.cache_salt, session_id=session)
    try:
        out = routed.first[0]
        while not out.finished:
            out = await anext(routed.streams[0])
    finally:
        st.dispatcher.done(routed)
    if out.error is not None or out.finish_reason == FinishReason.ERROR:
        raise EngineOutputError(out.error.message if out.error is not None else
                                "The engine failed while generating this request.")
    if out.new_logprobs is None:
        return {}
    rows = rows_of(out.new_logprobs)
    return {int(t): float(lp) for t, lp in zip(rows.token_ids[:rows.width],
                                               rows.logprobs[:rows.width], strict=True)}
