"""Streamed requests are counted as they ended: 200 completed, the error's status for a stream
ended by an error event (and kvroute_stream_errors), 499 only when the client left."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Control
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
ADMIN = {"authorization": "Bearer admin-secret"}




def samples(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = http.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def requests(http: httpx.Client, status: str, endpoint: str = "/v1/completions") -> float:
    key = ("kvroute_requests_total", (("endpoint", endpoint), ("status", status)))
    return samples(http).get(key, 0.0)


def stream_errors(http: httpx.Client) -> float:
    return samples(http).get(("kvroute_stream_errors_total", ()), 0.0)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    opts = ClusterOptions(engines=2, sim={"step_time": 0.01},
                          control=Control(admin_key="admin-secret", remove_drain_timeout=0.0))
    with LocalCluster(opts) as c:
        yield c


def _stream(max_tokens: int) -> dict[str, object]:
    return {"model": MODEL, "prompt": "count me", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}


def test_completed_streams_count_200(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        for _ in range(3):
            r = http.post("/v1/completions", json=_stream(5))
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
            chat = http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3, "stream": True})
            assert chat.status_code == 200
        # A stream is counted as its answer ends, which may be after the client read [DONE].
        eventually(lambda: requests(http, "200") == 3)
        eventually(lambda: requests(http, "200", "/v1/chat/completions") == 3)
        assert requests(http, "499") == 0
        assert requests(http, "499", "/v1/chat/completions") == 0
        assert stream_errors(http) == 0


def test_a_stream_ended_by_an_error_event_counts_its_error(cluster: LocalCluster) -> None:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        # Not resumed on the other engine (router/routing/resume.py): its error event stays.
        no_resume = {**_stream(2000), "vllm_xargs": {"kvroute_resume": False}}
        with http.stream("POST", "/v1/completions", json=no_resume) as stream:
            assert stream.status_code == 200
            engine = stream.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
            lines = stream.iter_lines()
            assert next(line for line in lines if line).startswith("data: {")
            # Removed with no drain time: the stream under way ends with an error event.
            removed = http.delete(f"/admin/engines/{engine}", headers=ADMIN)
            assert removed.status_code == 200 and removed.json()["cut"] == 1
            events = [line for line in lines if line]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["code"] == 503
        eventually(lambda: stream_errors(http) == 1)
        assert requests(http, "503") == 1
        assert requests(http, "499") == 0 and requests(http, "200") == 0


def test_only_a_client_that_left_counts_499(cluster: LocalCluster) -> None:
    state = cluster.state
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=_stream(2000)) as stream:
            assert stream.status_code == 200
            next(line for line in stream.iter_lines() if line)
        # The connection is closed: the router notices, aborts, and counts the departure.
        eventually(lambda: not state.active)
        eventually(lambda: requests(http, "499") == 1)
        assert http.post("/v1/completions", json=_stream(3)).status_code == 200
        eventually(lambda: requests(http, "200") == 1)
        assert requests(http, "499") == 1 and stream_errors(http) == 0
