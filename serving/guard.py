"""The request id and the bearer API key, read from an ASGI scope: one check for every path.

The Starlette middleware of the router and the raw-ASGI fast paths in front of it both call these,
so a request is admitted (or refused) by the same comparison whichever of them serves it.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Headers = Iterable[tuple[bytes, bytes]]


def request_id(headers: Headers) -> bytes:
    """The client's ``x-request-id`` (if not empty), else a fresh one."""
    for name, value in headers:
        if name == b"x-request-id" and value:
            return value
    return f"req-{time.monotonic_ns():x}".encode()


class ApiKey:
    """``Authorization: Bearer KEY`` against the configured key (None: every request passes)."""

    __slots__ = ("key",)

    def __init__(self, key: str | None) -> None:
        self.key = key.encode() if key else None

    def admits(self, headers: Headers) -> bool:
        key = self.key
        if key is None:
            return True
        for name, value in headers:
            if name == b"authorization":
                return value[:7].lower() == b"bearer " and hmac.compare_digest(value[7:], key)
        return False


class RequestIdSend:
    """An ASGI ``send`` that puts the request's x-request-id on the answer and notes that the
    answer has started (after which an error can no longer be answered)."""

    __slots__ = ("send", "rid", "started")

    def __init__(self, headers: Headers, send: Callable[[MutableMapping[str, Any]],
                                                          Awaitable[None]]) -> None:
        self.send = send
        self.rid = request_id(headers)
        self.started = False

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            message["headers"] = [*message.get("headers", []), (b"x-request-id", self.rid)]
        await self.send(message)
