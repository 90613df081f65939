"""gpt-oss chat rendering through Harmony, as vLLM 0.32 does it (not through the Jinja template).

Mirrors ``vllm/entrypoints/openai/parser/harmony_utils.py``: a system message (reasoning effort,
conversation start date), a developer message with the instructions of a leading system/developer
message and the function tools, then the conversation (assistant tool calls on the commentary
channel with a ``functions.<name>`` recipient, tool results authored by ``functions.<name>``,
reasoning on the analysis channel), analysis turns before the last final answer dropped, and the
legacy tool-call header shape restored token-wise.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import msgspec
from msgspec import UNSET
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
    load_harmony_encoding,
)

from render.errors import BadRequestError
from render.protocol import MEDIA_PART_TYPES, ChatCompletionRequest, ChatMessage

_EFFORT = {
    "high": ReasoningEffort.HIGH,
    "medium": ReasoningEffort.MEDIUM,
    "low": ReasoningEffort.LOW,
}


def _flatten(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = [c if isinstance(c, str) else c.get("text") for c in content]
    kept = [t for t in texts if t is not None]
    return "".join(kept) if kept else None


def _as_dict(i: int, msg: ChatMessage) -> dict[str, Any]:
    """The message as vLLM's validated request holds it (reasoning_content renamed reasoning)."""
    d: dict[str, Any] = msgspec.to_builtins(msg)
    if isinstance(d.get("content"), list):
        for part in d["content"]:
            if isinstance(part, dict) and part.get("type") in MEDIA_PART_TYPES:
                raise BadRequestError(
                    f"Content part type {part['type']!r} is not supported: this render serves "
                    f"text-only models (messages[{i}].content).",
                    f"messages[{i}].content",
                )
    rc = d.pop("reasoning_content", None)
    if rc is not None and d.get("reasoning") is None:
        d["reasoning"] = rc
    return d


class HarmonyRenderer:
    """Renders chat requests for gpt-oss models to token ids."""

    def __init__(self, start_date: str | None = None) -> None:
        self.encoding: HarmonyEncoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self._start_date = start_date
        enc = self.encoding
        self._start, self._channel, self._constrain, self._message = (
            enc.encode(t, allowed_special="all")[0]
            for t in ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
        )

    def render(self, req: ChatCompletionRequest) -> list[int]:
        chat = [_as_dict(i, m) for i, m in enumerate(req.messages)]
        instructions = None
        if chat and chat[0].get("role") in ("system", "developer"):
            instructions = _flatten(chat[0].get("content"))
            chat = chat[1:]
        effort = req.reasoning_effort
        if effort is not None and effort not in _EFFORT:
            raise BadRequestError(
                f"reasoning_effort={effort!r} is not supported by Harmony. Supported values "
                f"are: {', '.join(_EFFORT)}.",
                "reasoning_effort",
            )
        messages = [self._system(effort)]
        if instructions or req.tools:
            messages.append(self._developer(instructions, req))
        names: dict[str, str] = {}
        for m in chat:
            for call in m.get("tool_calls") or []:
                names[call.get("id")] = call.get("function", {}).get("name")
        for m in chat:
            messages.extend(self._convert(m, names))
        return self._legacy_headers(self._render(messages))

    def _system(self, effort: str | None) -> Message:
        content = SystemContent.new()
        if effort is not None:
            content = content.with_reasoning_effort(_EFFORT[effort])
        date = self._start_date or datetime.now().strftime("%Y-%m-%d")
        content = content.with_conversation_start_date(date)
        return Message.from_role_and_content(Role.SYSTEM, content)

    def _developer(self, instructions: str | None, req: ChatCompletionRequest | None) -> Message:
        content = DeveloperContent.new()
        if instructions is not None:
            content = content.with_instructions(instructions)
        if req is not None and req.tools:
            content = content.with_function_tools(
                [
                    ToolDescription.new(
                        name=t.function.name,
                        description=t.function.description if t.function.description else "",
                        parameters=(
                            None if t.function.parameters is UNSET else t.function.parameters
                        ),
                    )
                    for t in req.tools
                ]
            )
        return Message.from_role_and_content(Role.DEVELOPER, content)

    def _convert(self, m: dict[str, Any], names: dict[str, str]) -> list[Message]:
        role = m.get("role")
        out: list[Message] = []
        tool_calls = m.get("tool_calls") or []
        if role == "assistant" and tool_calls:
            text = _flatten(m.get("content"))
            if text:
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary")
                )
            if m.get("reasoning"):
                out.append(
                    Message.from_role_and_content(Role.ASSISTANT, m["reasoning"]).with_channel(
                        "analysis"
                    )
                )
            for call in tool_calls:
                func = call.get("function", {})
                args = func.get("arguments", "") or ""
                if not isinstance(args, str):
                    args = json.dumps(args)
                msg = Message.from_role_and_content(Role.ASSISTANT, args).with_channel("commentary")
                out.append(
                    msg.with_recipient(f"functions.{func.get('name', '')}").with_content_type(
                        "json"
                    )
                )
            return out
        if role == "tool":
            name = names.get(m.get("tool_call_id", ""), "")
            text = _flatten(m.get("content")) or ""
            author = Author.new(Role.TOOL, f"functions.{name}")
            msg = Message.from_author_and_content(author, text).with_channel("commentary")
            return [msg.with_recipient("assistant")]
        if role == "assistant" and m.get("reasoning"):
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, m["reasoning"]).with_channel(
                    "analysis"
                )
            )
        content = m.get("content") or ""
        if isinstance(content, str):
            contents = [TextContent(text=content)]
        else:
            contents = [
                TextContent(text=c.get("text", "") if isinstance(c, dict) else c) for c in content
            ]
        if role == "assistant" and contents and contents[0].text:
            out.append(
                Message.from_role_and_contents(Role.ASSISTANT, contents).with_channel("final")
            )
        elif role in ("system", "developer"):
            text = _flatten(m.get("content"))
            if text is not None:
                out.append(self._developer(text, None))
        elif role != "assistant":
            out.append(Message.from_role_and_contents(Role(role), contents))
        return out

    def _render(self, messages: list[Message]) -> list[int]:
        # Drop analysis turns that precede the last final answer (the model never sees old CoT).
        last_final = -1
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].author.role == Role.ASSISTANT and messages[i].channel == "final":
                last_final = i
                break
        kept = [
            m for i, m in enumerate(messages) if not (i < last_final and m.channel == "analysis")
        ]
        return list(
            self.encoding.render_conversation_for_completion(
                Conversation.from_messages(kept),
                Role.ASSISTANT,
                config=RenderConversationConfig(auto_drop_analysis=False),
            )
        )

    def _legacy_headers(self, ids: list[int]) -> list[int]:
        """``assistant<|channel|>X to=R <|constrain|>T`` -> ``assistant to=R<|channel|>X T``."""
        enc = self.encoding
        out = ids.copy()
        i = 0
        while i < len(out):
            if out[i] != self._start:
                i += 1
                continue
            try:
                end = out.index(self._message, i + 1)
                ch = out.index(self._channel, i + 1, end)
                co = out.index(self._constrain, ch + 1, end)
            except ValueError:
                i += 1
                continue
            author = enc.decode(out[i + 1 : ch])
            chan_rcpt = enc.decode(out[ch + 1 : co])
            ctype = enc.decode(out[co + 1 : end])
            if author != "assistant" or " to=" not in chan_rcpt or not chan_rcpt.endswith(" "):
                i = end + 1
                continue
            channel, recipient = chan_rcpt[:-1].split(" to=", 1)
            if not channel or not recipient or not ctype:
                i = end + 1
                continue
            header = (
                [self._start]
                + enc.encode(f"assistant to={recipient}")
                + [self._channel]
                + enc.encode(f"{channel} {ctype}")
                + [self._message]
            )
            out[i : end + 1] = header
            i += len(header)
        return out
