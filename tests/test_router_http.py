"""The router over the HTTP transport, in front of simulated engines behind their HTTP faces.

The same answers as over ZMQ (the output pipeline is shared), KV events found through each
pod's /kv_event_sources feeding the index, cached tokens the pod reports, its load scraped from
/metrics, aborts reaching the pod, its 4xx answered as the client's 4xx, and a fleet mixing
both transports.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Control, Frontend
from router.link.http_state import HttpEngineState
from tests.openai_clients import OpenAIClient
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
LONG = "Tell me about the ocean and the ships that sail on it. " * 8


def _chat(user: str, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": user}],
            "max_tokens": max_tokens, **kw}


ADMIN = "admin-key"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # Answers show the engines' cached tokens (vLLM's --enable-prompt-tokens-details).
    opts = ClusterOptions(engines=2, transport="http", sim={"step_time": 0.005},
                          control=Control(admin_key=ADMIN),
                          frontend=Frontend(enable_prompt_tokens_details=True))
    with LocalCluster(opts) as c:
        yield c


def _engine(route: str) -> str:
    return route.split(";")[0].removeprefix("engine=")


def test_pods_are_linked_over_http(cluster: LocalCluster) -> None:
    st = cluster.state
    for name, url in cluster.urls.items():
        eng = st.client.engines[name]
        assert isinstance(eng, HttpEngineState) and eng.spec.url == url
        assert st.client.endpoint(name) == url
    # Their KV feeds come from /kv_event_sources: subscribed without any KV config.
    assert set(st.fleet.subscribed) == set(cluster.names)
    eventually(lambda: all(e.fresh_load is not None for e in st.client.engines.values()))


def test_chat_and_completions_stream_and_not(cluster: LocalCluster,
                                             openai_client: OpenAIClient) -> None:
    client = openai_client(cluster.base_url)
    chat = client.chat.completions.create(**_chat("Hello there!", 12, temperature=0))
    text = chat.choices[0].message.content or ""
    assert chat.choices[0].finish_reason == "length" and "Hello there!" in text
    streamed = client.chat.completions.create(**_chat("Hello there!", 12, temperature=0),
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text
    done = client.completions.create(model=MODEL, prompt="one two three", max_tokens=5,
                                     logprobs=2, temperature=0)
    lp = done.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None and len(lp.tokens or []) == 5
    assert all(1 <= len(top) <= 3 for top in lp.top_logprobs)


def test_stop_strings_are_the_routers(cluster: LocalCluster,
                                      openai_client: OpenAIClient) -> None:
    """The pod never sees a stop string: the router ends the choice and aborts the pod."""
    client = openai_client(cluster.base_url)
    full = client.chat.completions.create(**_chat("alpha beta gamma", 30, temperature=0))
    text = full.choices[0].message.content or ""
    stop = "gamma"
    assert stop in text
    cut = client.chat.completions.create(**_chat("alpha beta gamma", 30, temperature=0,
                                                 stop=[stop]))
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]
    st = cluster.state
    eventually(lambda: all(not e.in_flight for e in st.client.engines.values()))


def test_shared_prefix_is_routed_to_its_pod_and_reported_cached(
        cluster: LocalCluster, openai_client: OpenAIClient) -> None:
    client = openai_client(cluster.base_url)
    first = client.chat.completions.with_raw_response.create(**_chat(LONG + "first", 4))
    engine = _engine(first.headers["x-kvroute-route"])
    st = cluster.state
    # The pod's BlockStored events reached the router's index (its block size learned).
    eventually(lambda: st.index.engines().get(engine) is not None
               and st.kv.counters(engine).batches > 0)
    second = client.chat.completions.with_raw_response.create(**_chat(LONG + "second", 4))
    assert _engine(second.headers["x-kvroute-route"]) == engine
    assert "prefix_hit" in second.headers["x-kvroute-route"]
    usage = second.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) > 0


def test_token_in_generate(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        ok = http.post("/inference/v1/generate", json={
            "request_id": "gen-1", "token_ids": [1, 2, 3],
            "sampling_params": {"max_tokens": 3, "temperature": 0, "logprobs": 1}})
        assert ok.status_code == 200, ok.text
        choice = ok.json()["choices"][0]
        assert len(choice["token_ids"]) == 3 and len(choice["logprobs"]["content"]) == 3
    st = cluster.state
    assert all(not e.in_flight for e in st.client.engines.values())


def test_client_disconnect_aborts_on_the_pod(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions",
                         json=_chat("disconnect me", 4000, stream=True)) as resp:
            engine = _engine(resp.headers["x-kvroute-route"])
            sched = cluster.threads[engine].engine.scheduler
            lines = resp.iter_lines()
            next(lines)
            assert sched.requests  # running on the pod
    eventually(lambda: not sched.requests)  # the pod aborted it
    eventually(lambda: not cluster.state.client.engines[engine].in_flight)


def test_a_pod_joins_and_leaves_at_run_time(cluster: LocalCluster) -> None:
    cluster.start_engine("engine-9")  # a third sim behind its HTTP face
    url = cluster.urls["engine-9"]
    auth = {"authorization": f"Bearer {ADMIN}"}
    st = cluster.state
    with httpx.Client(base_url=cluster.base_url, timeout=30, headers=auth) as http:
        bad = http.post("/admin/engines", json={"name": "x", "url": "http://10.9.9.9:1"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "url"
        joined = http.post("/admin/engines", json={"name": "engine-9", "url": url})
        assert joined.status_code == 200 and joined.json() == {"name": "engine-9", "url": url}
        eventually(lambda: "engine-9" in st.fleet.attached)
        listed = {e["name"]: e for e in http.get("/admin/engines").json()["engines"]}
        assert listed["engine-9"]["url"] == url and listed["engine-9"]["status"] == "ready"
        gone = http.delete("/admin/engines/engine-9")
        assert gone.status_code == 200 and gone.json()["removed"]
    assert "engine-9" not in st.client.engines and "engine-9" not in st.fleet.subscribed


def test_pod_refusing_a_request_is_the_clients_error() -> None:
    """A router admitting longer prompts than its pods: the pod's 400 reaches the client."""
    opts = ClusterOptions(engines=1, transport="http", sim={"max_model_len": 256},
                          router_max_model_len=4096)
    with LocalCluster(opts) as c, httpx.Client(base_url=c.base_url, timeout=30) as http:
        r = http.post("/v1/chat/completions", json=_chat("word " * 400, 4))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "BadRequestError"
        r = http.post("/v1/chat/completions", json=_chat("word " * 400, 4, stream=True))
        assert r.status_code == 400, r.text
        assert c.state.client.engines["engine-0"].counters.refused >= 1
        assert http.post("/v1/chat/completions", json=_chat("short", 4)).status_code == 200


def test_a_fleet_mixing_zmq_and_http_engines(openai_client: OpenAIClient) -> None:
    opts = ClusterOptions(engines=2, transport="mixed", sim={"step_time": 0.005})
    with LocalCluster(opts) as c:
        st = c.state
        assert not st.client.engines["engine-0"].spec.is_http
        assert st.client.engines["engine-1"].spec.is_http
        client = openai_client(c.base_url)
        seen = set()
        for i in range(8):
            raw = client.chat.completions.with_raw_response.create(
                **_chat(f"{i} " + "distinct prompt " * 20, 3))
            assert raw.parse().choices[0].finish_reason == "length"
            seen.add(_engine(raw.headers["x-kvroute-route"]))
        assert seen == {"engine-0", "engine-1"}
