"""The HTTP face's link to its engine: ADD / ABORT / UTILITY over inproc ZMQ, outputs demultiplexed.

As `vllm serve` is an API server in front of its EngineCore, the face is one more client of
the engine's busy loop: it sends ``[request type, msgpack]`` on an inproc PUSH the engine
polls beside its ZMQ frontend's sockets, and reads the engine's ``EngineCoreOutputs`` (client
index ``FACE_CLIENT``) on an inproc PULL, in one reader task that feeds per-request queues and
answers utility calls (run between two of the engine's polls, as vLLM's between steps).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from sim.engine import FACE_CLIENT, SimEngine
from wire.engine import (
    REQ_ABORT,
    REQ_ADD,
    REQ_UTILITY,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    UtilityOutput,
    enc_hook,
    ext_hook,
)
from wire.ndarrays import rows_of

log = logging.getLogger("kvroute.sim.http")


class Outputs:
    """One engine request's outputs as an async iterator, ending with the finishing one."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._items: deque[EngineCoreOutput] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.done = False

    def push(self, out: EngineCoreOutput) -> None:
        if self.done:
            return
        self._items.append(out)
        self.done = out.finish_reason is not None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Outputs:
        return self

    async def __anext__(self) -> EngineCoreOutput:
        while not self._items:
            if self.done:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class FaceLink:
    """Submit and abort engine requests from the face's event loop."""

    def __init__(self, engine: SimEngine) -> None:
        # The engine's context: inproc addresses live in one context.
        self._ctx = zmq.asyncio.Context.shadow(engine.context)
        self._in = self._ctx.socket(zmq.PUSH)
        self._out = self._ctx.socket(zmq.PULL)
        for sock in (self._in, self._out):
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.LINGER, 0)
        self._in.connect(engine.face_input)
        self._out.connect(engine.face_output)
        self._encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
        self._decoder = msgspec.msgpack.Decoder(EngineCoreOutputs, ext_hook=ext_hook)
        self.requests: dict[str, Outputs] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._reader = asyncio.create_task(self._read(), name="sim-face-outputs")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._in.close(linger=0)
        self._out.close(linger=0)

    async def submit(self, request: EngineCoreRequest) -> Outputs:
        request.client_index = FACE_CLIENT
        outputs = Outputs(request.request_id)
        self.requests[request.request_id] = outputs
        await self._in.send_multipart((REQ_ADD, self._encoder.encode(request)))
        return outputs

    async def abort(self, request_ids: Iterable[str]) -> None:
        """Abort on the engine; each stream ends with an ABORT output (vLLM sends none)."""
        ids = [rid for rid in request_ids if rid in self.requests]
        for rid in ids:
            self.requests.pop(rid).push(
                EngineCoreOutput(rid, [], finish_reason=FinishReason.ABORT))
        if ids:
            await self._in.send_multipart((REQ_ABORT, self._encoder.encode(ids)))

    async def call_utility(self, method: str, *args: Any) -> Any:
        """Run ``EngineCore.<method>(*args)`` on the engine; its value, or UtilityFailed."""
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            await self._in.send_multipart(
                (REQ_UTILITY, self._encoder.encode((FACE_CLIENT, call_id, method, args))))
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def _read(self) -> None:
        while True:
            frames = await self._out.recv_multipart(copy=True)
            try:
                outs = self._decoder.decode(frames[0])
                if outs.utility_output is not None:
                    self._answer(outs.utility_output)
                for out in outs.outputs:
                    if out.new_logprobs is not None:
                        out.new_logprobs = rows_of(out.new_logprobs, frames)
                    stream = self.requests.get(out.request_id)
                    if stream is None:
                        continue
                    if out.finish_reason is not None:
                        del self.requests[out.request_id]
                    stream.push(out)
            except (msgspec.DecodeError, ValueError) as exc:
                log.error("unreadable engine output: %s", exc)


    def _answer(self, out: UtilityOutput) -> None:
        future = self._calls.get(out.call_id)
        if future is None or future.done():
            return
        if out.failure_message is not None:
            future.set_exception(UtilityFailed(out.failure_message))
        else:  # vLLM's UtilityResult: [type_info, value]
            result = out.result
            future.set_result(result[1] if isinstance(result, list) and len(result) == 2
                              else result)


class UtilityFailed(Exception):
    """The engine ran a utility method and reported its failure (the message is vLLM's)."""


async def merged(streams: list[Outputs]) -> AsyncIterator[tuple[int, EngineCoreOutput]]:
    """(choice index, output) of several requests in arrival order (n > 1)."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    from output.pipeline import interleave

    async for item in interleave(list(enumerate(streams))):
        yield item
