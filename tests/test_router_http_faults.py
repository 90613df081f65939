"""Pods killed (SIGKILL) under the HTTP transport behave as a ZMQ engine's death does
(tests/test_router_faults.py): a request with no token yet is retried on another pod, a stream
under way ends with an error event, nothing hangs, and the dead pod is taken out of routing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Limits
from router.link.engine_state import EngineStatus
from tests.openai_clients import OpenAIClient
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"


def _chat(user: str, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": user}],
            "max_tokens": max_tokens, **kw}


@pytest.fixture
def pods() -> Iterator[LocalCluster]:
    # engine_dead_after is long: a cut stream must end because the connection broke, not
    # because a silence deadline ran out.
    opts = ClusterOptions(engines=2, processes=True, transport="http",
                          sim={"step_time": 0.02}, limits=Limits(engine_dead_after=60.0))
    with LocalCluster(opts) as c:
        yield c


@pytest.mark.slow
def test_pod_killed_mid_stream(pods: LocalCluster, openai_client: OpenAIClient) -> None:
    client = openai_client(pods.base_url, timeout=30)
    # Not resumed on the other pod (test_a_pod_killed_mid_stream_resumes_on_another): the
    # error event stays.
    with client.chat.completions.with_streaming_response.create(
            **_chat("long one", 2000), stream=True,
            extra_body={"vllm_xargs": {"kvroute_resume": False}}) as resp:
        victim = resp.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
        chunks = resp.parse()
        next(chunks)
        pods.kill_engine(victim)
        # The error event inside the stream, sent as the pod's connection broke: not the
        # client's read timeout (a hang would end in APITimeoutError).
        with pytest.raises(openai.APIError, match="connection closed") as failed:
            for _ in chunks:
                pass
        assert not isinstance(failed.value, openai.APITimeoutError)
    st = pods.state
    eventually(lambda: st.client.engines[victim].status is EngineStatus.DEAD)
    survivor = next(n for n in pods.names if n != victim)
    for i in range(6):
        raw = client.chat.completions.with_raw_response.create(**_chat(f"after {i}", 4))
        assert raw.parse().choices[0].finish_reason == "length"
        assert survivor in raw.headers["x-kvroute-route"]
    with httpx.Client(base_url=pods.base_url) as http:
        metrics = http.get("/metrics").text
    assert f'kvroute_engine_healthy{{engine="{victim}"}} 0.0' in metrics
    assert sum(e.num_in_flight for e in st.client.engines.values()) == 0


@pytest.mark.slow
def test_no_token_request_is_retried_on_another_pod(pods: LocalCluster,
                                                     openai_client: OpenAIClient) -> None:
    victim = pods.names[0]
    st = pods.state
    pods.kill_engine(victim)
    # Until its monitor notices, the router still takes the dead pod for ready: prompts placed
    # there fail to connect before any token and are retried on the other pod.
    client = openai_client(pods.base_url, timeout=30)
    for i in range(4):
        chat = client.chat.completions.create(**_chat(f"retry me {i}", 4))
        assert chat.choices[0].finish_reason == "length"
    eventually(lambda: victim not in st.dispatcher.healthy())
    eventually(lambda: st.client.engines[victim].status is EngineStatus.DEAD)
    with httpx.Client(base_url=pods.base_url) as http:
        r = http.post("/v1/chat/completions", json=_chat("after the death", 4))
        assert r.status_code == 200 and pods.names[1] in r.headers["x-kvroute-route"]


@pytest.mark.slow
def test_a_pod_killed_mid_stream_resumes_on_another(pods: LocalCluster) -> None:
    """Resuming sits above the transport: a pod's stream goes on on the other pod, one answer."""
    with httpx.Client(base_url=pods.base_url, timeout=60) as http, http.stream(
            "POST", "/v1/chat/completions",
            json=_chat("long one", 200, stream=True, temperature=0)) as r:
        victim = r.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        pods.kill_engine(victim)
        events = [line for line in lines if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert "error" not in events[-2], events[-2]
        assert '"finish_reason":"length"' in events[-2]
        metrics = http.get("/metrics").text
    assert 'kvroute_resumes_total{outcome="resumed"} 1.0' in metrics
