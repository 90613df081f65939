"""Drain-then-remove: an engine takes no new request, its running ones finish, then it goes.

One implementation for every way an engine leaves the fleet at run time: an operator's
``DELETE /admin/engines/NAME`` (router/front/control.py) and discovery finding a pod deleted,
not ready or moved (router/routing/discovered.py). A drain is taken back (``cancel``) while it
still waits, never once the removal has begun.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from router.routing.dispatch import Dispatcher
from router.routing.fleet import Fleet

log = logging.getLogger("kvroute.fleet")

# How often a drain looks at the engine's requests (a drain takes seconds, not milliseconds).
DRAIN_POLL = 0.05


@dataclass(frozen=True, slots=True)
class Removal:
    name: str
    drained: bool  # every request on it finished before the timeout
    cut: int  # requests still on it when it was removed (they end with an error)


class Drains:
    """The engines draining now; each one's drain-then-remove runs in its own task."""

    def __init__(self, fleet: Fleet, dispatcher: Dispatcher, poll: float = DRAIN_POLL) -> None:
        self.fleet = fleet
        self.dispatcher = dispatcher
        self.poll = poll
        self.tasks: dict[str, asyncio.Task[Removal]] = {}
        self.removing: set[str] = set()  # past the point of no return

    def start(self, name: str, timeout: float) -> asyncio.Task[Removal]:
        """From now on no request is placed on ``name``; its running requests get ``timeout``
        seconds to finish, then it is removed. A drain already running is returned as is."""
        task = self.tasks.get(name)
        if task is not None and not task.done():  # a done one's callback has yet to run
            return task
        self.dispatcher.draining.add(name)
        task = asyncio.get_running_loop().create_task(self._run(name, timeout),
                                                      name=f"drain-{name}")
        self.tasks[name] = task
        task.add_done_callback(lambda done: self._done(name, done))
        return task

    def cancel(self, name: str) -> bool:
        """Take a draining engine back into service; False if it is not draining or its
        removal has begun."""
        task = self.tasks.get(name)
        if task is None or task.done() or name in self.removing:
            return False
        del self.tasks[name]
        self.dispatcher.draining.discard(name)
        task.cancel()
        log.info("engine drain cancelled: back in service", extra={"engine": name})
        return True

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _done(self, name: str, task: asyncio.Task[Removal]) -> None:
        if self.tasks.get(name) is task:
            del self.tasks[name]
        if not task.cancelled() and task.exception() is not None:
            log.error("engine removal failed", extra={"engine": name},
                      exc_info=task.exception())

    def in_flight(self, name: str) -> int:
        """The requests holding a slot on the engine, or on its link, whichever is more."""
        eng = self.fleet.client.engines.get(name)
        return max(self.dispatcher.admission.in_flight(name),
                   eng.num_in_flight if eng is not None else 0)

    async def _run(self, name: str, timeout: float) -> Removal:
        try:
            log.info("engine draining", extra={"engine": name, "timeout": timeout})
            drained = await self._idle(name, timeout)
            # No await between the wait and this mark: ``cancel`` either stopped the wait or
            # finds the mark.
            self.removing.add(name)
            cut = self.in_flight(name)
            await self.fleet.remove(name)
            return Removal(name, drained, cut)
        finally:
            # Unless a newer drain of the same name (after a cancel) owns the marks now.
            if self.tasks.get(name) in (None, asyncio.current_task()):
                self.removing.discard(name)
                self.dispatcher.draining.discard(name)

    async def _idle(self, name: str, timeout: float) -> bool:
        """Wait until no request holds a slot on the engine; False if ``timeout`` ran out."""
        deadline = time.monotonic() + timeout
        while self.in_flight(name):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self.poll)
        return True
