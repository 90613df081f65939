"""One request's outputs as an async iterator, fed by the engine client's listener task."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from wire.engine import EngineCoreOutput


class ChoiceStream(Protocol):
    """What the answer reads for one choice: a ``RequestStream``, or one that can go on on
    another engine (router/routing/resume.py)."""

    @property
    def request_id(self) -> str: ...

    @property
    def engine(self) -> str: ...

    @property
    def finished(self) -> bool: ...

    @property
    def queued(self) -> int: ...

    def fail(self, exc: BaseException) -> None: ...

    def __aiter__(self) -> ChoiceStream: ...

    async def __anext__(self) -> EngineCoreOutput: ...


class RequestStream:
    """Yields ``EngineCoreOutput``s until one carries a finish_reason; raises if the link fails.

    Outputs already received are still yielded before a failure is raised, so a consumer sees
    every token the engine produced.
    """

    __slots__ = ("request_id", "engine", "_items", "_waiter", "_done", "_error")

    def __init__(self, request_id: str, engine: str) -> None:
        self.request_id = request_id
        self.engine = engine
        self._items: deque[EngineCoreOutput] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: BaseException | None = None

    @property
    def finished(self) -> bool:
        return self._done or self._error is not None

    @property
    def queued(self) -> int:
        """Outputs received and not yet read: the next ``__anext__`` will not wait."""
        return len(self._items)

    def push(self, out: EngineCoreOutput) -> None:
        self._items.append(out)
        self._wake()

    def finish(self, out: EngineCoreOutput) -> None:
        if self.finished:
            return
        self._items.append(out)
        self._done = True
        self._wake()

    def fail(self, exc: BaseException) -> None:
        if self.finished:
            return
        self._error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> EngineCoreOutput:
        while not self._items:
            if self._error is not None:
                raise self._error
            if self._done:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    async def collect(self) -> list[EngineCoreOutput]:
        """All outputs until the finishing one (raises like iteration does)."""
        return [out async for out in self]
