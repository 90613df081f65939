"""The non-stream response: the pipeline's stream chunks folded into one body.

The same ``Pipeline.feed`` that feeds SSE produces every chunk here, so streamed and collected
responses of one request cannot disagree (as vLLM's Rust frontend does it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from output.openai_types import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatMessage,
    Chunk,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    DeltaToolCall,
    GenerateChoice,
    GenerateLogprobs,
    GenerateLogprobsContent,
    GenerateResponse,
    ToolCallFunction,
    Usage,
)
from output.pipeline import CHAT, COMPLETION, Pipeline
from output.sse import Abort
from serving.errors import EngineOutputError
from wire.engine import EngineCoreOutput

Body = ChatCompletion | Completion | GenerateResponse


class _Acc:
    __slots__ = ("text", "reasoning", "tools", "chat_lp", "cmpl_lp", "gen_lp", "ids", "finish",
                 "stop_reason", "any_text", "prompt_ids")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] | None = None
        self.tools: dict[int, DeltaToolCall] = {}
        self.chat_lp: list[bytes] = []  # the JSON of each chunk's entries, brackets stripped
        self.cmpl_lp: CompletionLogprobs | None = None
        self.gen_lp: list[GenerateLogprobsContent] | None = None
        self.ids: list[int] | None = None
        self.finish: str | None = None
        self.stop_reason: int | str | None = None
        self.any_text = False
        self.prompt_ids: list[int] | None = None


class Collector:
    """Folds chunks in arrival order; ``body`` builds the final object."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self._acc = [_Acc() for _ in range(pipeline.spec.n)]

    def add(self, chunk: Chunk) -> None:
        if isinstance(chunk, ChatCompletionChunk):
            for c in chunk.choices:
                a = self._acc[c.index]
                d = c.delta
                if d.content is not None:
                    a.any_text = a.any_text or d.role is None
                    a.text.append(d.content)
                if d.reasoning_content is not None:
                    a.reasoning = (a.reasoning or []) + [d.reasoning_content]
                for tc in d.tool_calls or ():
                    _merge_tool_call(a.tools, tc)
                if c.logprobs is not None:
                    _add_chat_logprobs(a.chat_lp, c.logprobs)
                self._finish(a, c.finish_reason, c.stop_reason, c.token_ids)
        elif isinstance(chunk, Completion):
            for cc in chunk.choices:
                a = self._acc[cc.index]
                a.text.append(cc.text)
                if cc.prompt_token_ids is not None:
                    a.prompt_ids = cc.prompt_token_ids
                lp = cc.logprobs
                if lp is not None:
                    if a.cmpl_lp is None:
                        a.cmpl_lp = CompletionLogprobs([], [], [], [])
                    a.cmpl_lp.text_offset += lp.text_offset
                    a.cmpl_lp.token_logprobs += lp.token_logprobs
                    a.cmpl_lp.tokens += lp.tokens
                    a.cmpl_lp.top_logprobs += lp.top_logprobs
                self._finish(a, cc.finish_reason, cc.stop_reason, cc.token_ids)
        else:
            for g in chunk.choices:
                a = self._acc[g.index]
                if g.text is not None:
                    a.text.append(g.text)
                if isinstance(g.logprobs, GenerateLogprobs) and g.logprobs.content is not None:
                    a.gen_lp = (a.gen_lp or []) + g.logprobs.content
                elif isinstance(g.logprobs, ChatLogprobs):
                    _add_chat_logprobs(a.chat_lp, g.logprobs)
                self._finish(a, g.finish_reason, g.stop_reason, g.token_ids)

    @staticmethod
    def _finish(a: _Acc, finish: str | None, stop_reason: int | str | None,
                ids: list[int] | None) -> None:
        if ids is not None:
            a.ids = (a.ids or []) + ids
        if finish is not None:
            a.finish, a.stop_reason = finish, stop_reason

    def body(self, usage: Usage) -> Body:
        spec = self.pipeline.spec
        want_lp = spec.logprobs is not None
        parsers = self.pipeline.parsers
        if parsers is not None and not parsers.include_reasoning:
            want_lp = False  # hidden reasoning: no logprobs (vLLM's suppress_metadata)
        if spec.kind == CHAT:
            choices = []
            for i, a in enumerate(self._acc):
                tools = [self._acc[i].tools[k] for k in sorted(a.tools)]
                if a.any_text:
                    content: str | None = "".join(a.text)
                elif parsers is not None:  # as vLLM's parsers answer an empty content
                    content = (None if tools and not parsers.forced
                               else self.pipeline.empty_content(i))
                else:
                    content = None if tools else ""
                reasoning = None if a.reasoning is None else "".join(a.reasoning)
                msg = ChatMessage(spec.role, content, reasoning, tools, reasoning)
                lp = _chat_logprobs(a.chat_lp) if want_lp else None
                choices.append(ChatChoice(i, msg, lp, a.finish, a.stop_reason, a.ids))
            return ChatCompletion(id=spec.request_id, created=spec.created, model=spec.model,
                                  choices=choices, usage=usage,
                                  prompt_logprobs=self.pipeline.prompt_logprobs(),
                                  prompt_token_ids=spec.prompt_token_ids,
                                  prompt_text=spec.prompt_text,
                                  kv_transfer_params=self.pipeline.kv_transfer_params)
        if spec.kind == COMPLETION:
            cchoices = [
                CompletionChoice(i, "".join(a.text),
                                 (a.cmpl_lp or CompletionLogprobs([], [], [], []))
                                 if want_lp else None,
                                 a.finish, a.stop_reason, a.ids,
                                 # A body shows the prompt's ids only when asked (a stream
                                 # also with an echo).
                                 a.prompt_ids if spec.return_token_ids else None,
                                 self.pipeline.prompt_logprobs(i))
                for i, a in enumerate(self._acc)
            ]
            return Completion(id=spec.request_id, created=spec.created, model=spec.model,
                              choices=cchoices, usage=usage,
                              kv_transfer_params=self.pipeline.kv_transfer_params)
        text_mode = spec.output_mode == "text"
        gchoices = []
        for i, a in enumerate(self._acc):
            glp: GenerateLogprobs | ChatLogprobs | None = None
            if want_lp:
                glp = (_chat_logprobs(a.chat_lp) if text_mode
                       else GenerateLogprobs(a.gen_lp or []))
            # vLLM's non-stream generate choice defaults finish_reason to "stop".
            gchoices.append(GenerateChoice(i, a.finish or "stop", a.stop_reason, a.ids or [],
                                           "".join(a.text) if text_mode else None, glp))
        return GenerateResponse(request_id=spec.request_id, model=spec.model,
                                created=spec.created, usage=usage,
                                prompt_token_ids=spec.prompt_token_ids,
                                output_mode=spec.output_mode, choices=gchoices)


def _add_chat_logprobs(acc: list[bytes], lp: ChatLogprobs) -> None:
    content = lp.content
    if content is None:
        return
    raw = content if isinstance(content, msgspec.Raw) else msgspec.json.encode(content)
    items = memoryview(raw)[1:-1].tobytes()  # a JSON list: "[" entries "]"
    if items:
        acc.append(items)


def _chat_logprobs(acc: list[bytes]) -> ChatLogprobs:
    return ChatLogprobs(msgspec.Raw(b"[" + b",".join(acc) + b"]"))


def _merge_tool_call(tools: dict[int, DeltaToolCall], tc: DeltaToolCall) -> None:
    cur = tools.get(tc.index)
    if cur is None:
        fn = tc.function
        tools[tc.index] = DeltaToolCall(
            tc.index, tc.id, tc.type,
            ToolCallFunction(fn.name, fn.arguments or "") if fn is not None else None)
        return
    if tc.function is not None:
        if cur.function is None:
            cur.function = ToolCallFunction(tc.function.name, "")
        cur.function.arguments = (cur.function.arguments or "") + (tc.function.arguments or "")


async def collect(
    pipeline: Pipeline,
    outputs: AsyncIterator[tuple[int, EngineCoreOutput]],
    abort: Abort | None = None,
) -> Body:
    """Run the pipeline to the end and return the non-stream body (raises EngineOutputError)."""
    col = Collector(pipeline)
    for c in pipeline.start():
        col.add(c)
    try:
        async for index, out in outputs:
            chunk, stop_abort = pipeline.feed(index, out)
            if stop_abort and abort is not None:
                await abort(index)
            if chunk is not None:
                col.add(chunk)
            if pipeline.done:
                break
    finally:
        aclose = getattr(outputs, "aclose", None)
        if aclose is not None:
            await aclose()
    if not pipeline.done:
        raise EngineOutputError("The engine stream ended before the request finished.")
    return col.body(pipeline.usage())
