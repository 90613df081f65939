"""Two routers in front of one headless engine over ZMQ, through vLLM's multi-frontend handshake.

The router owning the engine's handshake lists a peer router's input and output addresses after
its own (as `vllm serve --api-server-count 2` lists its API servers); the engine connects to
both, and sends each request's outputs to the frontend at the request's ``client_index``. The
peer router (``link.client_index = 1``) never handshakes: it binds the listed addresses and
adopts the engine by probe. Both serve requests at once, each reads only its own outputs, and
both indexes follow the engine's KV events.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import EngineSpec, Frontend, LinkConfig
from router.link.engine_state import EngineState
from sim.launch import spawn_sim_engine
from tests.openai_clients import OpenAIClient
from tests.waits import eventually

MODEL = "Qwen/Qwen3-0.6B"
MAX_LEN = 4096
# Answers show the engine's cached tokens (vLLM's --enable-prompt-tokens-details).
DETAILS = Frontend(enable_prompt_tokens_details=True)


@pytest.fixture
def two_routers(tmp_path: Path) -> Iterator[tuple[LocalCluster, LocalCluster]]:
    kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{tmp_path}/kv",
          "replay_endpoint": f"ipc://{tmp_path}/replay", "topic": "kv"}
    feed = {"kv_events": kv["endpoint"], "replay": kv["replay_endpoint"], "topic": "kv"}
    a_in, a_out = f"ipc://{tmp_path}/a.in", f"ipc://{tmp_path}/a.out"
    b_in, b_out = f"ipc://{tmp_path}/b.in", f"ipc://{tmp_path}/b.out"
    hs = f"ipc://{tmp_path}/e0.hs"
    engine = spawn_sim_engine(hs, ["--kv-events-config", json.dumps(kv), "--block-size", "16",
                                   "--max-model-len", str(MAX_LEN), "--step-time", "0.005",
                                   "--frontend-gone-timeout", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    owner = LocalCluster(ClusterOptions(
        external=(EngineSpec("e0", hs, input=a_in, output=a_out, peer_inputs=(b_in,),
                             peer_outputs=(b_out,), **feed),),
        router_max_model_len=MAX_LEN, frontend=DETAILS))
    peer = LocalCluster(ClusterOptions(
        external=(EngineSpec("e0", input=b_in, output=b_out, block_size=16, **feed),),
        router_max_model_len=MAX_LEN, link=LinkConfig(client_index=1), frontend=DETAILS))
    try:
        owner.start()
        peer.start()
        yield owner, peer
    finally:
        peer.stop()
        owner.stop()
        engine.terminate()
        engine.wait(30)


def _chat(user: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": user}], "max_tokens": 24,
            "temperature": 0, **kw}


def test_both_routers_serve_through_one_engine(
        two_routers: tuple[LocalCluster, LocalCluster], openai_client: OpenAIClient) -> None:
    owner, peer = two_routers
    results: dict[str, str] = {}
    failures: list[BaseException] = []

    def ask(cluster: LocalCluster, tag: str) -> None:
        try:
            client = openai_client(cluster.base_url, timeout=60)
            stream = client.chat.completions.create(**_chat(f"{tag} says hi"), stream=True)
            results[tag] = "".join(c.choices[0].delta.content or "" for c in stream
                                   if c.choices)
        except BaseException as exc:  # re-raised in the test thread
            failures.append(exc)

    threads = [threading.Thread(target=ask, args=(c, f"{name}-{i}"))
               for i in range(4) for c, name in ((owner, "owner"), (peer, "peer"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    # Each answer echoes its own prompt: no router received another's outputs.
    assert len(results) == 8
    for tag, text in results.items():
        assert f"{tag} says hi" in text, (tag, text)
    for cluster in (owner, peer):
        eng = cluster.state.client.engines["e0"]
        assert isinstance(eng, EngineState)
        assert eng.counters.stray_outputs == 0 and eng.counters.refused_identities == 0
    assert peer.state.client.engines["e0"].adopted  # linked by probe, never a handshake


def test_both_indexes_follow_the_engines_kv_events(
        two_routers: tuple[LocalCluster, LocalCluster], openai_client: OpenAIClient) -> None:
    owner, peer = two_routers
    long = "the harbour lights at dawn " * 30
    client = openai_client(owner.base_url)
    client.chat.completions.create(**_chat(long + "first"))
    for cluster in (owner, peer):
        st = cluster.state
        eventually(lambda st=st: st.index.engine_blocks("e0") > 0)
    via_peer = openai_client(peer.base_url)
    raw = via_peer.chat.completions.with_raw_response.create(**_chat(long + "second"))
    assert "prefix_hit" in raw.headers["x-kvroute-route"]
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) > 0
