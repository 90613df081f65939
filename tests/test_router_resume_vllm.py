"""A stream resumed on another engine continues a real model's greedy answer exactly.

The session's one real `vllm serve` (tiny random-weight Qwen3) is linked twice, as two HTTP
engines ``p1`` and ``p2`` (no second vLLM process: one per session is the budget). The engine a
stream runs on is removed mid-stream with no drain time, which ends its link as a death does
(``EngineUnavailableError``); the stream goes on on the other engine as its prompt plus the
tokens sent, and the client's text equals what `vllm serve` itself answers to the same request.
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
from tests.engines import MAX_MODEL_LEN, TINY_MODEL
from tests.vllm_serve import SERVED_NAME, VllmServe

pytestmark = [pytest.mark.vllm]

ADMIN = {"authorization": "Bearer adm"}
BODY = {"model": SERVED_NAME, "prompt": "The lighthouse keeper wrote in his log that",
        "max_tokens": 450, "temperature": 0, "ignore_eos": True}


@contextmanager
def _router(vllm_serve: VllmServe) -> Iterator[LocalCluster]:
    pods = tuple(EngineSpec(name, url=vllm_serve.base_url) for name in ("p1", "p2"))
    opts = ClusterOptions(external=pods, model=str(TINY_MODEL), served_model_name=SERVED_NAME,
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


def test_a_resumed_greedy_stream_equals_vllm_serve_s_answer(vllm_serve: VllmServe) -> None:
    want = httpx.post(f"{vllm_serve.base_url}/v1/completions", json=BODY,
                      timeout=120).json()["choices"][0]["text"]
    # The cut must land while the engine still generates: a tiny model on a busy box may have
    # sent its whole answer to the router first (nothing to resume then), so that try is
    # repeated on a new router.
    for _ in range(3):
        with _router(vllm_serve) as router, \
                httpx.Client(base_url=router.base_url, timeout=120) as http:
            with http.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
                assert r.status_code == 200
                engine = r.headers["x-kvroute-route"].split(";")[0].removeprefix("engine=")
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                removed = http.delete(f"/admin/engines/{engine}", headers=ADMIN)
                assert removed.status_code == 200 and removed.json()["cut"] == 1, removed.text
                rest = [line for line in lines if line.startswith("data: ")]
            events = [json.loads(line[6:]) for line in [first, *rest] if line != "data: [DONE]"]
            assert rest[-1] == "data: [DONE]"
            assert not [e for e in events if "error" in e], events[-1]
            assert _text(events) == want
            if _resumed(http) == 1.0:
                return
    pytest.fail("in 3 tries the engine had always finished before it was cut")
