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


def _xml_call(name: str, params: dict[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def qwen3_coder_cases() -> list[Case]:
    w = _xml_call("get_weather", {"city": "Paris", "days": "3"})
    t = _xml_call("get_time", {})
    z = _xml_call("lookup", {"zip": "03106", "limit": "null", "exact": "true",
                             "tags": '["a", "b"]', "meta": '{"k": 1}'})
    outputs: dict[str, str] = {
        "text_only": "The weather is fine.",
        "empty": "",
        "blank": "\n\n",
        "one_call": w,
        "text_then_call": f"Let me check.\n\n{w}",
        "blank_then_call": f"\n\n{w}",
        "two_calls": f"{w}\n{t}",
        "empty_args_then_call": f"{t}\n{w}",
        "typed_params": z,
        "union_null_int": _xml_call("lookup", {"limit": "7"}),
        "number_as_string": _xml_call("lookup", {"zip": "00501"}),
        "bad_integer": _xml_call("get_weather", {"days": "three"}),
        "non_ascii": _xml_call("get_weather", {"city": "Zürich — 東京 🌧"}),
        "escapes": _xml_call("get_weather", {"city": 'a "quoted" \\ back\tslash'}),
        "multiline_value": _xml_call("get_weather", {"city": "line one\nline two\n"}),
        "blank_lines_value": _xml_call("get_weather", {"city": "\nA\n"}),
        "unknown_function": _xml_call("launch", {"count": "3"}),
        "unknown_param": _xml_call("get_weather", {"extra": "42"}),
        "text_after_call": f"{w}\nDone.",
        "no_tool_call_tag": "<function=get_time>\n</function>",
        "no_param_close": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                          "<parameter=days>\n3\n</function>\n</tool_call>",
        "no_end_tags": "<tool_call>\n<function=get_time>\n</function>",
        "lt_in_text": "a < b and <func not a call",
        "long_value": _xml_call("get_weather", {"city": "long " * 60}),
        "html_value": _xml_call("get_weather", {"city": "<b>bold</b> & <i>"}),
        "json_in_string": _xml_call("get_weather", {"city": '{"not": "parsed"}'}),
        "three_calls": f"{w}\n{t}\n{z}",
        "spaces_around": f"  Sure thing.  \n{w}\n  ",
        "empty_tool_call": "<tool_call>\n</tool_call>",
        "name_no_close": "<tool_call>\n<function=get_time</function>\n</tool_call>",
    }
    cases = [Case(f"qwen3_coder/{k}", "qwen3", v, "qwen3_coder", tools=TOOLS,
                  prompt=QWEN_NO_THINK, chat_template_kwargs={"enable_thinking": False})
             for k, v in outputs.items()]
    cases += [
        Case("qwen3_coder/cut_in_value", "qwen3",
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "qwen3_coder",
             tools=TOOLS, prompt=QWEN_NO_THINK, chat_template_kwargs={"enable_thinking": False},
             finish="length"),
        Case("qwen3_coder/cut_after_param", "qwen3",
             "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n",
             "qwen3_coder", tools=TOOLS, prompt=QWEN_NO_THINK,
             chat_template_kwargs={"enable_thinking": False}, finish="length"),
        Case("qwen3_coder/single_call", "qwen3", f"{w}\n{t}", "qwen3_coder", tools=TOOLS,
             parallel_tool_calls=False, prompt=QWEN_NO_THINK,
             chat_template_kwargs={"enable_thinking": False}),
        Case("qwen3_coder/tool_choice_none", "qwen3", w, "qwen3_coder", tools=TOOLS,
             tool_choice="none", prompt=QWEN_NO_THINK,
             chat_template_kwargs={"enable_thinking": False}),
        Case("qwen3_coder+qwen3/think_then_call", "qwen3",
             "<think>\nNeed weather.\n</think>\n\n" + w, "qwen3_coder", "qwen3", tools=TOOLS),
        Case("qwen3_coder+qwen3/call_inside_think", "qwen3", "<think>\nCalling " + w,
             "qwen3_coder", "qwen3", tools=TOOLS),
    ]
    return cases


GLM_PROMPT = "[gMASK]<sop><|user|>\nhi<|assistant|>"
GLM_NO_THINK = GLM_PROMPT + "\n<think></think>"


def _glm_call(name: str, params: dict[str, str]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                   for k, v in params.items())
    return f"<tool_call>{name}\n{body}</tool_call>"


def glm_cases() -> list[Case]:
    w = _glm_call("get_weather", {"city": "Paris", "days": "3"})
    t = _glm_call("get_time", {})
    outputs: dict[str, str] = {
        "text_only": "The weather is fine.",
        "empty": "",
        "one_call": w,
        "text_then_call": f"Let me check.\n{w}",
        "two_calls": f"{w}\n{t}",
        "empty_args_then_call": f"{t}{w}",
        "no_newline_after_name": "<tool_call>get_weather<arg_key>city</arg_key>"
                                 "<arg_value>Rome</arg_value></tool_call>",
        "typed": _glm_call("lookup", {"zip": "03106", "limit": "null", "exact": "false",
                                      "tags": '["x"]'}),
        "union_int": _glm_call("lookup", {"limit": "12"}),
        "non_ascii": _glm_call("get_weather", {"city": "Zürich — 東京 🌧"}),
        "escapes": _glm_call("get_weather", {"city": 'say "hi"\\n\nnext'}),
        "multiline": _glm_call("get_weather", {"city": "\nA\nB\n"}),
        "unknown_function": _glm_call("launch", {"count": "3"}),
        "unknown_then_known": _glm_call("launch", {}) + w,
        "spaced_name": "<tool_call>  get_time  </tool_call>",
        "spaced_key": "<tool_call>get_weather<arg_key> city </arg_key><arg_value>X</arg_value>"
                      "</tool_call>",
        "text_after_call": f"{w}\nDone.",
        "long_value": _glm_call("get_weather", {"city": "long " * 60}),
        "lt_text": "a <tool b",
        "three_calls": w + t + _glm_call("lookup", {"zip": "1"}),
        "value_with_tags": _glm_call("get_weather", {"city": "<b>x</b>"}),
    }
    cases = [Case(f"glm47/{k}", "qwen3", v, "glm47", tools=TOOLS, prompt=GLM_NO_THINK,
                  chat_template_kwargs={"enable_thinking": False})
             for k, v in outputs.items()]
    cases += [
        Case("glm47/cut_in_value", "qwen3", "<tool_call>get_weather\n<arg_key>city</arg_key>"
             "<arg_value>Par", "glm47", tools=TOOLS, prompt=GLM_NO_THINK,
             chat_template_kwargs={"enable_thinking": False}, finish="length"),
        Case("glm47/cut_in_name", "qwen3", "<tool_call>get_wea", "glm47", tools=TOOLS,
             prompt=GLM_NO_THINK, chat_template_kwargs={"enable_thinking": False},
             finish="length"),
        Case("glm47+glm45/think_then_call", "qwen3", "<think>Need weather.</think>" + w,
             "glm47", "glm45", tools=TOOLS, prompt=GLM_PROMPT),
        Case("glm47+glm45/call_inside_think", "qwen3", "<think>Calling " + w, "glm47",
             "glm45", tools=TOOLS, prompt=GLM_PROMPT),
        Case("glm47+glm45/think_twice", "qwen3", "<think>a</think>b<think>c</think>d", "glm47",
             "glm45", tools=TOOLS, prompt=GLM_PROMPT),
        Case("glm47+glm45/no_start", "qwen3", "plan</think>answer", "glm47", "glm45",
             tools=TOOLS, prompt=GLM_PROMPT),
        Case("glm47+glm45/thinking_off", "qwen3", "answer</think>x", "glm47", "glm45",
             tools=TOOLS, prompt=GLM_NO_THINK, chat_template_kwargs={"enable_thinking": False}),
        Case("glm47+glm45/hidden", "qwen3", "<think>a</think>" + w, "glm47", "glm45",
             tools=TOOLS, prompt=GLM_PROMPT, include_reasoning=False),
        Case("glm47+glm45/cut_in_think", "qwen3", "<think>abc", "glm47", "glm45",
             tools=TOOLS, prompt=GLM_PROMPT, finish="length"),
    ]
    return cases


THINK_OUTPUTS: dict[str, str] = {
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
        "trailing_space": "<think>a  \n</think>b",
    }


def think_cases(name: str, family: str, prompt: str, closed: str,
                kwargs_off: dict[str, Any] | None = None, kwargs_on: dict[str, Any] | None = None,
                start: str = "<think>", end: str = "</think>") -> list[Case]:
    """A think-tag reasoning parser's corpus: the outputs above in the family's markers."""
    def spell(text: str) -> str:
        return text.replace("<think>", start).replace("</think>", end)

    off = kwargs_off if kwargs_off is not None else {"enable_thinking": False}
    on = kwargs_on or {}
    outputs = {k: spell(v) for k, v in THINK_OUTPUTS.items()}
    tag = f"{name}/think"
    cases = [Case(f"{tag}/{k}", family, v, None, name, prompt=prompt, chat_template_kwargs=on)
             for k, v in outputs.items()]
    cases += [Case(f"{tag}/thinking_off/{k}", family, outputs[k], None, name, prompt=closed,
                   chat_template_kwargs=off)
              for k in ("tags", "no_tags", "no_start_tag", "empty")]
    cases += [
        Case(f"{tag}/prompt_opened", family, spell("still thinking</think>out"), None, name,
             prompt=prompt + start + "\n", chat_template_kwargs=on),
        Case(f"{tag}/cut", family, spell("<think>\nabc"), None, name, prompt=prompt,
             finish="length", chat_template_kwargs=on),
        Case(f"{tag}/cut_after", family, spell("<think>a</think>partial answ"), None, name,
             prompt=prompt, finish="length", chat_template_kwargs=on),
        Case(f"{tag}/hidden", family, outputs["tags"], None, name, prompt=prompt,
             include_reasoning=False, chat_template_kwargs=on),
        Case(f"{tag}/hidden_no_content", family, spell("<think>abc</think>"), None, name,
             prompt=prompt, include_reasoning=False, chat_template_kwargs=on),
    ]
    return cases


def qwen3_reasoning_cases() -> list[Case]:
    outputs = THINK_OUTPUTS
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


DS_PROMPT = "<｜User｜>hi<｜Assistant｜>"
DS_NO_THINK = DS_PROMPT + "</think>"


def _ds3_call(name: str, args: str) -> str:
    return ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n" + args
            + "\n```<｜tool▁call▁end｜>")


def _ds31_call(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"


def _marked_outputs(call: Any, begin: str, end: str) -> dict[str, str]:
    def section(*calls: str) -> str:
        return begin + "".join(calls) + end

    w = call("get_weather", '{"city": "Paris"}')
    t = call("get_time", "{}")
    return {
        "text_only": "The weather is fine.",
        "empty": "",
        "one_call": section(w),
        "text_then_call": "Let me check." + section(w),
        "blank_then_call": "\n\n" + section(w),
        "two_calls": section(w, t),
        "two_calls_newline": section(w, "\n", t),
        "empty_args_then_call": section(t, w),
        "non_ascii": section(call("get_weather", '{"city": "Zürich — 東京 🌧"}')),
        "escapes": section(call("get_weather", '{"city": "a\\"b\\\\c\\u00e9"}')),
        "compact": section(call("get_weather", '{"city":"Rome","days":2}')),
        "nested": section(call("lookup", '{"meta": {"a": [1, {"b": null}]}}')),
        "unknown_function": section(call("launch", '{"n": 3}')),
        "text_after": section(w) + "Done.",
        "no_section_end": begin + w,
        "malformed_args": section(call("get_weather", "{city: Paris}")),
        "multiline_args": section(call("get_weather", '{\n  "city": "Paris"\n}')),
        "long": section(call("get_weather", '{"city": "' + "x" * 300 + '"}')),
        "lt_text": "a <｜tool not a call",
        "begin_only": "Checking." + begin,
        "three_calls": section(w, t, call("lookup", '{"zip": "03106"}')),
        "string_args": section(call("get_time", '"UTC"')),
    }


def deepseek_cases(name: str, call: Any) -> list[Case]:
    begin, end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    outputs = _marked_outputs(call, begin, end)
    fam = "deepseek_v3_1"
    cases = [Case(f"{name}/{k}", fam, v, name, tools=TOOLS, prompt=DS_NO_THINK)
             for k, v in outputs.items()]
    w = call("get_weather", '{"city": "Paris"}')
    cases += [
        Case(f"{name}/cut_in_args", fam,
             begin + call("get_weather", '{"city": "Pa').split("<｜tool▁call▁end｜>")[0].rstrip(
                 "`\n"), name, tools=TOOLS, prompt=DS_NO_THINK, finish="length"),
        Case(f"{name}/cut_in_name", fam, f"{begin}<｜tool▁call▁begin｜>get_wea", name,
             tools=TOOLS, prompt=DS_NO_THINK, finish="length"),
        Case(f"{name}/single_call", fam, outputs["two_calls"], name, tools=TOOLS,
             parallel_tool_calls=False, prompt=DS_NO_THINK),
        Case(f"{name}/tool_choice_none", fam, outputs["one_call"], name, tools=TOOLS,
             tool_choice="none", prompt=DS_NO_THINK),
        Case(f"{name}/named", fam, '{"city": "Lyon"}', name, tools=TOOLS,
             tool_choice={"type": "function", "function": {"name": "get_weather"}},
             prompt=DS_NO_THINK),
        Case(f"{name}/required", fam, '[{"name": "get_time", "parameters": {}}]', name,
             tools=TOOLS, tool_choice="required", prompt=DS_NO_THINK),
        Case(f"{name}/text_between", fam, f"{begin}{w}between{w}{end}", name, tools=TOOLS,
             prompt=DS_NO_THINK),
        Case(f"{name}/hidden_reasoning", fam, f"{begin}{w}{end}", name, tools=TOOLS,
             prompt=DS_NO_THINK, include_reasoning=False),
    ]
    return cases


def kimi_cases() -> list[Case]:
    begin, end = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    counter = iter(range(100))

    def call(name: str, args: str) -> str:
        return (f"<|tool_call_begin|>functions.{name}:{next(counter)}"
                f"<|tool_call_argument_begin|>{args}<|tool_call_end|>")

    outputs = _marked_outputs(call, begin, end)
    outputs.update({
        "spaced_args": f"{begin}<|tool_call_begin|>functions.get_time:0"
                       f"<|tool_call_argument_begin|>  {{}}  <|tool_call_end|>{end}",
        "empty_args": f"{begin}<|tool_call_begin|>functions.get_time:0"
                      f"<|tool_call_argument_begin|><|tool_call_end|>{end}",
        "bad_header": f"{begin}<|tool_call_begin|>get_time<|tool_call_argument_begin|>{{}}"
                      f"<|tool_call_end|>{end}",
        "section_end_in_args": f"{begin}<|tool_call_begin|>functions.get_time:0"
                               f"<|tool_call_argument_begin|>{{}}{end}",
    })
    cases = [Case(f"kimi_k2/{k}", "qwen3", v, "kimi_k2", tools=TOOLS, prompt=QWEN_NO_THINK,
                  chat_template_kwargs={"thinking": False})
             for k, v in outputs.items()]
    w = call("get_weather", '{"city": "Paris"}')
    cases += [
        Case("kimi_k2/cut_in_args", "qwen3", f'{begin}<|tool_call_begin|>functions.get_time:0'
             f'<|tool_call_argument_begin|>{{"zone": "CE', "kimi_k2", tools=TOOLS,
             prompt=QWEN_NO_THINK, chat_template_kwargs={"thinking": False}, finish="length"),
        Case("kimi_k2+kimi_k2/think_then_call", "qwen3", f"<think>plan</think>{begin}{w}{end}",
             "kimi_k2", "kimi_k2", tools=TOOLS),
        Case("kimi_k2+kimi_k2/call_inside_think", "qwen3", f"<think>plan {begin}{w}{end}",
             "kimi_k2", "kimi_k2", tools=TOOLS),
        Case("kimi_k2/tool_choice_none", "qwen3", outputs["one_call"], "kimi_k2", tools=TOOLS,
             tool_choice="none", prompt=QWEN_NO_THINK, chat_template_kwargs={"thinking": False}),
    ]
    return cases


LLAMA_PROMPT = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def llama_cases() -> list[Case]:
    w = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    t = '{"name": "get_time", "parameters": {}}'
    outputs: dict[str, str] = {
        "text_only": "The weather is fine.",
        "empty": "",
        "one_call": w,
        "arguments_key": '{"name": "get_weather", "arguments": {"city": "Rome"}}',
        "python_tag": "<|python_tag|>" + w,
        "two_calls": f"{w}; {t}",
        "two_calls_newline": f"{w}\n{t}",
        "empty_args_then_call": f"{t}; {w}",
        "three_calls": f"{w}; {t}; " + '{"name": "lookup", "parameters": {"zip": "03106"}}',
        "non_ascii": '{"name": "get_weather", "parameters": {"city": "Zürich — 東京 🌧"}}',
        "escapes": '{"name": "get_weather", "parameters": {"city": "a\\"b\\\\c\\u00e9\\n"}}',
        "compact": '{"name":"get_weather","parameters":{"city":"Oslo","days":2}}',
        "nested": '{"name": "lookup", "parameters": {"meta": {"a": [1, 2.5, null, true]}}}',
        "text_then_json": "Sure: " + w,
        "braces_in_text": "Use {x} notation.",
        "not_a_call": '{"answer": 42}',
        "missing_params": '{"name": "get_time"}',
        "name_not_string": '{"name": 3, "parameters": {}}',
        "malformed": '{"name": "get_weather", "parameters": {"city": Paris}}',
        "missing_brace": '{"name": "get_weather", "parameters": {"city": "Paris"}',
        "unknown_function": '{"name": "launch", "parameters": {"n": 1}}',
        "string_params": '{"name": "get_time", "parameters": "UTC"}',
        "params_first": '{"parameters": {"city": "Lima"}, "name": "get_weather"}',
        "text_after": w + " That is all.",
        "long": '{"name": "get_weather", "parameters": {"city": "' + "x" * 300 + '"}}',
        "leading_space": " " + w,
        "python_tag_only": "<|python_tag|>",
        "python_tag_text": "<|python_tag|>print(1)",
        "second_broken": w + '; {"name": "get_time", "parameters": {oops}}',
    }
    cases = [Case(f"llama3_json/{k}", "llama3_1", v, "llama3_json", tools=TOOLS,
                  prompt=LLAMA_PROMPT) for k, v in outputs.items()]
    cases += [
        Case("llama3_json/cut_in_args", "llama3_1", w[:40], "llama3_json", tools=TOOLS,
             prompt=LLAMA_PROMPT, finish="length"),
        Case("llama3_json/cut_in_name", "llama3_1", w[:15], "llama3_json", tools=TOOLS,
             prompt=LLAMA_PROMPT, finish="length"),
        Case("llama3_json/single_call", "llama3_1", f"{w}; {t}", "llama3_json", tools=TOOLS,
             prompt=LLAMA_PROMPT, parallel_tool_calls=False),
        Case("llama3_json/tool_choice_none", "llama3_1", w, "llama3_json", tools=TOOLS,
             prompt=LLAMA_PROMPT, tool_choice="none"),
    ]
    return cases


def harmony_cases() -> list[Case]:
    think = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
    call = ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            '{"city":"Paris"}')
    final = "<|channel|>final<|message|>It is sunny."
    outputs: dict[str, str] = {
        "final_only": final,
        "think_final": think + final,
        "think_call": think + call,
        "call_only": call,
        "empty": "",
        "non_ascii_args": "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                          '<|message|>{"city":"Zürich — 東京 🌧"}',
        "escapes_args": "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                        '<|message|>{"city":"a\\"b\\\\c\\u00e9"}',
        "empty_args": "<|channel|>commentary to=functions.get_time <|constrain|>json"
                      "<|message|>{}",
        "two_calls": call + "<|end|><|start|>assistant<|channel|>commentary "
                     "to=functions.get_time <|constrain|>json<|message|>{}",
        "empty_args_then_call": "<|channel|>commentary to=functions.get_time <|constrain|>json"
                                "<|message|>{}<|end|><|start|>assistant" + call,
        "preamble_then_call": "<|channel|>commentary<|message|>Checking now.<|end|>"
                              "<|start|>assistant" + call,
        "two_finals": final + "<|end|><|start|>assistant<|channel|>final<|message|>Bye.",
        "two_thoughts": "<|channel|>analysis<|message|>A.<|end|><|start|>assistant"
                        "<|channel|>analysis<|message|>B.<|end|><|start|>assistant" + final,
        "recipient_first": "<|start|>assistant to=functions.get_time<|channel|>commentary json"
                           "<|message|>{}",
        "recipient_first_no_start": " to=functions.get_time<|channel|>commentary json"
                                    "<|message|>{}",
        "builtin_tool": "<|channel|>analysis<|message|>search<|end|><|start|>assistant"
                        "<|channel|>commentary to=browser.search json<|message|>{\"q\":\"x\"}",
        "bare_recipient": "<|channel|>commentary to=get_time <|constrain|>json<|message|>{}",
        "text_args": "<|channel|>commentary to=functions.get_time code<|message|>UTC now",
        "unknown_channel": "<|channel|>notes<|message|>hidden<|end|><|start|>assistant" + final,
        "multiline_final": "<|channel|>final<|message|>Line 1\nLine 2\n\n- item",
        "lt_text": "<|channel|>final<|message|>a <| b and <|chan",
        "long_think": "<|channel|>analysis<|message|>" + "step. " * 80 + "<|end|>"
                      "<|start|>assistant" + final,
        "no_header": "Plain text without a channel.",
        "analysis_only": "<|channel|>analysis<|message|>Only thinking.",
        "spaced_args": "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                       '<|message|>{ "city" : "Oslo" }',
        "malformed_args": "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                          "<|message|>{city: Oslo}",
        "final_then_call": final + "<|end|><|start|>assistant" + call,
        "nested_args": "<|channel|>commentary to=functions.lookup <|constrain|>json"
                       '<|message|>{"meta":{"a":[1,null,true]}}',
    }
    prompt = "<|start|>assistant"
    cases = [Case(f"openai/{k}", "gpt_oss", v, "openai", "openai_gptoss", prompt=prompt,
                  tools=TOOLS) for k, v in outputs.items()]
    cases += [
        Case("openai/cut_in_think", "gpt_oss", "<|channel|>analysis<|message|>Hmm, let",
             "openai", "openai_gptoss", prompt=prompt, tools=TOOLS, finish="length"),
        Case("openai/cut_in_args", "gpt_oss", call[:-5], "openai", "openai_gptoss",
             prompt=prompt, tools=TOOLS, finish="length"),
        Case("openai/cut_in_header", "gpt_oss", think + "<|channel|>comm", "openai",
             "openai_gptoss", prompt=prompt, tools=TOOLS, finish="length"),
        Case("openai/hidden_reasoning", "gpt_oss", think + final, "openai", "openai_gptoss",
             prompt=prompt, tools=TOOLS, include_reasoning=False),
        Case("openai/tool_choice_none", "gpt_oss", think + call, "openai", "openai_gptoss",
             prompt=prompt, tools=TOOLS, tool_choice="none"),
        Case("openai/no_tools", "gpt_oss", think + call, "openai", "openai_gptoss",
             prompt=prompt),
        Case("openai/single_call", "gpt_oss", outputs["two_calls"], "openai", "openai_gptoss",
             prompt=prompt, tools=TOOLS, parallel_tool_calls=False),
    ]
    return cases


MISTRAL_PROMPT = "[INST]hi[/INST]"


def mistral_cases() -> list[Case]:
    w = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    t = '{"name": "get_time", "arguments": {}}'
    outputs: dict[str, str] = {
        "text_only": "The weather is fine.",
        "empty": "",
        "one_call": f"[TOOL_CALLS][{w}]",
        "text_then_call": f"Let me check. [TOOL_CALLS][{w}]",
        "blank_then_call": f"\n\n[TOOL_CALLS][{w}]",
        "two_calls": f"[TOOL_CALLS][{w}, {t}]",
        "empty_args_then_call": f"[TOOL_CALLS][{t}, {w}]",
        "bare_object": f"[TOOL_CALLS]{w}",
        "space_after_marker": f"[TOOL_CALLS] [{w}]",
        "marker_twice": f"[TOOL_CALLS][TOOL_CALLS][{w}]",
        "non_ascii": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich 東京"}}]',
        "escapes": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "a\\"b\\u00e9"}}]',
        "compact": '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Rome","days":2}}]',
        "nested": '[TOOL_CALLS][{"name": "lookup", "arguments": {"meta": {"a": [1, null]}}}]',
        "unknown_function": '[TOOL_CALLS][{"name": "launch", "arguments": {"n": 1}}]',
        "text_after": f"[TOOL_CALLS][{w}] done",
        "not_json": "Hi [TOOL_CALLS] not json",
        "args_first": '[TOOL_CALLS][{"arguments": {"city": "Lima"}, "name": "get_weather"}]',
        "name_only": '[TOOL_CALLS][{"name": "get_time"}]',
        "three_calls": f'[TOOL_CALLS][{w}, {t}, {{"name": "lookup", "arguments": {{"zip": "1"}}}}]',
        "long": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "' + "x" * 300 + '"}}]',
        "lt_text": "a [TOOL not a call",
        "malformed": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": Paris}}]',
        "newlines": f"[TOOL_CALLS][\n  {w},\n  {t}\n]",
        "text_only_brackets": "Use [x] notation.",
    }
    cases = [Case(f"mistral/{k}", "mistral_nemo", v, "mistral", tools=TOOLS,
                  prompt=MISTRAL_PROMPT) for k, v in outputs.items()]
    cases += [
        Case("mistral/cut_in_args", "mistral_nemo", f"[TOOL_CALLS][{w}"[:45], "mistral",
             tools=TOOLS, prompt=MISTRAL_PROMPT, finish="length"),
        Case("mistral/cut_after_marker", "mistral_nemo", "Checking. [TOOL_CALLS]", "mistral",
             tools=TOOLS, prompt=MISTRAL_PROMPT, finish="length"),
        Case("mistral/single_call", "mistral_nemo", f"[TOOL_CALLS][{w}, {t}]", "mistral",
             tools=TOOLS, prompt=MISTRAL_PROMPT, parallel_tool_calls=False),
        Case("mistral/tool_choice_none", "mistral_nemo", f"[TOOL_CALLS][{w}]", "mistral",
             tools=TOOLS, prompt=MISTRAL_PROMPT, tool_choice="none"),
        Case("mistral/no_tools", "mistral_nemo", f"[TOOL_CALLS][{w}]", "mistral",
             prompt=MISTRAL_PROMPT),
    ]
    return cases


def pythonic_cases(name: str) -> list[Case]:
    outputs: dict[str, str] = {
        "text_only": "The weather is fine.",
        "empty": "",
        "one_call": "[get_weather(city='Paris')]",
        "two_calls": "[get_weather(city='Paris'), get_time()]",
        "empty_args_then_call": '[get_time(), get_weather(city="Oslo")]',
        "typed": "[lookup(zip='03106', limit=None, exact=True, tags=['a', 'b'], "
                 "meta={'k': 1.5})]",
        "json_names": "[lookup(limit=null, exact=false, tags=[true])]",
        "negative": "[lookup(limit=-3, meta={'x': -2.5})]",
        "tuple_set": "[lookup(tags=(1, 2), meta={'s': {3}})]",
        "non_ascii": "[get_weather(city='Zürich — 東京 🌧')]",
        "escapes": "[get_weather(city='it\\'s \"q\" \\\\ \\n')]",
        "triple_quoted": "[get_weather(city=" + "'" * 3 + "multi\nline" + "'" * 3 + ")]",
        "dotted": "[tools.get_weather(city='Rome')]",
        "positional": "[get_weather('Paris')]",
        "text_then_list": "Sure: [get_weather(city='Paris')]",
        "text_after": "[get_weather(city='Paris')] done",
        "not_a_call": "[1, 2, 3]",
        "expression_arg": "[get_weather(city=x + 1)]",
        "unclosed": "[get_weather(city='Paris')",
        "brackets_in_string": "[get_weather(city='a)b]c[d(e')]",
        "newlines": "[\n  get_weather(city='Paris'),\n  get_time()\n]",
        "three_calls": "[get_time(), get_time(zone='UTC'), lookup(zip='1')]",
        "nested_call": "[get_weather(city=get_time())]",
        "fstring": "[get_weather(city=f'Paris')]",
        "empty_list": "[]",
        "long": "[get_weather(city='" + "x" * 300 + "')]",
        "unknown_function": "[launch(n=3)]",
        "bytes": "[get_weather(city=b'x')]",
        "leading_space": " [get_time()]",
        "second_broken": "[get_time(), get_weather(city=x y)]",
    }
    cases = [Case(f"{name}/{k}", "llama3_1", v, name, tools=TOOLS, prompt=LLAMA_PROMPT)
             for k, v in outputs.items()]
    cases += [
        Case(f"{name}/cut_in_call", "llama3_1", "[get_weather(city='Par", name, tools=TOOLS,
             prompt=LLAMA_PROMPT, finish="length"),
        Case(f"{name}/cut_after_call", "llama3_1", "[get_time(), get_weather(ci", name,
             tools=TOOLS, prompt=LLAMA_PROMPT, finish="length"),
        Case(f"{name}/single_call", "llama3_1", outputs["two_calls"], name, tools=TOOLS,
             prompt=LLAMA_PROMPT, parallel_tool_calls=False),
        Case(f"{name}/tool_choice_none", "llama3_1", outputs["one_call"], name, tools=TOOLS,
             prompt=LLAMA_PROMPT, tool_choice="none"),
    ]
    return cases


def all_cases() -> list[Case]:
    return [*hermes_cases(), *qwen3_reasoning_cases(), *qwen3_coder_cases(), *glm_cases(),
            *think_cases("glm45", "qwen3", GLM_PROMPT, GLM_NO_THINK),
            *deepseek_cases("deepseek_v3", _ds3_call), *deepseek_cases("deepseek_v31", _ds31_call),
            *kimi_cases(), *llama_cases(), *harmony_cases(), *mistral_cases(),
            *pythonic_cases("pythonic"), *pythonic_cases("llama4_pythonic"),
            *think_cases("mistral", "mistral_nemo", MISTRAL_PROMPT, MISTRAL_PROMPT + "[/THINK]",
                         {}, start="[THINK]", end="[/THINK]"),
            *think_cases("kimi_k2", "qwen3", QWEN_PROMPT, QWEN_NO_THINK, {"thinking": False}),
            *think_cases("deepseek_r1", "qwen3", QWEN_PROMPT + "<think>\n", QWEN_NO_THINK),
            *think_cases("deepseek_v3", "qwen3", QWEN_PROMPT + "<think>\n", QWEN_NO_THINK, {},
                         {"thinking": True})]


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
_ML = {"content": None, "finish_reason": "tool_calls", "tool_calls": [
    {"id": _ID, "name": "get_weather", "arguments": '{\n  "city": "Paris"\n}'}]}


def _calls(*calls: tuple[str, str], finish: str = "tool_calls",
           call_id: str = _ID) -> dict[str, Any]:
    return {"content": None, "finish_reason": finish,
            "tool_calls": [{"id": call_id, "name": n, "arguments": a} for n, a in calls]}


EXPECTED: dict[str, dict[str, Any]] = {
    # A call that breaks after it was announced keeps the raw rest of its text as arguments.
    "llama3_json/malformed": _calls(("get_weather", '{"city": Paris}}')),
    "llama3_json/second_broken": _calls(("get_weather", '{"city": "Paris"}'),
                                        ("get_time", "{oops}}")),
    "llama3_json/missing_brace": _calls(("get_weather", '{"city": "Paris"}')),
    "llama3_json/cut_in_args": _calls(("get_weather", '{"'), finish="length"),
    # The array's JSON breaks inside the call's arguments: they end where it broke.
    "mistral/malformed": _calls(("get_weather", '{"city": '), call_id="MistralId"),
    # vLLM's DeepSeek regexes match one line: its answer drops a call whose JSON spans lines.
    "deepseek_v3/multiline_args": _ML,
    "deepseek_v31/multiline_args": _ML,
    # Leading whitespace streams before anyone knows a call follows; trailing is held.
    "qwen3_coder/spaces_around": {"content": "  Sure thing.", "finish_reason": "tool_calls",
                                  "tool_calls": [{"id": _ID, "name": "get_weather",
                                                  "arguments": '{"city": "Paris", "days": 3}'}]},
    # The call's JSON is complete; text after it inside the tags is dropped.
    "hermes/extra_after_json": {"content": None, "finish_reason": "tool_calls", "tool_calls": [
        {"id": _ID, "name": "get_time", "arguments": "{}"}]},
}


def describe(case: Case) -> dict[str, Any]:
    return {"id": case.id, "output": case.output}
