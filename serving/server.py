"""Serve an ASGI app on a bound socket with a stock HTTP server: uvicorn, Hypercorn or Granian.

Both services (render, router) serve through this one function, so the HTTP server is a setting,
not a fork in the code. Every server runs as released, configured only through its public options:
- ``uvicorn``: httptools (llhttp, C) for HTTP/1.1, on the caller's uvloop; what vLLM's own API
  server runs.
- ``hypercorn``: h11 (pure Python), ``hypercorn.asyncio.serve`` with a ``Config``.
- ``granian``: Rust (hyper) HTTP, its embedded asyncio server (``granian.server.embed.Server``,
  marked experimental upstream). Its public API binds the listener itself from an address, so
  it cannot take the caller's socket: it rebinds the socket's address (see ``_granian``).
Each service's default (``ROUTER_SERVER``, ``RENDER_SERVER``) is picked by measurement,
bench/servers.py (docs/operations.md, "HTTP server").
Everything above the server (routes, raw ASGI SSE writes, disconnect detection, draining) is
plain ASGI; tests/test_server_conformance.py checks that every server behaves the same there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kvroute.http")

SERVERS = ("uvicorn", "hypercorn", "granian")
# Each service's default server, chosen here only, from bench/servers.py's side-by-side run.
ROUTER_SERVER = "uvicorn"
RENDER_SERVER = "uvicorn"
# Servers whose public API takes an already-listening socket; the others rebind its address.
TAKES_SOCKET = frozenset({"uvicorn", "hypercorn"})

Shutdown = Callable[[], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class ServeOptions:
    server: str  # one of SERVERS
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
    get ``graceful_timeout``). Without ``shutdown`` SIGINT/SIGTERM stop it. The caller runs the
    event loop (uvloop) and closes ``sock`` afterwards (closing twice is harmless)."""
    if opts.server == "uvicorn":
        await _uvicorn(app, sock, opts, shutdown)
    elif opts.server == "hypercorn":
        await _hypercorn(app, sock, opts, shutdown)
    else:
        await _granian(app, sock, opts, shutdown)


async def _hypercorn(app: Any, sock: socket.socket, opts: ServeOptions,
                     shutdown: Shutdown | None) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    hc = Config()
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
    hc.include_server_header = False  # as on uvicorn below: no server banner per response
    await serve(app, hc, shutdown_trigger=shutdown)


async def _uvicorn(app: Any, sock: socket.socket, opts: ServeOptions,
                   shutdown: Shutdown | None) -> None:
    import uvicorn

    if "uvloop" not in type(asyncio.get_running_loop()).__module__:
        # uvicorn's httptools protocol answers keep-alive requests far later on the stdlib loop
        # than on uvloop, so the services run uvloop wherever it installs; say so when it is absent.
        log.warning("uvicorn runs on %s, not uvloop: keep-alive requests will be slow",
                    type(asyncio.get_running_loop()).__name__)

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # The caller owns the signals (the router flips readiness first), or `_stopping`
            # below does: uvicorn's own capture re-raises the signal once it has shut down, so
            # a clean SIGTERM would end the process as killed (-15) instead of exiting 0.
            # uvicorn has no setting for this; a no-op capture_signals is how vLLM's API server
            # does it.
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

    def stop() -> None:
        server.should_exit = True

    async with _stopping(shutdown, stop, own_signals=True):
        await server.serve(sockets=[sock])


async def _granian(app: Any, sock: socket.socket, opts: ServeOptions,
                   shutdown: Shutdown | None) -> None:
    """Granian's embedded server on ``sock``'s address.

    Its public API takes an address, not a socket, and binds with SO_REUSEPORT itself. So the
    caller's socket is closed here first (a listener left open beside Granian's would take a
    share of the connections and never answer them) and Granian binds the same host and port.
    Limits that follow: a connection queued on ``sock`` before this call is reset, one that
    arrives during the app's lifespan startup (Granian listens after it) is refused, and ``sock``
    must be this process's only handle on the port (render's ``--workers 1``). Once stopped,
    the embedded server no longer delivers an open response's sends: it does not drain (the
    router drains its own streams before it stops the server; render's open requests are cut).
    It has no keep-alive idle timeout, graceful-timeout or head-size setting (hyper's apply)."""
    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    host, port = sock.getsockname()[:2]
    sock.close()
    loggers = None if opts.error_log else {  # propagate to the caller's logging instead
        "_granian": {"handlers": [], "propagate": True},
        "granian.access": {"handlers": [], "propagate": True}}
    server = Server(
        app, address=host, port=port, interface=Interfaces.ASGI, http=HTTPModes.http1,
        websockets=False, backlog=opts.backlog,
        log_enabled=True, log_level=LogLevels.info if opts.access_log else LogLevels.warning,
        log_access=opts.access_log,
        log_dictconfig=None if loggers is None else {"loggers": loggers},
    )
    async with _stopping(shutdown, server.stop, own_signals=True):
        await server.serve()


@contextlib.asynccontextmanager
async def _stopping(shutdown: Shutdown | None, stop: Callable[[], None],
                    own_signals: bool) -> AsyncIterator[None]:
    """Calls ``stop`` once ``shutdown()`` returns; without ``shutdown`` and with ``own_signals``
    (a server that installs no handlers of its own), on SIGINT/SIGTERM."""
    loop = asyncio.get_running_loop()
    trigger = None
    signals: tuple[signal.Signals, ...] = ()
    if shutdown is not None:
        async def stop_when_told() -> None:
            await shutdown()
            stop()

        trigger = asyncio.create_task(stop_when_told(), name="asgi-shutdown")
    elif own_signals:
        signals = (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        if trigger is not None:
            trigger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trigger
