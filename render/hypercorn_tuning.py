"""Hypercorn 0.18 minus its per-request waste: compiled h11, a lazy keep-alive timer, a cached
Date, a response head written with its body, a lean channel for the app's ``receive``, writes
without the send lock when nobody else writes.

Hypercorn's own CPU per keep-alive request is 0.52-0.67 ms here, against 0.1-0.2 ms for uvicorn
(docs/benchmarks.md, "Hypercorn tuned"). Much of it is not HTTP work:
- h11, pure Python, parses every request and builds and validates every response event. Its
  fork compiled with mypyc (PyPI `h11-mypyc`: h11 0.16 re-annotated for mypyc, with a few small
  rewrites such as the obs-fold check, installed as its own module) does the same for about
  half. Hypercorn's HTTP/1.1 protocol is pointed at it; nothing else in the process changes
  (httpx keeps h11).
  `tests/test_hypercorn_tuning.py` checks the two give the same events, errors and bytes.
- The keep-alive timer: around every request Hypercorn cancels and awaits one task and creates
  another running `asyncio.wait_for` (itself a second task and a timer). `LazyIdleTask` arms that
  watcher only once a connection has been idle for `ARM_DELAY`, so a connection carrying a
  request stream never creates one. An idle connection closes `ARM_DELAY` later than the
  configured timeout, and notices server shutdown within `ARM_DELAY`.
- The Date header, formatted anew (wsgiref) for every response: `TunedConfig` formats it once per
  second.
- Two writes per response: the head as soon as the app starts the response, then the body.
  `HeadHoldingH11Protocol` writes the head with the body when the app sends both in one step
  (every non-stream answer), else one loop turn later: one syscall and one client wake-up fewer.
- Each request's ASGI messages reach the app through an `asyncio.Queue`: ~9 Python calls per
  put and ~8 per get (size checks, task accounting and an Event that nobody joins), three puts
  and two gets per request. `AppChannel` has the same put/get semantics (bounded by
  `max_app_queue_size`, FIFO waiters, cancellation as asyncio.Queue's) in one call each;
  `LeanTaskGroup` hands it to the app instead.
- Every write takes the connection's send lock and awaits `drain()` (8 Python calls), though
  the lock is free and the transport took the bytes at once nearly always. `LeanTCPServer`
  writes straight away when the lock is free, and takes the lock and drains only when the
  transport buffers bytes or is closing: the same order of bytes and the same back-pressure.
These replace five module attributes of Hypercorn (its protocol's `h11`, its TCP server's timer
class and task group, its HTTP/1.1 protocol class, its worker's TCP server class), so `apply`
checks the version they were written against and otherwise leaves Hypercorn stock;
`--http-server hypercorn-stock` serves it stock on purpose, for comparison (`apply(False)` puts
Hypercorn's own parts back).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from importlib.metadata import version
from types import ModuleType
from typing import Any

import hypercorn.asyncio.task_group as task_group_module
import hypercorn.protocol.h11 as h11_protocol
from hypercorn.asyncio.task_group import TaskGroup
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData
from hypercorn.protocol.h11 import H11Protocol

log = logging.getLogger("kvroute.http")

Watcher = Callable[[], Coroutine[Any, Any, Any]]  # Hypercorn's idle-timeout coroutine function

TUNED_VERSIONS = ("0.18.",)  # the Hypercorn releases whose internals this module was checked on
ARM_DELAY = 0.25  # s a connection stays idle before its keep-alive watcher exists


class TunedConfig(Config):
    """Hypercorn's Config with its default response headers built once per second."""

    _headers_second = -1
    _headers: tuple[tuple[bytes, bytes], ...] = ()

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        # The Date header has one-second resolution (RFC 9110 5.6.7): the same second, the same
        # bytes. Callers get a fresh list each time, as from Hypercorn's own method.
        second = int(time.time())
        if second != self._headers_second or not self.include_date_header:
            self._headers = tuple(super().response_headers(protocol))
            self._headers_second = second if self.include_date_header else -1
        return list(self._headers)


class LazyIdleTask:
    """Hypercorn's `AsyncioSingleTask` for the keep-alive timer, armed only after `ARM_DELAY`.

    Same interface and the same guarantee after `stop()`: the action is not running and will not
    start. A restart within `ARM_DELAY` of the last one costs a timer handle, not two tasks."""

    def __init__(self, delay: float = ARM_DELAY) -> None:
        self.delay = delay
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None

    async def restart(self, task_group: Any, action: Watcher) -> None:
        await self.stop()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.delay, self._arm, task_group, action)

    def _arm(self, task_group: Any, action: Watcher) -> None:
        self._timer = None
        # The connection's own task group, as Hypercorn's class does: it is awaited (and this
        # task cancelled with it) when the connection ends.
        watcher = action()
        try:
            self._task = task_group._task_group.create_task(watcher)
        except RuntimeError:
            # The group has already finished: the connection is closing (its `stop()` is a loop
            # turn away), so there is nothing left to watch.
            watcher.close()

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class AppChannel:
    """`asyncio.Queue`'s ``put`` and ``get`` for an app's ASGI messages, without the rest.

    The same algorithm: ``put`` waits while ``maxsize`` messages are unread (``maxsize <= 0``:
    never), waiters are woken first come, first served, and a waiter cancelled after its wake-up
    passes the wake-up on, so no message or free slot is stranded."""

    __slots__ = ("_items", "_maxsize", "_getters", "_putters")

    def __init__(self, maxsize: int = 0) -> None:
        self._items: deque[Any] = deque()
        self._maxsize = maxsize
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()

    def qsize(self) -> int:
        return len(self._items)

    async def put(self, item: Any) -> None:
        items = self._items
        while 0 < self._maxsize <= len(items):
            await self._wait(self._putters)
        items.append(item)
        _wake_first(self._getters)

    async def get(self) -> Any:
        items = self._items
        while not items:
            await self._wait(self._getters)
        item = items.popleft()
        if self._putters:
            _wake_first(self._putters)
        return item

    async def _wait(self, waiters: deque[asyncio.Future[None]]) -> None:
        waiter = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            waiter.cancel()
            with contextlib.suppress(ValueError):
                waiters.remove(waiter)
            # Woken, then cancelled before it could act: the wake-up goes to the next waiter.
            if not waiter.cancelled():
                _wake_first(waiters)
            raise


def _wake_first(waiters: deque[asyncio.Future[None]]) -> None:
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return


# Hypercorn's per-request app runner (private; `apply` serves stock if a release lacks it).
_HANDLE: Any = vars(task_group_module).get("_handle")


class LeanTaskGroup(TaskGroup):
    """Hypercorn's connection task group with an `AppChannel` as each app's ``receive``."""

    async def spawn_app(self, app: Any, config: Config, scope: Any,
                        send: Callable[[Any], Awaitable[None]]
                        ) -> Callable[[Any], Awaitable[None]]:
        channel = AppChannel(config.max_app_queue_size)
        loop = self._loop

        def call_soon(func: Callable[..., Any], *args: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(func(*args), loop).result()

        self.spawn(_HANDLE, app, config, scope, channel.get, send,
                   partial(loop.run_in_executor, None), call_soon)
        return channel.put


class LeanTCPServer(TCPServer):
    """Hypercorn's connection server, writing without the lock and `drain()` when neither is
    needed."""

    async def protocol_send(self, event: Event) -> None:
        if type(event) is not RawData or self.send_lock.locked():
            await super().protocol_send(event)  # a writer is draining: queue behind it
            return
        writer = self.writer
        try:
            writer.write(event.data)
            transport = writer.transport
            # As stock from here: nothing yielded between the write and taking the lock.
            if transport.is_closing() or transport.get_write_buffer_size():
                async with self.send_lock:
                    await writer.drain()
        except (ConnectionError, RuntimeError):
            await self.protocol.handle(Closed())


class HeadHoldingH11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol with a response's head written together with what follows.

    Stock Hypercorn writes the status line and headers as soon as the app sends
    ``http.response.start``, then the body in a second write: two syscalls, and a client woken
    once for a head it cannot use alone. Here the head's bytes wait for the next write of the
    connection (the body, the end of a chunked body, or a close), or, for an app that starts a
    response and then waits (a stream before its first event), for the next turn of the loop:
    the head is never later than one loop turn. Bytes and their order are unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write = self.send
        self.send = self._send_after_head
        self._head = b""
        self._flush: asyncio.Task[None] | None = None

    async def _send_h11_event(self, event: Any) -> None:
        h11 = vars(h11_protocol)["h11"]  # h11_mypyc once tuned (see ``apply``)
        if type(event) is not h11.Response:
            await super()._send_h11_event(event)
            return
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise
            return
        self._head += data
        asyncio.get_running_loop().call_soon(self._flush_head)

    def _flush_head(self) -> None:
        # Usually the body went out in the same step as the head and there is nothing to do.
        if self._head and self._flush is None:
            self._flush = asyncio.ensure_future(self._send_head())

    async def _send_head(self) -> None:
        try:
            if self._head:
                await self._send_after_head(RawData(data=b""))
        finally:
            self._flush = None

    async def _send_after_head(self, event: Event) -> None:
        head = self._head
        if head:
            # Taken before any await: exactly one sender writes it, ahead of its own bytes.
            self._head = b""
            if isinstance(event, RawData):
                event = RawData(data=head + event.data)
            else:
                await self._write(RawData(data=head))
        await self._write(event)


def compiled_h11() -> ModuleType | None:
    """`h11_mypyc` if it imports, else None (serve with h11)."""
    try:
        return importlib.import_module("h11_mypyc")
    except ImportError:
        return None


def apply(tuned: bool = True) -> bool:
    """Point this process's Hypercorn at the tuned parts, or (``tuned=False``) at its own.
    Idempotent. False when it serves stock: asked to, or, with a warning, when the installed
    Hypercorn is not one the tuning was checked on."""
    import h11
    import hypercorn.asyncio.run as run
    import hypercorn.asyncio.tcp_server as tcp_server
    import hypercorn.asyncio.worker_context as worker_context
    import hypercorn.protocol as protocol

    if not tuned:
        vars(tcp_server)["AsyncioSingleTask"] = worker_context.AsyncioSingleTask
        vars(tcp_server)["TaskGroup"] = TaskGroup
        vars(run)["TCPServer"] = TCPServer
        vars(h11_protocol)["h11"] = h11
        vars(protocol)["H11Protocol"] = H11Protocol
        return False
    hv = version("hypercorn")
    if not hv.startswith(TUNED_VERSIONS) or "AsyncioSingleTask" not in vars(tcp_server) \
            or "TaskGroup" not in vars(tcp_server) or _HANDLE is None \
            or "TCPServer" not in vars(run) \
            or "h11" not in vars(h11_protocol) or "H11Protocol" not in vars(protocol):
        log.warning("hypercorn %s is not a version kvroute's tuning was checked on (%s): "
                    "serving it stock", hv, ", ".join(v + "x" for v in TUNED_VERSIONS))
        return False
    vars(tcp_server)["AsyncioSingleTask"] = LazyIdleTask
    vars(tcp_server)["TaskGroup"] = LeanTaskGroup
    vars(run)["TCPServer"] = LeanTCPServer
    vars(protocol)["H11Protocol"] = HeadHoldingH11Protocol
    fast = compiled_h11()
    if fast is None:
        log.warning("h11-mypyc is not installed: Hypercorn parses HTTP with pure-Python h11")
    else:
        vars(h11_protocol)["h11"] = fast
    return True


def parts_in_use() -> tuple[object, ModuleType, type, type, type]:
    """(keep-alive timer class, h11 module, HTTP/1.1 protocol class, connection task group
    class, connection server class): what Hypercorn's HTTP/1.1 serving uses now."""
    import hypercorn.asyncio.run as run
    import hypercorn.asyncio.tcp_server as tcp_server
    import hypercorn.protocol as protocol

    return (vars(tcp_server)["AsyncioSingleTask"], vars(h11_protocol)["h11"],
            vars(protocol)["H11Protocol"], vars(tcp_server)["TaskGroup"],
            vars(run)["TCPServer"])
