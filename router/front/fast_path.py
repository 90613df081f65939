"""The three model POSTs as raw ASGI in front of Starlette's stack, errors still the app's own.

Per request Starlette's stack (ServerErrorMiddleware -> Guard -> ExceptionMiddleware -> Router ->
Route -> request_response) costs an ASGI call, a ``send`` wrapper and often a task-local context
per layer before the first byte is parsed, and again on every ``send``. The fast path does what
that stack does for the model endpoints and nothing else: the Guard's x-request-id and API key,
the body limit, then the same opener the Starlette handler calls. Anything it does not own goes to
the full app untouched: other paths and methods, a missing or wrong API key and a draining router
(the Guard answers), a body without a Content-Length or over the limit (read_body answers). An
exception is answered by the app's own error path (serving/http_errors.py's ErrorPath, which is
also the app's exception_handlers), and the key and request id are serving/guard.py's, the
Guard's own, so an error reads the same, byte for byte, on either path.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from router.front import handlers
from router.front.state import router_state
from serving.guard import ApiKey, RequestIdSend

if TYPE_CHECKING:
    from router.front.handlers import Answer
    from router.front.state import Lifecycle, RouterState
    from serving.http_errors import ErrorPath

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Opener = Callable[["RouterState", Receive, bytes, float, Any], Awaitable["Answer"]]

OPENERS: Mapping[str, Opener] = {
    "/inference/v1/generate": handlers.open_generate,
    "/v1/chat/completions": handlers.open_chat,
    "/v1/completions": handlers.open_completion,
}


class FastPath:
    """Owns a POST to one of ``OPENERS`` that the Guard would let through with a declared body
    within the limit; ``take`` says whether it does (before anything is read)."""

    def __init__(self, api_key: ApiKey, lifecycle: Lifecycle, errors: ErrorPath) -> None:
        self.api_key = api_key
        self.lifecycle = lifecycle
        self.errors = errors

    def take(self, scope: Scope) -> Opener | None:
        opener = OPENERS.get(scope["path"])
        if opener is None or scope["method"] != "POST" or self.lifecycle.draining:
            return None
        size = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                size = int(value) if value.isdigit() else None
        state = scope.get("state")
        if size is None or state is None or size > router_state(state).render.limits.max_body_bytes:
            return None
        if not self.api_key.admits(scope["headers"]):
            return None  # the Guard answers it
        return opener

    async def __call__(self, opener: Opener, scope: Scope, receive: Receive,
                       send: Send) -> None:
        arrival = time.perf_counter()
        send_with_id = RequestIdSend(scope["headers"], send)
        if send_with_id.refusal is not None:
            await self.errors.answer(Request(scope, receive), send_with_id.refusal)(
                scope, receive, send_with_id)
            return
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
            response = await opener(router_state(scope["state"]), receive, body, arrival,
                                    scope["headers"])
            await response(scope, receive, send_with_id)
        except Exception as exc:
            if send_with_id.started:
                raise  # as Starlette: the answer is under way, the server ends the connection
            answer = self.errors.answer(Request(scope, receive), exc)
            await answer(scope, receive, send_with_id)
            if not self.errors.expected(exc):
                raise  # as Starlette's ServerErrorMiddleware: answered, and the server logs it
