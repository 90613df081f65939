"""One choice's parsers as the output pipeline calls them: text in, a ``ParsedDelta`` per step.

The stages (reasoning, then tool calls or plain content) write into the choice's ``Out``; the
request's options apply to what comes out: ``include_reasoning: false`` drops the reasoning,
``parallel_tool_calls: false`` keeps only the first call (vLLM's
``maybe_filter_parallel_tool_calls``). Malformed output never raises here: the stages degrade,
and a step that breaks anyway answers its text as content, counted in ``failures``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from output.parsers.base import Stage
from output.parsers.emit import Out, ParsedDelta

log = logging.getLogger(__name__)


class ChatParser:
    __slots__ = ("out", "head", "include_reasoning", "single_call", "failed", "on_failure",
                 "_empty")

    def __init__(self, out: Out, head: Stage, *, include_reasoning: bool = True,
                 single_call: bool = False, on_failure: object = None,
                 empty_content: str | None = "") -> None:
        self.out = out
        self._empty = empty_content
        self.head = head
        self.include_reasoning = include_reasoning
        self.single_call = single_call
        self.failed = False
        self.on_failure = on_failure

    @property
    def empty_content(self) -> str | None:
        """The message content when none was written (vLLM's parsers answer None or "")."""
        return None if self.out.region and self._empty == "" else self._empty

    def parse(self, text: str, token_ids: Sequence[int], finished: bool) -> ParsedDelta | None:
        if self.failed:
            return ParsedDelta(text) if text else None
        try:
            if text:
                self.head.feed(text)
            if finished:
                self.head.finish()
        except Exception:  # a parser bug must not end the stream: the rest is content
            log.exception("output parser failed; the rest of the output is content")
            self.failed = True
            if callable(self.on_failure):
                self.on_failure()
            self.out.text(text)
        delta = self.out.take()
        if delta is None:
            return None
        content, reasoning, calls = delta
        if reasoning is not None and not self.include_reasoning:
            reasoning = None
        if calls is not None and self.single_call:
            calls = [c for c in calls if c.index == 0] or None
        if content is None and reasoning is None and calls is None:
            return None
        return ParsedDelta(content, reasoning, calls)
