"""What the parser stages produce for one engine step: content, reasoning and tool-call deltas.

Stages write into one ``Out`` per choice as they recognise text; the pipeline ``take``s it once
per step as a ``ParsedDelta``. A call's first delta carries its index, id, type and name; its
argument fragments follow under the same index (those of one step merged into one delta).
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

from output.openai_types import DeltaToolCall, ToolCallFunction


class ParsedDelta(NamedTuple):
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


def random_call_id(name: str, index: int) -> str:
    """vLLM's default tool-call id: ``chatcmpl-tool-`` and 16 random hex digits."""
    return f"chatcmpl-tool-{uuid.uuid4().int & (2**64 - 1):016x}"


def kimi_call_id(name: str, index: int) -> str:
    """Kimi K2's id, ``functions.NAME:INDEX`` (the index counts the conversation's calls)."""
    return f"functions.{name}:{index}"


class Out:
    """One choice's parsed output of the current step."""

    __slots__ = ("_content", "_reasoning", "_calls", "ncalls", "first_call", "_make_id", "mute",
                 "region")

    def __init__(self, make_id: object = random_call_id, first_call: int = 0,
                 mute_calls: bool = False) -> None:
        # Calls recognised but not made (tool_choice "none" with vLLM's engine parsers, which
        # still take their markup out of the content).
        self.mute = mute_calls
        # A tool-call region began (vLLM's legacy parsers then answer empty content as None).
        self.region = False
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, DeltaToolCall] = {}
        self.ncalls = 0  # calls started so far
        self.first_call = first_call  # ids count from here (Kimi: calls already in the chat)
        self._make_id = make_id

    def text(self, s: str) -> None:
        if s:
            self._content.append(s)

    def think(self, s: str) -> None:
        if s:
            self._reasoning.append(s)

    def call(self, name: str, call_id: str | None = None) -> int:
        """Start the next tool call (``call_id``: the id the model wrote); returns its index."""
        index = self.ncalls
        self.ncalls += 1
        if self.mute:
            return index
        make_id = self._make_id
        assert callable(make_id)
        if call_id is None:
            call_id = make_id(name, self.first_call + index)
        self._calls[index] = DeltaToolCall(index, call_id, "function",
                                           ToolCallFunction(name, None))
        return index

    def args(self, index: int, s: str) -> None:
        if not s or self.mute:
            return
        delta = self._calls.get(index)
        if delta is None:
            self._calls[index] = DeltaToolCall(index, function=ToolCallFunction(None, s))
            return
        fn = delta.function
        assert fn is not None
        fn.arguments = s if fn.arguments is None else fn.arguments + s

    def take(self) -> ParsedDelta | None:
        """This step's delta (None: nothing recognised yet), and a fresh start for the next."""
        content, reasoning, calls = self._content, self._reasoning, self._calls
        if not content and not reasoning and not calls:
            return None
        self._content, self._reasoning, self._calls = [], [], {}
        return ParsedDelta("".join(content) if content else None,
                           "".join(reasoning) if reasoning else None,
                           [calls[k] for k in sorted(calls)] if calls else None)
