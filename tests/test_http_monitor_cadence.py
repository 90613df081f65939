"""How often the HTTP transport's monitor asks a pod for /metrics and /health.

A scrape brings routing the load of the pod's other frontends; while the pod counts only this
router's requests it is scraped every ``http_load_interval_quiet``, not every
``http_load_interval``. A pod that answers requests in full is not probed: its answers came
from its engine, which is what /health checks. The pods here are small HTTP/1.1 servers on
real sockets counting what they are asked; the tests wait on those counts, never on time.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.config import EngineSpec, LinkConfig
from router.link.http_client import HttpEngineClient
from router.link.http_state import health_due, others_of, parse_load, scrape_interval
from wire.engine import EngineCoreRequest
from wire.sampling import SamplingParams

MODELS = b'{"object":"list","data":[{"id":"m","max_model_len":4096}]}'


def _generate_answer() -> bytes:
    """A token-in stream as a pod sends it: one token, finished, then usage and [DONE]."""
    events = [{"request_id": "generate-tokens-r", "usage": None, "output_mode": "tokens",
               "choices": [{"index": 0, "finish_reason": "length", "stop_reason": None,
                            "token_ids": [5], "routed_experts": None, "logprobs": None}]},
              {"request_id": "generate-tokens-r", "output_mode": "tokens", "choices": [],
               "usage": {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1}}]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n")


class Pod:
    """Answers /health, /v1/models, /metrics (``running`` requests) and generate; counts paths
    and wakes waiters on every request."""

    def __init__(self) -> None:
        self.asked: Counter[bytes] = Counter()
        self.running = 0
        self.changed = asyncio.Condition()

    async def wait_for(self, path: bytes, count: int, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: self.asked[path] >= count)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                path = head.split(b" ", 2)[1]
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                body: bytes | None
                if path == b"/metrics":
                    body = (f"vllm:num_requests_running {self.running}\n"
                            "vllm:num_requests_waiting 0\n").encode()
                elif path.endswith(b"/generate"):
                    body = _generate_answer()
                else:
                    body = {b"/health": b"", b"/v1/models": MODELS}.get(path)
                status = b"200 OK" if body is not None else b"404 Not Found"
                body = body or b""
                writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                async with self.changed:
                    self.asked[path] += 1
                    self.changed.notify_all()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _started(pod: Pod, link: LinkConfig) -> tuple[asyncio.Server, HttpEngineClient]:
    server = await asyncio.start_server(pod.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HttpEngineClient(link)
    await client.__aenter__()
    client.add_engine(EngineSpec("pod", url=f"http://127.0.0.1:{port}"))
    await client.wait_ready(30.0, ["pod"])
    return server, client


@pytest.mark.parametrize("running", [0, 1])
async def test_a_pod_counting_only_our_requests_is_scraped_at_the_quiet_interval(
        running: int) -> None:
    """Probes every microsecond, scrapes as often while others load the pod (``running``: one
    request not ours), every hour while nobody does: 50 probes of a quiet pod see the scrapes of
    its joining only; a loaded pod's scrapes come as fast as the probes."""
    pod = Pod()
    pod.running = running
    link = LinkConfig(http_health_interval=1e-6, http_load_interval=1e-6,
                      http_load_interval_quiet=3600.0)
    server, client = await _started(pod, link)
    try:
        if running:
            await pod.wait_for(b"/metrics", 50)
        else:
            await pod.wait_for(b"/health", pod.asked[b"/health"] + 50)
            assert pod.asked[b"/metrics"] <= 2  # at joining, and the first scrape after
    finally:
        await client.__aexit__(None, None, None)
        server.close()
        await server.wait_closed()


async def test_a_full_answer_is_a_sign_of_life() -> None:
    pod = Pod()
    server, client = await _started(pod, LinkConfig(http_health_interval=3600.0))
    try:
        eng = client.engines["pod"]
        assert eng.answered == 0.0
        request = EngineCoreRequest("r1", [1, 2, 3], None, SamplingParams(max_tokens=1), None,
                                    0.0, None, None, None)
        stream = await client.submit("pod", request)
        outs = [out async for out in stream]
        assert outs[-1].finish_reason is not None
        answered = eng.answered
        assert answered > 0.0
        assert not health_due(answered, 0.0, answered, 3600.0)
    finally:
        await client.__aexit__(None, None, None)
        server.close()
        await server.wait_closed()


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 120))
def test_the_quiet_interval_only_while_every_request_counted_is_ours(
        running: int, waiting: int, ours: int) -> None:
    body = f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
    load = parse_load(body.encode(), 0.0, ours)
    others = others_of(load)
    assert others == max(0, running + waiting - ours)
    assert scrape_interval(load, 0.5, 1.5) == (1.5 if others == 0 else 0.5)


def test_a_failed_scrape_keeps_the_busy_interval() -> None:
    assert scrape_interval(None, 0.5, 1.5) == 0.5


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0, 1e6), st.floats(1e-6, 1e3))
def test_a_probe_is_due_an_interval_after_the_later_of_probe_and_answer(
        now: float, probe: float, answer: float, interval: float) -> None:
    assert health_due(now, probe, answer, interval) == (now - max(probe, answer) >= interval)
