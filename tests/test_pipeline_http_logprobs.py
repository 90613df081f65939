"""Chat logprobs (written as raw JSON by the pipeline) through HTTP to the unmodified openai client,
streamed and not, on a sim engine: the client parses them, and both modes agree."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI

from devtools.cluster import ClusterOptions, LocalCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(ClusterOptions(engines=1, sim={"step_time": 0.002})) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Any]:
    with OpenAI(base_url=f"{cluster.base_url}/v1", api_key="x", max_retries=0,
                timeout=60) as c:
        yield c


@pytest.mark.parametrize("top", [0, 5])
def test_chat_logprobs_stream_equals_non_stream(cluster: LocalCluster, client: Any,
                                                top: int) -> None:
    model = str(cluster.state.models.registry.names()[0])
    body: dict[str, Any] = {
        "model": model, "max_tokens": 24, "seed": 7, "logprobs": True, "top_logprobs": top,
        "messages": [{"role": "user", "content": "Write about 日本語 text and emoji 🎉."}]}
    full = client.chat.completions.create(**body)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens == 24
    text = full.choices[0].message.content
    # vLLM's token strings add up to the text; the raw bytes to its exact UTF-8.
    assert "".join(e.token for e in content) == text
    assert b"".join(bytes(e.bytes) for e in content) == text.encode()
    for e in content:
        # The sim's top-k may repeat the sampled token, which then appears once: <= top.
        assert e.logprob <= 0.0 and (top == 0) == (not e.top_logprobs)
        assert len(e.top_logprobs) <= top
        if top:
            assert e.top_logprobs[0].token == e.token  # the sampled token comes first

    streamed = []
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed += c.logprobs.content
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
