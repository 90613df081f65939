"""Request bodies read under a size limit, and JSON answers from an already built encoder."""

from __future__ import annotations

from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response

from serving.errors import BodyTooLarge

JSON = "application/json"


class Encoder(Protocol):
    def encode(self, obj: object, /) -> bytes: ...


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body; over ``limit`` bytes (declared or streamed) is BodyTooLarge (413)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def json_response(encoder: Encoder, obj: object) -> Response:
    return Response(encoder.encode(obj), media_type=JSON)
