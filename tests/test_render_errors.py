"""Bad input fails at decode time or as a RenderError with the right status, never otherwise."""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from render import ModelRegistry, Renderer
from render.errors import BadRequestError, RenderError
from render.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest


@cache
def qwen3(allow: bool = False) -> Renderer:
    return Renderer.load(allow_request_chat_template=allow)


def decode_chat(body: Any) -> ChatCompletionRequest:
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"messages": [{"role": 5, "content": "hi"}]}, "$.messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "$.messages[0].content"),
        ({"messages": "hello"}, "$.messages"),
        ({"messages": [{"role": "user", "content": [{"type": "video_game"}]}]}, "type"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, "$.max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "seed": 2**64}, "$.seed"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}, "tool_choice"),
    ],
)
def test_malformed_requests_fail_at_decode_time(body: dict[str, Any], where: str) -> None:
    with pytest.raises(msgspec.ValidationError) as e:
        decode_chat(body)
    assert where in str(e.value)


HI = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"messages": []}, "Cannot apply chat template to an empty conversation. Provide at "
         "least one message.", None),
        ({"messages": HI, "max_tokens": 0},
         "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"),
        ({"messages": HI, "n": 0}, "n must be at least 1, got 0.", None),
        ({"messages": HI, "cache_salt": ""}, "Parameter 'cache_salt' must be a non-empty string "
         "if provided. (parameter=cache_salt)", "cache_salt"),
        ({"messages": HI, "tools": []}, "`tools` must not be an empty array. Either provide at "
         "least one tool or omit the field entirely. (parameter=tools)", "tools"),
        ({"messages": HI, "top_logprobs": -2, "logprobs": True}, "`top_logprobs` must be a "
         "positive value or -1. (parameter=top_logprobs, value=-2)", "top_logprobs"),
        ({"messages": HI, "stop_token_ids": [-1]}, "token_id(s) [-1] in stop_token_ids contain "
         "out-of-vocab token ids. Vocabulary size: 151936 (parameter=stop_token_ids, "
         "value=[-1])", "stop_token_ids"),
    ],
)
def test_refused_as_vllm_refuses(body: dict[str, Any], message: str, param: str | None) -> None:
    """Values vLLM's pydantic models take and its checks refuse: the same words and param."""
    with pytest.raises(BadRequestError) as e:
        qwen3().render_chat(decode_chat(body))
    assert (e.value.message, e.value.param, e.value.type) == (message, param, "BadRequestError")


def test_custom_roles_reach_the_template() -> None:
    """vLLM takes any role (its custom message type); the template decides what it renders."""
    gen = qwen3().render_chat(decode_chat({"messages": [{"role": "wizard", "content": "x"}]}))
    assert gen.token_ids


def render(body: dict[str, Any], renderer: Renderer | None = None) -> None:
    (renderer or qwen3()).render_chat(decode_chat(body))


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "image_url",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}
                ]
            },
            "input_audio",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"}, "trust"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}, "tools"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "does not match",
        ),
        (
            {
                "messages": [{"role": "assistant", "content": "x"}],
                "continue_final_message": True,
            },
            "Cannot set both",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "use_beam_search": True}, "Beam"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "chat_template_kwargs": {"tokenize": 1},
            },
            "unexpected",
        ),
    ],
)
def test_bad_requests_are_400_render_errors(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(RenderError) as e:
        render(body)
    assert e.value.status == 400 and fragment in e.value.message


def test_template_raise_exception_is_a_400_with_its_message() -> None:
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "chat_template": (
            "{% if messages|length < 2 %}{{ raise_exception('need two turns') }}{% endif %}"
        ),
    }
    with pytest.raises(RenderError) as e:
        render(body, qwen3(allow=True))
    assert e.value.status == 400 and e.value.message == "need two turns"


def test_request_template_used_when_allowed() -> None:
    body = {
        "messages": [{"role": "user", "content": "abc"}],
        "chat_template": "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}",
    }
    r = qwen3(allow=True)
    assert r.chat_token_ids(decode_chat(body)) == r.encode("[user]abc", False)


def test_broken_template_syntax_is_a_400() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template": "{% for %}"}
    with pytest.raises(RenderError) as e:
        render(body, qwen3(allow=True))
    assert e.value.status == 400


def test_unknown_model_is_404_and_default_model_answers_none() -> None:
    reg = ModelRegistry([qwen3()])
    assert reg.get(None) is qwen3()
    assert reg.get(qwen3().served_model_name) is qwen3()
    with pytest.raises(RenderError) as e:
        reg.get("nope")
    assert e.value.status == 404 and e.value.to_dict()["error"]["param"] == "model"


def test_completion_prompt_shapes_are_checked() -> None:
    r = qwen3()
    with pytest.raises(RenderError):
        r.render_completion(msgspec.convert({"prompt": ["a", 1]}, CompletionRequest))
    with pytest.raises(RenderError) as e:
        r.render_completion(msgspec.convert({"prompt": [10**9]}, CompletionRequest))
    assert "out of vocabulary" in e.value.message
    with pytest.raises(RenderError):
        r.detokenize(DetokenizeRequest(tokens=[10**9]))


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3)
    ),
    max_leaves=10,
)
ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"])
MESSAGE = st.fixed_dictionaries(
    {"role": ROLES},
    optional={
        "content": st.none()
        | st.text(max_size=30)
        | st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=10)}
            ),
            max_size=3,
        ),
        "tool_calls": JSONISH,
        "name": JSONISH,
        "reasoning": st.none() | st.text(max_size=10),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(MESSAGE, max_size=4),
    extra=st.dictionaries(
        st.sampled_from(
            ["max_tokens", "temperature", "stop", "tools", "continue_final_message", "n"]
        ),
        JSONISH,
        max_size=3,
    ),
)
def test_fuzzed_chat_requests_never_escape_as_other_errors(
    messages: list[dict[str, Any]], extra: dict[str, Any]
) -> None:
    """Whatever a client sends, render answers or raises a decode/Render error (never a 500)."""
    body = {"messages": messages, **extra}
    try:
        req = decode_chat(body)
    except msgspec.ValidationError:
        return
    try:
        g = qwen3().render_chat(req)
    except RenderError as e:
        assert 400 <= e.status < 500
        return
    assert g.token_ids and all(t >= 0 for t in g.token_ids)
