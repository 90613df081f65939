"""vLLM's ``stream_interval``: a streamed choice's chunks merged, ``interval`` tokens at a time.

vLLM's output processor sends a choice's first output at once, then waits until ``interval``
more tokens have come (or the choice finished) and sends them as one delta: the text, token
ids and logprobs of the chunks in between, joined. ``Interval.push`` does the same with the
pipeline's chunks (each one engine output of one choice).
"""

from __future__ import annotations

import msgspec

from output.openai_types import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatLogprobs,
    Chunk,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    GenerateChoice,
    GenerateLogprobs,
    GenerateResponse,
)


class Interval:
    """Per choice: the chunk held back and how many tokens were sent."""

    def __init__(self, interval: int, n: int) -> None:
        self.interval = interval
        self._held: list[Chunk | None] = [None] * n
        self._sent: list[int | None] = [None] * n  # tokens sent; None: nothing sent yet

    def push(self, index: int, chunk: Chunk | None, tokens: int, finished: bool
             ) -> Chunk | None:
        """``chunk`` (may be None) of choice ``index`` with its token count so far; returns the
        chunk to send now, if any."""
        held = self._held[index]
        if chunk is not None:
            held = chunk if held is None else _merge(held, chunk)
        sent = self._sent[index]
        if not (finished or sent is None or tokens - sent >= self.interval):
            self._held[index] = held
            return None
        self._held[index] = None
        self._sent[index] = tokens
        return held


def _merge(a: Chunk, b: Chunk) -> Chunk:
    """Two chunks of one choice as one delta (``b`` after ``a``): ``a`` extended in place."""
    if isinstance(a, ChatCompletionChunk) and isinstance(b, ChatCompletionChunk):
        _merge_chat(a.choices[0], b.choices[0])
    elif isinstance(a, Completion) and isinstance(b, Completion):
        _merge_completion(a.choices[0], b.choices[0])
    elif isinstance(a, GenerateResponse) and isinstance(b, GenerateResponse):
        _merge_generate(a.choices[0], b.choices[0])
    else:
        raise TypeError(f"cannot merge {type(a).__name__} and {type(b).__name__}")
    if b.usage is not None:
        a.usage = b.usage
    return a


def _join(x: str | None, y: str | None) -> str | None:
    return y if x is None else x if y is None else x + y


def _ids(x: list[int] | None, y: list[int] | None) -> list[int] | None:
    return y if x is None else x if y is None else x + y


def _raw_lists(x: ChatLogprobs | None, y: ChatLogprobs | None) -> ChatLogprobs | None:
    if x is None or y is None:
        return y if x is None else x
    parts = []
    for lp in (x, y):
        content = lp.content
        raw = content if isinstance(content, msgspec.Raw) else msgspec.json.encode(content)
        inner = bytes(raw)[1:-1]
        if inner:
            parts.append(inner)
    return ChatLogprobs(msgspec.Raw(b"[" + b",".join(parts) + b"]"))


def _merge_chat(a: ChatChunkChoice, b: ChatChunkChoice) -> None:
    a.delta.content = _join(a.delta.content, b.delta.content)
    a.delta.reasoning_content = _join(a.delta.reasoning_content, b.delta.reasoning_content)
    if b.delta.tool_calls:
        a.delta.tool_calls = [*(a.delta.tool_calls or []), *b.delta.tool_calls]
    a.logprobs = _raw_lists(a.logprobs, b.logprobs)
    a.token_ids = _ids(a.token_ids, b.token_ids)
    a.finish_reason, a.stop_reason = b.finish_reason, b.stop_reason


def _merge_completion(a: CompletionChoice, b: CompletionChoice) -> None:
    a.text += b.text
    if a.logprobs is None or b.logprobs is None:
        a.logprobs = a.logprobs or b.logprobs
    else:
        x, y = a.logprobs, b.logprobs
        a.logprobs = CompletionLogprobs(x.text_offset + y.text_offset,
                                        x.token_logprobs + y.token_logprobs,
                                        x.tokens + y.tokens, x.top_logprobs + y.top_logprobs)
    a.token_ids = _ids(a.token_ids, b.token_ids)
    a.finish_reason, a.stop_reason = b.finish_reason, b.stop_reason


def _merge_generate(a: GenerateChoice, b: GenerateChoice) -> None:
    a.token_ids = _ids(a.token_ids, b.token_ids)
    a.text = _join(a.text, b.text)
    if isinstance(a.logprobs, GenerateLogprobs) and isinstance(b.logprobs, GenerateLogprobs):
        a.logprobs = GenerateLogprobs([*(a.logprobs.content or []), *(b.logprobs.content or [])])
    elif isinstance(a.logprobs, ChatLogprobs) or isinstance(b.logprobs, ChatLogprobs):
        a.logprobs = _raw_lists(a.logprobs if isinstance(a.logprobs, ChatLogprobs) else None,
                                b.logprobs if isinstance(b.logprobs, ChatLogprobs) else None)
    a.finish_reason, a.stop_reason = b.finish_reason, b.stop_reason
