"""Hostile request fields against a real router on sim engines (and a render service): each gets
its documented 400 naming the limit, and the router stays healthy after it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from render.protocol import MAX_JSON_DEPTH
from render.sampling_checks import MAX_LOGPROB_TOKEN_IDS
from router.config import Limits
from serving.guard import MAX_REQUEST_ID
from tests.render_proc import render_server

MSGS = [{"role": "user", "content": "Say something."}]
OUTPUT_ENTRIES = 10_000  # above the model's context: a request naming no max_tokens passes


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    # Tighter caps than the defaults, to show they are the configured ones.
    limits = Limits(max_n=8, max_logprobs=5, max_output_entries=OUTPUT_ENTRIES)
    with LocalCluster(ClusterOptions(engines=2, sim={"step_time": 0.001}, limits=limits)) as c:
        yield c


@pytest.fixture(scope="module")
def http(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def model(cluster: LocalCluster) -> str:
    return str(cluster.state.models.registry.names()[0])


def _refused(resp: httpx.Response, *words: str, param: str | None = None) -> None:
    """A 400 in OpenAI's error format whose message holds ``words``."""
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    # BadRequestError from the checks; "Bad Request" (as vLLM's) for what fails decoding.
    assert err["type"] in ("BadRequestError", "Bad Request") and err["code"] == 400, err
    for word in words:
        assert word in err["message"], err
    if param is not None:
        assert err["param"] == param, err


def _healthy(http: httpx.Client, model: str) -> None:
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/chat/completions", json={"model": model, "messages": MSGS,
                                                  "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def _nested_bytes(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_top_logprobs_over_max_logprobs(http: httpx.Client, model: str) -> None:
    resp = http.post("/v1/chat/completions", json={
        "model": model, "messages": MSGS, "logprobs": True, "top_logprobs": 1_000_000,
        "n": 4, "max_tokens": 4})
    _refused(resp, "Requested sample logprobs of 1000000", "max allowed: 5", param="logprobs")
    resp = http.post("/v1/completions", json={"model": model, "prompt": "hi", "logprobs": 6})
    _refused(resp, "max allowed: 5", param="logprobs")
    # At the cap it is served.
    ok = http.post("/v1/completions", json={"model": model, "prompt": "hi", "logprobs": 5,
                                            "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    _healthy(http, model)


def test_logprob_token_ids_over_vllms_bound(http: httpx.Client, model: str) -> None:
    resp = http.post("/v1/chat/completions", json={
        "model": model, "messages": MSGS, "logprobs": True, "max_tokens": 2,
        "logprob_token_ids": list(range(MAX_LOGPROB_TOKEN_IDS + 1))})
    _refused(resp, f"logprob_token_ids of length {MAX_LOGPROB_TOKEN_IDS + 1}",
             f"max allowed: {MAX_LOGPROB_TOKEN_IDS}", param="logprob_token_ids")
    _healthy(http, model)


def test_output_entries_bounded(http: httpx.Client, model: str) -> None:
    """n x max_tokens x (logprobs + 1): each within its own cap, together over the product's."""
    resp = http.post("/v1/chat/completions", json={
        "model": model, "messages": MSGS, "n": 3, "temperature": 1.0, "max_tokens": 1000,
        "logprobs": True, "top_logprobs": 5})
    _refused(resp, "3 x 1000 x 6 = 18000 exceeds max_output_entries (10000)", param="n")
    resp = http.post("/v1/completions", json={"model": model, "prompt": "hi", "n": 8,
                                              "temperature": 1.0, "max_tokens": 1251})
    _refused(resp, "exceeds max_output_entries", param="n")
    _healthy(http, model)


def test_prompt_logprobs_over_max_logprobs(http: httpx.Client, model: str) -> None:
    resp = http.post("/v1/completions", json={"model": model, "prompt": "hi",
                                              "prompt_logprobs": -1})
    # vLLM counts -1 as the whole vocabulary.
    _refused(resp, "prompt logprobs of 151936", param="prompt_logprobs")
    _healthy(http, model)


def test_n_over_the_configured_max(http: httpx.Client, model: str) -> None:
    resp = http.post("/v1/chat/completions", json={"model": model, "messages": MSGS, "n": 9,
                                                    "temperature": 1.0, "max_tokens": 2})
    _refused(resp, "n must be at most 8", param="n")
    _healthy(http, model)


def test_token_in_path_checks_the_same_limits(http: httpx.Client, model: str) -> None:
    gen = http.post("/v1/chat/completions/render", json={"model": model, "messages": MSGS,
                                                          "max_tokens": 2}).json()
    gen["sampling_params"]["logprobs"] = 100
    resp = http.post("/inference/v1/generate", json=gen)
    _refused(resp, "max allowed: 5", param="sampling_params.logprobs")
    gen["sampling_params"]["logprobs"] = None
    gen["sampling_params"]["stop"] = ["s"] * 65
    resp = http.post("/inference/v1/generate", json=gen)
    _refused(resp, "at most 64 strings", param="sampling_params.stop")
    _healthy(http, model)


def test_stop_strings_bounded_in_count_and_bytes(
    cluster: LocalCluster, http: httpx.Client, model: str
) -> None:
    proc = psutil.Process()  # the router runs in this process (LocalCluster's thread)
    rss_before = proc.memory_info().rss
    # 97 KiB of stop string: the request that took 5 GB with a prefix table.
    resp = http.post("/v1/chat/completions", json={"model": model, "messages": MSGS,
                                                    "stop": "a" * 100_000, "max_tokens": 4})
    _refused(resp, "at most 16384 bytes", "max_stop_bytes", param="stop")
    resp = http.post("/v1/chat/completions", json={
        "model": model, "messages": MSGS, "stop": [f"s{i}" for i in range(65)]})
    _refused(resp, "at most 64 strings", "max_stop_strings", param="stop")
    # At the byte limit, one long stop string is served, with memory linear in its length.
    ok = http.post("/v1/chat/completions", json={"model": model, "messages": MSGS,
                                                  "stop": ["a" * 16383 + "b"], "max_tokens": 64})
    assert ok.status_code == 200, ok.text
    # A prefix table of that string alone would be ~134 MB; allow the test process slack.
    assert proc.memory_info().rss - rss_before < 100 * 2**20
    _healthy(http, model)


@pytest.mark.parametrize("where", ["chat_template_kwargs", "tool_parameters", "vllm_xargs"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_deep_json_is_refused(http: httpx.Client, model: str, where: str, depth: int) -> None:
    base = json.dumps({"model": model, "messages": MSGS, "max_tokens": 2}).encode()[:-1]
    inner = _nested_bytes(depth)
    if where == "chat_template_kwargs":
        body = base + b', "chat_template_kwargs": {"a": ' + inner + b"}}"
    elif where == "vllm_xargs":
        body = base + b', "vllm_xargs": {"a": ' + inner + b"}}"
    else:
        body = (base + b', "tools": [{"type": "function", "function": {"name": "f", '
                b'"parameters": {"type": "object", "properties": ' + inner + b"}}}]}")
    for path in ("/v1/chat/completions", "/v1/chat/completions/render"):
        resp = http.post(path, content=body, headers={"content-type": "application/json"})
        _refused(resp, f"deeper than {MAX_JSON_DEPTH} levels")
    _healthy(http, model)


def test_json_at_the_depth_limit_is_served(http: httpx.Client, model: str) -> None:
    resp = http.post("/v1/chat/completions", json={
        "model": model, "messages": MSGS, "max_tokens": 2,
        "chat_template_kwargs": {"a": _nested(MAX_JSON_DEPTH - 1)}})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("rid", [b"x" * (MAX_REQUEST_ID + 1), b"tab\there", b"caf\xc3\xa9",
                                 b"sp ace", b"esc\x1b[31mred", b"del\x7f"])
def test_unfit_request_id_is_refused(http: httpx.Client, model: str, rid: bytes) -> None:
    for path, body in (("/v1/chat/completions", {"model": model, "messages": MSGS,
                                                 "max_tokens": 2}),
                       ("/v1/chat/completions/render", {"model": model, "messages": MSGS})):
        resp = http.post(path, json=body, headers=[(b"x-request-id", rid)])
        assert resp.status_code == 400, resp.text
        assert resp.headers.get("x-request-id", "").encode() != rid  # never echoed
        if any(c < 0x20 and c != 0x09 or c == 0x7F for c in rid):
            continue  # control bytes but tab: the HTTP server (h11) refuses the header itself
        _refused(resp, "x-request-id must be", param="x-request-id")
        assert resp.headers["x-request-id"].startswith("req-")  # a fresh id instead
    _healthy(http, model)


def test_fit_request_id_is_echoed(http: httpx.Client, model: str) -> None:
    rid = "trace-" + "0123456789abcdef" * 31  # 502 visible characters
    resp = http.post("/v1/chat/completions", json={"model": model, "messages": MSGS,
                                                    "max_tokens": 2},
                     headers={"x-request-id": rid})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-request-id"] == rid


def test_render_service_refuses_the_same() -> None:
    with render_server("--max-logprobs", "3") as url, httpx.Client(base_url=url,
                                                                   timeout=60) as http:
        body = {"messages": MSGS, "chat_template_kwargs": {"a": _nested(200)}}
        _refused(http.post("/v1/chat/completions/render", json=body),
                 f"deeper than {MAX_JSON_DEPTH} levels")
        raw = b'{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": ' \
              b'{"a": ' + _nested_bytes(5000) + b"}}"
        _refused(http.post("/v1/chat/completions/render", content=raw,
                           headers={"content-type": "application/json"}),
                 f"deeper than {MAX_JSON_DEPTH} levels")
        _refused(http.post("/v1/completions/render", json={"prompt": "x", "logprobs": 4}),
                 "max allowed: 3", param="logprobs")
        _refused(http.post("/v1/completions/render", json={"prompt": "x", "stop": "s" * 20000}),
                 "max_stop_bytes", param="stop")
        assert http.get("/health").status_code == 200
        ok = http.post("/v1/completions/render", json={"prompt": "x", "logprobs": 3})
        assert ok.status_code == 200, ok.text
