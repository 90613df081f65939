"""Test helper: follow a discovery source's changes into an engine set, checking the stream."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from discovery.endpoints import Change, ChangeKind, Endpoint, Source, apply, changes


class Follower:
    """Runs ``changes(source)`` on the caller's loop into ``engines``; every change must fit
    the set it applies to (JOINED only for a new name, UPDATED and LEFT only for a known one,
    UPDATED only with a real difference), or the follower fails."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.engines: dict[str, Endpoint] = {}
        self.log: list[Change] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Follower:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._task is not None
        self.check()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def check(self) -> None:
        """Raise what failed in the follower, if anything did."""
        assert self._task is not None
        if self._task.done() and not self._task.cancelled():
            self._task.result()

    async def _run(self) -> None:
        stream = changes(self.source)
        async with contextlib.aclosing(stream):
            async for change in stream:
                name = change.endpoint.name
                if change.kind is ChangeKind.JOINED:
                    assert name not in self.engines, f"joined twice: {change}"
                else:
                    assert self.engines.get(name) == (change.previous or change.endpoint), \
                        f"{change.kind.value} does not fit {self.engines.get(name)}: {change}"
                    if change.kind is ChangeKind.UPDATED:
                        assert change.previous != change.endpoint
                apply(self.engines, change)
                self.log.append(change)
