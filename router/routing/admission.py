"""Admission and the router's own load ledger: per-engine in-flight slots and a bounded queue."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from router.routing.policy import EngineLoad
from serving.errors import OverloadedError


@dataclass(slots=True)
class _Ledger:
    in_flight: int = 0
    pending_prefill_tokens: int = 0


class Admission:
    """Counts what the router has put on each engine and queues requests when all are full."""

    def __init__(self, max_in_flight: int, max_queue: int, queue_timeout: float,
                 retry_after: int) -> None:
        self.max_in_flight = max_in_flight
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.retry_after = retry_after
        self._ledger: dict[str, _Ledger] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def in_flight(self, engine: str) -> int:
        ledger = self._ledger.get(engine)
        return ledger.in_flight if ledger else 0

    def open_engines(self, healthy: Iterable[str]) -> list[str]:
        return [e for e in healthy if self.in_flight(e) < self.max_in_flight]

    def loads(self, engines: Iterable[str], stats: Callable[[str], tuple[int, int]]
              ) -> list[EngineLoad]:
        """EngineLoad per engine: our ledger plus the engine's (running, waiting)."""
        out = []
        for engine in engines:
            ledger = self._ledger.get(engine) or _Ledger()
            running, waiting = stats(engine)
            out.append(EngineLoad(engine, ledger.in_flight, ledger.pending_prefill_tokens,
                                  running, waiting))
        return out

    async def wait_for_slot(self, has_open: Callable[[], bool]) -> None:
        """Return once ``has_open()``; FIFO behind earlier waiters; raise OverloadedError."""
        if not self._waiters and has_open():
            return
        if len(self._waiters) >= self.max_queue:
            raise OverloadedError(429, "The router's request queue is full; retry later.",
                             self.retry_after)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.queue_timeout
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            try:
                async with asyncio.timeout_at(deadline):
                    await fut
            except TimeoutError:
                raise OverloadedError(503, "No engine slot became free in time; retry later.",
                                 self.retry_after) from None
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self.wake()  # our turn came as we left: pass it on
                raise
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
            if has_open():
                return

    def take(self, engine: str, uncached_tokens: int) -> None:
        ledger = self._ledger.setdefault(engine, _Ledger())
        ledger.in_flight += 1
        ledger.pending_prefill_tokens += uncached_tokens

    def prefilled(self, engine: str, uncached_tokens: int) -> None:
        """The first token arrived: the prompt no longer weighs on that engine's queue."""
        ledger = self._ledger.get(engine)
        if ledger is not None:
            ledger.pending_prefill_tokens -= uncached_tokens

    def release(self, engine: str) -> None:
        ledger = self._ledger.get(engine)
        if ledger is not None:
            ledger.in_flight -= 1
        self.wake()

    def wake(self) -> None:
        """Let the oldest waiter re-check (a slot freed, or an engine joined/recovered)."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
