"""What a client of `vllm serve` expects from the router, on simulated engines (the real-vLLM
referee of the same is tests/test_parity_vllm.py): echoes, prompt ids/text/logprobs, logprob
spellings, usage switches, stream_interval, beam search, response ids, refusals as vLLM makes
them, the context taken from the engines, and an engine's refusal leaving no predicted blocks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from radix import namespace_for
from render.protocol import ChatCompletionRequest
from router.config import Frontend
from router.front.answer_spec import check_json, header_priority, session_id
from serving.errors import InvalidJSONError

SIM_CONTEXT = 256
HI = [{"role": "user", "content": "Hello there, how are you?"}]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One sim engine; the router's context comes from the engine's ready response."""
    opts = ClusterOptions(engines=1, sim={"step_time": 0.002, "max_model_len": SIM_CONTEXT},
                          context_from_engines=True)
    with LocalCluster(opts) as c:
        yield c


@pytest.fixture(scope="module")
def http(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as client:
        yield client


def _chat(http: httpx.Client, **fields: Any) -> httpx.Response:
    return http.post("/v1/chat/completions",
                     json={"messages": HI, "max_tokens": 4, "temperature": 0, **fields})


def _cmpl(http: httpx.Client, **fields: Any) -> httpx.Response:
    return http.post("/v1/completions",
                     json={"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0,
                           **fields})


def _events(resp: httpx.Response) -> list[Any]:
    assert resp.status_code == 200, resp.text
    data = [line[len("data: "):] for line in resp.text.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_the_context_is_the_engines(cluster: LocalCluster, http: httpx.Client) -> None:
    """No --max-model-len: the engine's ready response sets what render admits."""
    assert http.post("/tokenize", json={"prompt": "x"}).json()["max_model_len"] == SIM_CONTEXT
    resp = _chat(http, messages=[{"role": "user", "content": " hello" * (SIM_CONTEXT + 10)}])
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "input_tokens" and err["message"].startswith(
        f"This model's maximum context length is {SIM_CONTEXT} tokens. However, your prompt "
        f"contains at least {SIM_CONTEXT + 1} input tokens")
    # A budget past the room left stops at the context's end (vLLM 0.32), not a 400.
    ids = list(range(1000, 1000 + SIM_CONTEXT - 3))
    body = _cmpl(http, prompt=ids, max_tokens=50, ignore_eos=True).json()
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["finish_reason"] == "length"


def test_engine_refusals_in_a_stream_come_after_its_200(http: httpx.Client) -> None:
    """What vLLM's input processor refuses: a 400, and for a stream an error event after the
    200 (vLLM's stream has started by then)."""
    for fields in ({"logprobs": True, "top_logprobs": 21}, {"logit_bias": {"999999": 1}},
                   {"allowed_token_ids": [999999]}, {"thinking_token_budget": 4}):
        plain = _chat(http, **fields)
        assert plain.status_code == 400, fields
        streamed = _events(_chat(http, stream=True, **fields))
        assert streamed == [plain.json()], fields
    err = _chat(http, logit_bias={"999999": 1}).json()["error"]
    assert err == {"message": "token_id(s) [999999] in logit_bias contain out-of-vocab token ids. "
                              "Vocabulary size: 151936 (parameter=logit_bias, value=[999999])",
                   "type": "BadRequestError", "param": "logit_bias", "code": 400}


def test_refusals_before_a_stream_are_400s(http: httpx.Client) -> None:
    resp = _chat(http, stream=True, prompt_logprobs=1)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == (
        "`prompt_logprobs` are not available when `stream=True`. (parameter=prompt_logprobs)")
    resp = http.post("/v1/chat/completions", content=json.dumps({"messages": HI}),
                     headers={"content-type": "text/plain"})
    assert resp.status_code == 400 and resp.json()["error"] == {
        "message": "1 validation error:\n  Unsupported Media Type: Only 'application/json' is "
                   "allowed", "type": "Bad Request", "param": None, "code": 400}


def test_x_request_id_is_the_answers_id(http: httpx.Client) -> None:
    headers = {"x-request-id": "abc-1"}
    chat = http.post("/v1/chat/completions", headers=headers,
                     json={"messages": HI, "max_tokens": 2}).json()
    assert chat["id"] == "chatcmpl-abc-1"
    cmpl = http.post("/v1/completions", headers=headers,
                     json={"prompt": ["a", "b"], "max_tokens": 2}).json()
    assert cmpl["id"] == "cmpl-abc-1" and len(cmpl["choices"]) == 2


def test_echo(http: httpx.Client) -> None:
    """Chat echoes the last message when it is the answer's role; completions the prompt, with
    its logprobs ahead of the completion's, or the prompt alone with max_tokens 0."""
    messages = [*HI, {"role": "assistant", "content": "I am"}]
    fields = {"messages": messages, "echo": True, "add_generation_prompt": False,
              "continue_final_message": True}
    chat = _chat(http, **fields).json()["choices"][0]["message"]["content"]
    assert chat.startswith("I am") and len(chat) > len("I am")
    events = _events(_chat(http, stream=True, **fields))
    assert [e["choices"][0]["delta"].get("content") for e in events[:2]] == ["", "I am"]
    body = _cmpl(http, echo=True, logprobs=1).json()["choices"][0]
    lp = body["logprobs"]
    assert body["text"].startswith("The quick brown fox")
    assert lp["tokens"][:4] == ["The", " quick", " brown", " fox"] and len(lp["tokens"]) == 8
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][:5] == [0, 3, 9, 15, 19]
    only = _cmpl(http, echo=True, max_tokens=0).json()
    assert only["choices"][0]["text"] == "The quick brown fox"
    assert only["usage"]["completion_tokens"] == 1  # generated, not shown (vLLM's count)


def test_prompt_logprobs_ids_and_text(http: httpx.Client) -> None:
    chat = _chat(http, prompt_logprobs=2, return_token_ids=True, return_prompt_text=True).json()
    ids = chat["prompt_token_ids"]
    plp = chat["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    first = plp[1]
    assert next(iter(first)) == str(ids[1]) and 2 <= len(first) <= 3
    assert set(next(iter(first.values()))) == {"logprob", "rank", "decoded_token"}
    assert chat["prompt_text"].startswith("<|im_start|>user\nHello there")
    events = _events(_chat(http, stream=True, return_token_ids=True))
    assert events[0]["prompt_token_ids"] == ids and "prompt_token_ids" not in events[1]
    cmpl = _cmpl(http, prompt_logprobs=0, return_token_ids=True).json()["choices"][0]
    assert cmpl["prompt_token_ids"] and len(cmpl["prompt_logprobs"]) == len(
        cmpl["prompt_token_ids"])


def test_logprob_spellings(http: httpx.Client) -> None:
    content = _chat(http, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True
                    ).json()["choices"][0]["logprobs"]["content"]
    assert all(c["token"].startswith("token_id:") for c in content)
    top = content[0]["top_logprobs"][0]
    assert list(top["token"].encode()) == top["bytes"]
    every = _chat(http, logprobs=True, logprob_token_ids=[11, 13]
                  ).json()["choices"][0]["logprobs"]["content"]
    assert all(len(c["top_logprobs"]) == 3 for c in every)  # the sampled token and the two
    cmpl = _cmpl(http, logprobs=2, logprob_token_ids=[11, 13]).json()["choices"][0]["logprobs"]
    assert all(set(d) >= {",", "."} for d in cmpl["top_logprobs"])


def test_stream_interval_merges_chunks(http: httpx.Client) -> None:
    events = _events(_cmpl(http, stream=True, stream_interval=2, max_tokens=6, ignore_eos=True,
                           return_token_ids=True))
    assert [len(e["choices"][0]["token_ids"]) for e in events] == [1, 2, 2, 1]


def test_beam_search(http: httpx.Client) -> None:
    body = _chat(http, use_beam_search=True, n=2, max_tokens=3).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6
    events = _events(_chat(http, use_beam_search=True, n=2, max_tokens=3, stream=True))
    texts = {e["choices"][0]["index"]: e["choices"][0]["delta"]["content"]
             for e in events if e["choices"][0].get("finish_reason")}
    assert texts == {c["index"]: c["message"]["content"] for c in body["choices"]}
    assert _cmpl(http, use_beam_search=True, stream=True).status_code == 400
    # Each step asks 2 x width logprobs of an engine: within --max-logprobs (20), as vLLM.
    wide = _chat(http, use_beam_search=True, n=11, max_tokens=2)
    assert wide.status_code == 400 and wide.json()["error"]["message"].startswith(
        "Requested sample logprobs of 22, which is greater than max allowed: 20")
    assert _events(_chat(http, use_beam_search=True, n=11, stream=True)) == [wide.json()]


def test_an_engine_refusal_leaves_no_predicted_blocks() -> None:
    """The engine refuses a prompt the router admitted (its context is smaller than the one the
    router was given): a 400 with the engine's words, and none of its blocks predicted."""
    opts = ClusterOptions(engines=1, sim={"max_model_len": 128, "block_size": 16},
                          router_max_model_len=1024)
    prompt = list(range(2000, 2300))
    with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=30) as http:
        resp = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert resp.status_code == 400 and "max_model_len is 128" in resp.json()["error"]["message"]

        async def predicted() -> int:
            match = c.state.index.match(prompt, namespace_for(None, None), 0.0)
            return max(m.optimistic_tokens for m in match.values())

        assert c.call(predicted) == 0


def test_usage_switches() -> None:
    """vLLM's defaults: no prompt_tokens_details, a usage chunk only when asked; the flags turn
    them on, and return_tokens_as_token_ids becomes every request's default."""
    frontend = Frontend(enable_prompt_tokens_details=True, enable_force_include_usage=True,
                        return_tokens_as_token_ids=True)
    opts = ClusterOptions(engines=1, frontend=frontend)
    with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=30) as http:
        body = _chat(http, logprobs=True).json()
        assert "cached_tokens" in body["usage"]["prompt_tokens_details"]
        assert body["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:")
        events = _events(_chat(http, stream=True))
        assert events[-1]["choices"] == [] and "usage" in events[-1]
        assert all("usage" in e for e in events)  # forced usage is continuous too (vLLM)


def test_usage_has_no_details_by_default(http: httpx.Client) -> None:
    assert "prompt_tokens_details" not in _chat(http).json()["usage"]
    assert "usage" not in _events(_chat(http, stream=True))[-1]


def test_what_vllm_reads_from_headers() -> None:
    """The session id the engine requests carry: the request's, else x-session-id, else
    vllm_xargs' (vLLM's order); x-vllm-priority an integer or nothing; a JSON content type
    with or without its parameters."""
    def req(**fields: Any) -> ChatCompletionRequest:
        return ChatCompletionRequest(messages=[], **fields)

    header = [(b"x-session-id", b"from-header")]
    assert session_id(req(session_id="s1", vllm_xargs={"session_id": "x"}), header) == "s1"
    assert session_id(req(vllm_xargs={"session_id": "x"}), header) == "from-header"
    assert session_id(req(vllm_xargs={"session_id": "x"}), []) == "x"
    assert session_id(req(vllm_xargs={"session_id": 5}), []) is None
    assert header_priority([(b"x-vllm-priority", b"-3")]) == -3
    assert header_priority([(b"x-vllm-priority", b"high")]) is None
    check_json([(b"content-type", b"Application/JSON; charset=utf-8")])
    for headers in ([], [(b"content-type", b"text/plain")], [(b"content-type", b"json")]):
        with pytest.raises(InvalidJSONError):
            check_json(headers)
