"""A chat request's parsing options, as the output parsers read them (output/parsers/)."""

from __future__ import annotations

from typing import Any

import msgspec

from output.parsers.registry import RequestOptions
from render.protocol import ChatCompletionRequest, NamedToolChoice
from render.tool_choice import effective


def request_options(req: ChatCompletionRequest) -> RequestOptions:
    choice = effective(req)
    tool_choice: str | dict[str, Any] | None = (
        {"type": "function", "function": {"name": choice.function.name}}
        if isinstance(choice, NamedToolChoice) else choice)
    tools = [msgspec.to_builtins(t) for t in req.tools] if req.tools else None
    history = sum(len(m.tool_calls) for m in req.messages
                  if m.role == "assistant" and isinstance(m.tool_calls, list))
    return RequestOptions(tools=tools, tool_choice=tool_choice,
                          include_reasoning=req.include_reasoning,
                          parallel_tool_calls=req.parallel_tool_calls, history_calls=history)
