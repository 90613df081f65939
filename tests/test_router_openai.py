"""The unmodified openai client through kvroute on sim engines: text, stops, stream parity,
several prompts per completions request."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from devtools.cluster import ClusterOptions, LocalCluster
from render.models import __file__ as _models_init
from router.config import Frontend
from serving.server import ROUTER_SERVER

SYSTEM = "You are a terse assistant that answers in one sentence. " * 6


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """On the default HTTP server; every other one passes tests/test_server_conformance.py."""
    opts = ClusterOptions(engines=3, sim={"step_time": 0.002}, http_server=ROUTER_SERVER,
                          frontend=Frontend(enable_prompt_tokens_details=True))
    with LocalCluster(opts) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Any]:
    with OpenAI(base_url=f"{cluster.base_url}/v1", api_key="x", max_retries=0,
                timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def model(cluster: LocalCluster) -> str:
    return str(cluster.state.models.registry.names()[0])


@pytest.fixture(scope="module")
def tokenizer(cluster: LocalCluster) -> Any:
    return cluster.state.models.registry.get(None).tokenizer


def _messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _engine_tokens(cluster: LocalCluster, body: dict[str, Any]) -> list[int]:
    """The same request rendered, then sent token-in/token-out: the engine's own token ids."""
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        gen = http.post("/v1/chat/completions/render", json=body).json()
        out = http.post("/inference/v1/generate", json=gen)
        assert out.status_code == 200, out.text
        return list(out.json()["choices"][0]["token_ids"])


def test_chat_text_is_the_detokenized_engine_tokens(
    cluster: LocalCluster, client: Any, model: str, tokenizer: Any
) -> None:
    body = {"model": model, "messages": _messages("Tell me about caches."), "max_tokens": 40,
            "seed": 11}
    chat = client.chat.completions.create(**body)
    ids = _engine_tokens(cluster, body)
    assert len(ids) == 40 == chat.usage.completion_tokens
    assert chat.choices[0].message.content == tokenizer.decode(ids, skip_special_tokens=True)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens > 60


def test_completion_text_and_logprobs(client: Any, model: str, tokenizer: Any) -> None:
    comp = client.completions.create(model=model, prompt="Routing by prefix", max_tokens=16,
                                     seed=5, logprobs=3, extra_body={"return_token_ids": True})
    choice = comp.choices[0]
    ids = choice.token_ids  # vLLM's extension field, kept by the openai client as extra
    assert choice.text == tokenizer.decode(ids, skip_special_tokens=True)
    assert len(choice.logprobs.tokens) == 16
    assert all(len(top) >= 1 for top in choice.logprobs.top_logprobs)


def test_stop_string_cuts_where_it_should(client: Any, model: str) -> None:
    base = {"model": model, "messages": _messages("Stop test."), "max_tokens": 40, "seed": 3}
    full = client.chat.completions.create(**base).choices[0].message.content
    stop = full[len(full) // 2: len(full) // 2 + 4]
    assert stop.strip(), "need a visible stop string"
    cut = client.chat.completions.create(**base, stop=[stop])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**base, stop=[stop], stream=True)
        if c.choices
    )
    assert streamed == full[: full.index(stop)]


def test_stream_equals_non_stream(client: Any, model: str) -> None:
    body = {"model": model, "messages": _messages("Same seed twice."), "max_tokens": 32,
            "seed": 7}
    whole = client.chat.completions.create(**body)
    chunks = list(client.chat.completions.create(**body, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text == whole.choices[0].message.content
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_n_choices_fan_out(client: Any, model: str) -> None:
    chat = client.chat.completions.create(model=model, messages=_messages("n=3"), n=3,
                                          max_tokens=8, seed=1)
    texts = [c.message.content for c in sorted(chat.choices, key=lambda c: c.index)]
    assert len(texts) == 3 and len(set(texts)) == 3  # seeds seed+i, as vLLM's ParentRequest
    assert chat.usage.completion_tokens == 24
    streamed: dict[int, str] = {}
    for c in client.chat.completions.create(model=model, messages=_messages("n=3"), n=3,
                                            max_tokens=8, seed=1, stream=True):
        for ch in c.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + (ch.delta.content or "")
    assert [streamed[i] for i in range(3)] == texts


def test_shared_prefix_goes_to_the_holder_and_hits_on_the_engine(
    cluster: LocalCluster, client: Any, model: str
) -> None:
    system = "Shared-prefix tenant 42 with a long policy document. " * 12
    engines = []
    cached = []
    for i in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model=model, max_tokens=4, seed=i,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": f"question {i}"}])
        engines.append(raw.headers["x-kvroute-route"].split(";")[0])
        cached.append(raw.parse().usage.prompt_tokens_details.cached_tokens)
    assert len(set(engines)) == 1, engines
    assert cached[0] == 0 and all(c >= 128 for c in cached[1:]), cached  # engine-reported


def test_load_imbalance_spills_to_other_engines(client: Any, model: str) -> None:
    system = "Hot tenant 7: everyone shares this long preamble before asking. " * 20
    body = {"model": model, "max_tokens": 48,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "warm up"}]}
    home = client.chat.completions.with_raw_response.create(**body).headers["x-kvroute-route"]
    home_engine = home.split(";")[0]

    def one(i: int) -> tuple[str, str]:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": f"q{i}"}]
        raw = client.chat.completions.with_raw_response.create(**{**body, "messages": msgs})
        engine, _, reason = (p.strip() for p in raw.headers["x-kvroute-route"].split(";"))
        return engine, reason

    with ThreadPoolExecutor(24) as pool:
        routes = list(pool.map(one, range(24)))
    per_engine = Counter(engine for engine, _ in routes)
    # The prefix holder takes the most, but queued work on it makes others cheaper.
    assert per_engine[home_engine] == max(per_engine.values()), per_engine
    assert len(per_engine) >= 2, per_engine
    # The first to leave the holder is a spill; later ones hit the new copies of the prefix.
    assert Counter(r for _, r in routes)["reason=spill"] >= 1


def test_tools_are_rendered_into_the_prompt(cluster: LocalCluster, client: Any,
                                            model: str) -> None:
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = _messages("Weather in Paris?")
    plain = client.chat.completions.create(model=model, messages=msgs, max_tokens=2)
    # tool_choice "none": this router reads no calls (no --enable-auto-tool-choice).
    with_tools = client.chat.completions.create(model=model, messages=msgs, max_tokens=2,
                                                tools=tools, tool_choice="none")
    with httpx.Client(base_url=cluster.base_url) as http:
        rendered = http.post("/v1/chat/completions/render", json={
            "model": model, "messages": msgs, "tools": tools, "tool_choice": "none"}).json()
    assert with_tools.usage.prompt_tokens == len(rendered["token_ids"])
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20
    # Tools alone mean tool_choice "auto", which needs the flags, as `vllm serve` says.
    with pytest.raises(openai.BadRequestError, match='"auto" tool choice requires '
                       "--enable-auto-tool-choice and --tool-call-parser to be set"):
        client.chat.completions.create(model=model, messages=msgs, max_tokens=2, tools=tools)


def test_duplicate_request_ids_in_flight_are_a_4xx(cluster: LocalCluster) -> None:
    body = {"request_id": "same-id", "token_ids": list(range(1000, 1100)),
            "sampling_params": {"max_tokens": 400, "ignore_eos": True}}
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http, \
            httpx.Client(base_url=cluster.base_url, timeout=60) as other:
        with http.stream("POST", "/inference/v1/generate", json={**body, "stream": True}) as first:
            lines = first.iter_lines()
            assert next(lines).startswith("data: ")  # its first token is out: it is in flight
            dup = other.post("/inference/v1/generate", json=body)
            assert dup.status_code == 400, dup.text
            assert dup.json()["error"]["param"] == "request_id"
            assert first.status_code == 200
            assert "[DONE]" in "".join(lines)  # the first one runs to its end regardless


def test_models_tokenize_health_ready_metrics(cluster: LocalCluster, client: Any,
                                              model: str) -> None:
    assert [m.id for m in client.models.list().data] == [model]
    with httpx.Client(base_url=cluster.base_url) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/ready").status_code == 200
        tok = http.post("/tokenize", json={"model": model, "prompt": "hi there"}).json()
        assert tok["count"] == len(tok["tokens"]) > 0
        r = http.get("/v1/models", headers={"x-request-id": "abc-123"})
        assert r.headers["x-request-id"] == "abc-123"
        metrics = http.get("/metrics").text
    assert "kvroute_routing_decisions_total" in metrics
    assert 'kvroute_engine_healthy{engine="engine-0"} 1.0' in metrics
    assert "kvroute_time_to_first_token_seconds_bucket" in metrics


def test_bad_inputs_are_openai_4xx(cluster: LocalCluster, model: str) -> None:
    with httpx.Client(base_url=cluster.base_url) as http:
        cases = [
            http.post("/v1/chat/completions", content=b"{not json"),
            http.post("/v1/chat/completions", json={"model": model, "messages": []}),
            http.post("/v1/chat/completions", json={"model": "nope", "messages": _messages("x")}),
            http.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": -1}),
            http.post("/inference/v1/generate", json={"token_ids": [-1],
                                                      "sampling_params": {}}),
            http.post("/inference/v1/generate", json={"token_ids": [1],
                                                      "sampling_params": {"n": "x"}}),
            http.post("/inference/v1/generate", json={"request_id": "", "token_ids": [0],
                                                      "sampling_params": {"n": 0}}),
            http.post("/inference/v1/generate", json={"request_id": "t", "token_ids": [5],
                                                      "sampling_params": {"top_p": 0}}),
            http.post("/inference/v1/abort_requests", json={"ids": []}),
        ]
    for r in cases:
        assert 400 <= r.status_code < 500, (r.status_code, r.text)
        assert set(r.json()["error"]) >= {"message", "type", "code"}


# Sampling values vLLM's SamplingParams refuses, each reaching the one shared check
# (render/sampling_checks.py) from both paths: render's OpenAI mapping and the token-in body.
SAMPLING_REFUSED = [
    {"temperature": 3.0}, {"temperature": -0.5}, {"top_p": 0.0}, {"top_p": 1.5},
    {"presence_penalty": 5.0}, {"frequency_penalty": -2.5}, {"repetition_penalty": 0.0},
    {"min_p": 2.0}, {"stop": ["ok", ""]}, {"bad_words": [""]},
    {"max_tokens": 5, "min_tokens": 10}, {"temperature": 0.0, "n": 2},
]


@pytest.mark.parametrize("fields", SAMPLING_REFUSED)
def test_bad_sampling_is_the_same_400_on_render_and_token_in(
        cluster: LocalCluster, model: str, fields: dict[str, Any]) -> None:
    with httpx.Client(base_url=cluster.base_url) as http:
        rendered = http.post("/v1/chat/completions/render",
                             json={"model": model, "messages": _messages("x"), **fields})
        token_in = http.post("/inference/v1/generate",
                             json={"request_id": "bad-sampling", "model": model, "token_ids": [5],
                                   "sampling_params": fields})
    assert (rendered.status_code, token_in.status_code) == (400, 400), (rendered.text,
                                                                       token_in.text)
    a, b = rendered.json()["error"], token_in.json()["error"]
    assert a["message"] == b["message"] and a["type"] == b["type"], (a, b)
    # The param names the field where it sits in each body (vLLM names none for some).
    if a["param"] is None:
        assert b["param"] is None, (a, b)
    else:
        assert b["param"] == f"sampling_params.{a['param']}" and a["param"] in fields, (a, b)


# Keeps the import of the embedded model package meaningful for readers: the tests run on it.
assert _models_init


# --- /v1/completions with several prompts (router/front/multi_prompt.py) ---

MULTI_PROMPTS = ["The router keeps a prefix index so that", "Engines report their KV cache as",
           "A third prompt, about detokenization, says"]


def _single(client: Any, model: str, prompt: Any, **kw: Any) -> Any:
    return client.completions.create(model=model, prompt=prompt, **kw)


def test_multi_prompt_choices_follow_vllms_prompt_major_order(client: Any, model: str) -> None:
    kw: dict[str, Any] = {"max_tokens": 12, "seed": 7, "n": 2}
    multi = _single(client, model, MULTI_PROMPTS, **kw)
    assert [c.index for c in multi.choices] == list(range(6))
    singles = [_single(client, model, p, **kw) for p in MULTI_PROMPTS]
    for p, single in enumerate(singles):
        for j in range(2):
            got = multi.choices[p * 2 + j]
            want = single.choices[j]
            assert (got.text, got.finish_reason) == (want.text, want.finish_reason)
    assert multi.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert multi.usage.completion_tokens == 6 * 12
    assert multi.usage.total_tokens == multi.usage.prompt_tokens + 72
    assert multi.id.startswith("cmpl-") and not multi.id.endswith("-0")


def test_multi_prompt_stream_equals_non_stream(client: Any, model: str) -> None:
    kw: dict[str, Any] = {"max_tokens": 10, "seed": 3, "n": 2, "logprobs": 2}
    full = _single(client, model, MULTI_PROMPTS, **kw)
    texts = [""] * 6
    tokens: list[list[str]] = [[] for _ in range(6)]
    finish: list[str | None] = [None] * 6
    ids = set()
    usage = None
    for chunk in _single(client, model, MULTI_PROMPTS, stream=True,
                         stream_options={"include_usage": True}, **kw):
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] += c.text
            tokens[c.index] += c.logprobs.tokens if c.logprobs else []
            finish[c.index] = c.finish_reason or finish[c.index]
    assert len(ids) == 1  # every chunk carries the response's id, not a prompt's
    assert texts == [c.text for c in full.choices]
    assert tokens == [c.logprobs.tokens for c in full.choices]
    assert finish == [c.finish_reason for c in full.choices]
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        full.usage.prompt_tokens, full.usage.completion_tokens)


def test_multi_prompt_echo_and_token_id_prompts(
    client: Any, model: str, cluster: LocalCluster
) -> None:
    tok = cluster.state.models.registry.get(None).tokenizer
    id_prompts = [tok.encode(p, add_special_tokens=False).ids for p in MULTI_PROMPTS[:2]]
    out = _single(client, model, id_prompts, max_tokens=4, seed=1, echo=True)
    assert len(out.choices) == 2
    for p, c in zip(MULTI_PROMPTS[:2], out.choices, strict=True):
        assert c.text.startswith(p) and len(c.text) > len(p)


def test_multi_prompt_a_bad_prompt_fails_the_whole_request(
    cluster: LocalCluster, model: str
) -> None:
    long = list(range(100, 100 + cluster.state.models.registry.get(None).max_model_len + 1))
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        r = http.post("/v1/completions",
                      json={"model": model, "prompt": [[1, 2, 3], long], "max_tokens": 4})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "BadRequestError"
        # nothing of the request stays in flight
        assert cluster.state.active == {}
        ok = http.post("/v1/completions",
                       json={"model": model, "prompt": [[1, 2, 3], [4, 5, 6]], "max_tokens": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
