"""Server-sent events: pipeline chunks as ``data:`` events, written through raw ASGI ``send``.

Starlette's StreamingResponse adds its wrappers' work to every chunk, so ``SSEResponse`` sends
``http.response.start`` and the body chunks itself. It also watches ``receive`` for
``http.disconnect`` while the producer waits on
the engine, so a client that goes away is noticed at once and the app can ABORT the engine
request (``on_disconnect``), not only at the next token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec

from output.openai_types import Chunk
from output.pipeline import Pipeline
from serving.errors import APIError, EngineLinkError, EngineOutputError, api_error, sse_event
from wire.engine import EngineCoreOutput

log = logging.getLogger("kvroute.sse")

DONE = b"data: [DONE]\n\n"
SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)

Abort = Callable[[int], Awaitable[None]]
# Scope key for the server's own ASGI ``send`` (set by the router's outermost middleware):
# every middleware send wrapper runs per body chunk and none of them acts on bodies.
RAW_SEND = "kvroute.raw_send"


class StreamEnd:
    """How a stream's body ended, as ``sse_stream`` (the one place that knows) records it:
    ``completed`` after the request's last event, ``error`` when an error event ended it; neither
    while the body is unfinished (the client left, or the writer was stopped). ``on_error`` runs
    as the error is recorded, before its event is written: whoever reads that event (or the
    stream's end) already sees what ``on_error`` counted."""

    __slots__ = ("completed", "error", "on_error")

    def __init__(self, on_error: Callable[[APIError], object] | None = None) -> None:
        self.completed = False
        self.error: APIError | None = None
        self.on_error = on_error


class Backlog:
    """What a stream holds for its client: ``held()`` estimates the bytes, ``limit`` caps them,
    checked every ``interval`` seconds while the stream runs."""

    __slots__ = ("held", "limit", "interval")

    def __init__(self, held: Callable[[], int], limit: int, interval: float) -> None:
        self.held = held
        self.limit = limit
        self.interval = interval


class SSEEncoder:
    """Chunk Struct -> ``data: {json}\\n\\n`` with one reusable msgspec encoder."""

    __slots__ = ("_encode",)

    def __init__(self) -> None:
        self._encode = msgspec.json.Encoder().encode

    def event(self, chunk: Chunk) -> bytes:
        # Two bytes concatenations beat encode_into a reused bytearray plus the final copy.
        return b"data: " + self._encode(chunk) + b"\n\n"

    def events(self, chunks: Sequence[Chunk]) -> bytes:
        return b"".join([self.event(c) for c in chunks])


async def sse_stream(
    pipeline: Pipeline,
    outputs: AsyncIterator[tuple[int, EngineCoreOutput]],
    abort: Abort | None = None,
    encoder: SSEEncoder | None = None,
    ready: Callable[[], bool] | None = None,
    end: StreamEnd | None = None,
) -> AsyncIterator[bytes]:
    """The whole SSE body of one request; a failure mid-way ends it with an error event.
    ``end`` records which of the two it was once the last bytes are produced.

    ``ready()`` says whether the next output is already queued (``outputs`` will not wait):
    then its event joins the same yielded bytes, so outputs that arrived together cost one
    HTTP write, not one each (the per-write server + syscall cost dominates per-token CPU).
    Events are never held back while waiting on the engine.
    """
    enc = encoder or SSEEncoder()
    feed = pipeline.feed
    event = enc.event
    pending: list[bytes] = []
    try:
        first = pipeline.start()
        if first:
            pending.append(enc.events(first))
            if ready is None or not ready():
                yield pending.pop()
        async for index, out in outputs:
            chunk, stop_abort = feed(index, out)
            if stop_abort and abort is not None:
                await abort(index)
            if chunk is not None:
                pending.append(event(chunk))
            if pipeline.done:
                break
            if pending and (ready is None or not ready()):
                yield pending[0] if len(pending) == 1 else b"".join(pending)
                pending.clear()
        if not pipeline.done:
            raise EngineOutputError("The engine stream ended before the request finished.")
        last = pipeline.end()
        if last:
            pending.append(enc.events(last))
        error: APIError | None = None
    except APIError as exc:  # the engine failed the request, died or went silent (503)
        if isinstance(exc, EngineLinkError):
            log.warning("engine failed mid-stream", extra={
                "request_id": pipeline.spec.request_id, "error": str(exc)})
        pending.append(sse_event(exc))
        error = exc
    except Exception as exc:  # the stream has started: the error can only go in-band
        log.exception("stream failed", extra={"request_id": pipeline.spec.request_id})
        pending.append(sse_event(exc))
        error = api_error(exc)
    finally:
        aclose = getattr(outputs, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
    # The last events, any error event and [DONE] leave in one write.
    pending.append(DONE)
    if end is not None:
        end.error = error
        end.completed = error is None
        if error is not None and end.on_error is not None:
            end.on_error(error)
    yield b"".join(pending)


class RefusedStream:
    """An ASGI app: the 200 stream vLLM answers a request its input processor refuses, as
    vLLM's streamed answer has started by then: the error's event, then ``[DONE]``."""

    def __init__(self, error: APIError) -> None:
        self.error = error

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": list(SSE_HEADERS)})
        await send({"type": "http.response.body", "body": sse_event(self.error) + DONE,
                    "more_body": False})


class SSEResponse:
    """An ASGI app streaming ``body``; calls ``on_disconnect`` if the client leaves first, and
    ``on_overflow`` if it stops reading while ``backlog`` grows past its limit (the stream is
    then cut: the connection closes without the rest)."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        *,
        status: int = 200,
        headers: Sequence[tuple[bytes, bytes]] = (),
        on_disconnect: Callable[[], Awaitable[None]] | None = None,
        body_send: Callable[[Any], Awaitable[None]] | None = None,
        backlog: Backlog | None = None,
        on_overflow: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.body = body
        self.backlog = backlog
        self.on_overflow = on_overflow
        self.body_send = body_send
        self.status = status
        self.headers = [*SSE_HEADERS, *headers]
        self.on_disconnect = on_disconnect
        # The client left before the last byte was handed to the server.
        self.disconnected = False
        # The client stopped reading and the backlog outgrew its cap: the stream was cut.
        self.overflowed = False
        self._sent_all = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(self._watch(receive))
        try:
            if self.backlog is None:
                await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
            else:
                await self._until_done_or_overflow(pump, watch, self.backlog)
        finally:
            watch.cancel()
            if not pump.done():
                # The client left: stop producing, then let the app abort the engine request.
                pump.cancel()
            results = await asyncio.gather(pump, watch, return_exceptions=True)
        if self._sent_all:
            # Servers answer ``receive`` with http.disconnect once the response is complete:
            # that is the end of an answer delivered, not a client that left.
            self.disconnected = False
        if self.overflowed and self.on_overflow is not None:
            await self.on_overflow()
        elif self.disconnected and self.on_disconnect is not None:
            await self.on_disconnect()
        exc = results[0]
        if isinstance(exc, BaseException) and not isinstance(exc, asyncio.CancelledError):
            raise exc

    async def _pump(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status,
                    "headers": self.headers})
        body_send = self.body_send or send
        try:
            async for data in self.body:
                await body_send({"type": "http.response.body", "body": data, "more_body": True})
            await body_send({"type": "http.response.body", "body": b"", "more_body": False})
            self._sent_all = True
        finally:
            aclose = getattr(self.body, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _until_done_or_overflow(self, pump: asyncio.Future[None],
                                      watch: asyncio.Future[None], backlog: Backlog) -> None:
        """Wait for the pump or the client; every ``backlog.interval`` seconds see whether
        what the stream holds, unsent, is over ``backlog.limit`` (a client not reading)."""
        while True:
            done, _ = await asyncio.wait((pump, watch), timeout=backlog.interval,
                                         return_when=asyncio.FIRST_COMPLETED)
            if done:
                return
            held = backlog.held()
            if held > backlog.limit:
                self.overflowed = True
                log.warning("client not reading: stream cut", extra={
                    "held_bytes": held, "limit": backlog.limit})
                return

    async def _watch(self, receive: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                return
