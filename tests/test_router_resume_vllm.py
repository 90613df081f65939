"""A stream resumed on another engine continues a real model's greedy answer exactly.

Two real vLLM engines of the same tiny random-weight Qwen3, the session's two: its headless
engine over ZMQ (``vllm0``) and its `vllm serve` over HTTP (``pod``). The engine a stream runs on
is removed mid-stream with no drain time, which ends its link as a death does
(``EngineUnavailableError``); the stream goes on on the other engine as its prompt plus the
tokens sent, and the client's text equals what `vllm serve` itself answers to the same request.
The router places by round robin so that each engine in turn is the one cut: the seam is
between two different vLLM processes, both ways.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import Control, EngineSpec
from router.routing.policy import PolicyConfig
from tests.engines import MAX_MODEL_LEN, TINY_MODEL, EngineProc
from tests.vllm_serve import SERVED_NAME, VllmServe

pytestmark = [pytest.mark.vllm]

ADMIN = {"authorization": "Bearer adm"}
TRIES = 5
BODY = {"model": SERVED_NAME, "prompt": "The lighthouse keeper wrote in his log that",
        "max_tokens": 450, "temperature": 0, "ignore_eos": True}


@contextmanager
def _router(vllm_engine: EngineProc, vllm_serve: VllmServe) -> Iterator[LocalCluster]:
    e = vllm_engine
    assert e.ready is not None
    headless = e.linked(max_model_len=True)
    engines = (headless, EngineSpec("pod", url=vllm_serve.base_url))
    opts = ClusterOptions(external=engines, model=str(TINY_MODEL), served_model_name=SERVED_NAME,
                          policy=PolicyConfig(name="round_robin"),
                          router_max_model_len=MAX_MODEL_LEN, ready_timeout=120.0,
                          control=Control(admin_key="adm", remove_drain_timeout=0.0))
    with LocalCluster(opts) as c:
        yield c


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(c["text"] for e in events for c in e.get("choices", []))


def _resumed(http: httpx.Client) -> float:
    found = [line for line in http.get("/metrics").text.splitlines()
             if line.startswith('kvroute_resumes_total{outcome="resumed"}')]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


# Round robin goes through the engines by name: "pod" first, then "vllm0".
@pytest.mark.parametrize("cut", ["pod", "vllm0"])
def test_a_resumed_greedy_stream_equals_vllm_serve_s_answer(vllm_engine: EngineProc,
                                                            vllm_serve: VllmServe,
                                                            cut: str) -> None:
    want = httpx.post(f"{vllm_serve.base_url}/v1/completions", json=BODY,
                      timeout=120).json()["choices"][0]["text"]
    # The cut must land while the engine still generates: a tiny model on a busy box may have
    # finished its answer before the removal (nothing cut) or sent all of it to the router first
    # (nothing to resume); the answer must be right either way, and the try is repeated on a
    # new router.
    for _ in range(TRIES):
        with _router(vllm_engine, vllm_serve) as router, \
                httpx.Client(base_url=router.base_url, timeout=120) as http:
            if cut == "vllm0":  # round robin's turn passes "pod"
                warm = http.post("/v1/completions", json={**BODY, "max_tokens": 1})
                assert warm.headers["x-kvroute-route"].startswith("engine=pod;")
            with http.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
                assert r.status_code == 200
                engine = r.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
                assert engine == cut
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                removed = http.delete(f"/admin/engines/{engine}", headers=ADMIN)
                assert removed.status_code == 200, removed.text
                rest = [line for line in lines if line.startswith("data: ")]
            events = [json.loads(line[6:]) for line in [first, *rest] if line != "data: [DONE]"]
            assert rest[-1] == "data: [DONE]"
            assert not [e for e in events if "error" in e], events[-1]
            assert _text(events) == want
            if removed.json()["cut"] == 1 and _resumed(http) == 1.0:
                return
    pytest.fail(f"in {TRIES} tries the engine had always finished before it was cut")
