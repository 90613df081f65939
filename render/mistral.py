"""Mistral (tekken) models: chat encoded by mistral-common, not by a Jinja template, as vLLM does.

vLLM 0.32 serves a directory holding ``tekken.json`` with its MistralTokenizer, which hands the raw
request messages to transformers' ``MistralCommonBackend.apply_chat_template`` ->
``mistral_common`` ``ChatCompletionRequest.from_openai`` + ``encode_chat_completion``; prompts of
completions go through ``Tekkenizer.encode(text, bos=add_special_tokens, eos=False)``, which treats
control-token look-alikes in the text as plain text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from render.errors import BadRequestError
from render.messages import parse_tool_arguments, tool_dicts
from render.protocol import MEDIA_PART_TYPES, ChatCompletionRequest


class MistralRenderer:
    def __init__(self, tekken_path: Path) -> None:
        from mistral_common.protocol.instruct.validator import ValidationMode
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        self._tok = MistralTokenizer.from_file(str(tekken_path), mode=ValidationMode.test)
        self._raw = self._tok.instruct_tokenizer.tokenizer

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._raw.encode(text, bos=add_special_tokens, eos=False))

    def llg_tokenizer(self) -> Any:
        """The llguidance tokenizer vLLM checks this model's grammars with (MistralTokenizer's
        ``llg_tokenizer``)."""
        from mistral_common.guidance.tokenizer import from_mistral_tokenizer

        return from_mistral_tokenizer(self._tok)

    def render(self, req: ChatCompletionRequest) -> list[int]:
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest as MistralRequest

        if req.chat_template is not None or req.chat_template_kwargs is not None:
            # vLLM's validate_request_params for Mistral tokenizers.
            raise BadRequestError(
                "chat_template is not supported for Mistral tokenizers.", "chat_template"
            )
        messages = [self._message(i, m) for i, m in enumerate(msgspec.to_builtins(req.messages))]
        last = messages[-1]["role"]
        if req.add_generation_prompt and req.continue_final_message:
            raise BadRequestError(
                "Cannot set both `add_generation_prompt` and `continue_final_message` to True."
            )
        if req.add_generation_prompt and last == "assistant":
            raise BadRequestError(
                "Cannot set `add_generation_prompt` to True when the last message is from the "
                "assistant. Consider using `continue_final_message` instead."
            )
        if req.continue_final_message and last != "assistant":
            raise BadRequestError(
                "Cannot set `continue_final_message` to True when the last message is not from "
                "the assistant."
            )
        try:
            request = MistralRequest.from_openai(
                messages=messages,
                tools=tool_dicts(req.tools),
                continue_final_message=req.continue_final_message,
            )
            return list(self._tok.encode_chat_completion(request).tokens)
        except (AssertionError, ValueError, TypeError, KeyError, MistralCommonException) as e:
            # mistral-common validates with asserts and its own exceptions: all are input errors.
            raise BadRequestError(str(e) or type(e).__name__) from e

    @staticmethod
    def _message(i: int, m: dict[str, Any]) -> dict[str, Any]:
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in MEDIA_PART_TYPES:
                    raise BadRequestError(
                        f"Content part type {part['type']!r} is not supported: this render "
                        f"serves text-only models (messages[{i}].content).",
                        f"messages[{i}].content",
                    )
        for call in m.get("tool_calls") or []:
            # vLLM's parse_chat_messages hands mistral-common parsed arguments: invalid or
            # non-object JSON becomes {} so the conversation can continue.
            function = call.get("function", {})
            function["arguments"] = parse_tool_arguments(function.get("arguments"))
        rc = m.pop("reasoning_content", None)
        if rc is not None and m.get("reasoning") is None:
            m["reasoning"] = rc
        return m
