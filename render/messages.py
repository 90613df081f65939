"""OpenAI chat messages -> the dicts a chat template sees, normalised exactly as vLLM 0.32 does.

Mirrors ``vllm/renderers/chat_utils.py`` (``_parse_chat_message_content``,
``_postprocess_messages``) and the developer-role handling of ``renderers/hf.py``: text parts
joined with "\\n" (or kept as ``{"type": "text"}`` parts when the template iterates content),
``null`` content as empty, tool-call ``arguments`` parsed into objects (invalid -> ``{}``),
``reasoning`` copied to ``reasoning_content``, ``developer`` turned into ``system`` for templates
that do not know it. Media parts are refused.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from msgspec import UNSET

from render.content_format import ContentFormat
from render.errors import BadRequestError
from render.protocol import MEDIA_PART_TYPES, ChatMessage, ContentPart, Tool, ToolCall

_BILLING_HEADER = "x-anthropic-billing-header"


def _part_text(part: ContentPart) -> str | None:
    if part.type == "refusal":
        value = part.refusal
    elif part.type == "thinking":
        value = part.thinking
    else:
        value = part.text
    return None if value is UNSET or value is None else str(value)


def _strip_billing_header(parts: list[str | ContentPart]) -> list[str | ContentPart]:
    """Claude Code's per-request attribution line would defeat the prefix cache (vLLM drops it)."""
    out: list[str | ContentPart] = []
    for part in parts:
        text = part if isinstance(part, str) else (part.text if part.type == "text" else None)
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else msgspec.structs.replace(part, text=rest))
    return out


def _content(msg: ChatMessage, index: int, fmt: ContentFormat) -> str | list[dict[str, Any]]:
    raw = msg.content
    # Plain string content (nearly every message of a chat) comes out of the general path below
    # unchanged, or as one text part: answer it directly (a long history pays the general path
    # once per message).
    if type(raw) is str and not (msg.role == "system" and raw.startswith(_BILLING_HEADER)):
        return [{"type": "text", "text": raw}] if fmt == "openai" else raw
    parts: list[str | ContentPart]
    if raw is UNSET or raw is None:
        parts = []
    elif isinstance(raw, str):
        parts = [ContentPart(type="text", text=raw)]
    else:
        parts = list(raw)
    if msg.role == "system":
        parts = _strip_billing_header(parts)
    items: list[Any] = []
    for part in parts:
        if isinstance(part, str):
            items.append({"type": "text", "text": part} if fmt == "openai" else part)
            continue
        if part.type in MEDIA_PART_TYPES:
            raise BadRequestError(
                f"Content part type {part.type!r} is not supported: this render serves "
                "text-only models (messages[{index}].content).".replace("{index}", str(index)),
                f"messages[{index}].content",
            )
        if part.type == "tool_reference":
            name = part.name if isinstance(part.name, str) else ""
            items.append({"type": "tool_reference", "name": name} if fmt == "openai" else name)
            continue
        text = _part_text(part)
        if text is None:
            continue  # vLLM skips text parts without text
        items.append({"type": "text", "text": text} if fmt == "openai" else text)
    if fmt == "openai":
        return items
    return "\n".join(items)


def parse_tool_arguments(raw: Any) -> Any:
    """A tool call's ``arguments`` as templates see them in vLLM: JSON strings parsed, and
    empty, invalid or non-object arguments as {} so the conversation can continue."""
    if not raw:
        return {}
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = None
        return parsed if isinstance(parsed, dict) else {}
    return raw


def _tool_call_dict(call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(call)
    function = out["function"]
    function["arguments"] = parse_tool_arguments(function.get("arguments"))
    return out


def normalize_messages(
    messages: list[ChatMessage], fmt: ContentFormat, supports_developer: bool
) -> list[dict[str, Any]]:
    """The conversation as vLLM hands it to ``apply_chat_template``."""
    out: list[dict[str, Any]] = []
    has_developer = False
    for i, msg in enumerate(messages):
        role = msg.role
        result: dict[str, Any] = {"role": role, "content": _content(msg, i, fmt)}
        if role == "assistant":
            if msg.tool_calls is not UNSET and msg.tool_calls is not None:
                result["tool_calls"] = [_tool_call_dict(c) for c in msg.tool_calls]
            reasoning = msg.reasoning if msg.reasoning is not UNSET else None
            if reasoning is None and msg.reasoning_content is not UNSET:
                reasoning = msg.reasoning_content
            if reasoning is not None:
                result["reasoning"] = reasoning
                result["reasoning_content"] = reasoning
        elif role == "tool":
            if msg.tool_call_id is not UNSET:
                result["tool_call_id"] = msg.tool_call_id
            content = result["content"]
            if isinstance(content, list) and all(p.get("type") == "text" for p in content):
                result["content"] = "\n".join(p.get("text", "") for p in content)
        if msg.name is not UNSET:
            result["name"] = msg.name
        if role == "developer":
            has_developer = True
            result["tools"] = None if msg.tools is UNSET else msg.tools
        if "tool_calls" in result and not result["tool_calls"]:
            del result["tool_calls"]  # empty tool_calls: keep templates on the plain path
        out.append(result)
    if has_developer and not supports_developer:
        out = _developer_to_system(out)
    return out


def _developer_to_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    converted = []
    for msg in conversation:
        if msg["role"] == "developer":
            msg = {k: v for k, v in msg.items() if k != "tools"}
            msg["role"] = "system"
        converted.append(msg)
    # Templates that want the system prompt first get every system message merged at the front.
    contents: list[str] = []
    others: list[dict[str, Any]] = []
    merge = False
    for i, msg in enumerate(converted):
        if msg["role"] != "system":
            others.append(msg)
            continue
        if i > 0 or contents:
            merge = True
        content = msg.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else p
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            contents.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(contents)}, *others]


def tool_dicts(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """Tools as vLLM's ``model_dump()`` gives them: description/parameters always present."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        f = tool.function
        function: dict[str, Any] = {
            "name": f.name,
            "description": None if f.description is UNSET else f.description,
            "parameters": None if f.parameters is UNSET else f.parameters,
        }
        if f.strict is not UNSET and f.strict is not None:
            function["strict"] = f.strict
        out.append({"type": tool.type, "function": function})
    return out
