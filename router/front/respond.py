"""The answer to one routed request: SSE stream or collected body, with aborts and bookkeeping."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import msgspec

from output.collect import collect
from output.detokenize import TokenDecoder
from output.pipeline import ParserFactory, Pipeline, PipelineSpec, interleave
from output.sse import RAW_SEND, Backlog, SSEResponse, StreamEnd, sse_stream
from router.front.beam_search import BeamAnswer
from router.front.multi_prompt import PipelineGroup, RoutedGroup
from router.front.state import RouterState
from router.link.engine_client import EngineLinkError
from router.routing.dispatch import Routed
from serving.errors import EngineOutputError, ShuttingDownError, error_json
from wire.engine import EngineCoreOutput

_JSON = msgspec.json.Encoder()

# The router's estimate of what one queued engine output takes (held and as its SSE event),
# and what each logprob entry adds (token id, logprob, its text and JSON around them).
EVENT_BYTES = 256
LOGPROB_BYTES = 128
ALL_LOGPROBS = 256_000


class EngineResponse:
    """An ASGI app: runs the pipeline over the routed request's outputs and writes the answer."""

    def __init__(self, state: RouterState, routed: Routed | RoutedGroup | BeamAnswer,
                 spec: PipelineSpec,
                 decoder: TokenDecoder, stream: bool,
                 pipeline: PipelineGroup | None = None,
                 parsers: ParserFactory | None = None) -> None:
        self.st = state
        self.routed = routed
        self.group = pipeline  # several prompts in one completions request
        self.parsers = parsers  # chat: the request's output parsers
        self.spec = spec
        self.decoder = decoder
        self.stream = stream
        self.arrival = time.perf_counter()
        self.first_token_at = time.perf_counter()  # open() returned with every first output
        # Outputs the SSE writer may still fold into its current write (see _ready).
        self._first_unread = True
        self._merged: deque[tuple[int, EngineCoreOutput]] = deque()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        st, routed = self.st, self.routed
        pipeline: Any = self.group or Pipeline(self.spec, self.decoder, self.parsers)
        route = routed.decision.header().encode()
        st.active[self.spec.request_id] = routed
        st.lifecycle.enter()
        status = "200"
        try:
            if self.stream:
                end = StreamEnd(on_error=lambda _: st.router_metrics.stream_errors.inc())
                status = "499"  # until the stream says how it ended
                body = sse_stream(pipeline, self._outputs(), self._abort_choice,
                                  ready=self._ready, end=end)
                # Body chunks skip Starlette's middleware send wrappers (they only act on
                # http.response.start): RouterApp put the server's own send in the scope.
                limits = st.config.streams
                sse = SSEResponse(body, headers=[(b"x-kvroute-route", route)],
                                  on_disconnect=self._client_left,
                                  body_send=scope.get(RAW_SEND),
                                  backlog=Backlog(self._held, limits.max_unsent_bytes,
                                                  limits.check_interval),
                                  on_overflow=self._slow_client)
                await sse(scope, receive, send)
                status = _stream_status(end, sse.disconnected)
                if sse.overflowed:
                    status = "slow_client"  # cut: it stopped reading (aborts cause slow_client)
            else:
                status = await self._collected(pipeline, route, receive, send)
        finally:
            await self.st.dispatcher.abort(routed, "unfinished")
            st.dispatcher.done(routed)
            st.active.pop(self.spec.request_id, None)
            st.lifecycle.leave()
            self._observe(pipeline, scope["path"], status)

    async def _collected(self, pipeline: Pipeline, route: bytes, receive: Any, send: Any) -> str:
        # Every output here already (max_tokens=1, short answers): nothing waits on the engine,
        # so no disconnect watch and no task; the coroutine is awaited inline below.
        work: Awaitable[Any] = collect(pipeline, self._outputs(), self._abort_choice)
        if not all(s.finished for s in self.routed.streams):
            task = asyncio.ensure_future(work)
            watch = asyncio.ensure_future(client_disconnected(receive))
            await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
            watch.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                await self._client_left()
                return "499"
            work = task  # done: awaiting it below takes no loop pass
        try:
            body, code = _JSON.encode(await work), 200
        except (EngineOutputError, EngineLinkError, ShuttingDownError) as exc:
            body, code = error_json(exc), exc.status
        # A declared length: without it both servers frame the body chunked, and the client
        # waits for a third write (the empty last chunk) before the answer is complete.
        headers = [(b"content-type", b"application/json"), (b"x-kvroute-route", route),
                   (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": code, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return str(code)

    def _ready(self) -> bool:
        """True when the next output of ``_outputs`` is already here (no wait on the engine)."""
        if self._first_unread:
            return True
        if len(self.routed.streams) == 1:
            return self.routed.streams[0].queued > 0
        return bool(self._merged)

    def _held(self) -> int:
        """The estimated bytes of the outputs received and not yet written (see EVENT_BYTES)."""
        k = self.spec.logprobs
        # -1: the whole vocabulary, as large as any model's.
        entries = 0 if k is None else 1 + (k if k >= 0 else ALL_LOGPROBS)
        per_output = EVENT_BYTES + LOGPROB_BYTES * entries
        queued = sum(s.queued for s in self.routed.streams) + len(self._merged)
        return queued * per_output

    def _outputs(self) -> AsyncIterator[tuple[int, EngineCoreOutput]]:
        routed = self.routed
        if len(routed.streams) == 1:
            return _OneChoice(self)
        # n > 1: the choices run concurrently on the engine; interleave them as they come,
        # every choice's first output (already read) first.
        self._merged.extend(enumerate(routed.first))
        self._first_unread = False
        return interleave(((i, s) for i, s in enumerate(routed.streams)
                           if not routed.first[i].finished), self._merged)

    async def _abort_choice(self, index: int) -> None:
        """The pipeline ended choice ``index`` on a stop string: the engine must stop too."""
        stream = self.routed.streams[index]
        with contextlib.suppress(EngineLinkError):
            await self.st.client.abort([stream.request_id])
        self.st.router_metrics.aborts.labels("stop_string").inc()

    async def _slow_client(self) -> None:
        await self.st.dispatcher.abort(self.routed, "slow_client")

    async def _client_left(self) -> None:
        await self.st.dispatcher.abort(self.routed, "client_disconnect")

    def _observe(self, pipeline: Pipeline, path: str, status: str) -> None:
        m = self.st.router_metrics
        now = time.perf_counter()
        m.requests_tally.inc((path, status))
        m.ttft_tally.observe(self.first_token_at - self.arrival)
        m.e2e_tally.observe(now - self.arrival)
        tokens = pipeline.completion_tokens
        m.generation_tokens_tally.inc((), tokens)
        if tokens > 1:
            m.tpot_tally.observe((now - self.first_token_at) / (tokens - 1))


def _stream_status(end: StreamEnd, disconnected: bool) -> str:
    """A stream's request status: as a collected answer would have had it (200, or the status
    of the error its error event carries), 499 only when the client left before the end."""
    if end.error is not None:
        return str(end.error.status)
    if end.completed and not disconnected:
        return "200"
    return "499"


class _OneChoice:
    """The outputs of a one-choice request: the first (already read), then its stream's.

    A plain async iterator, not an async generator: the loop's asyncgen hooks track each of
    those in a WeakSet, and one left suspended when the pipeline stops at the finished output
    would be finalized by them (call_soon_threadsafe: a self-pipe write and an aclose task) in
    the middle of the answer. Nor through Routed.outputs, an async generator for that reason.
    """

    __slots__ = ("response", "first")

    def __init__(self, response: EngineResponse) -> None:
        self.response = response
        self.first: EngineCoreOutput | None = response.routed.first[0]

    def __aiter__(self) -> _OneChoice:
        return self

    async def __anext__(self) -> tuple[int, EngineCoreOutput]:
        first = self.first
        if first is not None:
            self.first = None
            self.response._first_unread = False
            return 0, first
        if self.response.routed.first[0].finished:
            raise StopAsyncIteration
        return 0, await self.response.routed.streams[0].__anext__()


async def client_disconnected(receive: Any) -> None:
    """Returns when the client disconnects (the request body must have been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
