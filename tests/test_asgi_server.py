"""serving.server on both servers: serves, streams raw ASGI, sees disconnects, drains."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest

from serving.server import SERVERS, ServeOptions, serve_asgi


class App:
    """A raw ASGI app: /ping answers; /slow streams 5 chunks, one per ``step``; records events."""

    def __init__(self) -> None:
        self.step = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/ping":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"4")]})
            await send({"type": "http.response.body", "body": b"pong"})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        self.started.set()
        if scope["path"] == "/hang":
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
            return
        for i in range(5):
            await self.step.wait()
            self.step.clear()
            await send({"type": "http.response.body", "body": b"%d\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _listen() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@pytest.mark.parametrize("server", SERVERS)
async def test_serves_streams_sees_disconnects_and_drains(server: str) -> None:
    app, sock = App(), _listen()
    stop = asyncio.Event()
    opts = ServeOptions(server=server, graceful_timeout=10, error_log=False)
    serving = asyncio.create_task(serve_asgi(app, sock, opts, stop.wait))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            # The socket already listens: this waits in its backlog until the server accepts.
            assert (await http.get("/ping")).text == "pong"

            # One keep-alive connection serves past 1000 requests (Hypercorn's default cap; on
            # uvicorn, which has none, a few: off uvloop, as here, it answers keep-alive
            # requests ~40 ms apart, which is why kvroute always serves it on uvloop).
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            for _ in range(1001 if server.startswith("hypercorn") else 3):
                writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 200")
                assert await reader.readexactly(4) == b"pong"
            writer.close()

            # A client that leaves is seen by the app as http.disconnect.
            async with httpx.AsyncClient(base_url=url, timeout=10) as other:
                hang = asyncio.create_task(other.get("/hang"))
                await asyncio.wait_for(app.started.wait(), 5)
                hang.cancel()
            await asyncio.wait_for(app.disconnected.wait(), 5)

            # Shutdown while a stream is open: the stream still completes whole.
            app.started.clear()
            async with http.stream("GET", "/slow") as resp:
                await asyncio.wait_for(app.started.wait(), 5)
                stop.set()
                chunks = []
                app.step.set()
                async for line in resp.aiter_lines():
                    chunks.append(line)
                    app.step.set()
            assert chunks == ["0", "1", "2", "3", "4"]
        await asyncio.wait_for(serving, 15)
    finally:
        serving.cancel()
        sock.close()
