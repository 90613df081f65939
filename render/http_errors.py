"""Every error the render service answers with, mapped to OpenAI's error JSON in this one place.

    RenderError (render.errors)     its own status / type / param (400 bad input, 404 unknown model)
    msgspec.DecodeError             400 "Bad Request": malformed JSON
     └── msgspec.ValidationError    400 "Bad Request": wrong type / constraint; param = JSON path
    BodyTooLarge                    413 "Request Entity Too Large"
    starlette HTTPException         its status (404 unknown path, 405 wrong method)
    any other Exception             500 "InternalServerError" — a bug; the fuzz test asserts none

The body is always ``{"error": {"message", "type", "param", "code"}}``, as vLLM sends it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from render.errors import RenderError

log = logging.getLogger("kvroute.render")

_ENCODER = msgspec.json.Encoder()
# msgspec ends its messages with " - at `$.messages[0].role`".
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"Request body exceeds the limit of {limit} bytes.")
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (BodyTooLarge, (self.limit,))  # not ``cls(message)``: pickles whole like the rest


def error_response(status: int, message: str, type_: str, param: str | None) -> Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return Response(_ENCODER.encode(body), status_code=status, media_type="application/json")


def _record(request: Request, type_: str) -> None:
    metrics = getattr(request.state, "metrics", None)
    if metrics is not None:
        metrics.add_error(request.url.path, type_)


async def on_render_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RenderError)
    _record(request, exc.type)
    return error_response(exc.status, exc.message, exc.type, exc.param)


async def on_decode_error(request: Request, exc: Exception) -> Response:
    message = str(exc)
    m = _PATH.search(message)
    param = (m.group(1) or None) if m else None
    _record(request, "Bad Request")
    return error_response(400, message, "Bad Request", param)


async def on_body_too_large(request: Request, exc: Exception) -> Response:
    _record(request, "Request Entity Too Large")
    resp = error_response(413, str(exc), "Request Entity Too Large", None)
    # The rest of the body is never read: the server closes the connection after this answer,
    # and says so, or a keep-alive client would send its next request into a closing socket.
    resp.headers["connection"] = "close"
    return resp


async def on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    type_ = {404: "NotFoundError", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPException")
    _record(request, type_)
    response = error_response(exc.status_code, str(exc.detail), type_, None)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s", request.url.path, exc_info=exc)
    _record(request, "InternalServerError")
    return error_response(500, f"Internal error: {type(exc).__name__}: {exc}",
                          "InternalServerError", None)


Handler = Callable[[Request, Exception], Coroutine[Any, Any, Response]]
H = TypeVar("H")

def handler_for(handlers: Mapping[Any, H], exc: Exception) -> tuple[type, H] | tuple[None, None]:
    """The handler a Starlette app with ``handlers`` picks for ``exc`` (nearest class first),
    and the class it is registered for; for the raw ASGI routes in front of such apps."""
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            return cls, handler
    return None, None


EXCEPTION_HANDLERS: Mapping[Any, Handler] = {
    RenderError: on_render_error,
    msgspec.DecodeError: on_decode_error,
    BodyTooLarge: on_body_too_large,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}
