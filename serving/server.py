"""Serve an ASGI app on a bound socket: Hypercorn (h11; the default, tuned) or uvicorn (httptools).

Both services (render, router) serve through this one function, so the HTTP server is a setting,
not a fork in the code. Hypercorn is the default the issues specify. uvicorn with httptools (llhttp,
C) parses a request for a fraction of h11's CPU — ~0.1-0.2 ms of server CPU per request here against
~0.35-0.5 ms for tuned Hypercorn and ~0.5-0.7 ms for stock, measured side by side
(docs/benchmarks.md, "Hypercorn tuned") — so `--http-server uvicorn` is offered to deployments
where per-request CPU matters most. Everything above the server (routes, raw ASGI SSE
writes, disconnect detection, draining) is plain ASGI and behaves the same on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kvroute.http")

SERVERS = ("hypercorn", "hypercorn-stock", "uvicorn")
DEFAULT_SERVER = "hypercorn"

Shutdown = Callable[[], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class ServeOptions:
    server: str = DEFAULT_SERVER
    backlog: int = 2048  # a burst of connections must not be refused
    keep_alive_timeout: float = 75.0
    graceful_timeout: float = 30.0  # after shutdown: open requests get this long
    startup_timeout: float = 900.0  # lifespan startup (loading big tokenizers on a busy box)
    access_log: bool = False
    error_log: bool = True  # False: the caller's logging owns the server's loggers
    max_head_bytes: int = 64 * 1024  # request line + headers

    def __post_init__(self) -> None:
        if self.server not in SERVERS:
            raise ValueError(f"http server must be one of {SERVERS}, got {self.server!r}")


def bind_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening socket, bound before serving: port 0 resolves to a known port, a client that
    connects before the server starts queues instead of being refused, and worker processes can
    inherit it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


async def serve_asgi(app: Any, sock: socket.socket, opts: ServeOptions,
                     shutdown: Shutdown | None = None) -> None:
    """Serve ``app`` on the listening ``sock`` until ``shutdown()`` returns (then open requests
    get ``graceful_timeout``). Without ``shutdown`` the server's own SIGINT/SIGTERM handling
    stops it. The caller runs the event loop (uvloop) and closes ``sock`` afterwards."""
    if opts.server == "uvicorn":
        await _uvicorn(app, sock, opts, shutdown)
    else:
        await _hypercorn(app, sock, opts, shutdown, tuned=opts.server == "hypercorn")


async def _hypercorn(app: Any, sock: socket.socket, opts: ServeOptions,
                     shutdown: Shutdown | None, tuned: bool) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from render import hypercorn_tuning

    # Tuned (the default): compiled h11, a lazy keep-alive timer, a cached Date header
    # (render/hypercorn_tuning.py); "hypercorn-stock" serves Hypercorn exactly as released.
    tuned = hypercorn_tuning.apply(tuned)
    hc = hypercorn_tuning.TunedConfig() if tuned else Config()
    # Hypercorn closes the descriptor it served: give it its own, the caller closes ``sock``.
    hc.bind = [f"fd://{os.dup(sock.fileno())}"]
    hc.backlog = opts.backlog  # Hypercorn re-listens with its own backlog (default 100)
    hc.accesslog = "-" if opts.access_log else None
    hc.errorlog = "-" if opts.error_log else None
    hc.keep_alive_timeout = opts.keep_alive_timeout
    # Hypercorn closes a keep-alive connection after 1000 requests by default; vLLM's servers (and
    # uvicorn as configured below) never do, and a gateway's pooled connection must not reset.
    hc.keep_alive_max_requests = 2**62
    hc.graceful_timeout = opts.graceful_timeout
    hc.startup_timeout = opts.startup_timeout
    hc.h11_max_incomplete_size = opts.max_head_bytes
    # No `server: hypercorn-h11` on every response (uvicorn's is off below too): one header less
    # for h11 to validate and write per request. The Date header stays (RFC 9110 8.6.1).
    hc.include_server_header = False
    await serve(app, hc, shutdown_trigger=shutdown)


async def _uvicorn(app: Any, sock: socket.socket, opts: ServeOptions,
                   shutdown: Shutdown | None) -> None:
    import uvicorn

    if "uvloop" not in type(asyncio.get_running_loop()).__module__:
        # Measured: uvicorn's httptools protocol on the stdlib loop answers keep-alive requests
        # ~40 ms apart (0.15 ms on uvloop); the services run uvloop wherever it installs.
        log.warning("uvicorn runs on %s, not uvloop: keep-alive requests will be slow",
                    type(asyncio.get_running_loop()).__name__)

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if shutdown is None:
                with super().capture_signals():
                    yield
            else:  # the caller owns the signals (e.g. the router flips readiness first)
                yield

    config = uvicorn.Config(
        app,
        http="httptools",
        ws="none",
        loop="none",  # the caller runs the loop (uvloop)
        lifespan="on",
        access_log=opts.access_log,
        log_config=None if not opts.error_log else uvicorn.config.LOGGING_CONFIG,
        log_level="info" if opts.access_log else "warning",
        proxy_headers=False,  # no X-Forwarded-* rewriting: one coroutine less per request
        server_header=False,
        backlog=opts.backlog,
        timeout_keep_alive=math.ceil(opts.keep_alive_timeout),
        timeout_graceful_shutdown=math.ceil(opts.graceful_timeout),
        h11_max_incomplete_event_size=opts.max_head_bytes,
        limit_max_requests=None,  # as vLLM's servers: no cap per process or connection
    )
    server = Server(config)
    trigger = None
    if shutdown is not None:
        async def stop_when_told() -> None:
            await shutdown()
            server.should_exit = True

        trigger = asyncio.create_task(stop_when_told(), name="asgi-shutdown")
    try:
        await server.serve(sockets=[sock])
    finally:
        if trigger is not None:
            trigger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trigger
