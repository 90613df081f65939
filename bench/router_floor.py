"""A floor for bench/router.py (b): the least a Python token-in router can do per request.

    .venv/bin/python bench/router_floor.py --server raw|SERVER --engine ADDR --port N

It answers every POST as `/inference/v1/generate` with max_tokens=1: read the body, decode
``request_id`` and ``token_ids``, send the ADD through kvroute's own EngineClient, wait for the
outputs, write a small JSON answer. No validation, routing, metrics, logs, detokenization or
disconnect watch. ``raw`` serves it on a bare asyncio Protocol with httptools' parser (no ASGI,
no server library); the servers of `serving/server.py` serve it as a raw ASGI app, as the
router is served. Side by
side with the router in one run, (floor - direct) is what the HTTP hop and that server cost by
themselves, and (router - floor) what the router's own work adds. Prints ``ready`` once linked.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

import msgspec  # noqa: E402
import uvloop  # noqa: E402

from router.config import EngineSpec  # noqa: E402
from router.link.engine_client import EngineClient  # noqa: E402
from serving.server import SERVERS, ServeOptions, bind_socket, serve_asgi  # noqa: E402
from wire.engine import EngineCoreRequest  # noqa: E402
from wire.sampling import SamplingParams  # noqa: E402

FLOORS = ("raw", *SERVERS)


class Generate(msgspec.Struct):
    request_id: str
    token_ids: list[int]


class Floor:
    """The per-request work every floor server shares."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.decoder = msgspec.json.Decoder(Generate)
        self.sampling = SamplingParams(max_tokens=1, temperature=0.0)

    async def answer(self, body: bytes) -> bytes:
        gen = self.decoder.decode(body)
        stream = await self.client.submit("e", EngineCoreRequest(
            gen.request_id, gen.token_ids, None, self.sampling, None, time.time(), None, None,
            None))
        outs = await stream.collect()
        return msgspec.json.encode({"request_id": gen.request_id,
                                    "token_ids": [t for o in outs for t in o.new_token_ids]})


def raw_protocol(floor: Floor) -> type[asyncio.Protocol]:
    import httptools

    class RawHTTP(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport  # uvloop's transports are not asyncio.Transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body, self.body = b"".join(self.body), []
            asyncio.get_running_loop().create_task(self.respond(body))

        async def respond(self, body: bytes) -> None:
            out = await floor.answer(body)
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(out), out))

    return RawHTTP


def asgi_app(floor: Floor) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                done = message["type"] == "lifespan.shutdown"
                await send({"type": message["type"] + ".complete"})
                if done:
                    return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        out = await floor.answer(b"".join(parts))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    return app


async def serve(server: str, engine: str, port: int) -> None:
    client = EngineClient([EngineSpec("e", engine)])
    await client.start()
    await client.wait_ready(60)
    floor = Floor(client)
    sock = bind_socket("127.0.0.1", port)
    print("ready", flush=True)
    if server == "raw":
        srv = await asyncio.get_running_loop().create_server(raw_protocol(floor), sock=sock)
        async with srv:
            await srv.serve_forever()
    else:
        await serve_asgi(asgi_app(floor), sock, ServeOptions(server=server, error_log=False))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server", choices=FLOORS, required=True)
    p.add_argument("--engine", required=True, help="the sim engine's handshake address")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args(argv)
    uvloop.run(serve(a.server, a.engine, a.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
