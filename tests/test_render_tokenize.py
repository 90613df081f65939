"""/tokenize and /detokenize semantics of the library: vLLM's completion and chat forms."""

from __future__ import annotations

from functools import cache

import msgspec
import pytest

from render import Renderer
from render.errors import RenderError
from render.protocol import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest


@cache
def qwen3() -> Renderer:
    return Renderer.load()


def test_prompt_form_adds_special_tokens_by_default() -> None:
    r = qwen3()
    out = r.tokenize(TokenizeRequest(prompt="Hello <|im_end|> world", return_token_strs=True))
    assert out.tokens == r.tokenizer.encode("Hello <|im_end|> world").ids
    assert out.count == len(out.tokens) and out.max_model_len == r.max_model_len
    assert out.token_strs is not None and "<|im_end|>" in out.token_strs
    bare = r.tokenize(TokenizeRequest(prompt="Hello", add_special_tokens=False))
    assert bare.tokens == r.tokenizer.encode("Hello", add_special_tokens=False).ids


def test_chat_form_equals_the_rendered_prompt() -> None:
    r = qwen3()
    body = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False}
    out = r.tokenize(msgspec.convert(body, TokenizeRequest))
    assert out.tokens == r.chat_token_ids(msgspec.convert(body, ChatCompletionRequest))
    with_prompt = r.tokenize(msgspec.convert({"messages": body["messages"]}, TokenizeRequest))
    assert with_prompt.tokens[: len(out.tokens)] == out.tokens
    assert len(with_prompt.tokens) > len(out.tokens)


def test_detokenize_round_trip_and_empty_request_error() -> None:
    r = qwen3()
    ids = r.encode("Grüße, 世界 🌍 <|im_start|>", False)
    assert r.detokenize(DetokenizeRequest(tokens=ids)).prompt == "Grüße, 世界 🌍 <|im_start|>"
    with pytest.raises(RenderError):
        r.tokenize(TokenizeRequest())
