"""The API-parity corpus: requests sent alike to `vllm serve` and to kvroute.

tests/test_parity_vllm.py sends them and compares the answers.

Every case is greedy or seeded, with small ``max_tokens``, so one model answers it the same way
twice. ``both`` makes a non-stream case and its ``.stream`` twin; fields that exist only on one
side (``prompt_logprobs`` > 0 refuses a stream) get one case. Together the cases name every field
of vLLM 0.32's ``ChatCompletionRequest`` and ``CompletionRequest`` (checked against vLLM's own
classes by ``test_corpus_covers_every_vllm_field``).

``EXPECTED`` lists, by name, the cases whose answers differ on purpose or until another branch
lands, each with its reason; docs/parity.md says the same in prose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODEL = "tiny-qwen3"  # tests/vllm_serve.py SERVED_NAME, given to the router too
MAX_MODEL_LEN = 512  # tests/engines.py MAX_MODEL_LEN: both engines run with it

HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
# A prompt that leaves 10 tokens of room in the context (token 1052 is " there").
NEAR_END = [1052] * (MAX_MODEL_LEN - 10)
# A long chat message: its prompt leaves little room in the context.
LONG_TEXT = " hello" * 480
JSON_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@dataclass(frozen=True)
class Case:
    """One request. ``body`` is sent as JSON unless ``raw`` (the bytes sent as they are)."""

    name: str
    path: str
    body: dict[str, Any] | None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = "application/json"
    # Compare the response id (ids are random otherwise: x-request-id / request_id cases).
    compare_id: bool = False
    # vLLM's error message is compared where it is ours to match (not pydantic's wording).
    compare_message: bool = True
    method: str = "POST"
    # Compare how the stream's chunks hold its tokens (stream_interval decides it).
    compare_chunks: bool = False
    # Paths set aside (list indexes folded: ``data[].created``): timestamps and random ids
    # inside a body.
    aside: tuple[str, ...] = ()

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))


def chat(name: str, *, messages: list[dict[str, Any]] | None = None, **fields: Any) -> Case:
    opts = _options(fields)
    body = {"model": MODEL, "messages": HELLO if messages is None else messages,
            "max_tokens": 5, "temperature": 0, **fields}
    return Case(name, CHAT, _drop_unset(body), **opts)


def cmpl(name: str, *, prompt: Any = "The quick brown fox", **fields: Any) -> Case:
    opts = _options(fields)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0, **fields}
    return Case(name, COMPLETIONS, _drop_unset(body), **opts)


UNSET = object()  # a field to leave out of the base body


def _drop_unset(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not UNSET}


_OPTION_NAMES = ("headers", "content_type", "compare_id", "compare_message", "raw", "method",
                 "compare_chunks")


def _options(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: fields.pop(k) for k in _OPTION_NAMES if k in fields}


def both(case: Case, **stream_fields: Any) -> list[Case]:
    """The case and its streamed twin (``stream: true`` plus ``stream_fields``)."""
    assert case.body is not None
    body = {**case.body, "stream": True, **stream_fields}
    return [case, dataclasses.replace(case, name=case.name + ".stream", body=body)]


def _chat_cases() -> list[Case]:
    c: list[Case] = []
    c += both(chat("chat.basic"))
    c += both(chat("chat.max_completion_tokens", max_tokens=UNSET, max_completion_tokens=4))
    c += both(chat("chat.max_tokens_default", messages=[{"role": "user", "content": LONG_TEXT}],
                   max_tokens=UNSET))
    c += both(chat("chat.max_tokens_over_room",
                   messages=[{"role": "user", "content": LONG_TEXT}], max_tokens=100))
    c += both(chat("chat.penalties", frequency_penalty=1.5, presence_penalty=-0.5,
                   repetition_penalty=1.3, max_tokens=8))
    c += both(chat("chat.logit_bias", logit_bias={"1052": 100}))
    c += both(chat("chat.logprobs", logprobs=True, top_logprobs=3))
    c += both(chat("chat.logprobs_no_top", logprobs=True))
    c += both(chat("chat.n_seeded", n=2, temperature=1.0, seed=11))
    c += both(chat("chat.seed_sampling", temperature=0.9, top_p=0.8, top_k=40, min_p=0.05,
                   seed=1234))
    c += both(chat("chat.stop_string", stop="-fr", max_tokens=12))
    c += both(chat("chat.stop_list_include", stop=["xx", "-fr"], include_stop_str_in_output=True,
                   max_tokens=12))
    c += both(chat("chat.stop_token_ids", stop_token_ids=[1052, 198], max_tokens=12))
    c += [chat("chat.usage_stream", stream=True, stream_options={"include_usage": True}),
          chat("chat.continuous_usage", stream=True,
               stream_options={"include_usage": True, "continuous_usage_stats": True})]
    c += both(chat("chat.user_and_watermark", user="someone", watermarking=None))
    c += both(chat("chat.ignore_eos_min_tokens", ignore_eos=True, min_tokens=3, max_tokens=6))
    c += both(chat("chat.special_tokens", skip_special_tokens=False,
                   spaces_between_special_tokens=False, max_tokens=8))
    c += both(chat("chat.truncate_prompt", messages=[{"role": "user", "content": LONG_TEXT}],
                   truncate_prompt_tokens=20, truncation_side="left"))
    c += [chat("chat.prompt_logprobs", prompt_logprobs=2),
          chat("chat.prompt_logprobs_stream_refused", prompt_logprobs=1, stream=True)]
    c += both(chat("chat.logprob_token_ids", logprobs=True, logprob_token_ids=[1052, 9707]))
    c += both(chat("chat.allowed_token_ids", allowed_token_ids=[1052, 9707, 13]))
    c += both(chat("chat.echo", echo=True,
                   messages=[*HELLO, {"role": "assistant", "content": "I am"}],
                   add_generation_prompt=False, continue_final_message=True))
    c += both(chat("chat.echo_other_role", echo=True))
    c += both(chat("chat.add_special_tokens", add_special_tokens=True))
    c += both(chat("chat.documents", documents=[{"title": "t", "text": "a document"}]))
    c += both(chat("chat.template_kwargs", chat_template_kwargs={"enable_thinking": False}))
    c += both(chat("chat.reasoning_effort", reasoning_effort="none"))
    c += both(chat("chat.thinking_token_budget", thinking_token_budget=4))
    c += [chat("chat.request_chat_template", chat_template="{{ messages[0]['content'] }}")]
    c += both(chat("chat.mm_kwargs", media_io_kwargs={"image": {"x": 1}},
                   mm_processor_kwargs={"y": 2}))
    c += both(chat("chat.priority_zero", priority=0))
    c += [chat("chat.priority_refused", priority=5)]
    c += both(chat("chat.request_id", request_id="parity-req-1", compare_id=True))
    c += both(chat("chat.x_request_id", headers={"x-request-id": "parity-hdr-1"},
                   compare_id=True))
    c += both(chat("chat.session_id", session_id="session-7"))
    c += both(chat("chat.custom_role", messages=[{"role": "wizard", "content": "x"}]))
    c += both(chat("chat.multi_turn", messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                     {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "Thanks", "name": "bob"}]))
    c += both(chat("chat.echo_logprobs", echo=True, logprobs=True, top_logprobs=1,
                   messages=[*HELLO, {"role": "assistant", "content": "Fine"}],
                   add_generation_prompt=False, continue_final_message=True))
    c += both(chat("chat.token_ids_as_strings", logprobs=True, top_logprobs=2,
                   return_tokens_as_token_ids=True))
    c += both(chat("chat.return_token_ids", return_token_ids=True))
    c += both(chat("chat.render_only_fields", routed_experts_prompt_start=0,
                   return_token_offsets=True, mm_payload="none", return_mm_kwargs=False))
    c += both(chat("chat.return_prompt_text", return_prompt_text=True))
    c += both(chat("chat.cache_salt", cache_salt="salt-1"))
    c += both(chat("chat.transfer_params", kv_transfer_params={"a": 1},
                   ec_transfer_params={"b": 2}, vllm_xargs={"k": "v"}))
    c += both(chat("chat.repetition_detection",
                   repetition_detection={"max_pattern_size": 2, "min_count": 3},
                   max_tokens=10))
    c += [chat("chat.stream_interval", stream=True, stream_interval=3, max_tokens=7,
               return_token_ids=True, compare_chunks=True),
          chat("chat.stream_interval_collected", stream_interval=3, max_tokens=7)]
    c += both(chat("chat.beam_search", use_beam_search=True, n=2, length_penalty=0.5,
                   max_tokens=4))
    c += both(chat("chat.generation_defaults", temperature=UNSET, seed=3))
    c += both(chat("chat.nulls", temperature=None, top_p=None, n=None, max_tokens=None, seed=5,
                   logprobs=True, top_logprobs=None, stream_options=None,
                   messages=[{"role": "user", "content": LONG_TEXT}]))
    c += both(chat("chat.unknown_field", foo={"bar": 1}))
    c += both(chat("chat.n_usage", n=2, temperature=0.5, seed=4),
              stream_options={"include_usage": True})
    # No chat echo with n > 1: a chat echo asks prompt logprobs (vLLM's rule), and a vLLM 0.32
    # CPU engine with LoRA on dies of prompt logprobs in a batch of several requests.
    c += both(chat("chat.user_role_answer", add_generation_prompt=False, echo=True))
    c += both(chat("chat.stop_logprobs", stop="-fr", logprobs=True, top_logprobs=1,
                   max_tokens=12))
    c += both(chat("chat.min_tokens_stop_ids", stop_token_ids=[198], min_tokens=2,
                   max_tokens=4))
    c += both(chat("chat.top_logprobs_20", logprobs=True, top_logprobs=20, max_tokens=2))
    c += both(chat("chat.no_model", model=UNSET))
    c += both(chat("chat.reasoning_history", messages=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "And?"}]))
    c += both(chat("chat.n_logprobs", n=2, temperature=0.8, seed=6, logprobs=True,
                   top_logprobs=2, return_token_ids=True))
    c += both(chat("chat.thinking_template", chat_template_kwargs={"enable_thinking": True},
                   skip_special_tokens=False))
    c += both(chat("chat.truncate_all", messages=[{"role": "user", "content": LONG_TEXT * 2}],
                   truncate_prompt_tokens=-1))
    # Structured outputs, bad_words, tool calls and reasoning.
    c += both(chat("chat.response_format_text", response_format={"type": "text"}))
    c += both(chat("chat.response_format_json", response_format={"type": "json_object"}))
    c += both(chat("chat.response_format_schema", response_format={
        "type": "json_schema", "json_schema": {"name": "r", "schema": JSON_SCHEMA}}))
    c += both(chat("chat.structured_choice", structured_outputs={"choice": ["yes", "no"]}))
    c += both(chat("chat.bad_words", bad_words=[" there"]))
    c += both(chat("chat.tools_none", tools=TOOLS, tool_choice="none"))
    c += both(chat("chat.tools_auto", tools=TOOLS, tool_choice="auto"))
    c += both(chat("chat.tools_named", tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "get_weather"}}))
    c += both(chat("chat.include_reasoning", include_reasoning=False))
    c += both(chat("chat.parallel_tool_calls", tools=TOOLS, tool_choice="none",
                   parallel_tool_calls=False))
    return c


def _completion_cases() -> list[Case]:
    c: list[Case] = []
    c += both(cmpl("cmpl.basic"))
    c += both(cmpl("cmpl.token_prompt", prompt=[9707, 1052, 11]))
    c += both(cmpl("cmpl.prompts", prompt=["One", "Two"]))
    c += both(cmpl("cmpl.token_prompts", prompt=[[9707, 1052], [9707]]))
    c += both(cmpl("cmpl.echo", echo=True))
    c += both(cmpl("cmpl.echo_logprobs", echo=True, logprobs=2))
    c += both(cmpl("cmpl.echo_max_tokens_0", echo=True, max_tokens=0))
    c += both(cmpl("cmpl.echo_logprobs_max_tokens_0", echo=True, logprobs=1, max_tokens=0))
    c += both(cmpl("cmpl.logprobs", logprobs=3))
    c += both(cmpl("cmpl.logprobs_0", logprobs=0))
    c += both(cmpl("cmpl.max_tokens_default", prompt=NEAR_END, max_tokens=UNSET))
    c += both(cmpl("cmpl.max_tokens_over_room", prompt=NEAR_END, max_tokens=50))
    c += both(cmpl("cmpl.n_seeded", n=3, temperature=0.8, seed=5))
    c += both(cmpl("cmpl.n_prompts_logprobs", prompt=["A", "B"], n=2, temperature=0.7, seed=3,
                   logprobs=1), stream_options={"include_usage": True})
    c += [cmpl("cmpl.beam_search", use_beam_search=True, n=2, max_tokens=3)]
    c += both(cmpl("cmpl.sampling", temperature=1.2, top_p=0.9, top_k=10, min_p=0.01, seed=99,
                   frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.1))
    c += both(cmpl("cmpl.logit_bias", logit_bias={"13": 50}))
    c += both(cmpl("cmpl.stop", stop=["ể t"], max_tokens=12))
    c += both(cmpl("cmpl.stop_token_ids", stop_token_ids=[128254], include_stop_str_in_output=True,
                   max_tokens=12))
    c += [cmpl("cmpl.usage_stream", stream=True, stream_options={"include_usage": True}),
          cmpl("cmpl.continuous_usage", stream=True,
               stream_options={"include_usage": True, "continuous_usage_stats": True})]
    c += both(cmpl("cmpl.suffix", suffix="!"))
    c += both(cmpl("cmpl.user_watermark", user="u", watermarking=None, length_penalty=1.0,
                   use_beam_search=False))
    c += both(cmpl("cmpl.min_tokens", ignore_eos=True, min_tokens=2, max_tokens=4))
    c += both(cmpl("cmpl.special_tokens", skip_special_tokens=False,
                   spaces_between_special_tokens=False))
    c += both(cmpl("cmpl.truncate", prompt=LONG_TEXT, truncate_prompt_tokens=16,
                   truncation_side="right"))
    c += [cmpl("cmpl.prompt_logprobs", prompt_logprobs=1)]
    c += both(cmpl("cmpl.allowed_token_ids", allowed_token_ids=[11, 13, 1052]))
    c += both(cmpl("cmpl.logprob_token_ids", logprobs=2, logprob_token_ids=[11, 13]))
    c += both(cmpl("cmpl.add_special_tokens", add_special_tokens=False))
    c += both(cmpl("cmpl.x_request_id", headers={"x-request-id": "parity-hdr-2"},
                   compare_id=True))
    c += both(cmpl("cmpl.priority_request_id", priority=0, request_id="parity-cmpl-1",
                   compare_id=True))
    c += both(cmpl("cmpl.session_id", session_id="s-1"))
    c += both(cmpl("cmpl.token_ids_as_strings", logprobs=1, return_tokens_as_token_ids=True))
    c += both(cmpl("cmpl.return_token_ids", return_token_ids=True))
    c += both(cmpl("cmpl.render_only_fields", routed_experts_prompt_start=0,
                   return_token_offsets=True, mm_payload="none", return_mm_kwargs=False))
    c += both(cmpl("cmpl.cache_salt_transfer", cache_salt="s", kv_transfer_params={"x": 1},
                   ec_transfer_params={"y": 1}, vllm_xargs={"z": 1}))
    c += both(cmpl("cmpl.repetition_detection",
                   repetition_detection={"max_pattern_size": 2, "min_count": 3}, max_tokens=10))
    c += both(cmpl("cmpl.thinking_token_budget", thinking_token_budget=3))
    c += both(cmpl("cmpl.echo_token_ids", echo=True, return_token_ids=True))
    # No logprobs: vLLM 0.32's stream of an echo with n > 1 and logprobs fails now and then
    # (its second choice finds the prompt logprobs the first one took).
    c += both(cmpl("cmpl.echo_n", echo=True, n=2, temperature=0.7, seed=8))
    c += both(cmpl("cmpl.echo_prompt_logprobs", echo=True, logprobs=1, prompt_logprobs=2))
    c += both(cmpl("cmpl.echo_token_prompt", prompt=[9707, 1052, 11], echo=True))
    c += both(cmpl("cmpl.max_tokens_null", max_tokens=None))
    c += [cmpl("cmpl.n_continuous_usage", n=2, temperature=0.9, seed=2, stream=True,
               stream_options={"include_usage": True, "continuous_usage_stats": True})]
    c += both(chat("chat.tool_messages", tools=TOOLS, tool_choice="none", messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "rain"}]}]))
    c += [chat("err.tool_call_object_arguments", compare_message=False, messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"}])]
    c += both(cmpl("cmpl.defaults", temperature=UNSET, seed=21))
    c += [cmpl("cmpl.fills_context_echo", prompt=[1052] * MAX_MODEL_LEN, echo=True,
               max_tokens=0)]
    c += [cmpl("cmpl.stream_interval", stream=True, stream_interval=2, max_tokens=6,
               return_token_ids=True, compare_chunks=True)]
    c += [cmpl("cmpl.prompt_embeds", prompt=UNSET, prompt_embeds="AAAA")]
    c += both(cmpl("cmpl.response_format_json", response_format={"type": "json_object"}))
    c += both(cmpl("cmpl.structured_regex", structured_outputs={"regex": "[a-z]{3}"}))
    c += both(cmpl("cmpl.bad_words", bad_words=[","]))
    return c


def _error_cases() -> list[Case]:
    """Refusals and limits: status, error type and (where stable) message."""
    big = [1052] * (MAX_MODEL_LEN + 5)
    return [
        chat("err.unknown_model", model="nope"),
        chat("err.empty_messages", messages=[], compare_message=False),
        chat("err.max_tokens_type", max_tokens="five", compare_message=False),
        chat("err.max_tokens_zero", max_tokens=0, compare_message=False),
        chat("err.n_zero", n=0, compare_message=False),
        *both(chat("err.n_greedy", n=2)),
        chat("err.temperature", temperature=3.0),
        chat("err.top_p", top_p=0.0),
        chat("err.top_k", top_k=-5),
        chat("err.min_p", min_p=1.5),
        chat("err.presence_penalty", presence_penalty=3.0),
        chat("err.repetition_penalty", repetition_penalty=0.0),
        *both(chat("err.top_logprobs_21", logprobs=True, top_logprobs=21)),
        chat("err.top_logprobs_all", logprobs=True, top_logprobs=-1),
        chat("err.top_logprobs_no_logprobs", top_logprobs=2),
        chat("err.top_logprobs_negative", logprobs=True, top_logprobs=-2),
        chat("err.prompt_logprobs_21", prompt_logprobs=21),
        *both(chat("err.logit_bias_oov", logit_bias={"999999": 1.0})),
        chat("err.logit_bias_key", logit_bias={"abc": 1.0}),
        *both(chat("err.allowed_token_ids_oov", allowed_token_ids=[5, 999999])),
        chat("err.allowed_token_ids_empty", allowed_token_ids=[]),
        *both(chat("err.stop_token_ids_oov", stop_token_ids=[999999])),
        chat("err.logprob_token_ids_oov", logprobs=True, logprob_token_ids=[999999]),
        chat("err.logprob_token_ids_no_logprobs", logprob_token_ids=[5]),
        chat("err.min_tokens_over_max", min_tokens=9, max_tokens=3),
        chat("err.stop_empty", stop=[""]),
        chat("err.stream_options_without_stream", stream_options={"include_usage": True}),
        *both(chat("err.prompt_too_long",
                   messages=[{"role": "user", "content": LONG_TEXT * 2}])),
        chat("err.max_tokens_over_context", max_tokens=100000),
        chat("err.cache_salt_empty", cache_salt="", compare_message=False),
        chat("err.continue_and_generation_prompt", continue_final_message=True,
             add_generation_prompt=True),
        chat("err.tool_choice_without_tools", tool_choice="required"),
        chat("err.invalid_json", raw=b'{"model": ', compare_message=False),
        chat("err.text_plain", content_type="text/plain"),
        chat("err.no_content_type", content_type=None),
        chat("err.get_method", method="GET", compare_message=False),
        cmpl("err.cmpl_prompt_too_long", prompt=big),
        *both(cmpl("err.cmpl_fills_context", prompt=[1052] * MAX_MODEL_LEN)),
        *both(cmpl("err.cmpl_token_oov_late", prompt=[5, 999999])),
        chat("err.media_io_kwargs", media_io_kwargs={"image": {"x": 1}}),
        chat("err.image_part", messages=[{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
            compare_message=False),
        chat("err.max_completion_tokens_zero", max_completion_tokens=0),
        cmpl("err.cmpl_empty_token_list", prompt=[[]], compare_message=False),
        cmpl("err.cmpl_list_empty_string", prompt=["a", ""], compare_message=False),
        cmpl("err.cmpl_negative_token", prompt=[5, -1], compare_message=False),
        # A permission entry's id is random.
        Case("models.list", "/v1/models", None, method="GET", content_type=None,
             aside=("data[].created", "data[].permission[].id",
                    "data[].permission[].created")),
        chat("err.empty_stream_options", stream_options={}),
        chat("err.prompt_logprobs_all", prompt_logprobs=-1),
        chat("err.frequency_penalty", frequency_penalty=-2.5),
        chat("err.truncate_over_context", truncate_prompt_tokens=1000),
        chat("err.priority_range", priority=2**63, compare_message=False),
        chat("err.body_not_object", raw=b"[1, 2]", compare_message=False),
        chat("err.empty_body", raw=b"", compare_message=False),
        chat("err.repetition_detection", repetition_detection={"max_pattern_size": -1},
             compare_message=False),
        cmpl("err.cmpl_no_prompt", prompt=UNSET),
        *both(cmpl("err.cmpl_logprobs_21", logprobs=21)),
        cmpl("err.cmpl_beam_search_stream", use_beam_search=True, stream=True),
        cmpl("err.cmpl_token_oov", prompt=[999999]),
        cmpl("err.cmpl_empty_prompt", prompt="", compare_message=False),
        cmpl("err.cmpl_max_tokens_negative", max_tokens=-1, compare_message=False),
        cmpl("err.cmpl_prompt_logprobs_stream", prompt_logprobs=1, stream=True),
        cmpl("err.cmpl_seed_range", seed=2**64, compare_message=False),
    ]


CASES: list[Case] = [*_chat_cases(), *_completion_cases(), *_error_cases()]
BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "case names must be unique"


# Cases whose answers differ, by name, with the reason. Each must still differ (a mark left on a
# case that became identical fails the stage: remove it).
EXPECTED: dict[str, str] = {
    "err.get_method": "on purpose: every error kvroute answers is OpenAI's error JSON, a 405 "
                      "too (vLLM answers FastAPI's {\"detail\": ...} there)",
    "err.tool_call_object_arguments": "on purpose: kvroute takes a tool call's arguments as a "
                                      "JSON object too (vLLM's renderer turns them into one "
                                      "anyway); vLLM's server wants the string OpenAI sends",
}
