"""/v1/completions with several prompts: vLLM's choice order, summed usage, stream == non-stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from router.cluster import ClusterOptions, LocalCluster

PROMPTS = ["The router keeps a prefix index so that", "Engines report their KV cache as",
           "A third prompt, about detokenization, says"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(ClusterOptions(engines=3, sim={"step_time": 0.002})) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Any:
    return OpenAI(base_url=f"{cluster.base_url}/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(cluster: LocalCluster) -> str:
    return str(cluster.state.models.registry.names()[0])


def _single(client: Any, model: str, prompt: Any, **kw: Any) -> Any:
    return client.completions.create(model=model, prompt=prompt, **kw)


def test_choices_follow_vllms_prompt_major_order(client: Any, model: str) -> None:
    kw: dict[str, Any] = {"max_tokens": 12, "seed": 7, "n": 2}
    multi = _single(client, model, PROMPTS, **kw)
    assert [c.index for c in multi.choices] == list(range(6))
    singles = [_single(client, model, p, **kw) for p in PROMPTS]
    for p, single in enumerate(singles):
        for j in range(2):
            got = multi.choices[p * 2 + j]
            want = single.choices[j]
            assert (got.text, got.finish_reason) == (want.text, want.finish_reason)
    assert multi.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert multi.usage.completion_tokens == 6 * 12
    assert multi.usage.total_tokens == multi.usage.prompt_tokens + 72
    assert multi.id.startswith("cmpl-") and not multi.id.endswith("-0")


def test_stream_equals_non_stream(client: Any, model: str) -> None:
    kw: dict[str, Any] = {"max_tokens": 10, "seed": 3, "n": 2, "logprobs": 2}
    full = _single(client, model, PROMPTS, **kw)
    texts = [""] * 6
    tokens: list[list[str]] = [[] for _ in range(6)]
    finish: list[str | None] = [None] * 6
    ids = set()
    usage = None
    for chunk in _single(client, model, PROMPTS, stream=True,
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


def test_echo_and_token_id_prompts(client: Any, model: str, cluster: LocalCluster) -> None:
    tok = cluster.state.models.registry.get(None).tokenizer
    id_prompts = [tok.encode(p, add_special_tokens=False).ids for p in PROMPTS[:2]]
    out = _single(client, model, id_prompts, max_tokens=4, seed=1, echo=True)
    assert len(out.choices) == 2
    for p, c in zip(PROMPTS[:2], out.choices, strict=True):
        assert c.text.startswith(p) and len(c.text) > len(p)


def test_a_bad_prompt_fails_the_whole_request_and_nothing_runs(
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
