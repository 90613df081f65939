"""Exceptions to HTTP answers, in one place for a service: its Starlette app and its fast paths.

A service builds one ``ErrorPath`` with what it counts per error (``observe``), gives
``ErrorPath.handlers()`` to Starlette as ``exception_handlers`` and calls ``ErrorPath.answer``
from its raw-ASGI routes, so an error reads the same, byte for byte, on either path. The body is
serving/errors.py's ``error_json``; Starlette's own HTTPException (unknown path, wrong method)
joins the tree here, the one place that knows Starlette.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from serving.errors import APIError, api_error, error_json

log = logging.getLogger("kvroute.serving")

Handler = Callable[[Request, Exception], Coroutine[Any, Any, Response]]
Observe = Callable[[Request, APIError], None]

_HTTP_TYPES = {404: "NotFoundError", 405: "MethodNotAllowed"}


class _HTTPError(APIError):
    """Starlette's HTTPException as a member of the tree, its headers (e.g. Allow) kept."""

    def __init__(self, exc: HTTPException) -> None:
        super().__init__(exc.status_code, str(exc.detail),
                         _HTTP_TYPES.get(exc.status_code, "HTTPException"))
        self._headers = dict(exc.headers or {})

    def headers(self) -> dict[str, str]:
        return self._headers


def as_api_error(exc: BaseException) -> APIError:
    return _HTTPError(exc) if isinstance(exc, HTTPException) else api_error(exc)


def error_response(exc: BaseException) -> Response:
    """The HTTP answer to ``exc``: OpenAI's error JSON (no body for a client that left)."""
    err = as_api_error(exc)
    body = b"" if err.status == 499 else error_json(err)
    resp = Response(body, status_code=err.status,
                    media_type="application/json" if body else None)
    resp.headers.update(err.headers())
    return resp


class ErrorPath:
    """One service's exception -> answer mapping, with what it counts for each error."""

    def __init__(self, observe: Observe | None = None) -> None:
        self.observe = observe

    def answer(self, request: Request, exc: BaseException) -> Response:
        if not self.expected(exc):
            log.error("unexpected error on %s", request.url.path, exc_info=exc)
        if self.observe is not None:
            self.observe(request, as_api_error(exc))
        return error_response(exc)

    @staticmethod
    def expected(exc: BaseException) -> bool:
        """False for a bug: answered 500, then re-raised so the server logs it (as Starlette's
        ServerErrorMiddleware does with the ``Exception`` handler)."""
        return isinstance(exc, APIError | msgspec.DecodeError | HTTPException)

    async def _handle(self, request: Request, exc: Exception) -> Response:
        return self.answer(request, exc)

    def handlers(self) -> Mapping[Any, Handler]:
        """Starlette's ``exception_handlers``: every class goes through ``answer``."""
        return {cls: self._handle
                for cls in (APIError, msgspec.DecodeError, HTTPException, Exception)}
