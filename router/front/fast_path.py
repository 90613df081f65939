"""The three model POSTs as raw ASGI in front of Starlette's stack, errors still the app's own.

Per request Starlette's stack (ServerErrorMiddleware -> Guard -> ExceptionMiddleware -> Router ->
Route -> request_response) costs an ASGI call, a ``send`` wrapper and often a task-local context
per layer before the first byte is parsed, and again on every ``send``. The fast path does what
that stack does for the model endpoints and nothing else: the Guard's x-request-id and API key,
the body limit, then the same opener the Starlette handler calls. Anything it does not own goes to
the full app untouched: other paths and methods, a missing or wrong API key and a draining router
(the Guard answers), a body without a Content-Length or over the limit (read_body answers). An
exception is answered by the handler the app maps it to (RouterApp.exception_handlers, nearest
class first), so an error reads the same, byte for byte, on either path.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from types import SimpleNamespace
from typing import Any

from starlette.requests import Request

from render.http_errors import handler_for
from router.front import handlers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Opener = Callable[[Any, Receive, bytes, float], Awaitable[Any]]
Handler = Callable[[Request, Exception], Awaitable[Any]]

OPENERS: Mapping[str, Opener] = {
    "/inference/v1/generate": handlers.open_generate,
    "/v1/chat/completions": handlers.open_chat,
    "/v1/completions": handlers.open_completion,
}


class FastPath:
    """Owns a POST to one of ``OPENERS`` that the Guard would let through with a declared body
    within the limit; ``take`` says whether it does (before anything is read)."""

    def __init__(self, api_key: str | None, lifecycle: Any,
                 exception_handlers: Mapping[Any, Handler]) -> None:
        self.api_key = api_key.encode() if api_key else None
        self.lifecycle = lifecycle
        self.exception_handlers = exception_handlers

    def take(self, scope: Scope) -> Opener | None:
        opener = OPENERS.get(scope["path"])
        if opener is None or scope["method"] != "POST" or self.lifecycle.draining:
            return None
        size = None
        auth = b""
        for name, value in scope["headers"]:
            if name == b"content-length":
                size = int(value) if value.isdigit() else None
            elif name == b"authorization":
                auth = value
        state = scope.get("state")
        if size is None or state is None or size > state["config"].max_body_bytes:
            return None
        key = self.api_key
        if key is not None and not (auth[:7].lower() == b"bearer "
                                    and hmac.compare_digest(auth[7:], key)):
            return None
        return opener

    async def __call__(self, opener: Opener, scope: Scope, receive: Receive,
                       send: Send) -> None:
        arrival = time.perf_counter()
        rid = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                rid = value
        if rid is None:
            rid = f"req-{time.monotonic_ns():x}".encode()
        scope["state"]["request_id"] = rid.decode("latin-1")
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid)]
            await send(message)

        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body arrived: nobody to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            # The handlers read a dozen attributes of the state: plain ones, not State's
            # __getattr__ (a Python call each).
            response = await opener(SimpleNamespace(**scope["state"]), receive, body, arrival)
            await response(scope, receive, send_with_id)
        except Exception as exc:
            if started:
                raise  # as Starlette: the answer is under way, the server ends the connection
            cls, handler = handler_for(self.exception_handlers, exc)
            if handler is None:
                raise
            answer = await handler(Request(scope, receive), exc)
            await answer(scope, receive, send_with_id)
            if cls is Exception:
                raise  # as Starlette's ServerErrorMiddleware: answered, and the server logs it
