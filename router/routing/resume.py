"""A stream that outlives its engine: the request goes on on another engine, in the same answer.

When the engine serving a choice dies after the choice produced tokens (``EngineDeadError``, or
``EngineUnavailableError``: its link is gone), the choice is submitted again, to an engine that
has not failed it, as its prompt plus every token it produced so far, with what is left of its
budget (``max_tokens`` and ``min_tokens`` less those tokens; no prompt logprobs: they were
sent). Its outputs then continue the same ``ResumableStream``, so the answer's pipeline (the
detokenizer, stop strings, parsers, usage) and its SSE stream never see a seam: the client gets
one answer. A model continues its own output as it would have: greedy requests give exactly the
tokens an unbroken run gives. Sampled requests continue as a fresh draw from the seam on (a
seeded request's generator starts over there, with the same seed: a valid sample, reproducible
for that seam, but not the bytes an unbroken run would give); penalties that count output
tokens see the produced tokens as prompt from the seam on.

Not resumed: requests with structured outputs, a thinking budget or repetition detection (state
over the output the new engine would not have), requests that turned it off (``"vllm_xargs":
{"kvroute_resume": false}``), and a choice that has resumed ``max_resumes`` times already. A
resume that finds no engine, or whose engine fails before its first output too, ends the stream
with the original error. ``kvroute_resumes_total{outcome}`` counts both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence

import msgspec

from router.link.request_stream import ChoiceStream, RequestStream
from router.obs.metrics import RouterMetrics
from serving.errors import APIError, EngineDeadError, EngineUnavailableError
from wire.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from wire.sampling import SamplingParams

# (request id, prompt, params, engines not to use) -> the new stream and its first output.
Reopen = Callable[[str, Sequence[int], SamplingParams, Collection[str]],
                  Awaitable[tuple[RequestStream, EngineCoreOutput]]]
# Give back the router's slot on an engine the request left.
Release = Callable[[str], None]
Abort = Callable[[list[str]], Awaitable[None]]

_OFF = (False, 0, "0", "false", "off", "no")


def resumable(params: SamplingParams) -> bool:
    """Whether a request may be resumed on another engine (see the module docstring)."""
    extra = params.extra_args
    if isinstance(extra, dict) and extra.get("kvroute_resume", True) in _OFF:
        return False
    return (params.structured_outputs is None and params.thinking_token_budget is None
            and params.repetition_detection is None)


def resumed_params(params: SamplingParams, produced: int) -> SamplingParams:
    """The budget left after ``produced`` tokens; prompt logprobs were already sent."""
    max_tokens = None if params.max_tokens is None else params.max_tokens - produced
    return msgspec.structs.replace(
        params, max_tokens=max_tokens, min_tokens=max(0, params.min_tokens - produced),
        prompt_logprobs=None, prompt_logprob_token_ids=None, prompt_logprob_start=None)


class ResumableStream:
    """One choice's outputs, carried over to another engine when its engine dies."""

    __slots__ = ("stream", "request", "produced", "resumes", "max_resumes", "failed_on",
                 "reopen", "release", "abort", "metrics", "_resuming", "_cut")

    def __init__(self, stream: RequestStream, request: EngineCoreRequest,
                 first: EngineCoreOutput, *, reopen: Reopen, release: Release, abort: Abort,
                 metrics: RouterMetrics, max_resumes: int) -> None:
        self.stream = stream
        self.request = request  # what was submitted first: its prompt and sampling params
        self.produced: list[int] = list(first.new_token_ids)  # every token sent on so far
        self.resumes = 0
        self.max_resumes = max_resumes
        self.failed_on: set[str] = set()
        self.reopen = reopen
        self.release = release
        self.abort = abort
        self.metrics = metrics
        self._resuming = False
        self._cut: BaseException | None = None

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    @property
    def engine(self) -> str:
        return self.stream.engine

    @property
    def finished(self) -> bool:
        return self.stream.finished and not self._resuming

    @property
    def queued(self) -> int:
        return self.stream.queued

    def fail(self, exc: BaseException) -> None:
        """End the choice with ``exc`` (a resume under way is ended when it lands)."""
        self._cut = exc
        self.stream.fail(exc)

    def __aiter__(self) -> ChoiceStream:
        return self

    async def __anext__(self) -> EngineCoreOutput:
        try:
            out = await self.stream.__anext__()
        except (EngineDeadError, EngineUnavailableError) as exc:
            out = await self._resume(exc)
        if out.new_token_ids:
            self.produced.extend(out.new_token_ids)
        return out

    async def _resume(self, error: APIError) -> EngineCoreOutput:
        if self._cut is not None or self.resumes >= self.max_resumes:
            raise error
        request = self.request
        params = request.sampling_params
        assert params is not None and request.prompt_token_ids is not None
        produced = len(self.produced)
        if params.max_tokens is not None and produced >= params.max_tokens:
            # Its last token arrived, its finish did not: the length finish is all that is left.
            return EngineCoreOutput(self.request_id, [], finish_reason=FinishReason.LENGTH)
        self.resumes += 1
        self.failed_on.add(self.stream.engine)
        prompt = [*request.prompt_token_ids, *self.produced]
        self._resuming = True
        try:
            stream, first = await self.reopen(
                f"{request.request_id}-resume{self.resumes}", prompt,
                resumed_params(params, produced), self.failed_on)
        except APIError:
            self.metrics.resumes.labels("failed").inc()
            raise error from None
        finally:
            self._resuming = False
        left = self.stream.engine
        self.stream = stream
        self.release(left)  # the new engine's slot was taken by the reopen
        self.metrics.resumes.labels("resumed").inc()
        self.metrics.resumed_tokens.inc(len(prompt))
        if self._cut is not None:  # cut (drain deadline, shutdown) while it was reopening
            stream.fail(self._cut)
            await self.abort([stream.request_id])
            raise self._cut
        return first
