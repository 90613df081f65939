"""Model outputs for the parser tests: >= 30 per parser, each family's own markup, written as a
model of that family would write it, plus the ways models get it wrong.

Every parser's list covers: text only, calls after text, several calls in one turn, an
empty-argument call followed by another, non-ASCII and escaped characters in arguments, a call
inside the reasoning, output cut by max_tokens inside a call, and malformed calls. Markers split
at every byte and several tokens per engine step come from re-chunking each case
(tests/test_parsers_chunking.py).
"""

from __future__ import annotations

from typing import Any

from tests.parser_oracle import Case

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}}}}}
ZIP = {"type": "function", "function": {
    "name": "lookup", "parameters": {"type": "object", "properties": {
        "zip": {"type": "string"}, "limit": {"type": ["integer", "null"]},
        "exact": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object"}}}}}
TOOLS = (WEATHER, TIME, ZIP)

QWEN_PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
QWEN_NO_THINK = QWEN_PROMPT + "<think>\n\n</think>\n\n"


def _hermes_call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def hermes_cases() -> list[Case]:
    w = _hermes_call("get_weather", '{"city": "Paris"}')
    t = _hermes_call("get_time", "{}")
    outputs: dict[str, str] = {
        "text_only": "The weather is fine.",
        "empty": "",
        "blank": "\n\n",
        "one_call": w,
        "text_then_call": f"Let me check. {w}",
        "blank_then_call": f"\n\n{w}",
        "two_calls": f"{w}\n{t}",
        "three_calls_compact": w + '<tool_call>{"name":"get_time","arguments":{"zone":"CET"}}'
                               '</tool_call>' + _hermes_call("lookup", '{"zip": "03106"}'),
        "empty_args_then_call": f"{t}\n{w}",
        "empty_args_only": t,
        "non_ascii": _hermes_call("get_weather", '{"city": "Zürich — 東京 🌧"}'),
        "escapes": _hermes_call("get_weather", '{"city": "a\\"b\\\\c\\nd\\u00e9\\ud83d\\ude00"}'),
        "nested": _hermes_call("lookup", '{"zip": "1", "tags": ["a", "b"], '
                                         '"meta": {"k": [1, 2.5, -3e2, true, null]}}'),
        "numbers": _hermes_call("get_weather", '{"city": "x", "days": 3, "unit": "c"}'),
        "string_args": '<tool_call>\n{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}'
                       '\n</tool_call>',
        "args_first": '<tool_call>\n{"arguments": {"city": "Rome"}, "name": "get_weather"}'
                      '\n</tool_call>',
        "unknown_function": _hermes_call("launch_rockets", '{"count": 3}'),
        "text_after_call": f"{w}\nDone, anything else?",
        "text_between_calls": f"{w} and then {t}",
        "no_end_tag": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}',
        "lt_in_text": "if a < b and c <tool then <tool_call is not a call",
        "stray_end_tag": "just </tool_call> text",
        "long_string": _hermes_call("get_weather", '{"city": "' + "long " * 60 + '"}'),
        "not_json": "<tool_call>\nget_weather(city='Paris')\n</tool_call>",
        "missing_arguments": '<tool_call>\n{"name": "get_weather"}\n</tool_call>',
        "parameters_key": '<tool_call>\n{"name": "get_weather", "parameters": {"city": "x"}}'
                          '\n</tool_call>',
        "name_not_string": '<tool_call>\n{"name": 7, "arguments": {}}\n</tool_call>',
        "bad_literal": '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}'
                       '\n</tool_call>',
        "missing_brace": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}'
                         '\n</tool_call>',
        "extra_after_json": '<tool_call>\n{"name": "get_time", "arguments": {}} trailing'
                            '\n</tool_call>',
        "text_then_malformed": "Sure. <tool_call>\n{oops}\n</tool_call>",
        "deep": _hermes_call("lookup", '{"meta": {"a": {"b": {"c": {"d": [[[{}]]]}}}}}'),
    }
    cases = [Case(f"hermes/{k}", "qwen3", v, "hermes", tools=TOOLS, prompt=QWEN_NO_THINK)
             for k, v in outputs.items()]
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    cases += [
        Case("hermes/cut_in_args", "qwen3", cut, "hermes", tools=TOOLS, prompt=QWEN_NO_THINK,
             finish="length"),
        Case("hermes/cut_in_name", "qwen3", '<tool_call>\n{"name": "get_wea', "hermes",
             tools=TOOLS, prompt=QWEN_NO_THINK, finish="length"),
        Case("hermes/cut_after_start", "qwen3", "Checking.<tool_call>", "hermes", tools=TOOLS,
             prompt=QWEN_NO_THINK, finish="length"),
        Case("hermes/tool_choice_none", "qwen3", w, "hermes", tools=TOOLS, tool_choice="none",
             prompt=QWEN_NO_THINK),
        Case("hermes/single_call", "qwen3", f"{w}\n{t}", "hermes", tools=TOOLS,
             parallel_tool_calls=False, prompt=QWEN_NO_THINK),
        Case("hermes/named", "qwen3", '{"city": "Lyon"}', "hermes", tools=TOOLS,
             tool_choice={"type": "function", "function": {"name": "get_weather"}},
             prompt=QWEN_NO_THINK),
        Case("hermes/named_blank_lead", "qwen3", '\n {"city": "Lyon"} ', "hermes", tools=TOOLS,
             tool_choice={"type": "function", "function": {"name": "get_weather"}},
             prompt=QWEN_NO_THINK),
        Case("hermes/required", "qwen3",
             '[{"name": "get_weather", "parameters": {"city": "Nice"}}, '
             '{"name": "get_time", "parameters": {}}]', "hermes", tools=TOOLS,
             tool_choice="required", prompt=QWEN_NO_THINK),
        Case("hermes/required_single", "qwen3",
             '[{"name": "get_time", "parameters": {"zone": "CET"}}]', "hermes", tools=TOOLS,
             tool_choice="required", parallel_tool_calls=False, prompt=QWEN_NO_THINK),
    ]
    # With the Qwen3 reasoning parser in front, as Qwen3 is served.
    thought = "<think>\nThe user wants the weather.\n</think>\n\n"
    cases += [
        Case("hermes+qwen3/think_then_call", "qwen3", thought + w, "hermes", "qwen3",
             tools=TOOLS),
        Case("hermes+qwen3/think_text_call", "qwen3", thought + "One moment. " + w, "hermes",
             "qwen3", tools=TOOLS),
        Case("hermes+qwen3/call_inside_think", "qwen3", "<think>\nI will call " + w, "hermes",
             "qwen3", tools=TOOLS),
        Case("hermes+qwen3/think_only", "qwen3", "<think>\nhmm\n</think>\n\nSunny.", "hermes",
             "qwen3", tools=TOOLS),
        Case("hermes+qwen3/hidden_reasoning", "qwen3", thought + w, "hermes", "qwen3",
             tools=TOOLS, include_reasoning=False),
        Case("hermes+qwen3/cut_in_think", "qwen3", "<think>\nLong thoughts abo", "hermes",
             "qwen3", tools=TOOLS, finish="length"),
    ]
    return cases


def qwen3_reasoning_cases() -> list[Case]:
    outputs: dict[str, str] = {
        "tags": "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
        "no_start_tag": "Let me think.\n</think>\n\nFour.",
        "no_end_tag": "<think>\nStill thinking",
        "no_tags": "Just an answer.",
        "empty_think": "<think>\n\n</think>\n\nHi!",
        "end_twice": "<think>a</think>b</think>c",
        "start_in_content": "<think>a</think>b <think> c",
        "start_twice": "<think>a<think>b</think>c",
        "non_ascii": "<think>\nDenke nach… 思考中 🤔\n</think>\n\nJa — 是的.",
        "partial_end_text": "<think>a </thin b </think> c",
        "lt_text": "<think>x < y and y </ z</think>ok",
        "only_end": "</think>",
        "only_start": "<think>",
        "empty": "",
        "newlines": "<think>\n\n\n</think>\n\n\n",
        "long": "<think>" + "step. " * 80 + "</think>" + "done " * 20,
        "tool_call_text": "<think>a</think><tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "code": "<think>```py\nprint('</think>')\n```</think>answer",
        "html_like": "<think><b>bold</b></think><i>it</i>",
        "spaces": "<think>   </think>   ",
    }
    cases = [Case(f"qwen3/{k}", "qwen3", v, None, "qwen3") for k, v in outputs.items()]
    cases += [Case(f"qwen3/thinking_off/{k}", "qwen3", outputs[k], None, "qwen3",
                   prompt=QWEN_NO_THINK, chat_template_kwargs={"enable_thinking": False})
              for k in ("tags", "no_tags", "no_start_tag", "empty")]
    cases += [
        Case("qwen3/prompt_opened", "qwen3", "still thinking</think>out", None, "qwen3",
             prompt=QWEN_PROMPT + "<think>\n"),
        Case("qwen3/cut", "qwen3", "<think>\nabc", None, "qwen3", finish="length"),
        Case("qwen3/cut_after", "qwen3", "<think>a</think>partial answ", None, "qwen3",
             finish="length"),
        Case("qwen3/hidden", "qwen3", outputs["tags"], None, "qwen3", include_reasoning=False),
        Case("qwen3/hidden_no_content", "qwen3", "<think>abc</think>", None, "qwen3",
             include_reasoning=False),
        Case("qwen3/history", "qwen3", "x</think>y", None, "qwen3",
             prompt="<|im_start|>assistant\n<think>\nold\n</think>\n\nold answer<|im_end|>\n"
                    "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"),
    ]
    return cases


def all_cases() -> list[Case]:
    return [*hermes_cases(), *qwen3_reasoning_cases()]


def by_parser(cases: list[Case]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in cases:
        for name in (c.tool_parser, c.reasoning_parser):
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
    return counts


CHUNKINGS: list[list[int]] = [[1], [3, 2, 8, 5, 4, 7, 2, 6]]

# kvroute's answer where vLLM disagrees with itself and neither of its answers is the one a
# stream can keep (docs/parsers.md explains each).
_ID = "chatcmpl-tool-0000000000000000"
EXPECTED: dict[str, dict[str, Any]] = {
    # The call's JSON is complete; text after it inside the tags is dropped.
    "hermes/extra_after_json": {"content": None, "finish_reason": "tool_calls", "tool_calls": [
        {"id": _ID, "name": "get_time", "arguments": "{}"}]},
}


def describe(case: Case) -> dict[str, Any]:
    return {"id": case.id, "output": case.output}
