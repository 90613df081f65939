"""Pooled keep-alive HTTP/1.1 connections to one pod, read in the loop's protocol callbacks.

An HTTP engine streams one SSE event per token. httpx costs ~22 us of CPU per streamed event
and ~4 ms per short request on this path (pure-Python h11 and an await per chunk), an
``asyncio.Protocol`` fed to httptools' C parser (llhttp, what uvicorn parses with) ~4 us and
under 1 ms (measured side by side, bench/http_transport.py has the end-to-end figure). So a
connection is a Protocol: bytes arrive in ``data_received``, the parser calls back, and the
body goes to the exchange's ``Reader`` in the same callback (no task switch per event, as the
ZMQ listener reads its socket).

One exchange at a time per connection (HTTP/1.1 without pipelining). ``Pool.acquire`` hands out
an idle connection (most recently used first; those idle ``idle_after`` seconds or more are
closed) or opens one within ``connect_timeout``. A response must start (its head) within
``first_byte_timeout`` of the request, and a body in progress must not go silent for
``read_timeout``: either ends the exchange with ``EngineDeadError``. A connection goes back to
the pool only after a complete response that allows keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

import httptools

from serving.errors import EngineDeadError, EngineLinkError, EngineUnavailableError


class ConnectionClosed(EngineDeadError):
    """The connection closed while a response was awaited or under way."""


class Reader(Protocol):
    """One exchange's receiver; every callback runs in the connection's protocol callback."""

    def on_head(self, status: int) -> None: ...

    def on_body(self, data: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_error(self, exc: EngineLinkError) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection; ``send`` starts an exchange whose replies go to a Reader."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.reader: Reader | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.exchanges = 0  # requests sent on it: over 1, it was reused from the pool
        self.idle_since = 0.0
        self._keep_alive = True
        self._last_data = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timeout = 0.0
        self._deadline_kind = ""

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._last_data = self.pool.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # not asked for: a confused peer
            self._fail(EngineUnavailableError(f"{self.pool.name}: unexpected protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(EngineUnavailableError(f"{self.pool.name}: malformed HTTP response "
                                              f"({exc})"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        self.pool.forget(self)
        reader, self.reader = self.reader, None
        if reader is not None:
            why = f" ({exc})" if exc else ""
            reader.on_error(ConnectionClosed(f"{self.pool.name}: the connection closed before "
                                             f"the response ended{why}"))

    # ---- httptools callbacks ----

    def on_headers_complete(self) -> None:
        self._keep_alive = bool(self.parser.should_keep_alive())
        # The head arrived: from here on, silence longer than read_timeout ends the exchange.
        self._arm(self.pool.read_timeout, "no data")
        if self.reader is not None:
            self.reader.on_head(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self.reader is not None:
            self.reader.on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_timer()
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.on_end()
        if self._keep_alive and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    # ---- the exchange ----

    def send(self, request: bytes, reader: Reader) -> None:
        """Write a whole request; its response goes to ``reader``."""
        assert self.transport is not None and self.reader is None
        self.reader = reader
        self.exchanges += 1
        self.parser = httptools.HttpResponseParser(self)
        self._last_data = self.pool.loop.time()
        self._arm(self.pool.first_byte_timeout, "no response head")
        self.transport.write(request)

    def abandon(self) -> None:
        """Drop the exchange (its reader hears nothing more) and the connection: the peer sees
        the request's client disconnect."""
        self.reader = None
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._cancel_timer()
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()

    def _fail(self, exc: EngineLinkError) -> None:
        reader, self.reader = self.reader, None
        self.close()
        if reader is not None:
            reader.on_error(exc)

    # ---- one re-arming timer per connection (no timer per received chunk) ----

    def _arm(self, timeout: float, kind: str) -> None:
        self._cancel_timer()
        self._timeout = timeout
        self._deadline_kind = kind
        self._timer = self.pool.loop.call_at(self._last_data + timeout, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.reader is None:
            return
        due = self._last_data + self._timeout
        if self.pool.loop.time() < due:
            self._timer = self.pool.loop.call_at(due, self._check)
            return
        self._fail(EngineDeadError(f"{self.pool.name}: {self._deadline_kind} for "
                                   f"{self._timeout:g}s"))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Pool:
    """The keep-alive connections to one pod's host and port."""

    def __init__(self, name: str, host: str, port: int, *, tls: bool, connect_timeout: float,
                 first_byte_timeout: float, read_timeout: float, idle_after: float) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.ssl = ssl.create_default_context() if tls else None
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.read_timeout = read_timeout
        self.idle_after = idle_after
        self.loop = asyncio.get_running_loop()
        self._idle: deque[Connection] = deque()
        self._open: set[Connection] = set()
        self.opened = 0  # connections opened in all (keep-alive reuse shows as few)

    @property
    def size(self) -> int:
        return len(self._open)

    async def acquire(self) -> Connection:
        """An idle keep-alive connection, or a new one (EngineUnavailableError if the pod does
        not accept one in time)."""
        now = self.loop.time()
        idle = self._idle
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be timed out
            if not conn.closed and now - conn.idle_since < self.idle_after:
                return conn
            conn.close()
        return await self._connect()

    async def _connect(self) -> Connection:
        factory: Callable[[], Connection] = lambda: Connection(self)  # noqa: E731
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await self.loop.create_connection(factory, self.host, self.port,
                                                            ssl=self.ssl)
        except TimeoutError:
            raise EngineUnavailableError(f"{self.name}: no connection to {self.host}:"
                                         f"{self.port} within {self.connect_timeout:g}s") from None
        except OSError as exc:
            raise EngineUnavailableError(f"{self.name}: cannot connect to {self.host}:"
                                         f"{self.port} ({exc})") from exc
        self._open.add(conn)
        self.opened += 1
        return conn

    def release(self, conn: Connection) -> None:
        conn.idle_since = self.loop.time()
        self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self._open.discard(conn)
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    def prune(self) -> None:
        """Close the connections idle too long (called now and then by the client)."""
        now = self.loop.time()
        for conn in [c for c in self._idle if now - c.idle_since >= self.idle_after]:
            conn.close()

    def close(self) -> None:
        for conn in list(self._open):
            conn.abandon()
        self._idle.clear()
