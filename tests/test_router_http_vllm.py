"""The router in front of the session's real `vllm serve` over the HTTP transport.

With the official ``openai`` client: chat and completions, streamed and not, greedy answers
equal to the same requests sent to that `vllm serve` directly; on a shared prefix the pod
reports cache hits (its prefix-cache metrics) and the router's index has heard the pod's own KV
events (found through its /kv_event_sources); a client that disconnects has its request
aborted on the pod (the pod's metrics: its running count drops to zero long before the request
could have finished).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import EngineSpec
from router.link.http_state import parse_block_size, parse_load
from tests.engines import MAX_MODEL_LEN, TINY_MODEL
from tests.openai_clients import OpenAIClient
from tests.vllm_serve import SERVED_NAME, VllmServe
from tests.waits import eventually

pytestmark = [pytest.mark.vllm]

# Past two of the CPU build's 128-token blocks, within the 512-token context; new to the pod
# (a prefix it caches already announces nothing).
SHARED = uuid.uuid4().hex + " " + " ".join(f"w{i}" for i in range(90))


@pytest.fixture(scope="module")
def router(vllm_serve: VllmServe) -> Iterator[LocalCluster]:
    opts = ClusterOptions(external=(EngineSpec("pod", url=vllm_serve.base_url),),
                          model=str(TINY_MODEL), served_model_name=SERVED_NAME,
                          router_max_model_len=MAX_MODEL_LEN, ready_timeout=120.0)
    with LocalCluster(opts) as c:
        yield c


def _clients(make: OpenAIClient, router: LocalCluster,
             pod: VllmServe) -> tuple[openai.OpenAI, openai.OpenAI]:
    via = make(router.base_url, timeout=120)
    direct = make(pod.base_url, timeout=120)
    return via, direct


def _chat(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": SERVED_NAME, "messages": [{"role": "user", "content": content}],
            "max_tokens": 12, "temperature": 0, **kw}


def test_greedy_chat_equals_vllm_serve(router: LocalCluster, vllm_serve: VllmServe,
                                       openai_client: OpenAIClient) -> None:
    via, direct = _clients(openai_client, router, vllm_serve)
    body = _chat("Name three colours of the sea.")
    want = direct.chat.completions.create(**body)
    got = via.chat.completions.create(**body)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].finish_reason == want.choices[0].finish_reason
    assert got.usage is not None and want.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
        want.usage.prompt_tokens, want.usage.completion_tokens)
    streamed = via.chat.completions.create(**body, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == want.choices[0].message.content


def test_greedy_completions_equal_vllm_serve(router: LocalCluster, vllm_serve: VllmServe,
                                             openai_client: OpenAIClient) -> None:
    via, direct = _clients(openai_client, router, vllm_serve)
    body: dict[str, Any] = {"model": SERVED_NAME, "prompt": "The harbour at dawn",
                            "max_tokens": 10, "temperature": 0, "logprobs": 2}
    want = direct.completions.create(**body)
    got = via.completions.create(**body)
    assert got.choices[0].text == want.choices[0].text
    assert got.choices[0].finish_reason == want.choices[0].finish_reason
    w_lp, g_lp = want.choices[0].logprobs, got.choices[0].logprobs
    assert w_lp is not None and g_lp is not None
    assert g_lp.tokens == w_lp.tokens
    assert g_lp.token_logprobs == pytest.approx(w_lp.token_logprobs, abs=1e-4)
    assert [sorted(t) for t in g_lp.top_logprobs or []] == [
        sorted(t) for t in w_lp.top_logprobs or []]
    streamed = via.completions.create(**body, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want.choices[0].text


def test_shared_prefix_hits_the_pods_cache_and_the_index_heard_it(
        router: LocalCluster, vllm_serve: VllmServe, openai_client: OpenAIClient) -> None:
    via, _ = _clients(openai_client, router, vllm_serve)
    st = router.state
    before = st.kv.counters("pod").batches
    via.completions.create(model=SERVED_NAME, prompt=SHARED + " first", max_tokens=2)
    # The pod's BlockStored events (on the endpoint its /kv_event_sources names) reached the
    # router's index, which learned the pod's block size from them.
    eventually(lambda: st.kv.counters("pod").batches > before
               and st.index.engines().get("pod") == 128, timeout=30)
    hits_before = _pod_metric(vllm_serve, "vllm:prefix_cache_hits_total{")
    raw = via.completions.with_raw_response.create(model=SERVED_NAME,
                                                   prompt=SHARED + " second", max_tokens=2)
    assert "prefix_hit" in raw.headers["x-kvroute-route"]
    assert raw.parse().choices[0].finish_reason == "length"
    # The pod reports the prompt's first full blocks served from its cache.
    eventually(lambda: _pod_metric(vllm_serve, "vllm:prefix_cache_hits_total{")
               - hits_before >= 128, timeout=30)


def _pod_metric(pod: VllmServe, prefix: str) -> float:
    body = httpx.get(f"{pod.base_url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(prefix))


def _pod_load(pod: VllmServe) -> tuple[int, float]:
    """The pod's running requests and the tokens it generated so far."""
    body = httpx.get(f"{pod.base_url}/metrics", timeout=30).content
    generated = sum(float(line.rsplit(b" ", 1)[1]) for line in body.splitlines()
                    if line.startswith(b"vllm:generation_tokens_total{"))
    return parse_load(body, 0.0).running, generated


def test_client_disconnect_aborts_on_the_pod(router: LocalCluster,
                                             vllm_serve: VllmServe) -> None:
    _, generated_before = _pod_load(vllm_serve)
    max_tokens = 400
    with httpx.Client(base_url=router.base_url, timeout=120) as http:
        body = {"model": SERVED_NAME, "prompt": "Count on and on:", "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for _ in range(3):
                next(lines)
            assert router.state.client.engines["pod"].num_in_flight == 1
    # The pod stops generating: nothing runs any more, and it generated far fewer tokens than
    # the request asked for.
    eventually(lambda: _pod_load(vllm_serve)[0] == 0, timeout=30)
    eventually(lambda: not router.state.client.engines["pod"].in_flight)
    _, generated_after = _pod_load(vllm_serve)
    assert generated_after - generated_before < max_tokens


def test_the_pods_block_size_is_read_at_join(router: LocalCluster,
                                             vllm_serve: VllmServe) -> None:
    """vLLM's /metrics names its KV block size (vllm:cache_config_info), and the router's index
    has it for the pod: routes are noted before the pod's first KV event."""
    metrics = httpx.get(f"{vllm_serve.base_url}/metrics", timeout=30).content
    size = parse_block_size(metrics)
    assert size == 128  # the CPU build's block size
    assert router.state.index.engines()["pod"] == size
