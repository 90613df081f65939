"""The sim's HTTP face against the session's real `vllm serve`: the same requests to both.

Required equal: response shapes (the keys that carry a value, recursively, with their JSON types;
a key vLLM sends as null counts as absent), SSE framing (``data: {json}\\n\\n`` events closed by
``data: [DONE]``, one event per generated token), finish reasons, usage counts (cached tokens
as the session's server reports them), error statuses and error types, and
the KV-event flow (``/kv_event_sources`` naming the publisher, BlockStored events of the same
full blocks of a prompt, and the same cached tokens when it comes again). Token ids and text
differ: vLLM runs random weights, the sim echoes.

Left out of the shapes: ``weight_versions`` (vLLM's weight-update spans: not simulated) and
``system_fingerprint`` (vLLM's chat answers carry one; kvroute's output pipeline, which the face
shares with the router, has none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from tests.engines import MAX_MODEL_LEN, ROOT, TINY_MODEL
from tests.vllm_serve import SERVE_FLAGS, SERVED_NAME, VllmServe
from wire.engine import BlockStored, KVEventBatch

pytestmark = [pytest.mark.vllm]

IGNORED = frozenset({"weight_versions", "system_fingerprint"})
# The face reports cached tokens in usage as the session's `vllm serve` does (SERVE_FLAGS).
PROMPT_TOKENS_DETAILS = "--enable-prompt-tokens-details" in SERVE_FLAGS
BLOCK = 128  # the CPU build's block size; the sim is started with it


@dataclass
class Face:
    base_url: str
    kv_endpoint: str


@pytest.fixture(scope="module")
def sim_face(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Face]:
    """A sim engine behind its HTTP face only, configured as the session's vllm serve."""
    work = tmp_path_factory.mktemp("sim-face")
    kv = {"enable_kv_cache_events": True, "publisher": "zmq",
          "endpoint": f"ipc://{work}/kv", "replay_endpoint": f"ipc://{work}/kv-replay",
          "topic": "kv"}
    argv = [sys.executable, "-m", "kvroute.cli", "sim-engine", "--port", "0",
            "--model", str(TINY_MODEL), "--served-model-name", SERVED_NAME,
            "--max-model-len", str(MAX_MODEL_LEN), "--block-size", str(BLOCK),
            "--kv-events-config", json.dumps(kv)]
    if PROMPT_TOKENS_DETAILS:
        argv.append("--enable-prompt-tokens-details")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None
        url = None
        for raw in proc.stdout:  # the ready line (EOF if it exits first)
            line = raw.decode()
            if "HTTP face on " in line:
                url = line.rsplit(" ", 1)[1].strip()
                break
        assert url is not None, f"the sim exited ({proc.wait()})"
        yield Face(url, kv["endpoint"])
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def present(value: Any) -> Any:
    """``value`` without its null-valued keys, recursively."""
    if isinstance(value, dict):
        return {k: present(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [present(v) for v in value]
    return value


def shape(value: Any) -> Any:
    """The keys that carry a value, recursively, with JSON types (lists by their first item)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if v is not None and k not in IGNORED}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def events(body: bytes) -> list[Any]:
    """An SSE body's events, checking vLLM's framing: ``data: {json}`` events separated by a
    blank line, the last one ``[DONE]``."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    parts = body.split(b"\n\n")
    assert parts[-1] == b""
    out: list[Any] = []
    for part in parts[:-2]:
        assert part.startswith(b"data: "), part[:100]
        out.append(json.loads(part[6:]))
    return out


def _both(face: Face, pod: VllmServe, method: str, path: str,
          body: dict[str, Any] | None = None) -> tuple[httpx.Response, httpx.Response]:
    with httpx.Client(timeout=120) as http:
        return (http.request(method, pod.base_url + path, json=body),
                http.request(method, face.base_url + path, json=body))


PROMPT = list(range(1000, 1040))


def test_generate_answers_alike(sim_face: Face, vllm_serve: VllmServe) -> None:
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 5, "ignore_eos": True,
                                                       "temperature": 0}}
    want, got = _both(sim_face, vllm_serve, "POST", "/inference/v1/generate", body)
    assert want.status_code == got.status_code == 200
    w, g = want.json(), got.json()
    assert shape(g) == shape(w)
    assert g["choices"][0]["finish_reason"] == w["choices"][0]["finish_reason"] == "length"
    assert len(g["choices"][0]["token_ids"]) == len(w["choices"][0]["token_ids"]) == 5
    assert {k: g["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        k: w["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert g["request_id"].startswith("generate-tokens-")


def test_generate_streams_alike(sim_face: Face, vllm_serve: VllmServe) -> None:
    body = {"request_id": "fidelity-stream", "token_ids": PROMPT, "stream": True,
            "stream_options": {"include_usage": True},
            "sampling_params": {"max_tokens": 4, "ignore_eos": True, "logprobs": 2}}
    want, got = _both(sim_face, vllm_serve, "POST", "/inference/v1/generate", body)
    assert want.status_code == got.status_code == 200
    assert got.headers["content-type"] == want.headers["content-type"]
    w, g = events(want.content), events(got.content)
    assert len(g) == 5  # the sim: one event per token, then the usage event
    # vLLM's too, unless its API server lagged behind the engine: then the outputs that queued
    # for the request are merged into one event (on a fresh server's first requests here).
    assert 2 <= len(w) <= 5
    for e in (*w, *g):
        assert e["request_id"] == "generate-tokens-fidelity-stream"
    assert [shape(e) for e in (g[0], g[-2], g[-1])] == [shape(e) for e in (w[0], w[-2], w[-1])]
    assert [len(e["choices"][0]["token_ids"]) for e in g[:-1]] == [1, 1, 1, 1]
    assert sum(len(e["choices"][0]["token_ids"]) for e in w[:-1]) == 4
    assert [e["choices"][0]["finish_reason"] for e in g[:-1]] == [None, None, None, "length"]
    assert [e["choices"][0]["finish_reason"] for e in w[:-1]] == [None] * (len(w) - 2) + ["length"]
    assert present(g[-1]["usage"]) == present(w[-1]["usage"])  # counts and cached tokens


def test_chat_and_completions_answer_alike(sim_face: Face, vllm_serve: VllmServe) -> None:
    chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 4, "ignore_eos": True}
    cmpl = {"model": SERVED_NAME, "prompt": "Hello there", "max_tokens": 4, "ignore_eos": True}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", cmpl)):
        want, got = _both(sim_face, vllm_serve, "POST", path, body)
        assert want.status_code == got.status_code == 200
        w, g = want.json(), got.json()
        assert shape(g) == shape(w), path
        assert present(g["usage"]) == present(w["usage"])
        assert g["choices"][0]["finish_reason"] == w["choices"][0]["finish_reason"]
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        want, got = _both(sim_face, vllm_serve, "POST", path, streamed)
        w_ev, g_ev = events(want.content), events(got.content)
        assert [shape(e) for e in g_ev[-2:]] == [shape(e) for e in w_ev[-2:]], path
        assert present(g_ev[-1]["usage"]) == present(w_ev[-1]["usage"])


@pytest.mark.parametrize(("name", "body"), [
    ("no tokens", {"token_ids": [], "sampling_params": {"max_tokens": 3}}),
    ("negative id", {"token_ids": [1, -2], "sampling_params": {"max_tokens": 3}}),
    ("unknown model", {"token_ids": [1, 2], "model": "nope",
                       "sampling_params": {"max_tokens": 3}}),
    ("bad temperature", {"token_ids": [1, 2], "sampling_params": {"temperature": -1}}),
    ("greedy n", {"token_ids": [1, 2], "sampling_params": {"n": 2, "temperature": 0}}),
    ("out of vocabulary", {"token_ids": [1, 999_999_999], "sampling_params": {"max_tokens": 3}}),
    ("too long", {"token_ids": [7] * (MAX_MODEL_LEN + 10),
                  "sampling_params": {"max_tokens": 3}}),
])
def test_refusals_alike(sim_face: Face, vllm_serve: VllmServe, name: str,
                        body: dict[str, Any]) -> None:
    want, got = _both(sim_face, vllm_serve, "POST", "/inference/v1/generate", body)
    assert got.status_code == want.status_code, (name, want.text, got.text)
    w_err, g_err = want.json()["error"], got.json()["error"]
    # The same error object (the offending parameter's name is vLLM's own detail).
    assert shape({**g_err, "param": None}) == shape({**w_err, "param": None})
    assert (g_err["type"], g_err["code"]) == (w_err["type"], w_err["code"])
    streamed = {**body, "stream": True}
    want, got = _both(sim_face, vllm_serve, "POST", "/inference/v1/generate", streamed)
    assert got.status_code == want.status_code, (name, want.text, got.text)
    if want.status_code == 200:  # refused once the stream started: an in-band error event
        w, g = events(want.content), events(got.content)
        assert [shape(e) for e in g] == [shape(e) for e in w]
        assert g[-1]["error"]["code"] == w[-1]["error"]["code"]


def test_control_endpoints_alike(sim_face: Face, vllm_serve: VllmServe) -> None:
    for path in ("/v1/models", "/kv_event_sources"):
        want, got = _both(sim_face, vllm_serve, "GET", path)
        assert want.status_code == got.status_code == 200
        assert shape(got.json()) == shape(want.json()), path
    want, got = _both(sim_face, vllm_serve, "GET", "/health")
    assert want.status_code == got.status_code == 200
    want, got = _both(sim_face, vllm_serve, "POST", "/inference/v1/abort_requests",
                      {"request_ids": ["generate-tokens-none"]})
    assert want.status_code == got.status_code == 200
    want, got = _both(sim_face, vllm_serve, "GET", "/metrics")
    for name in ("vllm:num_requests_running{", "vllm:num_requests_waiting{",
                 "vllm:kv_cache_usage_perc{", "vllm:prefix_cache_queries_total{",
                 "vllm:prefix_cache_hits_total{", "process_start_time_seconds "):
        assert name in want.text and name in got.text, name


def _stored_blocks(endpoint: str, topic: str, send: Any) -> list[BlockStored]:
    """The BlockStored events a publisher sends while ``send()`` runs a request."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(endpoint)
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    stored: list[BlockStored] = []
    try:
        # A SUB joins asynchronously: requests are sent until one's events arrive (each is a
        # new prompt, so each stores its blocks afresh).
        for attempt in range(20):
            send(attempt)
            while sub.poll(2000):
                _, _, payload = sub.recv_multipart()
                stored += [e for e in decoder.decode(payload).events
                           if isinstance(e, BlockStored)]
            if stored:
                return stored
    finally:
        sub.close(linger=0)
        ctx.term()
    raise AssertionError(f"no BlockStored from {endpoint}")


def test_kv_events_flow_alike(sim_face: Face, vllm_serve: VllmServe) -> None:
    got_sources = httpx.get(sim_face.base_url + "/kv_event_sources").json()
    assert got_sources["0"]["endpoint"] == sim_face.kv_endpoint
    tokens = list(range(2000, 2000 + 2 * BLOCK + 20))

    def runner(base_url: str) -> Any:
        def send(attempt: int) -> None:
            prompt = [attempt + 3, *tokens]
            r = httpx.post(base_url + "/inference/v1/generate", timeout=120, json={
                "token_ids": prompt, "sampling_params": {"max_tokens": 1}})
            assert r.status_code == 200, r.text
        return send

    w = _stored_blocks(vllm_serve.kv_endpoint, vllm_serve.kv_topic, runner(vllm_serve.base_url))
    g = _stored_blocks(sim_face.kv_endpoint, "kv", runner(sim_face.base_url))
    # The same full blocks of the same prompt (the last one's attempt number may differ).
    w_ids = [t for e in w for t in e.token_ids]
    g_ids = [t for e in g for t in e.token_ids]
    assert len(w_ids) == len(g_ids) == 2 * BLOCK
    assert w_ids[1:] == g_ids[1:] == tokens[: 2 * BLOCK - 1]
    assert {e.block_size for e in w} == {e.block_size for e in g} == {BLOCK}
    assert w[0].parent_block_hash is None and g[0].parent_block_hash is None
    # The same prompt again: both report its full blocks served from their caches.
    again = {"token_ids": [9, *tokens], "sampling_params": {"max_tokens": 1}}
    for base in (vllm_serve.base_url, sim_face.base_url):
        assert httpx.post(base + "/inference/v1/generate", json=again,
                          timeout=120).status_code == 200
    before = [_hits(vllm_serve.base_url), _hits(sim_face.base_url)]
    want, got = _both(sim_face, vllm_serve, "POST", "/inference/v1/generate", again)
    assert present(got.json()["usage"]) == present(want.json()["usage"])
    after = [_hits(vllm_serve.base_url), _hits(sim_face.base_url)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [2 * BLOCK, 2 * BLOCK]


def _hits(base_url: str) -> float:
    """The prefix-cache hits (tokens) a server's /metrics reports so far."""
    body = httpx.get(base_url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total{"))
