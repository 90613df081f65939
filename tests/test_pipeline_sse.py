"""SSEResponse on a real Hypercorn server: raw ASGI streaming and client-disconnect detection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from output.sse import DONE, SSEResponse

TIMEOUT = 10.0


class Probe:
    """What the server side saw: disconnect callback, producer closed."""

    def __init__(self) -> None:
        self.disconnected = asyncio.Event()
        self.body_closed = asyncio.Event()
        self.waiting = asyncio.Event()


def _app(probe: Probe) -> Starlette:
    async def finite(request: Request) -> SSEResponse:
        async def body() -> AsyncIterator[bytes]:
            for i in range(3):
                yield f"data: {i}\n\n".encode()
            yield DONE

        return SSEResponse(body(), headers=[(b"x-request-id", b"abc")])

    async def endless(request: Request) -> SSEResponse:
        async def body() -> AsyncIterator[bytes]:
            try:
                yield b"data: first\n\n"
                probe.waiting.set()
                # Stands for a stream waiting on the engine for its next token.
                await asyncio.get_running_loop().create_future()
                yield b"data: never\n\n"
            finally:
                probe.body_closed.set()

        async def on_disconnect() -> None:
            probe.disconnected.set()

        return SSEResponse(body(), on_disconnect=on_disconnect)

    return Starlette(routes=[Route("/finite", finite), Route("/endless", endless)])


async def _serve(tmp_path: Path, probe: Probe) -> tuple[str, asyncio.Event, asyncio.Task[None]]:
    path = str(tmp_path / "sse.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(16)  # listening before the server runs: clients can connect at once
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = None
    stop = asyncio.Event()
    task = asyncio.create_task(serve(_app(probe), config, shutdown_trigger=stop.wait))
    return path, stop, task


async def test_streams_events_with_headers(tmp_path: Path) -> None:
    probe = Probe()
    path, stop, task = await _serve(tmp_path, probe)
    try:
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path)) as client:
            r = await asyncio.wait_for(client.get("http://kv/finite"), TIMEOUT)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-request-id"] == "abc"
        assert r.content == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" + DONE
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)


async def test_client_disconnect_is_detected_while_waiting(tmp_path: Path) -> None:
    probe = Probe()
    path, stop, task = await _serve(tmp_path, probe)
    try:
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path)) as client:
            async with client.stream("GET", "http://kv/endless") as r:
                async for chunk in r.aiter_raw():
                    assert chunk == b"data: first\n\n"
                    break
                await asyncio.wait_for(probe.waiting.wait(), TIMEOUT)
        # The producer is parked on the engine: only the receive() watcher can notice this.
        await asyncio.wait_for(probe.disconnected.wait(), TIMEOUT)
        await asyncio.wait_for(probe.body_closed.wait(), TIMEOUT)
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT)
