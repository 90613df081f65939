"""/tokenize and /detokenize semantics of the library: vLLM's completion and chat forms."""

from __future__ import annotations

from functools import cache

import msgspec
import pytest

from render import Renderer
from render.errors import RenderError
from render.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)


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


def test_token_offsets_map_tokens_back_to_the_prompt_text() -> None:
    r = qwen3()
    body = {
        "messages": [{"role": "user", "content": "héllo 世界 🌍"}],
        "return_token_offsets": True,
    }
    g = r.render_chat(msgspec.convert(body, ChatCompletionRequest))
    text = r.chat_prompt(msgspec.convert(body, ChatCompletionRequest))
    assert g.token_offsets is not None and len(g.token_offsets) == len(g.token_ids)
    # Spans cover the text in order (tokens splitting the emoji's bytes overlap on it).
    starts = [a for a, _ in g.token_offsets]
    assert starts == sorted(starts) and g.token_offsets[-1][1] == len(text)
    assert set().union(*(range(a, b) for a, b in g.token_offsets)) == set(range(len(text)))
    assert g.token_offsets == [
        tuple(o) for o in r.tokenizer.encode(text, add_special_tokens=False).offsets
    ]
    plain = r.render_chat(msgspec.convert({"messages": body["messages"]}, ChatCompletionRequest))
    assert plain.token_offsets is None and plain.token_ids == g.token_ids
    [c] = r.render_completion(
        msgspec.convert(
            {"prompt": "a b c d e", "return_token_offsets": True, "truncate_prompt_tokens": 2},
            CompletionRequest,
        )
    )
    assert c.token_offsets is not None and len(c.token_offsets) == len(c.token_ids) == 2
    assert c.token_offsets == [(5, 7), (7, 9)]  # the last two tokens, " d" and " e"
