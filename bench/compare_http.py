"""A raw asyncio HTTP/1.1 client for the oracle router (bench/compare_oracle.py): keep-alive
connections per engine, JSON requests, answers read whole or relayed chunk by chunk.

An HTTP client library would cost the oracle a millisecond or more of CPU per call, and the
oracle calls every engine for every request: it would queue requests behind its own CPU and no
longer route as a router with perfect knowledge would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class RawPool:
    """Idle keep-alive connections to one host:port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[Conn] = []

    async def _get(self) -> Conn:
        while self.idle:
            reader, writer = self.idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
        return await asyncio.open_connection(self.host, self.port)

    def _head(self, path: str, body: bytes) -> bytes:
        return (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: keep-alive\r\n\r\n").encode() + body

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[int, int | None, bool, bytes]:
        """(status, content length, chunked, content type)."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, chunked, ctype = None, False, b"application/json"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key, value = name.strip().lower(), value.strip()
            if key == b"content-length":
                length = int(value)
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif key == b"content-type":
                ctype = value
        return status, length, chunked, ctype

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """One request whose answer is read whole."""
        reader, writer = await self._get()
        writer.write(self._head(path, body))
        status, length, chunked, _ = await self._read_head(reader)
        parts = [chunk async for chunk in self._body(reader, length, chunked)]
        self.idle.append((reader, writer))
        return status, b"".join(parts)

    async def stream(self, path: str, body: bytes) -> tuple[int, bytes, AsyncIterator[bytes]]:
        """One request whose answer is relayed as it comes: (status, content type, body)."""
        reader, writer = await self._get()
        writer.write(self._head(path, body))
        status, length, chunked, ctype = await self._read_head(reader)

        async def relay() -> AsyncIterator[bytes]:
            done = False
            try:
                async for chunk in self._body(reader, length, chunked):
                    yield chunk
                done = True
            finally:
                if done:
                    self.idle.append((reader, writer))
                else:  # the client went away mid-answer: this connection is unusable
                    writer.close()

        return status, ctype, relay()

    @staticmethod
    async def _body(reader: asyncio.StreamReader, length: int | None,
                    chunked: bool) -> AsyncIterator[bytes]:
        if chunked:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif length:
            yield await reader.readexactly(length)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()
