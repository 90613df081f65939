"""A completions request with several prompts: one routed request and one pipeline per prompt.

vLLM's ``/v1/completions`` accepts a list of prompts and answers them in one response whose
choice ``prompt_index * n + i`` is choice ``i`` of prompt ``prompt_index``; usage sums over the
prompts. Each prompt is routed on its own (prompts of one batch rarely share a prefix, and each
should land where its own prefix is cached), and its own ``Pipeline`` keeps its own detokenizer
seed, echo and stop state. The group below presents the prompts as ONE request to the response
writer (router/front/respond.py), to SSE and to the collector, so a multi-prompt answer takes
the same single output path as any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from output.openai_types import Chunk, Completion, PromptTokensDetails, Usage
from output.pipeline import Pipeline, PipelineSpec
from router.link.request_stream import ChoiceStream
from router.routing.dispatch import Routed
from wire.engine import EngineCoreOutput


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """The routing of every prompt, for the ``x-kvroute-route`` header."""

    parts: tuple[Routed, ...]

    def header(self) -> str:
        return ", ".join(f"prompt={i}; {p.decision.header()}" for i, p in enumerate(self.parts))


class RoutedGroup:
    """Several ``Routed`` prompts as one: streams and first outputs in global choice order."""

    def __init__(self, parts: Sequence[Routed]) -> None:
        self.parts = tuple(parts)
        self.decision = GroupDecision(self.parts)
        self.streams: list[ChoiceStream] = [s for p in self.parts for s in p.streams]
        self.first: list[EngineCoreOutput] = [f for p in self.parts for f in p.first]

    @property
    def request_ids(self) -> list[str]:
        return [s.request_id for s in self.streams]


class PipelineGroup:
    """One ``Pipeline`` per prompt behind the ``Pipeline`` interface the writers use."""

    def __init__(self, spec: PipelineSpec, parts: Sequence[Pipeline]) -> None:
        # ``spec`` is the response's: its id, and n = every choice of every prompt.
        self.spec = spec
        self.parts = tuple(parts)
        self.parsers = None  # completions: no output parsers
        self._where: list[tuple[Pipeline, int, int]] = []  # (pipeline, local index, offset)
        for p in self.parts:
            offset = len(self._where)
            self._where += [(p, i, offset) for i in range(p.spec.n)]

    @property
    def done(self) -> bool:
        return all(p.done for p in self.parts)

    @property
    def cached_tokens(self) -> int | None:
        known = [p.cached_tokens for p in self.parts if p.cached_tokens is not None]
        return sum(known) if known else None

    @property
    def completion_tokens(self) -> int:
        return sum(p.completion_tokens for p in self.parts)

    @property
    def kv_transfer_params(self) -> dict[str, object] | None:
        """The first prompt's, as vLLM's body carries."""
        return self.parts[0].kv_transfer_params

    def prompt_logprobs(self, index: int = 0) -> list[dict[str, dict[str, object]] | None] | None:
        pipeline, local, _ = self._where[index]
        return pipeline.prompt_logprobs(local)

    def usage(self, index: int | None = None) -> Usage:
        if index is not None:
            pipeline, local, _ = self._where[index]
            return pipeline.usage(local)
        parts = [p.usage() for p in self.parts]
        prompt = sum(u.prompt_tokens for u in parts)
        completion = sum(u.completion_tokens for u in parts)
        cached = self.cached_tokens
        details = (None if cached is None or not self.spec.usage_details
                   else PromptTokensDetails(cached_tokens=cached))
        return Usage(prompt, prompt + completion, completion, details)

    def start(self) -> list[Chunk]:
        out: list[Chunk] = []
        for p in self.parts:
            out += [self._own(c, self._offset(p)) for c in p.start()]
        return out

    def feed(self, index: int, out: EngineCoreOutput) -> tuple[Chunk | None, bool]:
        pipeline, local, offset = self._where[index]
        chunk, abort = pipeline.feed(local, out)
        return (None if chunk is None else self._own(chunk, offset)), abort

    def end(self) -> list[Chunk]:
        if not self.spec.include_usage:
            return []
        spec = self.spec
        return [Completion(id=spec.request_id, created=spec.created, model=spec.model,
                           choices=[], usage=self.usage())]

    def _offset(self, pipeline: Pipeline) -> int:
        return next(off for p, _, off in self._where if p is pipeline)

    def _own(self, chunk: Chunk, offset: int) -> Chunk:
        """A prompt's chunk as the response's: the response id, choices at global indexes."""
        if not isinstance(chunk, Completion):
            raise TypeError(f"multi-prompt requests are completions, got {type(chunk).__name__}")
        # Each feed builds a fresh chunk, so it is re-labelled in place (no copies per token).
        chunk.id = self.spec.request_id
        for c in chunk.choices:
            c.index += offset
        return chunk
