"""Removing an HTTP engine always finishes, whenever the removal lands in its monitor's cycle.

The monitor of a pod probes and scrapes it in a loop; removal cancels the monitor and waits for
it. A cancel that lands while a probe's answer is arriving must still stop the monitor (Python
3.11's ``asyncio.wait_for`` returned the answer and dropped such a cancel: the monitor went on
and the removal, hence ``DELETE /admin/engines/NAME``, waited for ever).

The pod is a small HTTP/1.1 server on a real socket in the test's own loop, answering each
probe at once, and the monitor scrapes as fast as it can, so removals land at every point of
its cycle.
"""

from __future__ import annotations

import asyncio
import random

from router.config import EngineSpec, LinkConfig
from router.link.http_client import HttpEngineClient

ANSWERS = {
    b"/health": b"",
    b"/v1/models": b'{"object":"list","data":[{"id":"m","max_model_len":4096}]}',
    b"/metrics": b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n",
}
REMOVALS = 150


async def _pod(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while head := await reader.readuntil(b"\r\n\r\n"):
            path = head.split(b" ", 2)[1]
            body = ANSWERS.get(path)
            status = b"200 OK" if body is not None else b"404 Not Found"
            body = body or b""
            writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def test_removal_finishes_wherever_it_lands_in_the_monitor_cycle() -> None:
    server = await asyncio.start_server(_pod, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    rng = random.Random(7)
    link = LinkConfig(http_load_interval=1e-6, http_load_interval_quiet=1e-6,
                      http_health_interval=1e-6)
    stuck = []
    async with server, HttpEngineClient(link) as client:
        for i in range(REMOVALS):
            name = f"pod-{i}"
            client.add_engine(EngineSpec(name, url=f"http://127.0.0.1:{port}"))
            await client.wait_ready(30.0, [name])
            for _ in range(rng.randrange(12)):
                await asyncio.sleep(0)  # some loop turns into the monitor's next probe
            monitors = list(client.engines[name].tasks)
            removal = asyncio.ensure_future(client.remove_engine(name))
            await asyncio.wait({removal}, timeout=10.0)
            if not removal.done():
                stuck.append(name)  # it waits for a monitor that did not stop when cancelled
                while not removal.done():  # cancel again until one lands, to end the test
                    for task in monitors:
                        task.cancel()
                    await asyncio.wait({removal}, timeout=0.01)
                break
    assert not stuck, f"the removal of {stuck[0]} did not finish (of {i + 1} tried)"
    assert client.engines == {}
