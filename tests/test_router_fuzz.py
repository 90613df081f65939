"""Fuzzing the router's public endpoints with hypothesis: any input gets a 2xx or an OpenAI 4xx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.cluster import ClusterOptions, LocalCluster

MODEL = "Qwen/Qwen3-0.6B"

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
small_tokens = st.one_of(st.integers(1, 8), json_values)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "bogus"]),
     "content": st.one_of(st.text(max_size=40), json_values)}), max_size=3)
sampling = {
    "max_tokens": small_tokens, "temperature": json_values, "top_p": json_values,
    "n": st.one_of(st.integers(-1, 3), json_values), "stop": json_values, "seed": json_values,
    "stream": st.booleans(), "logprobs": json_values, "top_logprobs": json_values,
    "stream_options": json_values, "model": st.sampled_from([MODEL, "other", None]),
}

chat_bodies = st.fixed_dictionaries({"messages": messages}, optional=sampling)
completion_bodies = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(max_size=30), st.lists(st.integers(-5, 200_000), max_size=5),
                         json_values)}, optional=sampling)
generate_bodies = st.fixed_dictionaries(
    {"token_ids": st.one_of(st.lists(st.integers(-5, 200_000), max_size=5), json_values),
     "sampling_params": st.one_of(st.fixed_dictionaries({}, optional={
         "max_tokens": small_tokens, "n": st.integers(-1, 3), "stop": json_values,
         "logprobs": json_values, "seed": json_values}), json_values)},
    optional={"stream": st.booleans(), "model": st.sampled_from([MODEL, "other"]),
              "request_id": st.text(max_size=10), "output_mode": json_values})


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with LocalCluster(ClusterOptions(engines=2, sim={"step_time": 0.001})) as c:
        with httpx.Client(base_url=c.base_url, timeout=60) as client:
            yield client


def _check(resp: httpx.Response) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if resp.status_code >= 400:
        err = msgspec.json.decode(resp.content)["error"]
        assert err["code"] == resp.status_code and err["message"]


FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(body=chat_bodies)
def test_chat_fuzz(http: httpx.Client, body: dict[str, Any]) -> None:
    _check(http.post("/v1/chat/completions", json=body))


@FUZZ
@given(body=completion_bodies)
def test_completion_fuzz(http: httpx.Client, body: dict[str, Any]) -> None:
    _check(http.post("/v1/completions", json=body))


@FUZZ
@given(body=generate_bodies)
def test_generate_fuzz(http: httpx.Client, body: dict[str, Any]) -> None:
    _check(http.post("/inference/v1/generate", json=body))


@FUZZ
@given(raw=st.binary(max_size=64), path=st.sampled_from(
    ["/v1/chat/completions", "/v1/completions", "/inference/v1/generate",
     "/inference/v1/abort_requests", "/tokenize", "/detokenize", "/admin/engines"]))
def test_raw_bytes_fuzz(http: httpx.Client, raw: bytes, path: str) -> None:
    _check(http.post(path, content=raw))
