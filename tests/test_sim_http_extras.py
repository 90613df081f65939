"""The sim face's further `vllm serve` routes and what bench/compare.py reads from it: render and
tokenize (the tokens the engine computes), /reset_prefix_cache, the true-cache read
/sim/prefix_cache/match, vLLM's queue-time and TTFT histograms on /metrics; and a router over HTTP
sending max_tokens equal to SamplingParams' default (16) to the pod.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
LONG = "The harbour master logs every ship that enters and leaves the port. " * 12


def _chat(user: str, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": user}],
            "max_tokens": max_tokens, "temperature": 0, **kw}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    opts = ClusterOptions(engines=1, transport="http", sim={"step_time": 0.002})
    with LocalCluster(opts) as c:
        yield c


@pytest.fixture(scope="module")
def pod(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=next(iter(cluster.urls.values())), timeout=30) as c:
        yield c


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m is not None, name
    return float(m.group(1))


def test_render_and_tokenize_give_the_tokens_the_engine_computes(pod: httpx.Client) -> None:
    rendered = pod.post("/v1/chat/completions/render", json=_chat(LONG, 4)).json()
    tokens = rendered["token_ids"]
    assert len(tokens) > 100 and rendered["sampling_params"]["temperature"] == 0
    counted = pod.post("/tokenize", json={"model": MODEL, "messages": [
        {"role": "user", "content": LONG}]}).json()
    assert counted["tokens"] == tokens and counted["count"] == len(tokens)
    completion = pod.post("/v1/completions/render",
                          json={"model": MODEL, "prompt": "hello", "max_tokens": 2}).json()
    assert isinstance(completion, list) and completion[0]["token_ids"]
    assert pod.post("/v1/chat/completions/render",
                    json={**_chat("x", 1), "model": "nope"}).status_code == 404


def test_match_reset_and_histograms(pod: httpx.Client) -> None:
    tokens = pod.post("/v1/chat/completions/render", json=_chat(LONG, 2)).json()["token_ids"]
    before = pod.get("/metrics").text
    assert pod.post("/reset_prefix_cache").json() == {"success": True}
    assert pod.post("/sim/prefix_cache/match",
                    json={"prompt_token_ids": tokens}).json() == {"cached_tokens": 0}
    assert pod.post("/v1/chat/completions", json=_chat(LONG, 2)).status_code == 200
    cached = pod.post("/sim/prefix_cache/match", json={"prompt_token_ids": tokens}).json()
    # Full blocks only, and never the last prompt token (vLLM recomputes it).
    assert cached["cached_tokens"] == (len(tokens) - 1) // 16 * 16 > 0
    salted = pod.post("/sim/prefix_cache/match",
                      json={"prompt_token_ids": tokens, "cache_salt": "other"}).json()
    assert salted == {"cached_tokens": 0}
    after = pod.get("/metrics").text
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:request_queue_time_seconds_count"):
        assert _metric(after, name) == _metric(before, name) + 1
    assert _metric(after, "vllm:time_to_first_token_seconds_sum") > _metric(
        before, "vllm:time_to_first_token_seconds_sum")
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",model_name="' in after
    assert _metric(after, "vllm:prefix_cache_hits_total") == _metric(
        before, "vllm:prefix_cache_hits_total")  # the cache was emptied first
    assert pod.post("/reset_prefix_cache").json() == {"success": True}
    assert pod.post("/sim/prefix_cache/match",
                    json={"prompt_token_ids": tokens}).json() == {"cached_tokens": 0}


def test_router_over_http_sends_a_default_valued_max_tokens(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        for n in (16, 15):
            body = http.post("/v1/chat/completions", json=_chat("Hello!", n)).json()
            assert body["usage"]["completion_tokens"] == n
            assert body["choices"][0]["finish_reason"] == "length"
    eventually(lambda: cluster.state.dispatcher.healthy() != [])
