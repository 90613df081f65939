"""Streams that survive their engine's death: the request goes on on another engine inside the
same answer. Greedy answers equal the same request's answer on a healthy fleet, with no error
event; a request or a deployment can turn it off.

The simulated engines run the ``markov`` output (each token a hash of the tokens before it, as a
real model's greedy choice is a function of the sequence so far), the same "model" on both; the
silence deadline is far off, so the dropped connection is what ends a stream's first leg.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Limits, StreamLimits
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
GREEDY = {"model": MODEL, "prompt": "Tell me a story about a lighthouse", "max_tokens": 120,
          "temperature": 0}
SIM = {"step_time": 0.02, "output": "markov"}
LIMITS = Limits(engine_dead_after=600.0)


def _cluster(streams: StreamLimits | None = None) -> LocalCluster:
    return LocalCluster(ClusterOptions(engines=2, processes=True, sim=SIM, limits=LIMITS,
                                       streams=streams or StreamLimits()))


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with _cluster() as c:
        yield c


def _metric(http: httpx.Client, name: str, label: str = "") -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in http.get("/metrics").text.splitlines()
               if line.startswith(name) and label in line)


def _events(lines: Iterator[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _text(events: list[dict[str, Any]], index: int = 0) -> str:
    return "".join(c["text"] for e in events for c in e.get("choices", [])
                   if c["index"] == index)


def _stream_killing(cluster: LocalCluster, http: httpx.Client, body: dict[str, Any],
                    after: int = 5) -> tuple[list[dict[str, Any]], str]:
    """Stream ``body``; after ``after`` events kill the engine serving it; the whole stream."""
    with http.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                      "stream_options": {"include_usage": True}}
                     ) as r:
        assert r.status_code == 200
        victim = r.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
        lines = r.iter_lines()
        events = []
        while len(events) < after:
            events += _events(iter([next(lines)]))
        cluster.kill_engine(victim)
        events += _events(lines)
    return events, victim


def test_a_greedy_stream_goes_on_on_another_engine_exactly(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        events, victim = _stream_killing(cluster, http, GREEDY)
        assert not [e for e in events if "error" in e], events[-2:]
        finish = [c["finish_reason"] for e in events for c in e.get("choices", [])
                  if c["finish_reason"]]
        assert finish == ["length"]
        usage = events[-1]["usage"]
        assert usage["completion_tokens"] == GREEDY["max_tokens"]
        # The same request, unbroken, on the healthy engine left: the same text, byte for byte.
        healthy = http.post("/v1/completions", json=GREEDY).json()
        assert _text(events) == healthy["choices"][0]["text"]
        assert usage["prompt_tokens"] == healthy["usage"]["prompt_tokens"]
        assert _metric(http, "kvroute_resumes_total", 'outcome="resumed"') == 1
        assert _metric(http, "kvroute_resumed_tokens_total") > usage["prompt_tokens"]
        assert _metric(http, "kvroute_stream_errors_total") == 0
        # Both are counted as their answers end, which may be after the client read them.
        eventually(lambda: _metric(http, "kvroute_requests_total", 'status="200"') == 2)
        # The dead engine's slot was given back, the survivor's too once the answer ended.
        assert _metric(http, "kvroute_in_flight") == 0
        assert victim not in cluster.state.dispatcher.healthy()


def test_stop_strings_span_the_seam(cluster: LocalCluster) -> None:
    """Stop-string state lives in the answer's pipeline: a stop string that appears after the
    seam ends the resumed answer where it ends the unbroken one."""
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        whole = http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"]
        words = whole.split()
        stop = max(words[len(words) // 2:], key=whole.find)  # first seen late in the answer
        body = {**GREEDY, "stop": [stop]}
        expected = http.post("/v1/completions", json=body).json()["choices"][0]
        assert expected["finish_reason"] == "stop" and len(expected["text"]) > len(whole) // 3
        events, _ = _stream_killing(cluster, http, body)
        assert not [e for e in events if "error" in e]
        assert _text(events) == expected["text"]
        assert _metric(http, "kvroute_resumes_total", 'outcome="resumed"') == 1


def test_a_collected_answer_resumes_alike(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        whole = http.post("/v1/completions", json=GREEDY).json()
        answer: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: answer.update(
            http.post("/v1/completions", json=GREEDY).json()))
        worker.start()
        state = cluster.state
        engines = state.client.engines
        before = {n: e.counters.tokens for n, e in engines.items()}
        # Some tokens out (a failure before the first token is a retry, not a resume).
        eventually(lambda: any(e.num_in_flight and e.counters.tokens > before[n] + 5
                               for n, e in engines.items()))
        busy = next(n for n, e in state.client.engines.items() if e.num_in_flight)
        cluster.kill_engine(busy)
        worker.join(60)
        assert answer["choices"] == whole["choices"], answer
        assert answer["usage"] == whole["usage"]
        assert _metric(http, "kvroute_resumes_total", 'outcome="resumed"') == 1


def test_n_choices_each_resume_and_seeded_sampling_goes_on(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        body = {**GREEDY, "n": 2, "temperature": 1.0, "seed": 7}
        events, _ = _stream_killing(cluster, http, body, after=6)
        assert not [e for e in events if "error" in e]
        finish = sorted(c["finish_reason"] for e in events for c in e.get("choices", [])
                        if c["finish_reason"])
        assert finish == ["length", "length"]
        assert events[-1]["usage"]["completion_tokens"] == 2 * GREEDY["max_tokens"]
        assert _metric(http, "kvroute_resumes_total", 'outcome="resumed"') == 2


@pytest.mark.parametrize("off", ["request", "deployment"])
def test_resume_can_be_turned_off(off: str) -> None:
    streams = StreamLimits(resume=off == "request")  # the request turns it off itself
    body = dict(GREEDY)
    if off == "request":
        body["vllm_xargs"] = {"kvroute_resume": False}
    with _cluster(streams) as cluster, httpx.Client(base_url=cluster.base_url,
                                                    timeout=60) as http:
        events, _ = _stream_killing(cluster, http, body)
        assert "its connection dropped" in events[-1]["error"]["message"]
        assert _metric(http, "kvroute_resumes_total") == 0
        assert _metric(http, "kvroute_stream_errors_total") == 1


def test_with_no_engine_left_the_stream_ends_with_the_engine_s_error() -> None:
    opts = ClusterOptions(engines=1, processes=True, sim=SIM, limits=LIMITS)
    with LocalCluster(opts) as cluster, httpx.Client(base_url=cluster.base_url,
                                                     timeout=60) as http:
        events, _ = _stream_killing(cluster, http, GREEDY)
        assert "its connection dropped" in events[-1]["error"]["message"]
        assert _metric(http, "kvroute_resumes_total", 'outcome="failed"') == 1
