"""An HTTP engine's KV block size is known when it joins (vLLM's ``vllm:cache_config_info``
in its /metrics), not only from its first KV event: the router notes what it routes there from
the first request on (a fresh router used to route every repeat of a prompt cold until each pod
had announced a block). Against real `vllm serve`: tests/test_router_http_vllm.py.
"""

from __future__ import annotations

from pathlib import Path

from router.config import EngineSpec, LinkConfig
from router.link.http_client import HttpEngineClient
from router.link.http_state import parse_block_size
from tests.http_pods import Pods


async def test_a_pods_block_size_comes_with_its_ready_map(tmp_path: Path) -> None:
    pods = Pods(tmp_path, sim={"block_size": 32})  # not the default 16
    try:
        pod = pods.start("pod", "127.0.0.1")
        async with HttpEngineClient(LinkConfig()) as client:
            client.add_engine(EngineSpec("pod", url=pod.url))  # no block_size configured
            client.add_engine(EngineSpec("told", url=pod.url, block_size=64))
            await client.wait_ready(30.0, ["pod", "told"])
            ready = client.engines["pod"].ready
            assert ready is not None and ready.block_size == 32
            told = client.engines["told"].ready
            assert told is not None and told.block_size == 64  # the configured size wins
    finally:
        pods.close()


def test_block_size_parsing_refuses_what_is_not_one() -> None:
    info = 'vllm:cache_config_info{{block_size="{}",engine="0"}} 1.0\n'
    assert parse_block_size(info.format(128).encode()) == 128
    for bad in ("0", "-16", "x", "1e3", "99999999"):
        assert parse_block_size(info.format(bad).encode()) is None
    assert parse_block_size(b"vllm:num_requests_running 0\n") is None
    assert parse_block_size(b"not prometheus {{{ text") is None
    assert parse_block_size(b'vllm:cache_config_info{engine="0"} 1.0\n') is None
