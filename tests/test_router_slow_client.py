"""A client that stops reading cannot make the router buffer without bound: once its stream
holds more than ``streams.max_unsent_bytes`` the stream is cut and the engine request aborted."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.cluster import ClusterOptions, LocalCluster
from router.config import ConfigError, StreamLimits
from router.main import parse
from serving.server import SERVERS
from tests import waits

MODEL = "Qwen/Qwen3-0.6B"
MAX_LEN = 40960


def eventually(cond: Callable[[], bool], timeout: float = 120.0) -> None:
    """A slow client's stream takes longer to reach the cap: a longer hang bound."""
    waits.eventually(cond, timeout)


def counter(base_url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


@pytest.mark.parametrize("server", SERVERS)
def test_a_client_that_stops_reading_is_cut_and_its_request_aborted(server: str) -> None:
    opts = ClusterOptions(engines=1, http_server=server,
                          sim={"step_time": 0.0005, "max_model_len": MAX_LEN},
                          streams=StreamLimits(max_unsent_bytes=1 << 20, check_interval=0.05))
    with LocalCluster(opts) as c:
        sched = c.threads[c.names[0]].engine.scheduler
        rss_before = psutil.Process().memory_info().rss
        body = json.dumps({
            "model": MODEL, "messages": [{"role": "user", "content": "go on"}],
            "max_tokens": MAX_LEN - 64, "ignore_eos": True, "stream": True,
            "logprobs": True, "top_logprobs": 20}).encode()
        with socket.socket() as sock:
            # A small receive window: the router's writes back up at once.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", c.port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
            # Never read: the router cuts the stream and aborts the engine request, while this
            # client is still connected.
            eventually(lambda: counter(c.base_url, "kvroute_aborts_total",
                                       cause="slow_client") == 1)
            eventually(lambda: not sched.requests and not c.state.active)
            assert counter(c.base_url, "kvroute_requests_total", endpoint="/v1/chat/completions",
                           status="slow_client") == 1
            grown = psutil.Process().memory_info().rss - rss_before
            assert grown < 512 * 1024 * 1024, grown
        # Still serving.
        r = httpx.post(f"{c.base_url}/v1/completions", timeout=30,
                       json={"model": MODEL, "prompt": "after", "max_tokens": 2})
        assert r.status_code == 200


def test_stream_limits_in_the_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "router.toml"
    conf.write_text("[streams]\nmax_unsent_bytes = 1048576\ncheck_interval = 0.5\n")
    assert parse(["--config", str(conf)]).streams == StreamLimits(1 << 20, 0.5)
    conf.write_text("[streams]\nmax_unsent_bytes = 0\n")
    with pytest.raises(ConfigError, match="max_unsent_bytes"):
        parse(["--config", str(conf)])
