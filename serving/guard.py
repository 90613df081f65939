"""The request id and the bearer API key, read from an ASGI scope: one check for every path.

The Starlette middleware of the router and the raw-ASGI fast paths in front of it both call these,
so a request is admitted (or refused) by the same comparison whichever of them serves it.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from serving.errors import BadRequestError

Headers = Iterable[tuple[bytes, bytes]]

# The longest x-request-id echoed (vLLM has no bound; 512 holds any UUID or trace id twice over).
MAX_REQUEST_ID = 512
# Visible ASCII only: the id lands in answers, logs and engine request ids, which must not carry
# control bytes (log or header injection) or text a log reader cannot see.
_VISIBLE = bytes(range(0x21, 0x7F))
BAD_REQUEST_ID = (f"x-request-id must be 1 to {MAX_REQUEST_ID} visible ASCII characters "
                  "(0x21-0x7e).")


def request_id(headers: Headers) -> bytes | None:
    """The client's ``x-request-id`` (if not empty), else a fresh one; None if it is unfit
    (over ``MAX_REQUEST_ID`` bytes, or holding anything but visible ASCII)."""
    for name, value in headers:
        if name == b"x-request-id" and value:
            if len(value) > MAX_REQUEST_ID or value.translate(None, _VISIBLE):
                return None
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
    answer has started (after which an error can no longer be answered). An unfit client id is
    not echoed: ``refusal`` holds the 400 to answer with, under a fresh id."""

    __slots__ = ("send", "rid", "started", "refusal")

    def __init__(self, headers: Headers, send: Callable[[MutableMapping[str, Any]],
                                                          Awaitable[None]]) -> None:
        self.send = send
        rid = request_id(headers)
        self.refusal: BadRequestError | None = None
        if rid is None:
            rid = f"req-{time.monotonic_ns():x}".encode()
            self.refusal = BadRequestError(BAD_REQUEST_ID, "x-request-id")
        self.rid = rid
        self.started = False

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            message["headers"] = [*message.get("headers", []), (b"x-request-id", self.rid)]
        await self.send(message)
