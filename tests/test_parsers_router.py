"""Tool calls and reasoning end to end: the official openai client, the router with vLLM's parser
flags, simulated engines scripted (``vllm_xargs.kvroute_sim_token_ids``) to emit a model's text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from devtools.cluster import ClusterOptions, LocalCluster
from render.models import EMBEDDED_MODEL

EOS = "<|im_end|>"
TOOLS: list[Any] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}},
]
MESSAGES: list[Any] = [{"role": "user", "content": "Weather in Paris, and the time?"}]
THOUGHT = "The user wants two things."
CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris — 巴黎"}}\n'
         '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
SCRIPT = f"<think>\n{THOUGHT}\n</think>\n\n{CALLS}{EOS}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    opts = ClusterOptions(engines=1, sim={"step_time": 0.0005}, tool_call_parser="hermes",
                          reasoning_parser="qwen3", enable_auto_tool_choice=True)
    with LocalCluster(opts) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Any]:
    with openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(EMBEDDED_MODEL / "tokenizer.json"))


def scripted(tok: Tokenizer, text: str) -> dict[str, Any]:
    ids = tok.encode(text, add_special_tokens=False).ids
    return {"vllm_xargs": {"kvroute_sim_token_ids": ids}}


def _ask(client: Any, tok: Tokenizer, text: str, extra: dict[str, Any] | None = None,
         **kw: Any) -> Any:
    return client.chat.completions.create(model="Qwen/Qwen3-0.6B", messages=MESSAGES,
                                          max_tokens=200,
                                          extra_body={**scripted(tok, text), **(extra or {})},
                                          **kw)


# Thinking off: the template closes the think block in the prompt, so the output is content.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def _fold(chunks: list[Any]) -> dict[str, Any]:
    content, reasoning, alias, finish = [], [], [], None
    calls: dict[int, dict[str, Any]] = {}
    for c in chunks:
        for ch in c.choices:
            d = ch.delta
            content.append(d.content or "")
            reasoning.append(getattr(d, "reasoning_content", None) or "")
            alias.append(getattr(d, "reasoning", None) or "")
            for tc in d.tool_calls or []:
                if tc.index not in calls:
                    # A call's first delta names it: index, id, type and function name.
                    assert tc.id and tc.type == "function" and tc.function.name, tc
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    assert "".join(alias) == "".join(reasoning)
    return {"content": "".join(content), "reasoning": "".join(reasoning),
            "calls": [calls[k] for k in sorted(calls)], "finish": finish}


def test_calls_and_reasoning_collected(client: Any, tok: Tokenizer) -> None:
    r = _ask(client, tok, SCRIPT, tools=TOOLS)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert msg.reasoning_content == f"\n{THOUGHT}\n" == msg.reasoning  # type: ignore[attr-defined]
    assert [(c.type, c.function.name) for c in msg.tool_calls] == [
        ("function", "get_weather"), ("function", "get_time")]
    assert json.loads(msg.tool_calls[0].function.arguments) == {"city": "Paris — 巴黎"}
    # The model's bytes, not re-serialized: no \\u escapes.
    assert msg.tool_calls[0].function.arguments == '{"city": "Paris — 巴黎"}'
    assert msg.tool_calls[1].function.arguments == "{}"
    assert all(c.id.startswith("chatcmpl-tool-") and len(c.id) == 30 for c in msg.tool_calls)


def test_calls_and_reasoning_streamed(client: Any, tok: Tokenizer) -> None:
    chunks = list(_ask(client, tok, SCRIPT, tools=TOOLS, stream=True))
    folded = _fold(chunks)
    collected = _ask(client, tok, SCRIPT, tools=TOOLS).choices[0].message
    assert folded["finish"] == "tool_calls"
    assert folded["reasoning"] == collected.reasoning_content
    assert folded["content"] == ""
    assert [(c["name"], c["arguments"]) for c in folded["calls"]] == [
        (c.function.name, c.function.arguments) for c in collected.tool_calls]
    # Argument bytes arrive as they are generated, in several fragments.
    fragments = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []
                 if tc.index == 0 and tc.function.arguments]
    assert len(fragments) > 3


def test_content_before_a_call_and_plain_answers(client: Any, tok: Tokenizer) -> None:
    r = _ask(client, tok, f"<think>x</think>Let me look.{CALLS}{EOS}", tools=TOOLS)
    assert r.choices[0].message.content == "Let me look."
    assert len(r.choices[0].message.tool_calls) == 2
    plain = _ask(client, tok, f"<think>x</think>\n\nIt is sunny.{EOS}", tools=TOOLS)
    assert plain.choices[0].finish_reason == "stop"
    assert plain.choices[0].message.content == "\n\nIt is sunny."
    assert not plain.choices[0].message.tool_calls


def test_include_reasoning_false_and_single_call(client: Any, tok: Tokenizer) -> None:
    r = client.chat.completions.create(
        model="Qwen/Qwen3-0.6B", messages=MESSAGES, max_tokens=200, tools=TOOLS,
        parallel_tool_calls=False,
        extra_body={**scripted(tok, SCRIPT), "include_reasoning": False})
    msg = r.choices[0].message
    assert getattr(msg, "reasoning_content", None) is None
    assert [c.function.name for c in msg.tool_calls] == ["get_weather"]
    chunks = list(client.chat.completions.create(
        model="Qwen/Qwen3-0.6B", messages=MESSAGES, max_tokens=200, tools=TOOLS, stream=True,
        parallel_tool_calls=False,
        extra_body={**scripted(tok, SCRIPT), "include_reasoning": False}))
    folded = _fold(chunks)
    assert folded["reasoning"] == ""
    assert [c["name"] for c in folded["calls"]] == ["get_weather"]


def test_reasoning_starts_where_the_prompt_left_it(client: Any, tok: Tokenizer) -> None:
    # Thinking on: the model opens the block; text before </think> is reasoning even when the
    # model never wrote <think>.
    r = _ask(client, tok, f"plan</think>answer{EOS}", tools=TOOLS)
    assert (r.choices[0].message.reasoning_content, r.choices[0].message.content) == (
        "plan", "answer")
    # Thinking off: the prompt closed the block, all of it is content.
    r = _ask(client, tok, f"plain answer{EOS}", NO_THINKING, tools=TOOLS)
    assert r.choices[0].message.content == "plain answer"
    assert getattr(r.choices[0].message, "reasoning_content", None) is None


def test_tool_choice_none_leaves_calls_as_text(client: Any, tok: Tokenizer) -> None:
    r = _ask(client, tok, SCRIPT, tools=TOOLS, tool_choice="none")
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop" and not msg.tool_calls
    assert msg.content == "\n\n" + CALLS


def test_forced_tool_choice_constrains_and_parses(cluster: LocalCluster, client: Any,
                                                  tok: Tokenizer) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    with httpx.Client(base_url=cluster.base_url) as http:
        rendered = http.post("/v1/chat/completions/render", json={
            "messages": MESSAGES, "tools": TOOLS, "tool_choice": named}).json()
        required = http.post("/v1/chat/completions/render", json={
            "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
            "parallel_tool_calls": False}).json()
    assert rendered["sampling_params"]["structured_outputs"]["json"] == TOOLS[0]["function"][
        "parameters"]
    schema = required["sampling_params"]["structured_outputs"]["json"]
    assert schema["type"] == "array" and schema["maxItems"] == 1
    assert [s["properties"]["name"]["enum"] for s in schema["items"]["anyOf"]] == [
        ["get_weather"], ["get_time"]]
    # The constrained output is the call: arguments for the named function ...
    r = _ask(client, tok, f'{{"city": "Lyon"}}{EOS}', NO_THINKING, tools=TOOLS,
             tool_choice=named)
    call = r.choices[0].message.tool_calls[0]
    assert (r.choices[0].finish_reason, r.choices[0].message.content) == ("stop", "")
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather", {"city": "Lyon"})
    # ... or an array of {name, parameters} for required.
    out = '[{"name": "get_time", "parameters": {"zone": "CET"}}]'
    r = _ask(client, tok, out + EOS, NO_THINKING, tools=TOOLS, tool_choice="required")
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time",
                                                                         {"zone": "CET"})
