"""``tool_choice`` as vLLM 0.32 honours it: checked against the server's flags, and a named
function or ``required`` turned into a JSON-schema constraint on the output.

A server reads tool calls only with ``--enable-auto-tool-choice`` and ``--tool-call-parser``
(``ToolCalling``). Without them ``tool_choice: "auto"`` (the default when ``tools`` are sent) is a
400 with vLLM's message, and so are ``required`` and a named function; gpt-oss (Harmony) and
Mistral tokenizers read calls natively and are exempt, as in vLLM. When the tool parser reads a
forced call as the JSON its constraint produces (vLLM's ``supports_required_and_named``), the
request's structured output becomes that constraint (``get_json_schema_from_tools``): the named
function's parameters, or an array of ``{"name", "parameters"}`` objects, one of the tools each
(``maxItems: 1`` when ``parallel_tool_calls`` is false), their ``$defs`` gathered at the top.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

from render.errors import BadRequestError
from render.protocol import ChatCompletionRequest, NamedToolChoice, Tool


@dataclass(frozen=True, slots=True)
class ToolCalling:
    """What the server's flags say about reading tool calls."""

    tool_parser: str | None = None  # the parser that runs (set only with auto tool choice)
    enable_auto_tools: bool = False
    forced_json: bool = True  # the parser reads required/named output as the constraint's JSON
    native: bool = False  # Harmony or a Mistral tokenizer: calls are read whatever the flags


def effective(req: ChatCompletionRequest) -> str | NamedToolChoice | None:
    """The request's tool_choice with vLLM's default: ``auto`` when tools are sent, else none."""
    if req.tool_choice is UNSET:
        return "auto" if req.tools else "none"
    return req.tool_choice


def check(req: ChatCompletionRequest, calling: ToolCalling) -> None:
    """vLLM's OnlineRenderer check: a tool_choice the server cannot honour is a 400."""
    choice = effective(req)
    if choice is None or choice == "none":
        return
    if calling.tool_parser is not None or calling.native:
        return
    if choice == "auto":
        if not calling.enable_auto_tools:
            raise BadRequestError('"auto" tool choice requires --enable-auto-tool-choice and '
                                  "--tool-call-parser to be set")
        return
    desc = (f'function "{choice.function.name}"' if isinstance(choice, NamedToolChoice)
            else f'"{choice}"')
    raise BadRequestError(f"tool_choice={desc} requires --tool-call-parser to be set")


def forced_schema(req: ChatCompletionRequest, calling: ToolCalling) -> dict[str, Any] | None:
    """The JSON schema a named or required tool_choice constrains the output to, if any."""
    if calling.tool_parser is None or not calling.forced_json or not req.tools:
        return None
    choice = effective(req)
    if isinstance(choice, NamedToolChoice):
        tool = next((t for t in req.tools if t.function.name == choice.function.name), None)
        if tool is None:
            raise BadRequestError(
                f"Tool '{choice.function.name}' has not been passed in `tools`.", "tool_choice")
        return _params(tool)
    if choice == "required":
        return _array(req.tools, req.parallel_tool_calls)
    return None


def _params(tool: Tool) -> dict[str, Any]:
    params = tool.function.parameters
    if params is UNSET or not params:
        return {"type": "object", "properties": {}}
    copied: dict[str, Any] = copy.deepcopy(params)
    return copied


def _array(tools: list[Tool], parallel_tool_calls: bool | None) -> dict[str, Any]:
    items = []
    defs: dict[str, Any] = {}
    for tool in tools:
        params = _params(tool)
        found = params.pop("$defs", {})
        if not isinstance(found, dict):
            raise BadRequestError(
                f"`$defs` in the parameters of tool '{tool.function.name}' must be an object, "
                f"got {type(found).__name__}.", "tools")
        for name, definition in found.items():
            if name in defs and defs[name] != definition:
                raise BadRequestError(
                    f"Tool definition '{name}' has multiple schemas, which is not supported.",
                    "tools")
            defs[name] = definition
        items.append({"properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                     "parameters": params},
                      "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": items}}
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema
