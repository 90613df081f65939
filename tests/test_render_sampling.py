"""Sampling parameter mapping: generation_config defaults, EOS fill, stop strings, max_tokens."""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec
import pytest

from render import Renderer
from render.errors import ContextLengthError, RenderError
from render.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from wire.sampling import OUTPUT_DELTA, OUTPUT_FINAL_ONLY, SamplingParams

QWEN3_EOS = 151645  # <|im_end|>: the tokenizer's eos_token
QWEN3_ENDOFTEXT = 151643  # generation_config's second EOS id


@cache
def qwen3(max_model_len: int | None = None) -> Renderer:
    return Renderer.load(max_model_len=max_model_len)


def chat(**fields: Any) -> GenerateRequest:
    body = {"messages": [{"role": "user", "content": "Hello there"}], **fields}
    return qwen3().render_chat(msgspec.convert(body, ChatCompletionRequest))


def test_generation_config_defaults_apply_when_request_is_silent() -> None:
    sp = chat().sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k) == (0.6, 0.95, 20)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.min_p) == (1.0, 0.0, 0.0)


def test_request_values_override_generation_config() -> None:
    sp = chat(temperature=0.2, top_p=0.5, top_k=5, min_p=0.1, presence_penalty=0.3).sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.presence_penalty) == (
        0.2,
        0.5,
        5,
        0.1,
        0.3,
    )


def test_zero_temperature_is_greedy() -> None:
    sp = chat(temperature=0).sampling_params
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p) == (0.0, 1.0, 0, 0.0)


def test_eos_ids_filled_so_an_engine_stops_like_vllm() -> None:
    sp = chat().sampling_params
    assert sp._eos_token_id == QWEN3_EOS
    assert set(sp._all_stop_token_ids) == {QWEN3_EOS, QWEN3_ENDOFTEXT}
    # generation_config's extra EOS ids become stop_token_ids (the primary EOS stays separate).
    assert sp.stop_token_ids == [QWEN3_ENDOFTEXT]


def test_user_stop_token_ids_are_merged_not_replaced() -> None:
    sp = chat(stop_token_ids=[42, 43]).sampling_params
    assert sp.stop_token_ids is not None and set(sp.stop_token_ids) == {42, 43, QWEN3_ENDOFTEXT}
    assert set(sp._all_stop_token_ids) == {42, 43, QWEN3_EOS, QWEN3_ENDOFTEXT}


def test_ignore_eos_leaves_eos_unset_but_known() -> None:
    sp = chat(ignore_eos=True).sampling_params
    assert sp._eos_token_id is None
    assert sp.stop_token_ids == []
    assert QWEN3_EOS in sp._all_stop_token_ids


def test_stop_strings_are_kept_in_the_output_map() -> None:
    g = chat(stop="END")
    assert g.sampling_params.stop == ["END"]
    assert g.sampling_params.output_text_buffer_length == 2
    g = chat(stop=["a", "bcd"], include_stop_str_in_output=True)
    assert g.sampling_params.stop == ["a", "bcd"]
    assert g.sampling_params.output_text_buffer_length == 0
    wire = msgspec.json.decode(msgspec.json.encode(g))
    assert wire["sampling_params"]["stop"] == ["a", "bcd"]
    assert msgspec.msgpack.decode(
        msgspec.msgpack.encode(g.sampling_params), type=SamplingParams
    ) == (g.sampling_params)


def test_max_tokens_defaults_to_remaining_context() -> None:
    g = chat()
    assert g.sampling_params.max_tokens == qwen3().max_model_len - len(g.token_ids)


def test_max_tokens_beyond_context_is_refused_as_vllm() -> None:
    r = qwen3(64)
    req = msgspec.convert(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}, ChatCompletionRequest
    )
    with pytest.raises(ContextLengthError) as e:
        r.render_chat(req)
    assert e.value.message == ("max_tokens=100 cannot be greater than max_model_len=64. Please "
                               "request fewer output tokens. (parameter=max_tokens, value=100)")
    assert e.value.param == "max_tokens"


def test_max_tokens_past_the_room_left_stops_at_the_context_end() -> None:
    """vLLM 0.32's get_max_tokens: a budget within the context but past the room the prompt
    leaves is cut to that room (generation stops at the context's end), not refused."""
    r = qwen3(64)
    req = msgspec.convert(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}, ChatCompletionRequest
    )
    g = r.render_chat(req)
    assert g.sampling_params.max_tokens == 64 - len(g.token_ids) < 60


def test_prompt_beyond_context_is_refused_as_vllm() -> None:
    r = qwen3(64)
    req = msgspec.convert(
        {"messages": [{"role": "user", "content": "word " * 200}]}, ChatCompletionRequest
    )
    with pytest.raises(ContextLengthError) as e:
        r.render_chat(req)
    # vLLM tokenizes a text prompt to at most the context plus one token: "at least".
    assert e.value.message == (
        "This model's maximum context length is 64 tokens. However, your prompt contains at "
        "least 65 input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt. (parameter=input_tokens, value=65)")
    assert e.value.param == "input_tokens"


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat(max_tokens=50, max_completion_tokens=7).sampling_params.max_tokens == 7


def test_stream_sets_delta_output_and_keeps_stream_options() -> None:
    g = chat(stream=True, stream_options={"include_usage": True})
    assert g.sampling_params.output_kind == OUTPUT_DELTA and g.stream is True
    assert g.stream_options is not None and g.stream_options.include_usage is True
    assert chat().sampling_params.output_kind == OUTPUT_FINAL_ONLY


def test_every_openai_and_vllm_parameter_is_mapped() -> None:
    g = chat(
        n=2,
        seed=7,
        frequency_penalty=0.5,
        repetition_penalty=1.1,
        logit_bias={"11": 200.0, "12": -3},
        logprobs=True,
        top_logprobs=3,
        prompt_logprobs=1,
        min_tokens=2,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        bad_words=["bad", "bad"],
        allowed_token_ids=[1, 2, 3],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
        vllm_xargs={"k": 1},
        cache_salt="salt",
        priority=3,
        request_id="abc",
        thinking_token_budget=10,
    )
    sp = g.sampling_params
    assert (sp.n, sp.seed, sp.frequency_penalty, sp.repetition_penalty) == (2, 7, 0.5, 1.1)
    assert sp.logit_bias == {11: 100.0, 12: -3.0}  # clamped to [-100, 100] as vLLM does
    assert (sp.logprobs, sp.prompt_logprobs, sp.min_tokens) == (3, 1, 2)
    assert sp.skip_reading_prefix_cache is True  # prompt logprobs need every prompt token
    assert (sp.skip_special_tokens, sp.spaces_between_special_tokens) == (False, False)
    assert sp.bad_words == ["bad"] and sp.allowed_token_ids == [1, 2, 3]
    assert sp.structured_outputs is not None and sp.structured_outputs.json == {"type": "object"}
    assert sp.extra_args == {"k": 1} and sp.thinking_token_budget == 10
    assert (g.cache_salt, g.priority, g.request_id) == ("salt", 3, "chatcmpl-abc")


def test_seed_minus_one_means_no_seed() -> None:
    assert chat(seed=-1).sampling_params.seed is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 3.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        # vLLM names no parameter for these (its errors carry none).
        ({"presence_penalty": 5.0}, None),
        ({"min_p": 2.0}, None),
        ({"repetition_penalty": 0.0}, None),
        ({"stop": ["ok", ""]}, None),
        ({"min_tokens": 10, "max_tokens": 5}, None),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_out_of_range_parameters_are_400(fields: dict[str, Any], param: str | None) -> None:
    with pytest.raises(RenderError) as e:
        chat(**fields)
    assert e.value.status == 400 and e.value.param == param


def test_completion_defaults_and_echo_without_generation() -> None:
    r = qwen3()
    [g] = r.render_completion(msgspec.convert({"prompt": "Once upon"}, CompletionRequest))
    assert g.sampling_params.max_tokens == 16  # OpenAI completions default
    assert g.token_ids == r.encode("Once upon", True)
    [g] = r.render_completion(
        msgspec.convert({"prompt": "x", "echo": True, "max_tokens": 0}, CompletionRequest)
    )
    assert g.sampling_params.max_tokens == 1
    with pytest.raises(RenderError) as e:
        r.render_completion(msgspec.convert({"prompt": "x", "max_tokens": 0}, CompletionRequest))
    assert e.value.param == "max_tokens"
