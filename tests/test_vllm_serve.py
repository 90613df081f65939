"""The session's `vllm serve` is up as an oracle and as an ordinary pod with the token-in API."""

from __future__ import annotations

import httpx
import pytest

from tests.vllm_serve import SERVED_NAME, VllmServe

pytestmark = [pytest.mark.vllm]


def test_serve_lists_the_model_and_its_kv_event_sources(vllm_serve: VllmServe) -> None:
    with httpx.Client(base_url=vllm_serve.base_url, timeout=60) as http:
        models = http.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == [SERVED_NAME]
        sources = http.get("/kv_event_sources").json()
        assert sources["0"]["endpoint"] == vllm_serve.kv_endpoint
        assert sources["0"]["replay_endpoint"] == vllm_serve.kv_replay_endpoint


def test_serve_answers_token_in_generate(vllm_serve: VllmServe) -> None:
    body = {"token_ids": [1, 2, 3, 4],
            "sampling_params": {"max_tokens": 3, "temperature": 0, "ignore_eos": True}}
    with httpx.Client(base_url=vllm_serve.base_url, timeout=60) as http:
        answer = http.post("/inference/v1/generate", json=body).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 3
